// The company chat (docs/chat.md): channels, a channel's messages, a
// thread beside them, and composers that post as the person the session's
// token is bound to (the node names the author, never this page).
//
// Rules, and why:
// - Live without re-reading: `module.chat.posted` puts a message where it
//   belongs, `module.chat.working` shows "ada is working…" on the thread
//   she works in until she clears it. A message is drawn once, by id: the
//   post's own answer and its push may come in either order.
// - Pushes missed while the socket was down are not guessed at: when it is
//   live again the view reads the channel, the thread and the indicators
//   again.
// - A post carries an idempotency key kept until it succeeds, so pressing
//   Send again after an unclear failure posts once.
// - A session that cannot post sees the composer disabled with the reason;
//   a refusal from the node is shown as the node said it.

import { el, when, problem, seatLink } from "./dom.js";
import { get, call, why, cannot, onEvent, stream } from "./api.js";

/** Messages a read asks for; a full page offers older ones. */
const PAGE = 50;
/** A channel name as docs/chat.md has it: 1 to 80 characters (the node
 * judges the rest, and a post it refuses says why). */
const isChannel = (n) => n.length > 0 && [...n].length <= 80;
const NAME_RULE = "a channel name is 1 to 80 characters";
const route = (c) => `/chat/channels/${encodeURIComponent(c)}`;
const href = (c, t) => `#/chat/${encodeURIComponent(c)}${t ? "/" + encodeURIComponent(t) : ""}`;
const replies = (n) => `${n} ${n === 1 ? "reply" : "replies"}`;

/** A key no other post of this page shares (crypto.randomUUID needs a
 * secure context; a node reached over plain HTTP on a LAN is not one). */
function freshKey() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
}

/** A message's text, each `@handle` a link to that seat's page. */
function body(text, seats) {
  return text.split(/(@[a-z0-9_-]+)/i).map((part) => {
    const handle = part.startsWith("@") ? part.slice(1) : null;
    return handle && seats.has(handle) ? seatLink(handle) : part;
  });
}

/** "ada is working…", "ada and linus are working…". */
export function workingLine(seats) {
  if (!seats.length) return "";
  const names = seats.length === 1 ? seats[0] : `${seats.slice(0, -1).join(", ")} and ${seats.at(-1)}`;
  return `${names} ${seats.length === 1 ? "is" : "are"} working…`;
}

/** One list of messages (a channel's top level, or a thread) drawn once
 * per id, oldest first. */
class MessageList {
  constructor(label, seats, rowExtra) {
    this.rows = new Map();
    this.messages = new Map();
    this.seats = seats;
    this.rowExtra = rowExtra;
    this.list = el("ol", { class: "messages", "data-testid": "messages", "aria-label": label, "aria-live": "polite", tabindex: "0" });
    this.empty = el("p", { class: "muted", "data-testid": "no-messages" }, "No messages yet.");
    this.box = el("div", { class: "message-box" }, this.empty, this.list);
  }
  /** Adds `m` unless drawn; `older` rows go on top. */
  add(m, older = false) {
    if (this.rows.has(m.id)) return this.rows.get(m.id);
    const author = this.seats.has(m.author) ? seatLink(m.author) : el("strong", {}, m.author);
    const row = el("li", { "data-testid": "message", "data-id": m.id, "data-author": m.author, "data-thread": m.thread ?? "", "data-shown-ms": Date.now() },
      el("div", { class: "message-head" }, author, el("span", { class: "muted small", title: new Date(m.at_ms).toISOString() }, when(m.at_ms))),
      el("p", { class: "message-text", "data-testid": "message-text" }, body(m.text, this.seats)),
      this.rowExtra?.(m));
    const atBottom = this.list.scrollHeight - this.list.scrollTop - this.list.clientHeight < 40;
    if (older) this.list.prepend(row); else this.list.append(row);
    this.rows.set(m.id, row);
    this.messages.set(m.id, m);
    this.empty.hidden = true;
    if (!older && atBottom) this.list.scrollTop = this.list.scrollHeight;
    return row;
  }
  oldest() {
    return this.list.firstElementChild?.dataset.id;
  }
}

