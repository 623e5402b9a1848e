// Small DOM and formatting helpers shared by every view. Text goes in as
// text nodes, never as HTML: event payloads come from the outside world.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

/// A table inside a box that scrolls on its own, so a narrow screen never
/// scrolls the page sideways. `rows` are arrays of cells (or `tr` nodes).
export function table(label, heads, rows, attrs = {}) {
  const head = el("tr", {}, heads.map((h) => el("th", { scope: "col" }, h)));
  const body = rows.map((r) => (r instanceof Node ? r : el("tr", {}, r.map((c) => el("td", {}, c)))));
  // Each cell names its column, for the stacked layout of a phone's width.
  for (const tr of body) [...tr.children].forEach((td, i) => heads[i] && td.setAttribute("data-label", heads[i]));
  return el("div", { class: "scroll", role: "region", "aria-label": label, tabindex: "0" },
    el("table", attrs, el("thead", {}, head), el("tbody", {}, body)));
}

export function link(href, text, attrs = {}) {
  return el("a", { href, ...attrs }, text);
}

export const seatLink = (handle) => link(`#/seat/${encodeURIComponent(handle)}`, "@" + handle, { "data-testid": "seat-link" });
export const turnLink = (id) => link(`#/turn/${encodeURIComponent(id)}`, id.slice(0, 8), { "data-testid": "turn-link", title: id });

export function when(ms) {
  if (ms === null || ms === undefined) return "—";
  const d = new Date(ms);
  return d.toDateString() === new Date().toDateString() ? d.toLocaleTimeString() : d.toLocaleString();
}

export function ago(ms, now = Date.now()) {
  if (ms === null || ms === undefined) return "—";
  const s = Math.round((now - ms) / 1000);
  if (s < 0) return `in ${-s} s`;
  if (s < 90) return `${s} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

export function tokens(n) {
  if (n === null || n === undefined) return "—";
  if (n >= 1e6) return `${(n / 1e6).toFixed(n >= 1e7 ? 0 : 1)}M`;
  if (n >= 1e4) return `${Math.round(n / 1e3)}k`;
  return String(n);
}

export function trim(text, max = 160) {
  const s = typeof text === "string" ? text : JSON.stringify(text);
  return s.length > max ? s.slice(0, max - 1) + "…" : s;
}

/// A spend meter: `spent` of `cap` (no cap: the spend alone). `refused`
/// marks a window the budget refused work in.
export function meter(label, spent, cap, refused = false) {
  const frac = cap ? Math.min(1, spent / cap) : 0;
  const level = refused || frac >= 1 ? "over" : frac >= 0.8 ? "high" : "ok";
  return el("div", { class: `meter ${level}`, "data-testid": "meter", "data-spent": spent, "data-cap": cap ?? "" },
    el("span", { class: "meter-label" }, label, " ", el("span", { class: "muted" }, cap ? `${tokens(spent)} / ${tokens(cap)}` : `${tokens(spent)} · no cap`)),
    cap ? el("meter", { min: 0, max: cap, value: Math.min(spent, cap), "aria-label": `${label}: ${spent} of ${cap} tokens` }) : null,
    refused ? el("span", { class: "badge bad" }, "refused") : null);
}

export function badge(text, kind = "") {
  return el("span", { class: `badge ${kind}`, "data-testid": "badge" }, text);
}

/// A paragraph saying what could not be read and why (never an empty view).
export function problem(text) {
  return el("p", { class: "problem", role: "status", "data-testid": "problem" }, text);
}

export function section(title, ...children) {
  return el("section", { class: "card" }, el("h2", {}, title), ...children);
}
