// Usage view: balance, usage analytics charts, usage history (cursor-paged) and CSV export.

import {
  BarController, BarElement, CategoryScale, Chart, Filler, LinearScale, LineController, LineElement,
  PointElement, Tooltip, type ChartType,
} from "chart.js";
import { api, ApiError, type UsageAnalytics, type UsageRecord } from "./api";
import { byTestId, fmtNumber, fmtTime, fmtUsd, h, scrollTable, showError, total, type View } from "./dom";

Chart.register(BarController, BarElement, CategoryScale, Filler, LinearScale, LineController,
  LineElement, PointElement, Tooltip);

/** `lookback` accepts any `Nd` from 1d to 90d; these are the choices offered. */
const LOOKBACKS = ["1d", "7d", "14d", "30d", "60d", "90d"] as const;
const DEFAULT_LOOKBACK = "7d";
const HISTORY_PAGE_SIZE = 50;
/** Pages of 1000 lines read to count requests per day (and exported as CSV) at most. */
const MAX_WALK_PAGES = 20;

const ACCENT = "#2456c7";

/** `<model id>-<kind>-<line type>-<unit>` -> model id (see serve_app/billing/pricing.py sku()). */
export function modelOfSku(sku: string): string {
  const m = /^(.+)-[a-z0-9]+-(?:input|output|cache-read|cache-write|image|characters|seconds|minutes|credits)-(?:mtoken|kchar|unit)$/.exec(sku);
  return m?.[1] ?? sku;
}

type Unit = "usd" | "count";

interface ChartSlot {
  figure: HTMLElement;
  canvas: HTMLCanvasElement;
  note: HTMLElement;
  table: HTMLTableElement;
  chart?: Chart;
}

function chartSlot(testid: string, caption: string): ChartSlot {
  const canvas = h("canvas", { "data-testid": testid, role: "img", "aria-label": caption });
  const note = h("span", { class: "muted" });
  const table = h("table", { class: "visually-hidden" });
  const figure = h("figure", { class: "card chart" },
    h("figcaption", {}, caption, " ", note),
    h("div", { class: "chart-box" }, canvas),
    table);
  return { figure, canvas, note, table };
}

function draw(slot: ChartSlot, type: Extract<ChartType, "bar" | "line">, labels: string[],
  values: number[], unit: Unit, caption: string, horizontal = false): void {
  slot.chart?.destroy();
  const fmt = unit === "usd" ? fmtUsd : (v: number) => fmtNumber(v, 0);
  const sum = total(values);
  slot.canvas.dataset.total = String(sum);
  slot.canvas.dataset.points = String(values.length);
  slot.canvas.setAttribute("aria-label", values.length
    ? `${caption}: ${values.length} ${values.length === 1 ? "entry" : "entries"}, total ${fmt(sum)}. The table that follows lists each value.`
    : `${caption}: no data.`);
  slot.note.textContent = values.length ? `(total ${fmt(sum)})` : "(no data)";
  slot.table.replaceChildren(
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Label"), h("th", { scope: "col" }, "Value"))),
    h("tbody", {}, ...labels.map((label, i) =>
      h("tr", {}, h("th", { scope: "row" }, label), h("td", {}, fmt(values[i] ?? 0))))),
  );
  const reduceMotion = matchMedia("(prefers-reduced-motion: reduce)").matches;
  slot.chart = new Chart(slot.canvas, {
    type,
    data: {
      labels,
      datasets: [{
        label: caption, data: values, backgroundColor: type === "bar" ? ACCENT : "rgba(36,86,199,.15)",
        borderColor: ACCENT, borderWidth: type === "line" ? 2 : 0, pointRadius: 3, fill: type === "line",
      }],
    },
    options: {
      indexAxis: horizontal ? "y" : "x",
      responsive: true,
      maintainAspectRatio: false,
      animation: reduceMotion ? false : undefined,
      plugins: { tooltip: { callbacks: { label: (ctx) => fmt(Number(ctx.raw)) } } },
      scales: {
        [horizontal ? "x" : "y"]: { beginAtZero: true, ticks: { callback: (v) => fmt(Number(v)) } },
      },
    },
  });
}

