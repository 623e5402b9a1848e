// Loads the dashboard of a running node in Debian's headless Chromium and
// checks what a person would: the org and its seats, the socket live, the
// feed filled from the query channel, and a live push arriving. BASE_URL
// carries the operator token in its fragment, as the first-start URL does;
// the page logs in with it and wipes it from the address bar.
//
//   node dashboard.mjs BASE_URL EXPECT_LIVE_NODE_ID SCREENSHOT
//
// Prints READY once the page is live; the driver then makes a peer node
// publish and sends a signed webhook, and this script waits for both events
// (the peer's node_started, the delivery's webhook_received) in the feed.
import { chromium } from "playwright-core";

const [base, liveNode, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  // Without a session the page loads, asks for a token, and shows no data.
  const bare = new URL(base);
  bare.hash = "";
  await page.goto(bare.toString());
  await page.getByTestId("login-token").waitFor({ state: "visible", timeout: 15000 });
  if (await page.getByTestId("seat").count()) throw new Error("seats shown without a session");
  await page.goto(base);
  await page.getByTestId("socket").filter({ hasText: "live" }).waitFor({ timeout: 15000 });
  if (new URL(page.url()).hash) throw new Error(`the token stayed in the address bar: ${page.url()}`);
  await page.getByTestId("seat").first().waitFor({ timeout: 15000 });
  const seats = await page.getByTestId("seat").count();
  if (seats < 2) throw new Error(`expected the example company's seats, found ${seats}`);
  // The org is the landing view; the feed is a click away.
  await page.getByRole("link", { name: "Feed" }).click();
  await page.locator('[data-testid=event][data-type=node_started]').first().waitFor({ timeout: 15000 });
  console.log("READY");
  await page
    .locator("[data-testid=event][data-type=node_started]", { hasText: liveNode })
    .waitFor({ timeout: 20000 });
  await page
    .locator("[data-testid=event][data-type=webhook_received]")
    .first()
    .waitFor({ timeout: 20000 });
  if (errors.length) throw new Error(`page errors: ${errors.join("; ")}`);
  if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
  console.log("OK");
} finally {
  await browser.close();
}
