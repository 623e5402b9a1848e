// The org (roles, seats, people, and each seat's live state) and a seat's
// page (its recent turns, schedules, pause/resume, follows and memory). States come from
// `GET /agents`; a held seat reads as working while turns are in flight,
// else idle. What the fleet cannot say shows as unknown, never as idle.

import { el, table, seatLink, turnLink, when, ago, tokens, meter, badge, problem, section } from "./dom.js";
import { get, call, why, cannot, stream } from "./api.js";
import { renderFollows, renderMemory } from "./memory.js";

const STATE_KIND = { idle: "ok", working: "busy", paused: "warn", parked: "warn", stale: "bad", unplaced: "bad", unknown: "bad" };

/** idle / working / stale / paused / parked / unplaced / unknown. */
export function seatState(agent) {
  if (!agent) return "unknown";
  if (agent.state === "held") return agent.turns_in_flight > 0 ? "working" : agent.turns_in_flight === 0 ? "idle" : "unknown";
  return agent.state;
}

const ids = (identities) => Object.entries(identities ?? {}).map(([s, list]) => `${s}: ${list.join(", ")}`).join(" · ") || "—";
const mailbox = (m) => (m === null || m === undefined ? "unknown" : m === "missing" ? "none yet" : `${m.pending} waiting${m.in_work ? `, ${m.in_work} in work` : ""}`);
const inFlight = (n) => (n === null || n === undefined ? "unknown" : String(n));

/** The org, `/agents` and `/budgets` read together; each may fail alone. */
async function readAll() {
  const [org, agents, budgets] = await Promise.all([get("/org"), get("/agents"), get("/budgets")]);
  const byHandle = new Map((agents.body?.agents ?? []).map((a) => [a.handle, a]));
  const spend = new Map((budgets.body?.scopes ?? []).map((s) => [s.scope, s]));
  return { org, agents, budgets, byHandle, spend };
}

function stateBadge(agent) {
  const s = seatState(agent);
  const b = badge(s, STATE_KIND[s] ?? "");
  b.setAttribute("data-testid", "seat-state");
  if (agent?.reason) b.title = typeof agent.reason === "string" ? agent.reason : JSON.stringify(agent.reason);
  return b;
}

function daySpend(scope) {
  const d = scope?.windows?.day;
  return d ? meter("today", d.spent, d.cap, !!d.refused_at_ms) : el("span", { class: "muted" }, "unknown");
}

// What the person typed in the seats filter: it outlives the view's re-reads.
let seatFilter = "";

/** Hides the seat rows whose handle, role, state and node do not all match
 * the words typed. */
function applyFilter(rows) {
  const words = seatFilter.toLowerCase().split(/\s+/).filter(Boolean);
  for (const tr of rows.querySelectorAll("[data-testid=seat]")) {
    const text = [tr.dataset.handle, tr.dataset.role, tr.dataset.state, tr.dataset.node].join(" ").toLowerCase();
    tr.hidden = !words.every((w) => text.includes(w));
  }
}

export async function renderOrg(main) {
  const d = await readAll();
  if (!d.org.ok) return main.replaceChildren(section("Organisation", problem(why(d.org))));
  const org = d.org.body;
  const notes = [];
  if (!d.agents.ok) notes.push(problem(`seat states unknown: ${why(d.agents)}`));
  if (!d.budgets.ok) notes.push(problem(`spend unknown: ${why(d.budgets)}`));
  for (const e of d.agents.body?.errors ?? []) notes.push(problem(typeof e === "string" ? e : JSON.stringify(e)));
  const counts = {};
  for (const s of org.seats) { const st = seatState(d.byHandle.get(s.handle)); counts[st] = (counts[st] ?? 0) + 1; }
  const roles = table("Roles", ["Role", "Model", "Reviewer", "Day cap", "Seats"], org.roles.map((r) => [
    r.name, (r.executor ?? []).join(" → "), r.reviewer ?? "—", tokens(r.budget?.day),
    String(org.seats.filter((s) => s.role === r.name).length)]));
  const seats = table("Seats", ["Seat", "Role", "State", "Node", "In flight", "Mailbox", "Today's spend"],
    org.seats.map((s) => {
      const a = d.byHandle.get(s.handle);
      return el("tr", { "data-testid": "seat", "data-handle": s.handle, "data-state": seatState(a), "data-role": s.role, "data-node": a?.holder?.node ?? "" },
        el("td", {}, seatLink(s.handle), s.group ? el("div", { class: "muted small" }, s.group) : null),
        el("td", {}, s.role), el("td", {}, stateBadge(a)),
        el("td", {}, a?.holder?.node ?? (a ? "—" : "unknown")),
        el("td", {}, inFlight(a?.turns_in_flight)), el("td", {}, mailbox(a?.mailbox)),
        el("td", {}, daySpend(d.spend.get(`seat:${s.handle}`))));
    }));
  const filter = el("div", { class: "controls" }, el("label", { for: "seat-filter" }, "Filter seats"),
    el("input", { id: "seat-filter", type: "search", value: seatFilter, placeholder: "handle, role, state or node", "data-testid": "seat-filter",
      oninput: (e) => { seatFilter = e.target.value; applyFilter(seats); } }));
  const people = org.people?.length
    ? table("People", ["Person", "Identities"], org.people.map((p) => el("tr", { "data-testid": "person" }, el("td", {}, p.name), el("td", {}, ids(p.identities)))))
    : el("p", { class: "muted" }, "No people listed in the company document.");
  main.replaceChildren(
    section(org.name, el("p", { class: "muted", "data-testid": "org-summary" },
      `${org.timezone} · revision ${d.agents.body?.epoch ?? "?"} · ${org.seats.length} seats: `,
      Object.entries(counts).map(([k, n]) => `${n} ${k}`).join(", ")),
      daySpend(d.spend.get("company")), ...notes),
    section("Seats", filter, seats), section("Roles", roles), section("People", people));
  applyFilter(seats);
}

