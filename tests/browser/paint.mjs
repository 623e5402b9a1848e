// First paint and time to interactive of dashboard views, from headless
// Chromium's performance timings: first-contentful-paint, and the mark the
// page sets when a view is first drawn with its data (`view-ready:NAME`,
// handlers attached). Each run opens a fresh browser context (cold cache)
// on the session cookie; the baseline is the login (no cookie: same assets, no
// data), measured in the same run.
//
//   node paint.mjs BASE_URL TOKEN RUNS   → one JSON line per view and run
import { chromium } from "playwright-core";

const [base, token, runs] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
});
const url = new URL(base);
try {
  for (let run = 0; run < Number(runs); run++) {
    for (const view of ["login", "org", "feed"]) {
      const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
      if (view !== "login") {
        await context.addCookies([{ name: "crewlet_session", value: token, domain: url.hostname, path: "/", httpOnly: true, sameSite: "Strict" }]);
      }
      const page = await context.newPage();
      const started = Date.now();
      await page.goto(view === "login" ? `${base}/` : `${base}/#/${view}`);
      await page.waitForFunction((v) => performance.getEntriesByName(`view-ready:${v}`).length > 0, view, { timeout: 30000 });
      const t = await page.evaluate((v) => ({
        fcp: performance.getEntriesByName("first-contentful-paint")[0]?.startTime ?? null,
        ready: performance.getEntriesByName(`view-ready:${v}`)[0].startTime,
        rows: document.querySelectorAll("[data-testid=seat], [data-testid=event]").length,
      }), view);
      console.log(JSON.stringify({ run, view, ...t, wall: Date.now() - started }));
      await context.close();
    }
  }
} finally {
  await browser.close();
}
