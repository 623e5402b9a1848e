// What a seat keeps, on its page: the chat threads it follows
// (`GET /agents/{handle}/follows`) and its memory (`GET
// /agents/{handle}/memory`: notes, episodes, skills with their versions,
// profiles). Rule: what the node cannot say is shown as unknown with its
// reason, never as "nothing"; a node that does not serve memory at all
// says so, apart from a seat that has none yet.

import { el, table, when, trim, tokens, badge, turnLink, problem, section } from "./dom.js";
import { get, why } from "./api.js";

const text = (v, max = 160) => (v === null || v === undefined || v === "" ? "—" : trim(String(v), max));
const json = (r) => el("details", {}, el("summary", {}, "JSON"), el("pre", { class: "small" }, JSON.stringify(r, null, 2)));
const turn = (id) => (id ? turnLink(id) : "—");

/** A skill's versions, newest first: which model wrote each from which episodes. */
function versions(list) {
  if (!list?.length) return "—";
  return el("details", { "data-testid": "skill-versions" }, el("summary", {}, `${list.length} version${list.length === 1 ? "" : "s"}`),
    el("ol", { class: "plain small" }, list.map((v) => el("li", { "data-testid": "skill-version" },
      el("strong", {}, `v${v.version}`), ` · ${v.model ?? "model unknown"} · ${when(v.created_ms)} · from ${Array.isArray(v.episodes) ? v.episodes.length : v.episodes ?? "?"} episode(s)`,
      el("pre", {}, trim(v.procedure ?? "", 2000))))));
}

/** The sections of a memory answer (GET /agents/{handle}/memory), in the
 * order a person reads them: a title, the columns, and each row's cells. */
const KINDS = [
  ["notes", "Notes", ["Note", "Turn", "Written", "Embedded by"],
    (n) => [text(n.text, 400), turn(n.turn_id), when(n.created_ms), n.embedding_model ?? "none (recalled by recency)"]],
  ["episodes", "Episodes", ["Ended", "Turn", "Trigger", "Outcome", "Summary", "Tokens"],
    (e) => [when(e.ended_ms), turn(e.turn_id), text(e.trigger), text(e.outcome), text(e.summary, 300), tokens(e.tokens)]],
  ["skills", "Skills", ["Skill", "State", "Origin", "Version", "Uses", "Strength", "Last used", "Versions"],
    (k) => [el("strong", {}, text(k.name)), badge(k.state ?? "unknown", k.state === "active" ? "ok" : "warn"),
      k.promoted_from ? `${k.origin} from @${k.promoted_from}` : text(k.origin), `v${k.version}`, text(k.uses), text(k.strength),
      when(k.last_used_ms), versions(k.versions)]],
  ["profiles", "Profiles", ["Counterparty", "Known", "Turns", "First", "Last"],
    (p) => [text(p.counterparty), text(p.known, 300), text(p.turns), when(p.first_ms), when(p.last_ms)]],
];

/** A list the shape above does not name: its rows as JSON. */
const generic = (rows) => el("ul", { class: "plain small" }, rows.map((r) => el("li", {}, json(r))));

export async function renderFollows(handle) {
  const a = await get(`/agents/${encodeURIComponent(handle)}/follows`);
  if (!a.ok) return section("Follows", problem(`The threads @${handle} follows are unknown: ${why(a)}`));
  const rows = a.body.follows.map((f) => el("tr", { "data-testid": "follow", "data-backend": f.backend, "data-channel": f.channel, "data-thread": f.thread },
    el("td", {}, f.backend),
    el("td", {}, f.backend === "chat" ? el("a", { href: `#/chat/${encodeURIComponent(f.channel)}/${encodeURIComponent(f.thread)}` }, `#${f.channel}`) : f.channel),
    el("td", {}, el("code", {}, f.thread)),
    el("td", {}, when(f.last_post_ms))));
  return section("Follows", rows.length
    ? [el("p", { class: "muted small" }, `A message in one of these threads wakes @${handle} without a mention.`),
      table("Followed threads", ["Surface", "Channel", "Thread", "Last post"], rows)]
    : el("p", { class: "muted", "data-testid": "no-follows" }, `@${handle} follows no thread: it follows one by posting in it.`));
}

export async function renderMemory(handle) {
  const a = await get(`/agents/${encodeURIComponent(handle)}/memory`);
  if (a.status === 404 && a.body?.error === "no such route") {
    return section("Memory", el("p", { class: "muted", "data-testid": "memory-unavailable" },
      "Memory not available on this node: it serves no memory route, so what @" + handle + " remembers cannot be shown here."));
  }
  if (!a.ok) return section("Memory", problem(`@${handle}'s memory could not be read: ${why(a)}`));
  const known = new Set(KINDS.map(([k]) => k));
  const others = Object.keys(a.body).filter((k) => !known.has(k) && Array.isArray(a.body[k])).map((k) => [k, k, null, null]);
  const parts = [...KINDS, ...others].filter(([k]) => Array.isArray(a.body[k])).map(([k, title, heads, cells]) => {
    const rows = a.body[k];
    const list = !rows.length ? el("p", { class: "muted" }, `No ${title.toLowerCase()} yet.`)
      : heads ? table(`${title} of @${handle}`, [...heads, ""], rows.map((r) => el("tr", { "data-testid": "memory-row" },
        cells(r).map((c) => el("td", {}, c)), el("td", {}, json(r)))))
        : generic(rows);
    return el("div", { "data-testid": "memory-kind", "data-kind": k }, el("h3", {}, `${title} · ${rows.length}`), list);
  });
  return section("Memory", parts.length ? parts : el("p", { class: "muted", "data-testid": "memory-empty" }, `@${handle} remembers nothing yet.`));
}
