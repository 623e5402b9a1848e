// Acting, through the API only: activate a company revision (the diff
// against the active one shown first), set or remove a secret (a value is
// sent, never shown back), create and revoke tokens. Each control needs the
// scope its route needs; a session without it sees the control disabled
// with the reason, and a refusal from the node is shown as the node said it.

import { el, table, when, problem, section } from "./dom.js";
import { get, call, why, cannot } from "./api.js";

/** Line diff (longest common subsequence): rows of [" "|"-"|"+", line]. */
export function diffLines(a, b) {
  const x = a.split("\n"), y = b.split("\n");
  const n = x.length, m = y.length;
  const lcs = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--)
    lcs[i][j] = x[i] === y[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
  const out = [];
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && x[i] === y[j]) { out.push([" ", x[i]]); i++; j++; }
    else if (j < m && (i === n || lcs[i][j + 1] >= lcs[i + 1][j])) out.push(["+", y[j++]]);
    else out.push(["-", x[i++]]);
  }
  return out;
}

/** The changed lines with `around` unchanged lines each side; longer
 * unchanged runs become one "… N unchanged lines" row. */
function withContext(rows, around = 3) {
  const near = rows.map(() => false);
  rows.forEach(([k], i) => {
    if (k === " ") return;
    for (let j = Math.max(0, i - around); j <= Math.min(rows.length - 1, i + around); j++) near[j] = true;
  });
  const out = [];
  let skipped = 0;
  rows.forEach((row, i) => {
    if (near[i]) {
      if (skipped) out.push([" ", `… ${skipped} unchanged lines`]);
      skipped = 0;
      out.push(row);
    } else skipped++;
  });
  if (skipped) out.push([" ", `… ${skipped} unchanged lines`]);
  return out;
}

function disabledNote(scope) {
  const c = cannot(scope);
  return c ? el("p", { class: "muted", "data-testid": "disabled-reason" }, `Disabled: ${c}.`) : null;
}

export async function renderConfig(main) {
  const a = await get("/config");
  if (!a.ok && a.status !== 404) return main.replaceChildren(section("Company revision", problem(why(a))));
  let active = a.ok ? a.body.document : "";
  const blocked = cannot("write");
  const doc = el("textarea", { id: "config-doc", rows: 18, spellcheck: "false", "data-testid": "config-doc", disabled: !!blocked }, active);
  const diffBox = el("pre", { class: "diff", "data-testid": "config-diff", "aria-live": "polite" });
  const out = el("p", { role: "status", "data-testid": "config-result" });
  const activate = el("button", { type: "button", "data-testid": "config-activate", disabled: true, title: blocked ?? "show the diff first" }, "Activate");
  let shown = null;
  doc.addEventListener("input", () => { activate.disabled = true; shown = null; });
  const show = el("button", { type: "button", "data-testid": "config-show-diff", disabled: !!blocked, title: blocked ?? "" }, "Show diff");
  show.addEventListener("click", () => {
    const rows = diffLines(active, doc.value);
    const changed = rows.filter(([k]) => k !== " ");
    diffBox.replaceChildren(...(changed.length
      ? withContext(rows).map(([k, line]) => el("span", { class: k === "+" ? "add" : k === "-" ? "del" : "same" }, `${k} ${line}\n`))
      : [el("span", { class: "muted" }, "No change from the active revision.")]));
    shown = doc.value;
    activate.disabled = !changed.length;
  });
  activate.addEventListener("click", async () => {
    if (shown !== doc.value) return;
    activate.disabled = true;
    const r = await call("PUT", "/config", doc.value);
    out.textContent = r.ok ? `Revision ${r.body.epoch} ${r.body.activated ? "activated" : "was already active"}.` : `Not activated: ${why(r)}`;
    if (r.ok) {
      active = doc.value;
      heading.textContent = `Company revision ${r.body.epoch}`;
    }
  });
  const card = section(`Company revision ${a.ok ? a.body.applied_epoch ?? "" : "(none active)"}`,
    disabledNote("write"),
    el("label", { for: "config-doc" }, "Company document (TOML)"), doc,
    el("div", { class: "controls" }, show, activate), diffBox, out);
  const heading = card.querySelector("h2");
  main.replaceChildren(card);
}

