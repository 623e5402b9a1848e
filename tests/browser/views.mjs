// Every dashboard view from a live two-node fleet, in Debian's headless
// Chromium: each view shows the node's real data, at laptop (1280 px) and
// phone (390 px) widths, light and dark, with no sideways scroll; each is
// screenshotted under OUT_DIR. Then, driven with the Rust test over
// stdin/stdout: pause a seat from its page (prints PAUSED, waits for a
// RESUME line, resumes, prints RESUMED); a read-scope session sees every
// writing control disabled with the reason and the API refuses its write;
// a token that expires while its page is open lands on the login.
//
//   node views.mjs BASE_URL ADMIN_TOKEN READ_TOKEN OUT_DIR
import { launch, shoot as shootAt } from "./chromium.mjs";
import { createInterface } from "node:readline";

const [base, adminToken, readToken, out] = process.argv.slice(2);
const input = createInterface({ input: process.stdin });
const lines = input[Symbol.asyncIterator]();
const browser = await launch();
const T = 20000;
const errors = [];
const fail = (msg) => { throw new Error(msg); };

async function session(token, scheme = "light") {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, colorScheme: scheme });
  const page = await context.newPage();
  page.setDefaultTimeout(T);
  page.on("pageerror", (e) => errors.push(e.message));
  // Nothing is fetched from outside the node.
  page.on("request", (r) => { if (!r.url().startsWith(base) && !r.url().startsWith(base.replace("http", "ws"))) errors.push(`fetched ${r.url()}`); });
  await page.goto(`${base}/#token=${token}`);
  await page.getByTestId("nav").waitFor({ state: "visible", timeout: T });
  return page;
}

async function open(page, route) {
  await page.evaluate((r) => (location.hash = `#/${r}`), route);
  const name = route.split(/[/?]/)[0];
  await page.waitForFunction((n) => document.getElementById("view").dataset.ready === n, name, { timeout: T });
}

const shoot = (page, name) => shootAt(page, out, name);

const text = async (page, id) => (await page.getByTestId(id).first().textContent()) ?? "";