export function createUsageView(root: HTMLElement): View {
  const alert = h("p", { class: "error", role: "alert", "data-testid": "usage-error", hidden: true });
  const lookback = h("select", { id: "lookback", "data-testid": "lookback" },
    ...LOOKBACKS.map((v) => h("option", { value: v, selected: v === DEFAULT_LOOKBACK },
      `Last ${v.slice(0, -1)} day${v === "1d" ? "" : "s"}`)));
  const refresh = h("button", { type: "button" }, "Refresh");

  const spendByDate = chartSlot("chart-spend-by-date", "Spend by date (USD)");
  const requestsByDate = chartSlot("chart-requests-by-date", "Requests by date");
  const byModel = chartSlot("chart-by-model", "Spend by model (USD)");
  const byKey = chartSlot("chart-by-key", "Spend by API key (USD)");

  const historyBody = h("tbody");
  const historyTable = h("table", { "data-testid": "usage-history" },
    h("caption", { class: "visually-hidden" }, "Usage history, newest first"),
    h("thead", {}, h("tr", {}, ...["Time", "Model", "SKU", "Units", "Amount", "Currency"].map(
      (c) => h("th", { scope: "col" }, c)))),
    historyBody);
  const prev = h("button", { type: "button", "data-testid": "history-prev", disabled: true }, "← Newer");
  const next = h("button", { type: "button", "data-testid": "history-next", disabled: true }, "Older →");
  const pageLabel = h("span", { class: "muted", "aria-live": "polite" });
  const historyError = h("p", { class: "error", role: "alert", hidden: true });
  const exportButton = h("button", { type: "button", "data-testid": "export-csv" }, "Export CSV");
  const exportStatus = h("p", { class: "muted", role: "status" });

  const content = h("div", { class: "stack" },
    h("section", { "aria-labelledby": "balance-title", class: "card" },
      h("h2", { id: "balance-title" }, "Balance"),
      h("dl", { class: "balances" },
        h("div", {}, h("dt", {}, "USD"), h("dd", { "data-testid": "balance-usd" }, "…")),
        h("div", { "data-testid": "balance-diem-row", hidden: true },
          h("dt", {}, "DIEM"), h("dd", { "data-testid": "balance-diem" })))),
    h("section", { "aria-labelledby": "analytics-title", class: "stack" },
      h("div", { class: "toolbar" },
        h("h2", { id: "analytics-title" }, "Usage analytics"),
        h("div", { class: "actions" }, h("label", { for: "lookback" }, "Period"), lookback, refresh)),
      h("div", { class: "charts" }, spendByDate.figure, requestsByDate.figure, byModel.figure, byKey.figure)),
    h("section", { "aria-labelledby": "history-title", class: "card stack" },
      h("div", { class: "toolbar" },
        h("h2", { id: "history-title" }, "Usage history"), exportButton),
      exportStatus, historyError,
      scrollTable(historyTable, "Usage history"),
      h("div", { class: "pager" }, prev, pageLabel, next)),
  );
  root.replaceChildren(h("h1", { class: "visually-hidden" }, "Usage"), alert, content);

  const slots = [spendByDate, requestsByDate, byModel, byKey];
  let loaded = false;
  // cursors[i] opens page i (undefined: the first page).
  let cursors: (string | undefined)[] = [undefined];
  let page = 0;
  let nextCursor: string | null = null;

  function fail(err: unknown): void {
    showError(alert, err);
    if (err instanceof ApiError && err.adminRequired) content.hidden = true;
  }

  async function loadBalance(): Promise<void> {
    const b = await api.balance();
    byTestId(root, "balance-usd").textContent = fmtUsd(b.balances.usd ?? 0);
    const diemRow = byTestId(root, "balance-diem-row");
    diemRow.hidden = b.balances.diem === null;
    byTestId(root, "balance-diem").textContent = fmtNumber(b.balances.diem);
  }

  async function loadAnalytics(): Promise<void> {
    const a: UsageAnalytics = await api.usageAnalytics(lookback.value);
    const days = [...a.byDate].sort((x, y) => x.date.localeCompare(y.date));
    const labels = days.map((d) => d.date.slice(0, 10));
    draw(spendByDate, "line", labels, days.map((d) => d.USD), "usd", "Spend by date (USD)");
    draw(byModel, "bar", a.byModel.map((m) => m.modelName), a.byModel.map((m) => m.totalUsd),
      "usd", "Spend by model (USD)", true);
    draw(byKey, "bar", a.byKey.map((k) => k.description), a.byKey.map((k) => k.totalUsd),
      "usd", "Spend by API key (USD)", true);
    await loadRequests(labels);
  }

  /** Analytics has no request counts: count distinct requests of the usage history per day. */
  async function loadRequests(days: string[]): Promise<void> {
    const counts = new Map<string, Set<string>>(days.map((d) => [d, new Set<string>()]));
    let cursor: string | undefined;
    let pages = 0;
    do {
      const res = await api.usageHistory(cursor ? { cursor }
        : { pageSize: 1000, startTimestamp: `${days[0]}T00:00:00Z` });
      for (const line of res.data) {
        const id = line.inferenceDetails?.requestId ?? `${line.timestamp}|${modelOfSku(line.sku)}`;
        counts.get(line.timestamp.slice(0, 10))?.add(id);
      }
      cursor = res.nextCursor ?? undefined;
    } while (cursor && ++pages < MAX_WALK_PAGES);
    draw(requestsByDate, "bar", days, days.map((d) => counts.get(d)?.size ?? 0), "count", "Requests by date");
    if (cursor) requestsByDate.note.textContent += ` (first ${MAX_WALK_PAGES * 1000} usage lines only)`;
  }

  function historyRow(r: UsageRecord): HTMLTableRowElement {
    return h("tr", {},
      h("td", { class: "nowrap" }, fmtTime(r.timestamp)),
      h("td", {}, modelOfSku(r.sku)),
      h("td", { class: "mono" }, r.sku),
      h("td", { class: "num" }, fmtNumber(r.units, 6)),
      h("td", { class: "num" }, r.currency === "USD" ? fmtUsd(r.amount) : fmtNumber(r.amount, 6)),
      h("td", {}, r.currency));
  }

  async function loadHistory(): Promise<void> {
    showError(historyError, null);
    prev.disabled = next.disabled = true;
    try {
      const cursor = cursors[page];
      const res = await api.usageHistory(cursor ? { cursor } : { pageSize: HISTORY_PAGE_SIZE });
      nextCursor = res.nextCursor;
      historyBody.replaceChildren(...(res.data.length ? res.data.map(historyRow)
        : [h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No usage yet."))]));
      pageLabel.textContent = `Page ${page + 1}`;
    } catch (err) {
      if (err instanceof ApiError && err.adminRequired) throw err;
      showError(historyError, err);
    } finally {
      prev.disabled = page === 0;
      next.disabled = !nextCursor;
    }
  }

  async function exportCsv(): Promise<void> {
    exportButton.disabled = true;
    exportStatus.textContent = "Preparing CSV…";
    try {
      let csv = "";
      let filename = "billing-usage-history.csv";
      let cursor: string | undefined;
      let pages = 0;
      do {
        const res = await api.usageHistoryCsv(cursor);
        const text = await res.text();
        // Every page repeats the header row: keep the first one only.
        csv += pages === 0 ? text : text.slice(text.indexOf("\n") + 1);
        const disposition = /filename=([^;]+)/.exec(res.headers.get("Content-Disposition") ?? "");
        if (pages === 0 && disposition?.[1]) filename = disposition[1].trim().replace(/"/g, "");
        cursor = res.headers.get("x-next-cursor") ?? undefined;
      } while (cursor && ++pages < MAX_WALK_PAGES);
      const url = URL.createObjectURL(new Blob([csv], { type: "text/csv" }));
      const link = h("a", { href: url, download: filename, hidden: true });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
      const rows = Math.max(0, csv.trimEnd().split("\n").length - 1);
      exportStatus.textContent = `Downloaded ${filename} (${rows} rows${cursor ? `, first ${MAX_WALK_PAGES * 1000} only` : ""}).`;
    } catch (err) {
      exportStatus.textContent = "";
      fail(err);
    } finally {
      exportButton.disabled = false;
    }
  }

  async function load(): Promise<void> {
    root.setAttribute("aria-busy", "true");
    showError(alert, null);
    content.hidden = false;
    const results = await Promise.allSettled([loadBalance(), loadAnalytics(), loadHistory()]);
    const failed = results.find((r): r is PromiseRejectedResult => r.status === "rejected");
    if (failed) fail(failed.reason);
    root.removeAttribute("aria-busy");
  }

  lookback.addEventListener("change", () => {
    root.setAttribute("aria-busy", "true");
    showError(alert, null);
    loadAnalytics().catch(fail).finally(() => root.removeAttribute("aria-busy"));
  });
  refresh.addEventListener("click", () => void load());
  next.addEventListener("click", () => {
    if (!nextCursor) return;
    cursors = cursors.slice(0, page + 1).concat(nextCursor);
    page += 1;
    loadHistory().catch(fail);
  });
  prev.addEventListener("click", () => {
    if (page === 0) return;
    page -= 1;
    loadHistory().catch(fail);
  });
  exportButton.addEventListener("click", () => void exportCsv());

  return {
    show() {
      if (!loaded) {
        loaded = true;
        void load();
      }
    },
    destroy() {
      for (const slot of slots) slot.chart?.destroy();
      root.replaceChildren();
    },
  };
}