// The last pause or resume answer per seat: it outlives the re-read it causes.
const lastAct = new Map();

function pauseControls(handle, agent, refresh) {
  const blocked = cannot("write");
  const paused = agent?.paused === true;
  const reason = el("input", { id: "pause-reason", placeholder: "why (optional)", disabled: blocked || paused });
  const out = el("span", { class: "muted", role: "status", "data-testid": "pause-result" }, blocked ? `Pause and resume are disabled: ${blocked}.` : lastAct.get(handle) ?? "");
  const act = async (verb) => {
    const a = await call("POST", `/agents/${encodeURIComponent(handle)}/${verb}`, verb === "pause" && reason.value ? { reason: reason.value } : undefined);
    out.textContent = a.ok ? `${verb === "pause" ? "Paused" : "Resumed"}.` : `Not ${verb}d: ${why(a)}`;
    lastAct.set(handle, out.textContent);
    if (a.ok) refresh();
  };
  return el("div", { class: "controls" },
    el("label", { for: "pause-reason" }, "Reason"), reason,
    el("button", { type: "button", "data-testid": "pause", disabled: blocked || paused, title: blocked ?? "", onclick: () => act("pause") }, "Pause"),
    el("button", { type: "button", "data-testid": "resume", disabled: blocked || !paused, title: blocked ?? "", onclick: () => act("resume") }, "Resume"),
    out);
}

export async function renderSeat(main, handle, refresh) {
  const [d, turns, follows, memory] = await Promise.all([readAll(), stream.query({ seat: handle, type: "turn_ended", limit: 20 }),
    renderFollows(handle), renderMemory(handle)]);
  if (!d.org.ok) return main.replaceChildren(section(`@${handle}`, problem(why(d.org))));
  const seat = d.org.body.seats.find((s) => s.handle === handle);
  if (!seat) return main.replaceChildren(section(`@${handle}`, problem(`the active company has no seat @${handle}`)));
  const a = d.byHandle.get(handle);
  const scope = d.spend.get(`seat:${handle}`);
  const facts = table("Seat facts", ["Role", "State", "Node", "In flight", "Mailbox", "Paused", "Identities"], [[
    seat.role, stateBadge(a), a?.holder?.node ?? "—", inFlight(a?.turns_in_flight), mailbox(a?.mailbox),
    a?.paused === undefined || a?.paused === null ? "unknown" : a.paused ? "yes" : "no", ids(seat.identities)]]);
  const windows = scope ? Object.entries(scope.windows).map(([w, v]) => meter(`${w} (${v.window})`, v.spent, v.cap, !!v.refused_at_ms)) : [problem("spend unknown")];
  const parked = scope?.parked?.length ? el("p", { class: "problem" }, `${scope.parked.length} wake(s) parked for budget`) : null;
  const schedules = (d.org.body.schedules ?? []).filter((s) => s.seats.includes(handle));
  const turnRows = turns.kind === "result"
    ? turns.events.map((ev) => el("tr", { "data-testid": "seat-turn" },
      el("td", {}, turnLink(ev.payload.turn_id)), el("td", {}, when(ev.at_ms)), el("td", {}, ev.payload.outcome),
      el("td", {}, tokens((ev.payload.input_tokens ?? 0) + (ev.payload.output_tokens ?? 0))), el("td", {}, `${ev.payload.ms} ms`)))
    : [];
  main.replaceChildren(
    section(`@${handle}`, facts, pauseControls(handle, a, refresh)),
    section("Budget", ...windows, parked),
    section("Recent turns", turns.kind === "result"
      ? (turnRows.length ? table("Recent turns", ["Turn", "Ended", "Outcome", "Tokens", "Took"], turnRows) : el("p", { class: "muted" }, "No turns yet."))
      : problem(`turns could not be read: ${turns.error}`),
    el("p", {}, el("a", { href: `#/feed?seat=${encodeURIComponent(handle)}` }, `All of @${handle}'s events →`))),
    section("Schedules", schedules.length
      ? table("Schedules", ["Name", "Cron", "Time zone", "Next fire"], schedules.map((s) => el("tr", { "data-testid": "schedule" }, el("td", {}, s.name), el("td", {}, el("code", {}, s.cron)), el("td", {}, s.timezone),
        el("td", {}, s.next ? `${when(Date.parse(s.next))} (${ago(Date.parse(s.next))})` : "—"))))
      : el("p", { class: "muted" }, "No schedules wake this seat.")),
    follows, memory);
}
