// The dashboard's only ways to the node: REST calls with the session cookie
// and the `/ws/stream` socket (live pushes plus the query channel). A 401
// anywhere — no session, an expired or revoked token — ends the session
// and shows the login with the node's reason; a write refused for scope
// (403) is answered to the control that asked, never swallowed.

const listeners = new Set();
let onLoggedOut = () => {};
/** The session's scope (`read` / `write` / `admin`), null when logged out. */
export const session = { scope: null };

const RANK = { read: 0, write: 1, admin: 2 };
/** Why the session may not do what needs `scope`, or null when it may. */
export function cannot(scope) {
  if (!session.scope) return "log in first";
  if (RANK[session.scope] >= RANK[scope]) return null;
  return `your token has ${session.scope} scope; this needs ${scope}`;
}

export function whenLoggedOut(f) {
  onLoggedOut = f;
}

function loggedOut(body) {
  session.scope = null;
  stream.close();
  onLoggedOut(body?.error ?? "Your session ended: log in again.");
}

/** A call to the node: `{ok, status, body}`. A 401 logs out first. */
export async function call(method, path, body) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    init.body = typeof body === "string" ? body : JSON.stringify(body);
    init.headers["content-type"] = typeof body === "string" ? "text/plain" : "application/json";
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    return { ok: false, status: 0, body: { error: `the node did not answer (${e.message})` } };
  }
  const parsed = await res.json().catch(() => null);
  if (res.status === 401 && path !== "/login") loggedOut(parsed);
  return { ok: res.ok, status: res.status, body: parsed };
}

export const get = (path) => call("GET", path);

/** What went wrong with an answer, in a sentence. */
export function why(answer) {
  const b = answer.body ?? {};
  if (Array.isArray(b.errors)) return b.errors.map((e) => `${e.path ? e.path + ": " : ""}${e.message ?? JSON.stringify(e)}`).join("; ");
  return b.detail ? `${b.error}: ${b.detail}` : b.error ?? `the node answered ${answer.status}`;
}

export async function login(token) {
  const a = await call("POST", "/login", { token });
  if (a.ok) session.scope = a.body?.scope ?? null;
  return a;
}

export async function logout() {
  await call("POST", "/logout");
  loggedOut({ error: "You logged out." });
}

/** Reads the session's scope. The answer: ok, 401 (none: the login shows),
 * or anything else — the node cannot say yet, which is not "logged out". */
export async function resume() {
  const a = await get("/session");
  if (a.ok) session.scope = a.body.scope;
  return a;
}

/** The socket: pushes every fleet event to `onEvent` listeners and answers
 * queries by id. Reconnects while a session lasts. */
class Stream {
  constructor() {
    this.ws = null;
    this.next = 1;
    this.waiting = new Map();
    this.wanted = false;
    this.stateListeners = new Set();
  }
  open() {
    this.wanted = true;
    if (this.ws) return;
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/stream`);
    this.ws = ws;
    ws.onmessage = (msg) => {
      const frame = JSON.parse(msg.data);
      if (frame.kind === "hello") this.setState("live");
      else if (frame.kind === "event") listeners.forEach((f) => f(frame.event));
      else if (frame.kind === "lagged") this.setState(`live (missed ${frame.missed})`);
      else if ((frame.kind === "result" || frame.kind === "error") && this.waiting.has(frame.id)) {
        this.waiting.get(frame.id)(frame);
        this.waiting.delete(frame.id);
      }
    };
    ws.onclose = async () => {
      this.ws = null;
      this.setState("offline");
      for (const done of this.waiting.values()) done({ kind: "error", error: "the socket closed" });
      this.waiting.clear();
      // A session that ended (expired, revoked) shows the login, not a retry loop.
      if (this.wanted && (await resume()).status !== 401) setTimeout(() => this.wanted && this.open(), 1000);
    };
  }
  close() {
    this.wanted = false;
    this.ws?.close();
  }
  setState(s) {
    this.state = s;
    this.stateListeners.forEach((f) => f(s));
  }
  /** A history query (`{seat, type, trace_id, node, before_seq, limit}`). */
  query(filter) {
    return new Promise((done) => {
      const send = () => {
        const id = this.next++;
        this.waiting.set(id, done);
        this.ws.send(JSON.stringify({ id, query: "events", ...filter }));
      };
      if (this.ws?.readyState === WebSocket.OPEN) send();
      else if (this.ws) this.ws.addEventListener("open", send, { once: true });
      else done({ kind: "error", error: "not connected" });
    });
  }
}

export const stream = new Stream();

/** Calls `f(event)` for every live event until the returned stop is called. */
export function onEvent(f) {
  listeners.add(f);
  return () => listeners.delete(f);
}
