// Budgets (meters per window, parked work marked, the last 24 hours by hour
// from the fleet's events and the last 14 company days by role from the
// usage history, `GET /usage`), the fleet (nodes, roles,
// posture, epochs, duties, heartbeats) and plugins (grants and where each
// came from, health, breaker, reloads; a module's buckets browsable,
// read-only, through `GET /plugins/{name}/state/{bucket}`).

import { el, table, when, ago, meter, badge, tokens, problem, section, link } from "./dom.js";
import { get, why, stream } from "./api.js";

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  node.append(...children);
  return node;
}

/** Tokens of the turns that ended in the last 24 hours, by hour (the
 * fleet's history; rolling, so no midnight empties it). */
async function spendChart() {
  const r = await stream.query({ type: "turn_ended", limit: 1000 });
  if (r.kind !== "result") return problem(`the spend over time could not be read: ${r.error}`);
  const now = Date.now();
  const hours = new Array(24).fill(0); // [0] is 24 hours ago, [23] the last hour
  for (const e of r.events) {
    const ago = Math.floor((now - e.at_ms) / 3_600_000);
    if (ago >= 0 && ago < 24) hours[23 - ago] += (e.payload.input_tokens ?? 0) + (e.payload.output_tokens ?? 0);
  }
  const top = Math.max(1, ...hours);
  const bars = hours.map((t, h) => svg("rect", { x: h * 10 + 1, y: 60 - (t / top) * 58, width: 8, height: Math.max((t / top) * 58, t ? 1 : 0), class: "bar", "data-testid": "spend-bar", "data-tokens": t },
    svg("title", {}, `${23 - h}–${24 - h} h ago: ${tokens(t)} tokens`)));
  return el("figure", { class: "chart" },
    svg("svg", { viewBox: "0 0 240 72", role: "img", "aria-label": `Tokens spent in the last 24 hours by hour; most in one hour ${tokens(top)}` },
      ...bars, svg("line", { x1: 0, y1: 60.5, x2: 240, y2: 60.5, class: "axis" }),
      ...[24, 18, 12, 6].map((h) => svg("text", { x: (24 - h) * 10 + 1, y: 70, class: "tick" }, `-${h}h`)),
      svg("text", { x: 226, y: 70, class: "tick" }, "now")),
    el("figcaption", { class: "muted small" }, `Tokens of turns that ended in the last 24 hours, by hour (most ${tokens(top)}; ${r.truncated ? "the newest 1000 turns" : "every turn"}, ${r.coverage?.complete === false ? "some nodes did not answer" : "every node answered"}).`));
}

/** The company day of `ms` in `zone` (YYYY-MM-DD); UTC for a zone the
 * browser does not know. */
function dayIn(ms, zone) {
  try {
    return new Intl.DateTimeFormat("en-CA", { timeZone: zone, year: "numeric", month: "2-digit", day: "2-digit" }).format(ms);
  } catch {
    return new Date(ms).toISOString().slice(0, 10);
  }
}

const DAYS = 14;

/** Tokens by company day and role over the last 14 days, from the usage
 * history (`GET /usage`, kept by the data nodes). A node without `data`
 * holds none: it says where to look. A failed read says so. */
