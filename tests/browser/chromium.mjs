// What the browser scripts share: Debian's headless Chromium launched the
// one way, and a view's screenshots at both widths with the check that
// neither scrolls sideways.
import { chromium } from "playwright-core";

export function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ],
  });
}

/** Laptop (1280 px) and phone (390 px) widths: no sideways scroll at
 * either (thrown), a screenshot of each as OUT/NAME-WIDTH.png. */
export async function shoot(page, out, name) {
  for (const [w, h] of [[1280, 900], [390, 844]]) {
    await page.setViewportSize({ width: w, height: h });
    const wide = await page.evaluate(() => document.documentElement.scrollWidth);
    if (wide > w) throw new Error(`${name} scrolls sideways at ${w} px (${wide} px wide)`);
    await page.screenshot({ path: `${out}/${name}-${w}.png`, fullPage: true });
  }
  await page.setViewportSize({ width: 1280, height: 900 });
}
