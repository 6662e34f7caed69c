// Keys view: list, create (secret shown once), edit, revoke; and this key's rate limits.

import {
  api, ApiError, seenRateLimits, type ApiKeyRecord, type ApiKeyType, type CreateApiKeyRequest,
  type LimitPeriod, type ModelPrivacy, type UpdateApiKeyRequest,
} from "./api";
import { fmtDate, fmtTime, fmtUsd, h, scrollTable, showError, type View } from "./dom";
import { currentKey } from "./session";

const KEY_TYPES: ApiKeyType[] = ["INFERENCE", "ADMIN"];
const PERIODS: { value: LimitPeriod; label: string }[] = [
  { value: "EPOCH", label: "Per epoch (day)" },
  { value: "MONTH", label: "Per month" },
  { value: "LIFETIME", label: "Lifetime" },
];
const PRIVACY: { value: ModelPrivacy; label: string }[] = [
  { value: "ALL", label: "All models" },
  { value: "PRIVATE_TEXT", label: "Private text models" },
  { value: "PRIVATE_ONLY", label: "Private models only" },
];
const COLUMNS = ["Description", "Type", "Key", "Created", "Expires", "Consumption limit",
  "Privacy", "Spent (7 days)", "Actions"];

function options<T extends string>(choices: { value: T; label: string }[], selected: T): HTMLOptionElement[] {
  return choices.map((c) => h("option", { value: c.value, selected: c.value === selected }, c.label));
}

/** `YYYY-MM-DD` of tomorrow (UTC): an expiry must be in the future. */
function tomorrow(): string {
  return new Date(Date.now() + 86_400_000).toISOString().slice(0, 10);
}

function limitText(k: ApiKeyRecord): string {
  const { usd, diem } = k.consumptionLimits;
  if (usd === null && diem === null) return "None";
  const parts = [usd !== null ? fmtUsd(usd) : "", diem !== null ? `${diem} DIEM` : ""].filter(Boolean);
  const period = PERIODS.find((p) => p.value === k.limitPeriod)?.label.toLowerCase() ?? k.limitPeriod;
  return `${parts.join(" + ")} (${period})`;
}

/** A labelled control: `[label, control]` with a unique id. */
function field(label: string, control: HTMLInputElement | HTMLSelectElement, id: string): HTMLElement {
  control.id = id;
  return h("div", { class: "field" }, h("label", { for: id }, label), control);
}

