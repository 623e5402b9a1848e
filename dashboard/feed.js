// The live feed: a sentence per event (the JSON one click away), filtered
// by seat, type and turn, paged through the fleet's history. Paging is per
// node: `before_seq` is a position in one node's log, so "older" asks each
// node that answered for the rows before the oldest it gave.

import { el, when, seatLink, turnLink, trim, tokens, problem, section } from "./dom.js";
import { get, stream, onEvent } from "./api.js";

/** Rows a history read asks for (`#/feed?page=N` sets another, up to 1000). */
const PAGE = 100;
const MAX_ROWS = 2000;
export const KINDS = [
  "webhook_received", "delivery_refused", "wake_published", "delivery_unrouted", "delivery_dead_lettered",
  "turn_started", "prefetch", "turn_ended", "model_call", "tool_call", "review", "review_overturned",
  "budget_exhausted", "budget_parked", "reply_posted", "reply_uncertain", "provider_fallback",
  "llm_unavailable", "credential_benched", "credential_cooled_by_peer", "schedule_fired",
  "schedule_missed", "maintenance_pass", "learning_pass", "config_activated", "config_applied", "node_started",
  "node_evicted", "node_readmitted",
];

const who = (ev) => (ev.seat ? "@" + ev.seat : `node ${ev.node_id}`);
const plural = (n, one) => `${n} ${one}${n === 1 ? "" : "s"}`;

/** One event as a sentence a person reads. */
export function sentence(ev) {
  const p = ev.payload ?? {};
  switch (ev.type) {
    case "webhook_received":
      return `${p.source} ${p.event_type ?? "delivery"} received${p.mentions?.length ? " mentioning " + p.mentions.map((m) => "@" + m).join(", ") : ""}${p.claimed === false ? " (already claimed: a duplicate)" : ""}`;
    case "delivery_refused": return `${p.source ?? "a"} delivery refused: ${p.reason ?? p.detail ?? "no reason given"}`;
    case "wake_published": return `${who(ev)} woken by ${p.source} ${p.event_type ?? ""} (${p.reason ?? "route"})`;
    case "delivery_unrouted": return `${p.source ?? "a"} delivery reached no seat${p.reason ? ": " + p.reason : ""}`;
    case "delivery_dead_lettered": return `a delivery for ${who(ev)} was dead-lettered${p.reason ? ": " + p.reason : ""}`;
    case "turn_started": return `${who(ev)} started a turn (${plural(p.triggers?.length ?? 1, "trigger")})`;
    case "prefetch": {
      const skipped = Object.entries(p.blocks ?? {}).filter(([, b]) => b?.state === "failed" || b?.state === "timed_out").map(([k]) => k);
      const how = p.recall?.by;
      return `${who(ev)} recalled what it knows (${p.bytes ?? 0} bytes in ${p.ms ?? "?"} ms${how ? ", by " + how : ""})${skipped.length ? " — skipped: " + skipped.join(", ") : ""}`;
    }
    case "turn_ended":
      return `${who(ev)}'s turn ended ${p.outcome}: ${plural(p.model_calls ?? 0, "model call")}, ${plural(p.tool_calls ?? 0, "tool call")}, ${tokens((p.input_tokens ?? 0) + (p.output_tokens ?? 0))} tokens in ${p.ms} ms${p.detail ? " — " + p.detail : ""}`;
    case "model_call":
      return `${who(ev)} called ${p.model} (${p.phase}, round ${p.round}): ${tokens(p.input_tokens)} in / ${tokens(p.output_tokens)} out, ${p.ms} ms${p.tool_calls?.length ? " → " + p.tool_calls.join(", ") : ""}`;
    case "tool_call": return `${who(ev)} used ${p.tool}: ${p.ok ? "ok" : "failed"} in ${p.ms} ms${p.error ? " — " + trim(p.error, 120) : ""}`;
    case "review": return `the reviewer of ${who(ev)}'s work said ${p.verdict}${p.feedback ? ": " + trim(p.feedback, 120) : ""}`;
    case "review_overturned": return `the review of ${who(ev)}'s work was overturned${p.reason ? ": " + p.reason : ""}`;
    case "budget_exhausted": return `${who(ev)} refused by the ${p.scope} ${p.period} budget: ${tokens(p.spent)} of ${tokens(p.cap)} spent`;
    case "budget_parked": return `${who(ev)}'s work parked: the ${p.scope} ${p.period} budget has ${tokens(p.spent)} of ${tokens(p.cap)} spent, ${tokens(p.need)} needed`;
    case "reply_posted": return `${who(ev)} replied in ${p.target ?? p.server}: “${trim(p.text ?? "", 140)}”`;
    case "reply_uncertain": return `${who(ev)}'s reply via ${p.tool} may not have arrived: ${p.reason}`;
    case "provider_fallback": return `${who(ev)}'s model fell back from ${p.from} to ${p.to}: ${p.reason ?? p.failure}`;
    case "llm_unavailable": return `no model answered ${who(ev)}${p.last_error ? ": " + trim(p.last_error, 120) : ""}`;
    case "credential_benched": return `a model credential was benched${p.reason ? ": " + p.reason : ""}`;
    case "credential_cooled_by_peer": return "a peer cooled a model credential down";
    case "schedule_fired": return `schedule ${p.schedule} woke @${p.seat ?? ev.seat}${p.late_ms ? ` (${p.late_ms} ms late)` : ""}`;
    case "schedule_missed": return `schedule ${p.schedule} missed a fire${p.reason ? ": " + p.reason : ""}`;
    case "maintenance_pass": return `maintenance pass on ${ev.node_id} (${p.took_ms ?? "?"} ms)`;
    case "learning_pass": return `learning pass on ${ev.node_id}: ${p.outcome ?? "?"}${p.why ? " — " + trim(p.why, 120) : ""}`;
    case "config_activated": return `company revision ${p.epoch} activated (${p.org}, ${plural(p.seats ?? 0, "seat")})`;
    case "config_applied": return `node ${ev.node_id} applied revision ${p.epoch}`;
    case "node_evicted": return `node ${p.node} evicted from the state log's trim${p.reason ? ": " + trim(p.reason, 120) : ""}`;
    case "node_readmitted": return `node ${p.node} readmitted to the state log${p.reason ? ": " + trim(p.reason, 120) : ""}`;
    case "node_started": return `node ${ev.node_id} started (${(p.roles ?? []).join(", ")})`;
    default: return `${ev.type} on ${ev.node_id}`;
  }
}

