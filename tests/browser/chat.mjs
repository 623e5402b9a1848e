// The company chat in Debian's headless Chromium, two tabs on the two
// nodes of a fleet: tab A (write scope, node A) types "@grace hello" in
// #general; grace's reply appears in the thread, posted as grace, within
// 2 s of the send, while tab B (read scope, node B) sees the message, the
// working indicator raised and cleared, and the reply, all live; a
// follow-up in the thread without a mention is answered, seen in both.
// Tab B's composer is disabled with the reason. Screenshots of the chat at
// both widths go under OUT_DIR.
//
//   node chat.mjs BASE_A BASE_B WRITE_TOKEN READ_TOKEN OUT_DIR [FIGURE_N]
//
// Prints one JSON line per round trip: {"phase", "sent_ms", "shown_ms"}
// (the send pressed in tab A; the reply drawn in tab B). With FIGURE_N,
// then sends N more mentions in the thread one after the other, each
// waited for in tab B (phase "figure"), for the figure in BENCHMARKS.md.
// Ends with OK.
import { launch, shoot as shootAt } from "./chromium.mjs";

const [baseA, baseB, writeToken, readToken, out, figureN] = process.argv.slice(2);
const browser = await launch();
const T = 20000;
const errors = [];
const fail = (msg) => { throw new Error(msg); };

async function session(base, token) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  page.setDefaultTimeout(T);
  page.on("pageerror", (e) => errors.push(`${base}: ${e.message}`));
  page.on("request", (r) => { if (!r.url().startsWith(base) && !r.url().startsWith(base.replace("http", "ws"))) errors.push(`fetched ${r.url()}`); });
  await page.goto(`${base}/#token=${token}`);
  await page.getByTestId("nav").waitFor({ state: "visible" });
  // Every text a working indicator showed, as it showed it: the turn may
  // raise and clear it within a few hundred milliseconds.
  await page.evaluate(() => {
    window.workingSeen = [];
    new MutationObserver(() => {
      for (const w of document.querySelectorAll("[data-testid=working]")) {
        if (w.textContent && window.workingSeen.at(-1) !== w.textContent) window.workingSeen.push(w.textContent);
      }
    }).observe(document.body, { subtree: true, childList: true, characterData: true });
  });
  return page;
}

async function open(page, route) {
  await page.evaluate((r) => (location.hash = `#/${r}`), route);
  await page.waitForFunction((r) => document.getElementById("view").dataset.ready === "chat" &&
    location.hash === `#/${r}`, route);
}

const shoot = (page, name) => shootAt(page, out, name);

const thread = (page) => page.locator("[data-testid=thread] [data-testid=message]");
const byGrace = (page) => page.locator("[data-testid=thread] [data-testid=message][data-author=grace]");

/** Types `text` in a composer and presses Enter; the instant it was pressed. */
async function send(page, composer, text) {
  await page.getByTestId(composer).locator("textarea").fill(text);
  const at = Date.now();
  await page.getByTestId(composer).locator("textarea").press("Enter");
  return at;
}

/** Waits until `page`'s thread holds `n` messages of grace; the newest's draw instant. */
async function graceReplies(page, n) {
  await page.waitForFunction((k) => document.querySelectorAll("[data-testid=thread] [data-testid=message][data-author=grace]").length >= k, n);
  return Number(await byGrace(page).nth(n - 1).getAttribute("data-shown-ms"));
}