async function usageChart(zone) {
  const now = Date.now();
  const days = Array.from({ length: DAYS }, (_, i) => dayIn(now - (DAYS - 1 - i) * 86_400_000, zone));
  const r = await get(`/usage?period=day&by=role&from=${days[0]}`);
  if (r.status === 409) {
    return el("p", { class: "muted", "data-testid": "usage-elsewhere" },
      `This node keeps no usage history (it has no \`data\` role): open the dashboard of a node whose roles include \`data\` to see spend by day. ${r.body?.detail ?? ""}`);
  }
  if (!r.ok) return problem(`the spend by day could not be read: ${why(r)}`);
  const roles = [...new Set(r.body.rows.map((x) => x.key ?? "?"))].sort();
  const spent = new Map(r.body.rows.map((x) => [`${x.period}\u0000${x.key ?? "?"}`, (x.input_tokens ?? 0) + (x.output_tokens ?? 0)]));
  const total = (d) => roles.reduce((n, k) => n + (spent.get(`${d}\u0000${k}`) ?? 0), 0);
  const top = Math.max(1, ...days.map(total));
  const bars = [];
  days.forEach((d, i) => {
    let y = 60;
    roles.forEach((k, j) => {
      const t = spent.get(`${d}\u0000${k}`) ?? 0;
      if (!t) return;
      const h = Math.max((t / top) * 58, 1);
      y -= h;
      bars.push(svg("rect", { x: i * 17 + 1, y, width: 15, height: h, class: `bar r${j % 6}`, "data-testid": "usage-bar", "data-day": d, "data-key": k, "data-tokens": t },
        svg("title", {}, `${d} · ${k || "(no role)"}: ${tokens(t)} tokens`)));
    });
  });
  return el("figure", { class: "chart", "data-testid": "usage-chart" },
    svg("svg", { viewBox: `0 0 ${DAYS * 17} 72`, role: "img", "aria-label": `Tokens spent by company day and role over the last ${DAYS} days; most in one day ${tokens(top)}` },
      ...bars, svg("line", { x1: 0, y1: 60.5, x2: DAYS * 17, y2: 60.5, class: "axis" }),
      svg("text", { x: 1, y: 70, class: "tick" }, days[0].slice(5)), svg("text", { x: DAYS * 17 - 16, y: 70, class: "tick" }, "today")),
    el("figcaption", { class: "muted small" },
      roles.length ? roles.map((k, j) => el("span", { class: `key r${j % 6}` }, k || "(no role)")) : "No usage in these days.",
      ` Tokens by company day (${zone}) and role, from the fleet's usage history (most ${tokens(top)} in a day).`));
}

export async function renderBudgets(main) {
  const a = await get("/budgets");
  if (!a.ok) return main.replaceChildren(section("Budgets", problem(why(a))));
  const [chart, daily] = await Promise.all([spendChart(), usageChart(a.body.timezone)]);
  const cards = a.body.scopes.map((s) => {
    const label = s.scope === "company" ? "Company" : s.scope.replace(/^seat:/, "@");
    return el("div", { class: "budget", "data-testid": "budget", "data-scope": s.scope },
      el("h3", {}, label),
      ["day", "week", "month"].filter((w) => s.windows[w]).map((w) => {
        const v = s.windows[w];
        return meter(`${w} ${v.window}`, v.spent, v.cap, !!v.refused_at_ms);
      }),
      s.parked?.length
        ? el("p", { class: "problem", "data-testid": "parked" }, "Parked: ", s.parked.map((p) => typeof p === "string" ? p
          : `${p.wakes ?? "?"} wake(s) of @${p.seat ?? "?"} on the ${p.period} budget${p.until ? `, until ${when(Date.parse(p.until))}` : ""}`).join("; "))
        : null);
  });
  main.replaceChildren(section(`Budgets · ${a.body.org}`, el("p", { class: "muted" }, `Windows in ${a.body.timezone}; tokens spent against each cap.`),
    el("div", { class: "grid" }, cards)), section("Spend over time", chart), section("Spend by day", daily));
}

export async function renderFleet(main) {
  const a = await get("/fleet");
  if (!a.ok) return main.replaceChildren(section("Fleet", problem(why(a))));
  const rows = a.body.nodes.map((n) => el("tr", { "data-testid": "fleet-node", "data-node": n.id },
    el("td", {}, el("strong", {}, n.id), n.this_node ? badge("this node") : null, n.draining ? badge("draining", "warn") : null),
    el("td", {}, (n.roles ?? []).join(", ")),
    el("td", {}, Object.entries(n.labels ?? {}).map(([k, v]) => `${k}=${v}`).join(", ") || "—"),
    el("td", {}, badge(n.posture ?? "unknown", n.posture === "serve" ? "ok" : "warn")),
    el("td", {}, String(n.applied_epoch ?? "—")),
    el("td", {}, String(n.seats_held ?? "—"), " seats · ", String(n.turns_in_flight ?? "—"), " in flight"),
    el("td", {}, (n.duties ?? []).map((d) => d.duty).join(", ") || "—"),
    el("td", {}, n.broker ? `${n.broker.server_name} ${n.broker.cluster ? "· cluster " + (n.broker.cluster.name ?? JSON.stringify(n.broker.cluster)) : "· no cluster"}` : "—"),
    el("td", { title: when(n.last_beat_ms) }, ago(n.last_beat_ms))));
  main.replaceChildren(section(`Fleet · ${a.body.nodes.length} node(s)`,
    a.body.errors?.length ? problem(a.body.errors.map((e) => typeof e === "string" ? e : JSON.stringify(e)).join("; ")) : null,
    table("Nodes", ["Node", "Roles", "Labels", "Posture", "Epoch", "Holds", "Duties", "Broker", "Heartbeat"], rows)));
}