/** One feed row: the sentence, its time and links, the JSON behind a click. */
export function eventRow(ev) {
  const turn = ev.payload?.turn_id;
  return el("li", { "data-testid": "event", "data-type": ev.type, "data-event-id": ev.event_id },
    el("div", { class: "sentence", "data-testid": "sentence" }, sentence(ev)),
    el("div", { class: "muted small" },
      `${when(ev.at_ms)} · ${ev.type} · ${ev.node_id}`,
      ev.seat ? [" · ", seatLink(ev.seat)] : null,
      turn ? [" · turn ", turnLink(turn)] : null),
    el("details", {}, el("summary", {}, "JSON"), el("pre", {}, JSON.stringify(ev, null, 2))));
}

function matches(ev, f) {
  return (!f.seat || ev.seat === f.seat) && (!f.type || ev.type === f.type) && (!f.turn || ev.payload?.turn_id === f.turn);
}

/** What a history answer's coverage says, in a line. */
export function coverageLine(answer) {
  const c = answer.coverage ?? {};
  const notes = [];
  if (c.membership === "unknown") notes.push("fleet membership unknown: this node's history only");
  const missing = (c.missing ?? []).map((m) => `${m.node} (${m.reason})`);
  if (missing.length) notes.push(`history missing from ${missing.join(", ")}`);
  if (c.answered) notes.push(`from ${plural(c.answered.length, "node")}`);
  return notes.join(" · ");
}

export async function renderFeed(main, params) {
  const filter = { seat: params.get("seat") ?? "", type: params.get("type") ?? "", turn: params.get("turn") ?? "" };
  const page = Math.min(1000, Math.max(1, Number(params.get("page")) || PAGE));
  const list = el("ol", { class: "feed", "data-testid": "feed", "aria-live": "polite" });
  const coverage = el("p", { class: "muted small", "data-testid": "feed-coverage" });
  const seen = new Set();
  const oldest = new Map(); // node → the smallest seq it gave
  let nodes = [];
  const more = el("button", { type: "button", "data-testid": "feed-older", hidden: true }, "Older events");
  const add = (ev, live) => {
    if (seen.has(ev.event_id)) return;
    seen.add(ev.event_id);
    if (!live && (!oldest.has(ev.node_id) || ev.seq < oldest.get(ev.node_id))) oldest.set(ev.node_id, ev.seq);
    const row = eventRow(ev);
    if (live) list.prepend(row); else list.append(row);
    while (list.children.length > MAX_ROWS) list.lastElementChild.remove();
  };
  const form = el("form", { class: "filters", "data-testid": "feed-filters" },
    el("label", {}, "Seat ", el("input", { name: "seat", value: filter.seat, placeholder: "any", size: 10 })),
    el("label", {}, "Type ", el("select", { name: "type" }, el("option", { value: "" }, "any"),
      KINDS.map((k) => el("option", { value: k, selected: k === filter.type }, k)))),
    el("label", {}, "Turn ", el("input", { name: "turn", value: filter.turn, placeholder: "any", size: 12 })),
    el("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const k of ["seat", "type", "turn"]) {
      const v = form.elements[k].value.trim().replace(/^@/, "");
      if (v) q.set(k, v);
    }
    location.hash = `#/feed${q.size ? "?" + q : ""}`;
  });
  main.replaceChildren(section("Live events", form, coverage, list, more));

  const query = (extra) => stream.query({ seat: filter.seat || undefined, type: filter.type || undefined, limit: page, ...extra });
  const firstPage = async () => {
    if (filter.turn) {
      // A turn's events are read from every node's log by `/turns/{id}`.
      const a = await get(`/turns/${encodeURIComponent(filter.turn)}`);
      if (!a.body?.events) return coverage.replaceChildren(problem(`this turn could not be read: ${a.body?.error ?? a.status}`));
      a.body.events.filter((e) => matches(e, filter)).forEach((e) => add(e, false));
      coverage.textContent = coverageLine(a.body);
      return;
    }
    const r = await query({});
    if (r.kind === "error") return coverage.replaceChildren(problem(`history could not be read: ${r.error}`));
    r.events.forEach((e) => add(e, false));
    nodes = r.coverage?.answered ?? [];
    coverage.textContent = [coverageLine(r), r.truncated ? `newest ${r.limit} shown` : "all shown"].join(" · ");
    more.hidden = !r.truncated;
  };
  more.addEventListener("click", async () => {
    more.disabled = true;
    let any = false;
    for (const node of nodes) {
      if (!oldest.has(node)) continue;
      const r = await query({ node, before_seq: oldest.get(node) });
      if (r.kind === "error") { coverage.textContent += ` · ${node}: ${r.error}`; continue; }
      r.events.forEach((e) => add(e, false));
      any ||= r.truncated;
    }
    more.disabled = false;
    more.hidden = !any;
  });
  const stop = onEvent((ev) => matches(ev, filter) && add(ev, true));
  await firstPage();
  return stop;
}