/** A composer posting into `channel` (into `thread` when given). */
function composer(channel, thread, onPosted) {
  const id = thread ? "chat-reply" : "chat-message";
  const label = thread ? "Reply in thread" : `Message #${channel}`;
  const blocked = cannot("write");
  const text = el("textarea", { id, rows: 2, placeholder: blocked ? "" : `${label} (Enter sends, Shift+Enter a new line)`, disabled: !!blocked, "data-testid": thread ? "reply-input" : "message-input" });
  const send = el("button", { type: "submit", disabled: !!blocked, title: blocked ?? "" }, "Send");
  const out = el("p", { class: "muted small", role: "status", "data-testid": "composer-result" },
    blocked ? `You can read this channel but not post: ${blocked}.` : "");
  let key = freshKey();
  text.addEventListener("input", () => { key = freshKey(); });
  const form = el("form", { class: "composer", "data-testid": thread ? "thread-composer" : "composer" },
    el("label", { for: id }, label), el("div", { class: "composer-row" }, text, send), out);
  text.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); form.requestSubmit(); }
  });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const words = text.value.trim();
    if (!words || send.disabled) return;
    send.disabled = true;
    const a = await call("POST", `${route(channel)}/messages`, { text: words, ...(thread ? { thread } : {}), idempotency_key: key });
    send.disabled = false;
    if (a.ok) {
      text.value = "";
      key = freshKey();
      out.textContent = "";
      onPosted(a.body);
    } else out.textContent = `Not sent: ${why(a)}`;
    text.focus();
  });
  return form;
}

/** The channel list, with a form that opens a channel by name. */
function channelList(channels, current) {
  const item = (c) => el("li", {},
    el("a", { href: href(c.name), "data-testid": "channel", "data-channel": c.name, "aria-current": c.name === current ? "page" : null },
      `#${c.name}`, " ", el("span", { class: "muted small", "data-testid": "channel-count", title: "messages" }, String(c.messages))));
  const list = el("ul", { class: "plain" }, channels.map(item));
  const name = el("input", { id: "new-channel", placeholder: "e.g. general", autocomplete: "off", size: 12 });
  const out = el("p", { class: "muted small", role: "status" });
  const form = el("form", { class: "controls" }, el("label", { for: "new-channel" }, "Open channel"), name,
    el("button", { type: "submit" }, "Open"), out);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const n = name.value.trim().replace(/^#/, "");
    if (isChannel(n)) location.hash = href(n);
    else out.textContent = `Not opened: ${NAME_RULE}.`;
  });
  const nav = el("nav", { class: "channels", "aria-label": "Channels" }, el("h2", {}, "Channels"),
    channels.length ? null : el("p", { class: "muted" }, "No channel has a message yet."), list, form);
  /** A channel first heard of from a push, at the top of the list. */
  nav.addChannel = (c) => list.prepend(item(c));
  return nav;
}