export async function renderSecrets(main) {
  const a = await get("/secrets");
  const blocked = cannot("write");
  const out = el("p", { role: "status", "data-testid": "secret-result" });
  const name = el("input", { id: "secret-name", required: true, autocomplete: "off", disabled: !!blocked });
  const value = el("input", { id: "secret-value", type: "password", autocomplete: "new-password", disabled: !!blocked });
  const form = el("form", { class: "controls", "data-testid": "secret-form" },
    el("label", { for: "secret-name" }, "Name"), name, el("label", { for: "secret-value" }, "Value"), value,
    el("button", { type: "submit", disabled: !!blocked, title: blocked ?? "" }, "Set"));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const r = await call("PUT", `/secrets/${encodeURIComponent(name.value.trim())}`, value.value);
    value.value = "";
    out.textContent = r.ok ? `Secret ${name.value.trim()} set.` : `Not set: ${why(r)}`;
    if (r.ok) renderSecrets(main).then(() => (main.querySelector("[data-testid=secret-result]").textContent = `Secret ${name.value.trim()} set.`));
  });
  const remove = (n) => async () => {
    const r = await call("DELETE", `/secrets/${encodeURIComponent(n)}`);
    if (r.ok) await renderSecrets(main);
    main.querySelector("[data-testid=secret-result]").textContent = r.ok ? `Secret ${n} removed.` : `Not removed: ${why(r)}`;
  };
  const list = a.ok
    ? table("Secrets", ["Name", "Source", "Updated", ""], [
      ...(a.body.secrets ?? []).map((s) => el("tr", { "data-testid": "secret", "data-name": s.name },
        el("td", {}, s.name), el("td", {}, "fleet bucket"), el("td", {}, when(s.updated_ms ?? s.at_ms)),
        el("td", {}, el("button", { type: "button", disabled: !!blocked, title: blocked ?? "", "aria-label": `Remove ${s.name}`, onclick: remove(s.name) }, "Remove")))),
      ...(a.body.outside_bucket ?? []).map((s) => [s.name, s.source, "—", ""])])
    : problem(why(a));
  main.replaceChildren(section("Secrets", el("p", { class: "muted" }, "Values are sent to the node and never shown back."),
    disabledNote("write"), form, out, list));
}

export async function renderTokens(main) {
  const blocked = cannot("admin");
  const a = blocked ? null : await get("/tokens");
  const out = el("div", { role: "status", "data-testid": "token-result" });
  const name = el("input", { id: "token-name", autocomplete: "off", disabled: !!blocked });
  const scope = el("select", { id: "token-scope", disabled: !!blocked }, ["read", "write", "admin"].map((s) => el("option", { value: s }, s)));
  const ttl = el("input", { id: "token-ttl", type: "number", min: 1, placeholder: "never", disabled: !!blocked });
  const form = el("form", { class: "controls", "data-testid": "token-form" },
    el("label", { for: "token-name" }, "Name"), name, el("label", { for: "token-scope" }, "Scope"), scope,
    el("label", { for: "token-ttl" }, "Expires after (s)"), ttl,
    el("button", { type: "submit", disabled: !!blocked, title: blocked ?? "" }, "Create"));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { scope: scope.value, name: name.value.trim() };
    if (ttl.value) body.ttl_seconds = Number(ttl.value);
    const r = await call("POST", "/tokens", body);
    await renderTokens(main);
    // The value is shown once, here, for the person to copy; never again.
    main.querySelector("[data-testid=token-result]").replaceChildren(r.ok
      ? el("p", {}, `Token ${r.body.id} created; copy it now, it is not shown again: `, el("code", { "data-testid": "token-value" }, r.body.token))
      : el("p", {}, `Not created: ${why(r)}`));
  });
  const revoke = (id) => async () => {
    const r = await call("DELETE", `/tokens/${encodeURIComponent(id)}`);
    await renderTokens(main);
    main.querySelector("[data-testid=token-result]").textContent = r.ok ? `Token ${id} revoked.` : `Not revoked: ${why(r)}`;
  };
  const list = !a ? null : a.ok
    ? table("Tokens", ["Id", "Name", "Scope", "Created", "Expires", "Revoked", ""], a.body.tokens.map((t) => el("tr", { "data-testid": "token", "data-id": t.id },
      el("td", {}, el("code", {}, t.id)), el("td", {}, t.name || "—"), el("td", {}, t.scope), el("td", {}, when(t.created_ms)),
      el("td", {}, t.expires_ms ? when(t.expires_ms) : "never"), el("td", {}, t.revoked_ms ? when(t.revoked_ms) : "—"),
      el("td", {}, t.revoked_ms ? "" : el("button", { type: "button", "aria-label": `Revoke ${t.id}`, onclick: revoke(t.id) }, "Revoke")))))
    : problem(why(a));
  main.replaceChildren(section("Operator tokens", disabledNote("admin"), form, out, list));
}
