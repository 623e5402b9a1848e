// What a seat keeps, on its page: the chat threads it follows
// (`GET /agents/{handle}/follows`) and its memory (`GET
// /agents/{handle}/memory`: notes, episodes, skills with their versions,
// profiles). Rule: what the node cannot say is shown as unknown with its
// reason, never as "nothing"; a node that does not serve memory at all
// says so, apart from a seat that has none yet.

import { el, table, when, trim, problem, section } from "./dom.js";
import { get, why } from "./api.js";

/** The sections of a memory answer, in the order a person reads them. */
const KINDS = [["notes", "Notes"], ["episodes", "Episodes"], ["skills", "Skills"], ["profiles", "Profiles"]];
/** Columns shown per row at most: the rest is one click away. */
const COLUMNS = 6;

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

/** One value in a cell: times read as times, lists as counts with the rows a click away. */
function cell(key, v) {
  if (v === null || v === undefined) return "—";
  if (key.endsWith("_ms") && typeof v === "number") return when(v);
  if (Array.isArray(v)) {
    if (!v.length) return `no ${key}`;
    return el("details", {}, el("summary", {}, `${v.length} ${key}`), el("pre", { class: "small" }, trim(JSON.stringify(v, null, 2), 2000)));
  }
  return typeof v === "object" ? el("code", { class: "small" }, trim(JSON.stringify(v), 160)) : trim(String(v), 160);
}

function kindTable(label, rows) {
  const keys = [...new Set(rows.flatMap((r) => Object.keys(r ?? {})))].slice(0, COLUMNS);
  return table(label, [...keys, ""], rows.map((r) => el("tr", { "data-testid": "memory-row" },
    keys.map((k) => el("td", {}, cell(k, r?.[k]))),
    el("td", {}, el("details", {}, el("summary", {}, "JSON"), el("pre", { class: "small" }, JSON.stringify(r, null, 2)))))));
}

export async function renderMemory(handle) {
  const a = await get(`/agents/${encodeURIComponent(handle)}/memory`);
  if (a.status === 404 && a.body?.error === "no such route") {
    return section("Memory", el("p", { class: "muted", "data-testid": "memory-unavailable" },
      "Memory not available on this node: it serves no memory route, so what @" + handle + " remembers cannot be shown here."));
  }
  if (!a.ok) return section("Memory", problem(`@${handle}'s memory could not be read: ${why(a)}`));
  const known = new Set(KINDS.map(([k]) => k));
  const kinds = [...KINDS, ...Object.keys(a.body).filter((k) => !known.has(k) && Array.isArray(a.body[k])).map((k) => [k, k])];
  const parts = kinds.filter(([k]) => Array.isArray(a.body[k])).map(([k, title]) => {
    const rows = a.body[k];
    return el("div", { "data-testid": "memory-kind", "data-kind": k },
      el("h3", {}, `${title} · ${rows.length}`),
      rows.length ? kindTable(`${title} of @${handle}`, rows) : el("p", { class: "muted" }, `No ${title.toLowerCase()} yet.`));
  });
  return section("Memory", parts.length ? parts : el("p", { class: "muted", "data-testid": "memory-empty" }, `@${handle} remembers nothing yet.`));
}
