// Crewlet dashboard v0: reads only. REST for the catalogue, /ws/stream for
// the live feed and its queries. Nothing here writes.
//
// Every data call needs a session: `POST /login` with an operator token
// sets an HttpOnly cookie the browser then sends (this script never sees
// it). The first-start URL carries the token in the fragment (`#token=…`),
// which never leaves the browser; it is posted once, then wiped.

const feed = document.getElementById("feed");
const seen = new Set();
const MAX_ROWS = 500;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function when(ms) {
  return new Date(ms).toLocaleTimeString();
}

function addEvent(ev, live) {
  if (!ev || seen.has(ev.event_id)) return;
  seen.add(ev.event_id);
  const row = el("li", { "data-testid": "event", "data-type": ev.type, "data-event-id": ev.event_id },
    el("span", { class: "type" }, ev.type), " ",
    el("span", { class: "muted" }, `${when(ev.at_ms)} · ${ev.node_id}${ev.seat ? " · @" + ev.seat : ""}`),
    el("pre", {}, JSON.stringify(ev.payload)));
  if (live) feed.prepend(row); else feed.append(row);
  while (feed.children.length > MAX_ROWS) feed.lastElementChild.remove();
  document.getElementById("feed-count").textContent = `(${feed.children.length})`;
}

async function login(token) {
  const res = await fetch("/login", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ token }),
    credentials: "same-origin",
  });
  const body = await res.json().catch(() => null);
  return { ok: res.ok, error: body?.error ?? `the node answered ${res.status}` };
}

function showLogin(message) {
  const box = document.getElementById("login");
  document.getElementById("login-error").textContent = message ?? "";
  box.hidden = false;
}

async function getJson(path) {
  const res = await fetch(path, { credentials: "same-origin" });
  if (res.status === 401) showLogin("Log in with an operator token.");
  return { ok: res.ok, body: await res.json().catch(() => null) };
}

async function loadHealth() {
  const { body } = await getJson("/health");
  if (body) document.getElementById("node").textContent = `node ${body.node_id} · ${body.phase} · ${body.posture}`;
}

async function loadOrg() {
  const { ok, body } = await getJson("/org");
  const box = document.getElementById("org");
  if (!ok || !body) return;
  // `slack: U04ABCDEF · github: acme-ada-bot`, or a dash.
  const ids = (identities) => Object.entries(identities ?? {}).map(([surface, list]) => `${surface}: ${list.join(", ")}`).join(" · ") || "—";
  const seats = el("table", {}, el("tr", {}, el("th", {}, "Seat"), el("th", {}, "Role"), el("th", {}, "Group"), el("th", {}, "Identities")));
  for (const s of body.seats) {
    seats.append(el("tr", { "data-testid": "seat" }, el("td", {}, "@" + s.handle), el("td", {}, s.role), el("td", {}, s.group ?? "—"), el("td", {}, ids(s.identities))));
  }
  const parts = [el("p", {}, el("strong", {}, body.name), " ", el("span", { class: "muted" }, body.timezone)), seats];
  if (body.people?.length) {
    const people = el("table", {}, el("tr", {}, el("th", {}, "Person"), el("th", {}, "Identities")));
    for (const p of body.people) people.append(el("tr", { "data-testid": "person" }, el("td", {}, p.name), el("td", {}, ids(p.identities))));
    parts.push(people);
  }
  box.replaceChildren(...parts);
}

async function loadPlugins() {
  const { ok, body } = await getJson("/plugins");
  const box = document.getElementById("plugins");
  if (!ok || !Array.isArray(body?.plugins)) {
    box.replaceChildren(el("p", { class: "muted" }, "No plugins loaded on this node."));
    return;
  }
  const table = el("table", {}, el("tr", {}, el("th", {}, "Plugin"), el("th", {}, "Kind"), el("th", {}, "May touch")));
  for (const p of body.plugins) {
    table.append(el("tr", { "data-testid": "plugin" },
      el("td", {}, `${p.name} ${p.version ?? ""}${p.degraded ? " (degraded)" : ""}`),
      el("td", {}, p.kind),
      el("td", {}, el("code", {}, (p.permissions ?? []).join(", ") || "nothing"))));
  }
  box.replaceChildren(table);
}

// The history is the fleet's: say which nodes it did not reach, and a cut.
function showCoverage(frame) {
  const c = frame.coverage ?? {};
  const missing = (c.missing ?? []).map((m) => `${m.node} (${m.reason})`);
  const notes = [];
  if (c.membership === "unknown") notes.push("fleet membership unknown: this node's history only");
  if (missing.length) notes.push(`history missing from ${missing.join(", ")}`);
  if (frame.truncated) notes.push(`newest ${frame.limit} shown`);
  document.getElementById("feed-coverage").textContent = notes.join(" · ");
}

function connect() {
  const state = document.getElementById("socket");
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/stream`);
  ws.onopen = () => { state.textContent = "live"; state.classList.add("live"); };
  ws.onclose = () => {
    state.textContent = "offline"; state.classList.remove("live");
    setTimeout(connect, 1000);
  };
  ws.onmessage = (msg) => {
    const frame = JSON.parse(msg.data);
    if (frame.kind === "hello") ws.send(JSON.stringify({ id: 1, query: "events", limit: 100 }));
    else if (frame.kind === "event") addEvent(frame.event, true);
    else if (frame.kind === "result") {
      frame.events.forEach((e) => addEvent(e, false));
      showCoverage(frame);
    }
  };
}

function start() {
  document.getElementById("login").hidden = true;
  loadHealth();
  loadOrg();
  loadPlugins();
}

document.getElementById("login-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const input = document.getElementById("login-token");
  const done = await login(input.value.trim());
  input.value = "";
  if (done.ok) start(); else showLogin(done.error);
});

// A login URL (`#token=…`) opened here, on load or pasted into an open tab.
async function fromFragment() {
  const token = new URLSearchParams(location.hash.slice(1)).get("token");
  if (!token) return false;
  history.replaceState(null, "", location.pathname + location.search);
  const done = await login(token);
  if (!done.ok) showLogin(done.error);
  return done.ok;
}

window.addEventListener("hashchange", async () => {
  if (await fromFragment()) start();
});
await fromFragment();
start();
connect();
setInterval(loadHealth, 5000);
