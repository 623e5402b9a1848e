// A turn's page: its timeline from trigger to reply, read from every node's
// log by `GET /turns/{id}` (a turn may have run on a peer). Each step is a
// row: the wake, each model call (model, tokens, latency, fallback), each
// tool call, the reviewer's verdict, the reply, and the outcome with its
// cost. A node that did not answer is named: the timeline may be partial.

import { el, when, seatLink, trim, tokens, problem, section } from "./dom.js";
import { get } from "./api.js";
import { sentence, coverageLine } from "./feed.js";

function step(ev, t0) {
  const p = ev.payload ?? {};
  const detail = {
    model_call: () => [`${p.model} · ${p.phase} round ${p.round}`, `${tokens(p.input_tokens)} in / ${tokens(p.output_tokens)} out · ${p.ms} ms`],
    tool_call: () => [`${p.tool} ${p.ok ? "ok" : "failed"}`, `${p.ms} ms${p.error ? " · " + trim(p.error) : ""}${p.arguments ? " · args " + trim(p.arguments) : ""}${p.result ? " · result " + trim(p.result) : ""}`],
    review: () => [`verdict: ${p.verdict}`, p.feedback ? trim(p.feedback, 300) : ""],
    reply_posted: () => [`reply in ${p.target ?? p.server}`, trim(p.text ?? "", 400)],
    provider_fallback: () => [`fallback ${p.from} → ${p.to}`, p.reason ?? p.failure ?? ""],
    turn_ended: () => [`outcome: ${p.outcome}`, `cost ${tokens((p.input_tokens ?? 0) + (p.output_tokens ?? 0))} tokens (${p.input_tokens} in / ${p.output_tokens} out) · ${p.model_calls} model calls · ${p.tool_calls} tool calls · ${p.ms} ms`],
  }[ev.type];
  const [head, more] = detail ? detail() : [sentence(ev), ""];
  return el("li", { class: `step ${ev.type}`, "data-testid": "step", "data-type": ev.type },
    el("span", { class: "at muted small" }, `+${ev.at_ms - t0} ms`),
    el("div", {}, el("strong", {}, head), more ? el("div", { class: "small" }, more) : null,
      el("details", {}, el("summary", {}, "JSON"), el("pre", {}, JSON.stringify(ev, null, 2)))));
}

export async function renderTurn(main, id) {
  const a = await get(`/turns/${encodeURIComponent(id)}`);
  if (!a.body?.events) return main.replaceChildren(section(`Turn ${id}`, problem(`this turn could not be read: ${a.body?.error ?? a.status}`)));
  const d = a.body;
  if (!d.found) {
    return main.replaceChildren(section(`Turn ${id}`, problem(d.coverage?.complete === false
      ? `not found on the nodes that answered; ${coverageLine(d)} — it may be on one that did not`
      : "no node in the fleet has this turn")));
  }
  // Oldest first; the wake is the trace's, found by the turn's trace id.
  const events = [...d.events].sort((x, y) => x.at_ms - y.at_ms || x.seq - y.seq);
  const first = events[0];
  const trace = first.trace_id;
  const wakes = trace ? (await get(`/events?trace_id=${encodeURIComponent(trace)}&limit=20`)).body?.events ?? [] : [];
  const before = wakes.filter((e) => !e.payload?.turn_id && e.at_ms <= first.at_ms).sort((x, y) => x.at_ms - y.at_ms);
  const all = [...before, ...events];
  const ended = events.find((e) => e.type === "turn_ended");
  const t0 = all[0].at_ms;
  main.replaceChildren(section(`Turn ${id.slice(0, 8)}`,
    el("p", { "data-testid": "turn-summary" }, first.seat ? seatLink(first.seat) : "", ` · ran on ${d.nodes.join(", ")} · started ${when(first.at_ms)} · `,
      ended ? `${ended.payload.outcome}, ${tokens((ended.payload.input_tokens ?? 0) + (ended.payload.output_tokens ?? 0))} tokens` : "still running (or its end is on a node that did not answer)"),
    el("p", { class: "muted small" }, coverageLine(d)),
    el("ol", { class: "timeline", "data-testid": "timeline" }, all.map((e) => step(e, t0))),
    el("p", {}, el("a", { href: `#/feed?turn=${encodeURIComponent(id)}` }, "These events in the feed →"))));
}