try {
  const a = await session(baseA, writeToken);
  const b = await session(baseB, readToken);
  await open(a, "chat/general");
  await open(b, "chat/general");
  // Tab B cannot post: its composer says why; tab A's is live.
  if (!(await b.getByTestId("composer").locator("textarea").isDisabled())) fail("a read session may type in the composer");
  const reason = await b.getByTestId("composer").getByTestId("composer-result").textContent();
  if (!/read scope; this needs write/.test(reason)) fail(`the disabled composer does not say why: ${reason}`);

  // "@grace hello" from tab A, at the channel's top level.
  const sent = await send(a, "composer", "@grace hello");
  const mine = a.locator("[data-testid=message]", { hasText: "@grace hello" });
  await mine.waitFor();
  const id = await mine.getAttribute("data-id");
  const author = await mine.getAttribute("data-author");
  if (!author || author === "grace") fail(`the message is posted as ${author}`);
  // Tab A opens its thread; grace's reply appears there, posted as grace.
  await mine.getByTestId("replies").click();
  await a.getByTestId("thread").waitFor();
  const shownA = await graceReplies(a, 1);
  if (shownA - sent >= 2000) fail(`grace's reply took ${shownA - sent} ms to appear in the thread`);

  // Tab B, on node B, saw it all live: the message by its author, grace
  // working on its thread then done, one reply.
  const theirs = b.locator(`[data-testid=message][data-id="${id}"]`);
  await theirs.waitFor();
  if ((await theirs.getAttribute("data-author")) !== author) fail("tab B shows another author");
  await theirs.getByTestId("replies").filter({ hasText: "1 reply" }).waitFor();
  await b.waitForFunction((t) => !document.querySelector(`[data-testid=working][data-thread="${t}"]`)?.textContent, id);
  // (Tab A changed views while grace worked, a turn of some 20 ms: it may
  // have drawn the indicator between two reads or never; B held still.)
  const seen = await b.evaluate(() => window.workingSeen);
  if (!seen.includes("grace is working…")) fail(`tab B never showed grace working: ${JSON.stringify(seen)}`);
  if (await a.getByTestId("working").filter({ hasText: "working" }).count()) fail("tab A still shows someone working");
  await theirs.getByTestId("replies").click();
  await b.getByTestId("thread").waitFor();
  await graceReplies(b, 1);
  const replyA = await byGrace(a).first().getByTestId("message-text").textContent();
  const replyB = await byGrace(b).first().getByTestId("message-text").textContent();
  if (replyA !== replyB || !replyA) fail(`the tabs show different replies: ${replyA} / ${replyB}`);
  if (!(await b.getByTestId("thread-composer").locator("textarea").isDisabled())) fail("a read session may reply");
  console.log(JSON.stringify({ phase: "mention", sent_ms: sent, shown_ms: shownA }));

  // A follow-up in the thread, no mention: grace follows it and answers,
  // and tab B, holding the thread open, sees both live.
  const again = await send(a, "thread-composer", "and the build, is it green?");
  await b.locator("[data-testid=thread] [data-testid=message]", { hasText: "and the build, is it green?" }).waitFor();
  const shownB = await graceReplies(b, 2);
  await graceReplies(a, 2);
  if ((await thread(b).count()) !== 4) fail(`tab B's thread holds ${await thread(b).count()} messages, not 4`);
  console.log(JSON.stringify({ phase: "follow-up", sent_ms: again, shown_ms: shownB }));

  // The node refuses a read session's post, as the composer said.
  const refused = await b.evaluate(async () => {
    const r = await fetch("/chat/channels/general/messages", { method: "POST", credentials: "same-origin",
      headers: { "content-type": "application/json" }, body: JSON.stringify({ text: "may I?" }) });
    return { status: r.status, body: await r.json() };
  });
  if (refused.status !== 403 || refused.body.scope_needed !== "write") fail(`a read session posted: ${JSON.stringify(refused)}`);

  for (const [tab, page] of [["A", a], ["B", b]]) {
    const problems = await page.getByTestId("problem").allTextContents();
    if (problems.length) fail(`tab ${tab} shows problems: ${problems.join("; ")}`);
  }
  await shoot(a, "chat");
  await shoot(b, "chat-read-scope");
  // Every control named; the composer reachable by keyboard.
  const unnamed = await a.evaluate(() => [...document.querySelectorAll("button, input, select, textarea")]
    .filter((c) => !c.hidden && !(c.labels?.length || c.getAttribute("aria-label") || c.textContent.trim() || c.placeholder))
    .map((c) => c.outerHTML));
  if (unnamed.length) fail(`controls without a name: ${unnamed.join(" ")}`);
  await a.getByTestId("close-thread").focus();
  let reached = false;
  for (let i = 0; i < 40 && !reached; i++) {
    await a.keyboard.press("Tab");
    reached = await a.evaluate(() => document.activeElement?.id === "chat-reply");
  }
  if (!reached) fail("the thread's composer is not reachable by keyboard");

  // Grace's page lists the thread she now follows; its link opens it.
  await b.evaluate(() => (location.hash = "#/seat/grace"));
  const follow = b.locator(`[data-testid=follow][data-backend=chat][data-channel=general][data-thread="${id}"]`);
  await follow.getByRole("link").click();
  await b.getByTestId("thread").waitFor();
  if ((await thread(b).count()) !== 4) fail("the followed thread's link does not open it");

  // The figure: mentions in the thread one after another, each reply
  // waited for in tab B.
  for (let i = 1; i <= Number(figureN ?? 0); i++) {
    const at = await send(a, "thread-composer", `@grace ping ${i}`);
    const shown = await graceReplies(b, 2 + i);
    console.log(JSON.stringify({ phase: "figure", sent_ms: at, shown_ms: shown }));
  }

  if (errors.length) fail(`page errors: ${errors.join("; ")}`);
  console.log("OK");
} finally {
  await browser.close();
}