export async function renderChat(main, channelArg, threadArg) {
  // Pushes that come while the view reads are kept, then applied in order
  // over what the reads said: none falls between the reads and the view.
  const early = [];
  let apply = (ev) => early.push(ev);
  const stopEvents = onEvent((ev) => apply(ev));
  const [org, listed] = await Promise.all([get("/org"), get("/chat/channels")]);
  if (!listed.ok) {
    stopEvents();
    return main.replaceChildren(el("section", { class: "card" }, el("h2", {}, "Chat"),
      problem(listed.status === 404 ? `The company chat is not available on this node (${why(listed)}).` : `The channels could not be read: ${why(listed)}`)));
  }
  const seats = new Set((org.body?.seats ?? []).map((s) => s.handle));
  const channels = [...listed.body.channels].sort((a, b) => (b.last_at_ms ?? 0) - (a.last_at_ms ?? 0));
  const channel = channelArg ?? channels[0]?.name ?? "general";
  const thread = threadArg ?? null;
  if (!isChannel(channel)) {
    stopEvents();
    return main.replaceChildren(el("section", { class: "card" }, el("h2", {}, "Chat"), problem(`#${channel} is not a channel: ${NAME_RULE}.`), channelList(channels, null)));
  }
  if (!channels.some((c) => c.name === channel)) channels.push({ name: channel, messages: 0, last_at_ms: null });
  const counts = new Map(channels.map((c) => [c.name, c]));

  // Who works on which thread of this channel: "seat thread" → [seat, thread].
  const working = new Map();
  const held = (seat, t) => `${seat}\u0000${t ?? ""}`;
  const replyCounts = new Map();
  const top = new MessageList(`Messages in #${channel}`, seats, (m) => {
    const n = el("a", { href: href(channel, m.id), "data-testid": "replies" }, m.replies ? replies(m.replies) : "Reply");
    replyCounts.set(m.id, { link: n, count: m.replies ?? 0 });
    return el("div", { class: "small message-foot" }, n, " ",
      el("span", { class: "working", "data-testid": "working", "data-thread": m.id, role: "status" }));
  });
  const inThread = thread ? new MessageList("Messages in the thread", seats) : null;
  const threadWorking = el("p", { class: "working", "data-testid": "working", "data-thread": thread ?? "", role: "status", "aria-live": "polite" });
  const notes = el("div");

  const showWorking = () => {
    const on = (t) => [...new Set([...working.values()].filter(([, w]) => (w ?? "") === (t ?? "")).map(([s]) => s))].sort();
    for (const span of top.list.querySelectorAll("[data-testid=working]")) span.textContent = workingLine(on(span.dataset.thread));
    threadWorking.textContent = workingLine(on(thread));
  };
  const bumpReplies = (root) => {
    const r = replyCounts.get(root);
    if (!r) return;
    r.count += 1;
    r.link.textContent = replies(r.count);
  };
  const seen = new Set();
  const nav = channelList(channels, channel);
  /** One more message in channel `name`'s count. */
  const bumpChannel = (name) => {
    if (!counts.has(name)) {
      counts.set(name, { name, messages: 0 });
      nav.addChannel(counts.get(name));
    }
    const c = counts.get(name);
    c.messages += 1;
    const count = nav.querySelector(`[data-channel="${CSS.escape(name)}"] [data-testid=channel-count]`);
    if (count) count.textContent = String(c.messages);
  };
  /** A message for this view, from a read, a post's answer or a push. */
  const place = (m, live) => {
    if (m.channel !== channel) return;
    if (live && !seen.has(m.id)) bumpChannel(m.channel);
    if (!m.thread || m.thread === m.id) top.add(m);
    else if (live && !seen.has(m.id)) bumpReplies(m.thread);
    if (inThread && (m.id === thread || m.thread === thread)) inThread.add(m, m.id === thread);
    seen.add(m.id);
  };

  const older = el("button", { type: "button", "data-testid": "chat-older", hidden: true }, "Older messages");
  /** Reads the channel, the thread and the indicators (again, after the socket was down). */
  const read = async () => {
    const [msgs, ind, th] = await Promise.all([
      get(`${route(channel)}/messages?limit=${PAGE}`),
      get(`${route(channel)}/working`),
      thread ? get(`${route(channel)}/messages?thread=${encodeURIComponent(thread)}&limit=200`) : null,
    ]);
    const trouble = [];
    if (msgs.ok) {
      msgs.body.messages.forEach((m) => place(m, false));
      for (const m of msgs.body.messages) {
        const r = replyCounts.get(m.id);
        if (r && m.replies > r.count) { r.count = m.replies; r.link.textContent = replies(m.replies); }
      }
      if (older.hidden) older.hidden = msgs.body.messages.length < PAGE;
    } else trouble.push(problem(`The messages of #${channel} could not be read: ${why(msgs)}`));
    if (ind.ok) {
      working.clear();
      for (const w of ind.body.working) working.set(held(w.seat, w.thread), [w.seat, w.thread ?? null]);
    } else trouble.push(problem(`Who is working is unknown: ${why(ind)}`));
    if (th?.ok) {
      th.body.messages.forEach((m) => place(m, false));
      // The thread's first message, when its read lists only the replies.
      if (!inThread.rows.has(thread) && top.messages.has(thread)) inThread.add(top.messages.get(thread), true);
    } else if (th) trouble.push(problem(th.status === 404 ? `No such thread in #${channel}.` : `The thread could not be read: ${why(th)}`));
    notes.replaceChildren(...trouble);
    showWorking();
  };
  older.addEventListener("click", async () => {
    older.disabled = true;
    const a = await get(`${route(channel)}/messages?limit=${PAGE}&before=${encodeURIComponent(top.oldest() ?? "")}`);
    older.disabled = false;
    if (!a.ok) return notes.replaceChildren(problem(`Older messages could not be read: ${why(a)}`));
    [...a.body.messages].reverse().forEach((m) => { top.add(m, true); seen.add(m.id); });
    older.hidden = a.body.messages.length < PAGE;
  });
  await read();

  const threadPane = thread
    ? el("section", { class: "chat-thread", "aria-label": "Thread", "data-testid": "thread" },
      el("div", { class: "controls" }, el("h3", {}, "Thread"), el("a", { href: href(channel), "data-testid": "close-thread" }, "Close thread")),
      inThread.box, threadWorking, composer(channel, thread, (m) => place(m, true)))
    : null;
  main.replaceChildren(el("div", { class: `card chat${thread ? " with-thread" : ""}`, "data-testid": "chat", "data-channel": channel },
    nav,
    el("section", { class: "chat-channel", "aria-label": `#${channel}` },
      el("h2", { "data-testid": "channel-title" }, `#${channel}`), notes, older, top.box,
      composer(channel, null, (m) => place(m, true))),
    threadPane));

  apply = (ev) => {
    const p = ev.payload ?? {};
    if (ev.type === "module.chat.posted" && p.id) {
      if (p.channel === channel) place(p, true);
      else bumpChannel(p.channel);
    } else if (ev.type === "module.chat.working" && p.channel === channel && p.seat) {
      if (p.working) working.set(held(p.seat, p.thread), [p.seat, p.thread ?? null]);
      else working.delete(held(p.seat, p.thread));
      showWorking();
    }
  };
  early.splice(0).forEach(apply);
  let wasDown = false;
  const onSocket = (s) => {
    if (s === "offline") wasDown = true;
    else if (s === "live" && wasDown) { wasDown = false; read(); }
  };
  stream.stateListeners.add(onSocket);
  return () => { stopEvents(); stream.stateListeners.delete(onSocket); };
}