try {
  // Logged out, the page says so and shows nothing of the company.
  {
    const ctx = await browser.newContext();
    const page = await ctx.newPage();
    await page.goto(base);
    await page.getByTestId("logged-out").waitFor({ state: "visible", timeout: T });
    if (await page.getByTestId("seat").count()) fail("seats shown without a session");
    if ((await page.content()).includes("No company loaded")) fail("logged out reads as no company");
    await page.screenshot({ path: `${out}/login-1280.png` });
    await ctx.close();
  }

  const page = await session(adminToken);
  page.setDefaultTimeout(T);
  // The org: every seat with a state, a holder and today's spend.
  await open(page, "org");
  const seats = page.getByTestId("seat");
  if ((await seats.count()) !== 3) fail(`expected the example company's 3 seats, found ${await seats.count()}`);
  for (const s of await seats.all()) {
    const state = await s.getAttribute("data-state");
    if (!["idle", "working"].includes(state)) fail(`seat ${await s.getAttribute("data-handle")} is ${state}`);
  }
  const grace = page.locator("[data-testid=seat][data-handle=grace] [data-testid=meter]");
  if (Number(await grace.getAttribute("data-spent")) <= 0) fail("grace's spend today did not move after her turn");
  await shoot(page, "org");
  // The seats filter: words over handle, role, state and node.
  await page.getByLabel("Filter seats").fill("support idle");
  const shown = await page.locator("[data-testid=seat]:visible").evaluateAll((r) => r.map((x) => x.dataset.handle));
  if (shown.join() !== "grace") fail(`"support idle" shows ${shown}`);
  await page.getByLabel("Filter seats").fill("");

  // A turn's timeline, reached from the feed's link on a turn_ended sentence.
  await open(page, "feed?type=turn_ended");
  const ended = page.locator("[data-testid=event][data-type=turn_ended]").first();
  await ended.waitFor({ timeout: T });
  if (!/turn ended delivered/.test(await ended.getByTestId("sentence").textContent())) fail("a turn_ended row is not a sentence");
  await shoot(page, "feed");
  // Paged: three rows a page, older ones appended below without repeats.
  await open(page, "feed?page=3");
  const ids = () => page.getByTestId("event").evaluateAll((r) => r.map((x) => x.dataset.eventId));
  if ((await ids()).length !== 3) fail(`a page of 3 shows ${(await ids()).length} rows`);
  await page.getByTestId("feed-older").click();
  await page.waitForFunction(() => document.querySelectorAll("[data-testid=event]").length > 3, null, { timeout: T });
  const paged = await ids();
  if (new Set(paged).size !== paged.length) fail("paging repeated a row");
  await ended.getByTestId("turn-link").click();
  await page.waitForFunction(() => document.getElementById("view").dataset.ready === "turn", null, { timeout: T });
  const steps = await page.getByTestId("step").evaluateAll((s) => s.map((x) => x.dataset.type));
  for (const kind of ["webhook_received", "wake_published", "turn_started", "model_call", "tool_call", "review", "reply_posted", "turn_ended"]) {
    if (!steps.includes(kind)) fail(`the turn's timeline lacks ${kind}: ${steps.join(", ")}`);
  }
  if (!/scripted\/demo-support/.test(await page.getByTestId("timeline").textContent())) fail("the model call does not name its model");
  await shoot(page, "turn");

  // The seat's page: the turn in its recent turns.
  await open(page, "seat/grace");
  await page.getByTestId("seat-turn").first().waitFor({ timeout: T });
  // Her follows: the Slack thread she answered in. Her memory, or why not:
  // a node without the memory route says so, never "remembers nothing".
  await page.locator("[data-testid=follow][data-backend=slack][data-channel=C9][data-thread='9.1']").waitFor({ timeout: T });
  if (await page.getByTestId("memory-unavailable").count()) {
    if (!/Memory not available on this node/.test(await text(page, "memory-unavailable"))) fail("the memory's absence is not said");
  } else if ((await page.getByTestId("memory-kind").count()) < 4) fail("the seat page shows neither grace's memory nor why not");
  await shoot(page, "seat");
  // Ada's page: the example's stand-up with its next fire.
  await open(page, "seat/ada");
  await page.getByTestId("schedule").filter({ hasText: "standup" }).waitFor({ timeout: T });

  await open(page, "budgets");
  const spent = await page.locator("[data-testid=budget][data-scope='seat:grace'] [data-testid=meter]").first().getAttribute("data-spent");
  if (Number(spent) <= 0) fail("grace's budget meter did not move");
  const hourly = await page.getByTestId("spend-bar").evaluateAll((b) => b.map((x) => Number(x.dataset.tokens)));
  if (hourly.length !== 24 || !hourly.some((t) => t > 0)) fail(`the spend chart shows no spend: ${hourly}`);
  // By day from the usage history: grace's role (support) spent at least
  // her turn's tokens (the only turn yet; embeddings may add to it).
  const daily = await page.getByTestId("usage-bar").evaluateAll((b) => b.map((x) => ({ key: x.dataset.key, tokens: Number(x.dataset.tokens) })));
  const support = daily.filter((b) => b.key === "support").reduce((n, b) => n + b.tokens, 0);
  const turns = hourly.reduce((n, t) => n + t, 0);
  if (support < turns) fail(`the spend by day shows ${support} tokens of support, below the turn's ${turns}: ${JSON.stringify(daily)}`);
  await shoot(page, "budgets");

  await open(page, "fleet");
  if ((await page.getByTestId("fleet-node").count()) !== 2) fail("the fleet view does not show both nodes");
  await shoot(page, "fleet");

  await open(page, "plugins");
  await page.locator("[data-testid=plugin][data-plugin=scripted]").waitFor({ timeout: T });
  await page.locator("[data-testid=plugin][data-plugin=notebook] [data-testid=bucket-link]", { hasText: "worked" }).click();
  await page.waitForFunction(() => document.getElementById("view").dataset.ready === "plugins", null, { timeout: T });
  await page.getByTestId("bucket-entry").filter({ hasText: "grace" }).waitFor({ timeout: T });
  await shoot(page, "bucket");
  await open(page, "plugins");
  await shoot(page, "plugins");

  for (const v of ["config", "secrets", "tokens"]) {
    await open(page, v);
    await shoot(page, v);
  }

  // Dark, keyboard: the nav is reachable by Tab and every control has a name.
  {
    const dark = await session(adminToken, "dark");
    await open(dark, "org");
    const bg = await dark.evaluate(() => getComputedStyle(document.body).backgroundColor);
    if (bg === "rgb(245, 246, 250)") fail("dark scheme renders light");
    await shoot(dark, "org-dark");
    const unnamed = await dark.evaluate(() => [...document.querySelectorAll("button, input, select, textarea")]
      .filter((c) => !c.hidden && !(c.labels?.length || c.getAttribute("aria-label") || c.textContent.trim() || c.placeholder))
      .map((c) => c.outerHTML));
    if (unnamed.length) fail(`controls without a name: ${unnamed.join(" ")}`);
    let reached = false;
    for (let i = 0; i < 15 && !reached; i++) {
      await dark.keyboard.press("Tab");
      reached = await dark.evaluate(() => document.activeElement?.getAttribute("href") === "#/fleet");
    }
    if (!reached) fail("the Fleet link is not reachable by keyboard");
    await dark.keyboard.press("Enter");
    await dark.waitForFunction(() => document.getElementById("view").dataset.ready === "fleet", null, { timeout: T });
    await dark.context().close();
  }

  // A second tab on the org, never reloaded, sees linus's spend move live.
  const watcher = await session(adminToken);
  await open(watcher, "org");
  const linusSpend = () => watcher.locator("[data-testid=seat][data-handle=linus] [data-testid=meter]").getAttribute("data-spent");
  if (Number(await linusSpend()) !== 0) fail("linus spent before his first turn");

  // Pause from the UI; the driver checks the seat takes no wake; resume.
  await open(page, "seat/ada");
  await page.getByTestId("pause").click();
  await page.locator("[data-testid=seat-state]", { hasText: "paused" }).first().waitFor({ timeout: T });
  console.log("PAUSED");
  if ((await lines.next()).value !== "RESUME") fail("the driver did not say RESUME");
  input.close();
  await page.getByTestId("resume").click();
  await page.getByTestId("pause-result").filter({ hasText: "Resumed" }).waitFor({ timeout: T });
  await page.waitForFunction(() => document.querySelector("[data-testid=seat-state]")?.textContent !== "paused", null, { timeout: T });
  console.log("RESUMED");
  await watcher.waitForFunction(() => Number(document.querySelector("[data-testid=seat][data-handle=linus] [data-testid=meter]")?.dataset.spent) > 0, null, { timeout: T });
  await watcher.context().close();

  // A read-scope session: writing controls disabled with the reason; the API refuses.
  let readerPage;
  {
    const reader = await session(readToken);
    await open(reader, "seat/ada");
    if (!(await reader.getByTestId("pause").isDisabled())) fail("a read session may press Pause");
    if (!/read scope; this needs write/.test(await text(reader, "pause-result"))) fail("the disabled Pause does not say why");
    const refused = await reader.evaluate(async () => {
      const r = await fetch("/agents/ada/pause", { method: "POST", credentials: "same-origin" });
      return { status: r.status, body: await r.json() };
    });
    if (refused.status !== 403 || refused.body.scope_needed !== "write") fail(`the API let a read session pause: ${JSON.stringify(refused)}`);
    await open(reader, "tokens");
    if (!/read scope; this needs admin/.test(await text(reader, "disabled-reason"))) fail("tokens do not say why they are disabled");
    await shoot(reader, "read-scope-tokens");
    // Left on the org (re-read every few seconds) until its token is revoked below.
    await open(reader, "org");
    readerPage = reader;
  }

  // An expiring token: created here, logged in, and back at the login once it expires.
  {
    await open(page, "tokens");
    await page.fill("#token-name", "short");
    await page.fill("#token-ttl", "5");
    await page.getByRole("button", { name: "Create" }).click();
    const value = await page.getByTestId("token-value").textContent({ timeout: T });
    const brief = await session(value);
    await open(brief, "org");
    await brief.getByTestId("logged-out").waitFor({ state: "visible", timeout: T });
    if (!/expired/.test(await text(brief, "login-error"))) fail(`the login does not say the token expired: ${await text(brief, "login-error")}`);
    await brief.screenshot({ path: `${out}/expired-1280.png` });
    await brief.context().close();
  }
  // Acting: a secret set (its value never shown back) and removed.
  await open(page, "secrets");
  await page.fill("#secret-name", "DASH_SECRET");
  await page.fill("#secret-value", "dash-value-never-shown");
  await page.getByRole("button", { name: "Set", exact: true }).click();
  await page.locator("[data-testid=secret][data-name=DASH_SECRET]").waitFor();
  if ((await page.content()).includes("dash-value-never-shown")) fail("a secret's value is shown back");
  await page.getByRole("button", { name: "Remove DASH_SECRET" }).click();
  await page.getByTestId("secret-result").filter({ hasText: "removed" }).waitFor();
  if (await page.locator("[data-testid=secret][data-name=DASH_SECRET]").count()) fail("a removed secret is still listed");

  // A company revision: Activate only once the diff is shown, then activated.
  // It caps support's day below what grace spent: her next wake parks.
  await open(page, "config");
  const doc = page.getByTestId("config-doc");
  const before = await doc.inputValue();
  if (!before.includes("[roles.support]\n")) fail("the example company has no [roles.support]");
  await doc.fill(before.replace("[roles.support]\n", "[roles.support]\n# edited from the dashboard\nbudget = { day = 500 }\n"));
  if (!(await page.getByTestId("config-activate").isDisabled())) fail("Activate is enabled before the diff is shown");
  await page.getByTestId("config-show-diff").click();
  const added = await page.locator("[data-testid=config-diff] .add").allTextContents();
  if (!added.some((l) => l.includes("# edited from the dashboard"))) fail(`the diff does not show the added line: ${added}`);
  await page.getByTestId("config-activate").click();
  await page.getByTestId("config-result").filter({ hasText: "activated" }).waitFor();
  await shoot(page, "config-activated");
  console.log("ACTIVATED");
  // The driver mentions grace once every node applied it: the org marks her
  // parked, the budgets her parked work.
  await open(page, "org");
  await page.locator("[data-testid=seat][data-handle=grace][data-state=parked]").waitFor({ timeout: 60000 });
  await open(page, "budgets");
  await page.locator("[data-testid=budget][data-scope='seat:grace'] [data-testid=parked]").waitFor({ timeout: T });
  await shoot(page, "budgets-parked");

  // The read token revoked from the tokens page.
  await open(page, "tokens");
  const viewer = page.locator("[data-testid=token]", { hasText: "viewer" });
  await viewer.getByRole("button", { name: /^Revoke/ }).click();
  await page.getByTestId("token-result").filter({ hasText: "revoked" }).waitFor();
  // The session made from it ends: its open page is back at the login, saying why.
  await readerPage.getByTestId("logged-out").waitFor({ state: "visible", timeout: T });
  if (!/revoked/.test(await text(readerPage, "login-error"))) fail(`the login does not say the token was revoked: ${await text(readerPage, "login-error")}`);
  await readerPage.context().close();

  if (errors.length) fail(`page errors: ${errors.join("; ")}`);
  console.log("OK");
} finally {
  input.close();
  await browser.close();
}