export function createKeysView(root: HTMLElement): View {
  const alert = h("p", { class: "error", role: "alert", "data-testid": "keys-error", hidden: true });
  const status = h("p", { class: "muted", role: "status" });
  const tbody = h("tbody");
  const table = h("table", { "data-testid": "keys-table" },
    h("caption", { class: "visually-hidden" }, "Active API keys"),
    h("thead", {}, h("tr", {}, ...COLUMNS.map((c) => h("th", { scope: "col" }, c)))),
    tbody);

  // --- create form ---
  const description = h("input", { type: "text", maxlength: 64, "data-testid": "new-key-description", name: "description" });
  const keyType = h("select", { "data-testid": "new-key-type", name: "apiKeyType" },
    ...KEY_TYPES.map((t) => h("option", { value: t }, t)));
  const expires = h("input", { type: "date", min: tomorrow(), name: "expiresAt", "aria-describedby": "new-key-expiry-help" });
  const limitUsd = h("input", { type: "number", min: 0, step: "0.01", inputmode: "decimal", name: "limitUsd", "aria-describedby": "new-key-limit-help" });
  const period = h("select", { name: "limitPeriod" }, ...options(PERIODS, "EPOCH"));
  const privacy = h("select", { name: "modelPrivacy" }, ...options(PRIVACY, "ALL"));
  const createError = h("p", { class: "error", role: "alert", hidden: true });
  const createButton = h("button", { type: "submit", class: "primary", "data-testid": "create-key" }, "Create key");
  const createForm = h("form", { class: "card form-grid", "aria-labelledby": "create-key-title" },
    h("h2", { id: "create-key-title" }, "Create an API key"),
    field("Description", description, "new-key-description"),
    field("Type", keyType, "new-key-type"),
    field("Expires on (optional)", expires, "new-key-expiry"),
    h("p", { id: "new-key-expiry-help", class: "muted small" }, "At 00:00 UTC of that day. Empty: never expires."),
    field("Spending limit, USD (optional)", limitUsd, "new-key-limit"),
    h("p", { id: "new-key-limit-help", class: "muted small" }, "Empty: no limit."),
    field("Limit period", period, "new-key-period"),
    field("Model privacy", privacy, "new-key-privacy"),
    createError,
    h("div", { class: "actions" }, createButton));

  const secretPanel = h("div", { class: "card secret", role: "region", "aria-labelledby": "secret-title", tabindex: -1, hidden: true });

  // --- rate limits ---
  const limitsSummary = h("p", { class: "muted" });
  const limitsBody = h("tbody");
  const limitsError = h("p", { class: "error", role: "alert", hidden: true });
  const limitsTable = h("table", { "data-testid": "rate-limits" },
    h("caption", { class: "visually-hidden" }, "Rate limits of this key per model"),
    h("thead", {}, h("tr", {}, ...["Model", "Requests / min", "Tokens / min",
      "Remaining requests", "Remaining tokens"].map((c) => h("th", { scope: "col" }, c)))),
    limitsBody);

  const keysSection = h("section", { class: "card stack", "aria-labelledby": "keys-title" },
    h("h2", { id: "keys-title" }, "API keys"), alert, status, scrollTable(table, "API keys"));
  root.replaceChildren(
    h("h1", { class: "visually-hidden" }, "API keys"),
    secretPanel,
    keysSection,
    createForm,
    h("section", { class: "card stack", "aria-labelledby": "limits-title" },
      h("h2", { id: "limits-title" }, "Rate limits of this key"),
      limitsSummary, limitsError, scrollTable(limitsTable, "Rate limits"),
      h("p", { class: "muted small" }, "Remaining counts come from the x-ratelimit-* headers of your last playground call to each model in this session.")));

  let keys: ApiKeyRecord[] = [];

  function adminBlocked(err: unknown): boolean {
    if (err instanceof ApiError && err.adminRequired) {
      showError(alert, err);
      table.closest<HTMLElement>(".table-scroll")!.hidden = true;
      createForm.hidden = true;
      return true;
    }
    return false;
  }

  // --- list ---

  function keyRow(k: ApiKeyRecord): HTMLTableRowElement {
    const row = h("tr", { "data-key-id": k.id },
      h("td", {}, k.description || h("span", { class: "muted" }, "(no description)")),
      h("td", {}, k.apiKeyType),
      h("td", { class: "mono nowrap" }, `…${k.last6Chars}`),
      h("td", { class: "nowrap" }, fmtDate(k.createdAt)),
      h("td", { class: "nowrap" }, k.expiresAt ? fmtTime(k.expiresAt) : "Never"),
      h("td", {}, limitText(k)),
      h("td", {}, PRIVACY.find((p) => p.value === k.modelPrivacy)?.label ?? k.modelPrivacy),
      h("td", { class: "num" }, k.usage ? fmtUsd(Number(k.usage.trailingSevenDays.usd)) : "—"),
      h("td", { class: "row-actions" }));
    renderActions(row, k);
    return row;
  }

  function renderActions(row: HTMLTableRowElement, k: ApiKeyRecord): void {
    const cell = row.querySelector<HTMLTableCellElement>(".row-actions")!;
    const label = k.description || `…${k.last6Chars}`;
    const edit = h("button", { type: "button", "data-testid": `edit-${k.id}`, "aria-label": `Edit ${label}`, "aria-expanded": "false" }, "Edit");
    const revoke = h("button", { type: "button", class: "danger", "data-testid": `revoke-${k.id}`, "aria-label": `Revoke ${label}` }, "Revoke");
    edit.addEventListener("click", () => openEditor(row, k, edit));
    revoke.addEventListener("click", () => confirmRevoke(row, k));
    cell.replaceChildren(edit, revoke);
  }

  async function loadKeys(): Promise<void> {
    showError(alert, null);
    try {
      keys = await api.listKeys();
      tbody.replaceChildren(...(keys.length ? keys.map(keyRow)
        : [h("tr", {}, h("td", { colspan: COLUMNS.length, class: "muted" }, "No active keys."))]));
    } catch (err) {
      if (!adminBlocked(err)) showError(alert, err);
    }
  }

  // --- edit ---

  function openEditor(row: HTMLTableRowElement, k: ApiKeyRecord, toggle: HTMLButtonElement): void {
    const existing = row.nextElementSibling;
    if (existing?.classList.contains("edit-row")) {
      existing.remove();
      toggle.setAttribute("aria-expanded", "false");
      return;
    }
    const p = `edit-${k.id}`;
    const desc = h("input", { type: "text", maxlength: 64, value: k.description });
    const exp = h("input", { type: "date", min: tomorrow(), value: k.expiresAt ? k.expiresAt.slice(0, 10) : "" });
    const usd = h("input", { type: "number", min: 0, step: "0.01", inputmode: "decimal",
      value: k.consumptionLimits.usd ?? "" });
    const per = h("select", {}, ...options(PERIODS, k.limitPeriod));
    const priv = h("select", {}, ...options(PRIVACY, k.modelPrivacy));
    const error = h("p", { class: "error", role: "alert", hidden: true });
    const save = h("button", { type: "submit", class: "primary", "data-testid": `save-${k.id}` }, "Save");
    const cancel = h("button", { type: "button" }, "Cancel");
    const form = h("form", { class: "form-grid inline", "aria-label": `Edit ${k.description || k.last6Chars}` },
      field("Description", desc, `${p}-description`),
      field("Expires on (empty: never)", exp, `${p}-expires`),
      field("Spending limit, USD (empty: none)", usd, `${p}-limit`),
      field("Limit period", per, `${p}-period`),
      field("Model privacy", priv, `${p}-privacy`),
      error,
      h("div", { class: "actions" }, save, cancel));
    const editRow = h("tr", { class: "edit-row" }, h("td", { colspan: COLUMNS.length }, form));
    row.after(editRow);
    toggle.setAttribute("aria-expanded", "true");
    desc.focus();

    const close = () => {
      editRow.remove();
      toggle.setAttribute("aria-expanded", "false");
      toggle.focus();
    };
    cancel.addEventListener("click", close);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      // Send only what changed: the API changes the fields present.
      const change: UpdateApiKeyRequest = { id: k.id };
      if (desc.value !== k.description) change.description = desc.value;
      if (exp.value !== (k.expiresAt?.slice(0, 10) ?? "")) change.expiresAt = exp.value;
      const newUsd = usd.value === "" ? null : Number(usd.value);
      if (newUsd !== k.consumptionLimits.usd) change.consumptionLimit = { usd: newUsd };
      if (per.value !== k.limitPeriod) change.limitPeriod = per.value as LimitPeriod;
      if (priv.value !== k.modelPrivacy) change.modelPrivacy = priv.value as ModelPrivacy;
      if (Object.keys(change).length === 1) return close();
      save.disabled = true;
      try {
        const updated = await api.updateKey(change);
        const merged: ApiKeyRecord = { ...k, ...updated };
        keys = keys.map((x) => (x.id === k.id ? merged : x));
        editRow.remove();
        const fresh = keyRow(merged);
        row.replaceWith(fresh);
        status.textContent = `Saved ${merged.description || "key"}.`;
        fresh.querySelector<HTMLButtonElement>(`[data-testid="edit-${CSS.escape(k.id)}"]`)?.focus();
      } catch (err) {
        showError(error, err);
      } finally {
        save.disabled = false;
      }
    });
  }

  // --- revoke ---

  function confirmRevoke(row: HTMLTableRowElement, k: ApiKeyRecord): void {
    const cell = row.querySelector<HTMLTableCellElement>(".row-actions")!;
    const own = currentKey()?.endsWith(k.last6Chars) ?? false;
    const confirm = h("button", { type: "button", class: "danger", "data-testid": `confirm-revoke-${k.id}` }, "Confirm revoke");
    const cancel = h("button", { type: "button" }, "Cancel");
    cell.replaceChildren(
      h("span", { class: "confirm-text" }, own ? "This looks like the key you signed in with. Revoke it?" : "Revoke this key?"),
      confirm, cancel);
    confirm.focus();
    cancel.addEventListener("click", () => {
      renderActions(row, k);
      row.querySelector<HTMLButtonElement>(".danger")?.focus();
    });
    confirm.addEventListener("click", async () => {
      confirm.disabled = true;
      try {
        await api.deleteKey(k.id);
        const editRow = row.nextElementSibling;
        if (editRow?.classList.contains("edit-row")) editRow.remove();
        row.remove();
        keys = keys.filter((x) => x.id !== k.id);
        status.textContent = `Revoked ${k.description || `key …${k.last6Chars}`}.`;
        keysSection.querySelector("h2")?.setAttribute("tabindex", "-1");
        keysSection.querySelector<HTMLElement>("h2")?.focus();
      } catch (err) {
        confirm.disabled = false;
        showError(alert, err);
      }
    });
  }

  // --- create ---

  function showSecret(secret: string, label: string): void {
    const code = h("code", { "data-testid": "new-key-secret", class: "mono" }, secret);
    const copy = h("button", { type: "button", "data-testid": "copy-secret" }, "Copy");
    const copied = h("span", { role: "status", class: "muted" });
    const done = h("button", { type: "button" }, "Done");
    secretPanel.replaceChildren(
      h("h2", { id: "secret-title" }, `New key: ${label}`),
      h("p", { class: "warning" }, h("strong", {}, "Copy this key now. "),
        "It will not be shown again: the server keeps only a hash of it."),
      h("div", { class: "secret-row" }, code, copy),
      copied, done);
    secretPanel.hidden = false;
    secretPanel.focus();
    copy.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(secret);
        copied.textContent = "Copied to the clipboard.";
      } catch {
        getSelection()?.selectAllChildren(code);
        copied.textContent = "Copy failed: the key is selected, press Ctrl+C (⌘C).";
      }
    });
    done.addEventListener("click", () => {
      secretPanel.replaceChildren();
      secretPanel.hidden = true;
      description.focus();
    });
  }

  createForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    showError(createError, null);
    const req: CreateApiKeyRequest = {
      apiKeyType: keyType.value as ApiKeyType,
      description: description.value.trim(),
      limitPeriod: period.value as LimitPeriod,
      modelPrivacy: privacy.value as ModelPrivacy,
    };
    if (expires.value) req.expiresAt = expires.value;
    if (limitUsd.value !== "") req.consumptionLimit = { usd: Number(limitUsd.value) };
    createButton.disabled = true;
    try {
      const created = await api.createKey(req);
      createForm.reset();
      showSecret(created.apiKey, created.description || created.apiKeyType);
      await loadKeys();
    } catch (err) {
      showError(createError, err);
    } finally {
      createButton.disabled = false;
    }
  });

  // --- rate limits ---

  async function loadRateLimits(): Promise<void> {
    showError(limitsError, null);
    try {
      const rl = await api.rateLimits();
      limitsSummary.textContent = `Tier ${rl.apiTier.id} · balance ${fmtUsd(rl.balances.USD)}` +
        (rl.balances.DIEM ? ` and ${rl.balances.DIEM} DIEM` : "") +
        ` · key expires ${rl.keyExpiration ? fmtTime(rl.keyExpiration) : "never"}` +
        ` · next epoch ${fmtTime(rl.nextEpochBegins)}` +
        (rl.accessPermitted ? "" : " · no balance: inference is not permitted");
      limitsBody.replaceChildren(...rl.rateLimits.map((m) => {
        const amount = (type: string) => m.rateLimits.find((r) => r.type === type)?.amount;
        const seen = seenRateLimits.get(m.apiModelId);
        return h("tr", { "data-model-id": m.apiModelId },
          h("th", { scope: "row", class: "mono" }, m.apiModelId),
          h("td", { class: "num" }, amount("RPM")?.toLocaleString("en-US") ?? "—"),
          h("td", { class: "num" }, amount("TPM")?.toLocaleString("en-US") ?? "—"),
          h("td", { class: "num" }, seen?.remainingRequests ?? "—"),
          h("td", { class: "num" }, seen?.remainingTokens ?? "—"));
      }));
    } catch (err) {
      showError(limitsError, err);
    }
  }

  let loaded = false;
  return {
    show() {
      if (!loaded) {
        loaded = true;
        void loadKeys();
      }
      void loadRateLimits();
    },
    destroy() {
      root.replaceChildren();
    },
  };
}