function health(p) {
  if (p.degraded) return badge("degraded", "bad");
  if (p.state && p.state !== "running") return badge(p.state, "warn");
  return badge("healthy", "ok");
}

export async function renderPlugins(main) {
  const a = await get("/plugins");
  if (!a.ok) return main.replaceChildren(section("Plugins", problem(why(a))));
  const b = a.body;
  const buckets = new Map();
  for (const k of b.buckets ?? []) {
    const [, module, ...rest] = k.name.split("_");
    if (!buckets.has(module)) buckets.set(module, []);
    buckets.get(module).push({ ...k, short: rest.join("_") });
  }
  const rows = b.plugins.map((p) => el("tr", { "data-testid": "plugin", "data-plugin": p.name },
    el("td", {}, el("strong", {}, p.name), " ", el("span", { class: "muted" }, p.version ?? "")),
    el("td", {}, p.kind),
    el("td", {}, health(p)),
    el("td", {}, badge(`breaker ${p.breaker?.state ?? "unknown"}`, p.breaker?.state === "closed" ? "ok" : "bad"),
      el("div", { class: "small muted" }, `${p.faults ?? 0} faults · ${p.calls ?? 0} calls${p.last_fault ? " · last: " + p.last_fault : ""}`)),
    el("td", {}, `${p.reloads ?? 0} reloads`, p.reload_refused ? el("div", { class: "problem small" }, `refused: ${typeof p.reload_refused === "string" ? p.reload_refused : JSON.stringify(p.reload_refused)}`) : null),
    el("td", {}, el("ul", { class: "plain small" }, (p.effective ?? []).map((g) => el("li", {}, `${g.permission} ${g.value} `, el("span", { class: "muted" }, `(from ${g.from})`))),
      (p.permissions ?? []).filter((x) => x.startsWith("owns") || x.startsWith("reads") || x.startsWith("secret")).map((x) => el("li", {}, x)))),
    el("td", {}, (buckets.get(p.name) ?? []).map((k) => el("div", {}, link(`#/plugins/${encodeURIComponent(p.name)}/${encodeURIComponent(k.short)}`, k.short, { "data-testid": "bucket-link" }), el("span", { class: "muted small" }, ` ${k.keys} keys`))))));
  main.replaceChildren(section(`Plugins · ${b.plugins.length}`,
    b.detail ? el("p", { class: "muted" }, b.detail) : null,
    b.failed?.length ? problem(`failed to load: ${b.failed.map((f) => `${f.name ?? f.manifest}: ${f.error}`).join("; ")}`) : null,
    table("Plugins", ["Plugin", "Kind", "Health", "Breaker", "Reload", "Grants (where from)", "Buckets"], rows)));
}

export async function renderBucket(main, name, bucket) {
  const a = await get(`/plugins/${encodeURIComponent(name)}/state/${encodeURIComponent(bucket)}`);
  if (!a.ok) return main.replaceChildren(section(`${name} · ${bucket}`, problem(why(a))));
  main.replaceChildren(section(`${name} · bucket ${bucket} (read-only)`,
    el("p", { class: "muted" }, `${a.body.keys} keys${a.body.truncated ? `, first ${a.body.limit} shown` : ""} · `, link("#/plugins", "all plugins")),
    table("Entries", ["Key", "Revision", "Value"], (a.body.entries ?? []).map((e) => el("tr", { "data-testid": "bucket-entry" },
      el("td", {}, e.key), el("td", {}, String(e.revision)), el("td", {}, el("pre", { class: "small" }, JSON.stringify(e.value, null, 2))))))));
}

