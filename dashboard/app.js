// Crewlet dashboard: the company at a glance, live, and the few acts an
// operator needs — all through the node's API (REST with the session
// cookie, `/ws/stream` for pushes and history queries). No library and no
// fetch from outside the node: every file is embedded in the binary.
//
// Every data call needs a session: `POST /login` with an operator token
// sets an HttpOnly cookie the browser then sends (this script never sees
// it). The first-start URL carries the token in the fragment (`#token=…`),
// which never leaves the browser; it is posted once, then wiped. A 401 on
// any call (no session, a token expired or revoked) returns to the login.

import { el, problem } from "./dom.js";
import { get, login, logout, resume, session, stream, onEvent, whenLoggedOut, why } from "./api.js";
import { renderOrg, renderSeat } from "./org.js";
import { renderTurn } from "./turn.js";
import { renderFeed } from "./feed.js";
import { renderBudgets, renderFleet, renderPlugins, renderBucket } from "./ops.js";
import { renderConfig, renderSecrets, renderTokens } from "./act.js";
import { renderChat } from "./chat.js";

const main = document.getElementById("view");
const nav = document.getElementById("nav");
const loginBox = document.getElementById("login");

// Each view: its render, and whether it re-reads on live events (views
// holding a form the person is typing in do not).
const ROUTES = {
  org: { render: (box) => renderOrg(box), live: true },
  // The chat places each push itself: a re-read would lose what is typed.
  chat: { render: (box, [channel, thread]) => renderChat(box, channel, thread) },
  seat: { render: (box, [h], again) => renderSeat(box, h, again), live: true },
  turn: { render: (box, [id]) => renderTurn(box, id), live: true },
  feed: { render: (box, _, __, params) => renderFeed(box, params) },
  budgets: { render: (box) => renderBudgets(box), live: true },
  fleet: { render: (box) => renderFleet(box), live: true, every: 5000 },
  plugins: { render: (box, [name, bucket]) => (bucket ? renderBucket(box, name, bucket) : renderPlugins(box)), live: true, every: 10000 },
  config: { render: (box) => renderConfig(box) },
  secrets: { render: (box) => renderSecrets(box) },
  tokens: { render: (box) => renderTokens(box) },
};

let current = { stop: () => {} };

function parseRoute() {
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const [name, ...args] = path.split("/").map(decodeURIComponent);
  return { name: ROUTES[name] ? name : "org", args, params: new URLSearchParams(query ?? "") };
}

/** Shows the route in the address bar; re-reads it while it is shown. */
async function show() {
  current.stop();
  if (!session.scope) return;
  const { name, args, params } = parseRoute();
  const route = ROUTES[name];
  for (const a of nav.querySelectorAll("a")) a.toggleAttribute("aria-current", a.dataset.route === name);
  delete main.dataset.ready;
  main.replaceChildren(el("p", { class: "muted" }, "Loading…"));
  const me = { stop: () => {} };
  current = me;
  let busy = false;
  let again = false;
  // Renders into a box off the page and swaps it in, so a re-read does not flicker.
  const draw = async () => {
    if (busy) { again = true; return; }
    busy = true;
    const box = el("div", { class: "view", "data-testid": `view-${name}` });
    const stop = await route.render(box, args, () => draw(), params);
    busy = false;
    if (current !== me || !session.scope) return typeof stop === "function" && stop();
    if (typeof stop === "function") me.stop = stop;
    main.replaceChildren(box);
    main.dataset.ready = name;
    // The first time a view is drawn with its data (the benchmark reads it).
    if (!performance.getEntriesByName(`view-ready:${name}`).length) performance.mark(`view-ready:${name}`);
    if (again) { again = false; draw(); }
  };
  await draw();
  if (!route.live) return;
  // A person typing in the view is not interrupted by a re-read.
  const typing = () => main.contains(document.activeElement) && /INPUT|TEXTAREA|SELECT/.test(document.activeElement.tagName);
  let timer = null;
  const soon = () => { if (!timer) timer = setTimeout(() => { timer = null; if (!typing()) draw(); }, 700); };
  const unsubscribe = onEvent(soon);
  const tick = setInterval(soon, route.every ?? 5000);
  const prev = me.stop;
  me.stop = () => { prev(); unsubscribe(); clearInterval(tick); clearTimeout(timer); };
}

function showLogin(reason) {
  current.stop();
  session.scope = null;
  main.replaceChildren();
  delete main.dataset.ready;
  document.getElementById("scope").textContent = "logged out";
  document.getElementById("logout").hidden = true;
  nav.hidden = true;
  document.getElementById("login-error").textContent = reason ?? "";
  loginBox.hidden = false;
  document.getElementById("login-token").focus();
  if (!performance.getEntriesByName("view-ready:login").length) performance.mark("view-ready:login");
}

function started() {
  loginBox.hidden = true;
  nav.hidden = false;
  document.getElementById("scope").textContent = `${session.scope} scope`;
  document.getElementById("logout").hidden = false;
  stream.open();
  show();
}

async function loadHealth() {
  const { body } = await get("/health");
  if (body) document.getElementById("node").textContent = `node ${body.node_id} · ${body.phase} · ${body.posture}`;
}

// The node's 401 speaks to API clients; a person at the page reads what to do.
whenLoggedOut((reason) => showLogin(reason.startsWith("no operator token was sent")
  ? "Log in with an operator token: the node prints a login URL on its first start, and `crewlet tokens create` makes more."
  : `${reason.split("; send `Authorization")[0]}.`));
stream.stateListeners.add((s) => {
  const pill = document.getElementById("socket");
  pill.textContent = s;
  pill.classList.toggle("live", s.startsWith("live"));
});

document.getElementById("login-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const input = document.getElementById("login-token");
  const done = await login(input.value.trim());
  input.value = "";
  if (done.ok) started(); else showLogin(done.body?.error ?? `the node answered ${done.status}`);
});
document.getElementById("logout").addEventListener("click", () => logout());
document.getElementById("theme").addEventListener("click", () => {
  const dark = document.documentElement.dataset.theme !== "dark" &&
    !(document.documentElement.dataset.theme !== "light" && matchMedia("(prefers-color-scheme: dark)").matches);
  document.documentElement.dataset.theme = dark ? "dark" : "light";
  localStorage.setItem("crewlet-theme", document.documentElement.dataset.theme);
});
const theme = localStorage.getItem("crewlet-theme");
if (theme) document.documentElement.dataset.theme = theme;

// A login URL (`#token=…`) opened here, on load or pasted into an open tab.
async function fromFragment() {
  const token = new URLSearchParams(location.hash.slice(1)).get("token");
  if (!token || location.hash.startsWith("#/")) return null;
  history.replaceState(null, "", location.pathname + location.search);
  const done = await login(token);
  if (!done.ok) showLogin(done.body?.error ?? `the node answered ${done.status}`);
  return done.ok;
}

window.addEventListener("hashchange", async () => {
  const logged = await fromFragment();
  if (logged) started();
  else if (logged === null) show();
});

loadHealth();
setInterval(loadHealth, 5000);
// A session the node cannot judge yet (its token store does not answer) is
// neither in nor out: say so and ask again.
async function boot() {
  const a = await resume();
  if (a.ok) return started();
  if (a.status === 401) return;
  main.replaceChildren(problem(`The node cannot check this session yet (${why(a)}); asking again in 2 s.`));
  setTimeout(boot, 2000);
}
const viaFragment = await fromFragment();
if (viaFragment) started();
else if (viaFragment === null) boot();
