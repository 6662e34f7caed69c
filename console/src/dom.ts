// Small DOM and formatting helpers shared by the views.

import { ApiError } from "./api";

/** A view of the console: loads on first `show()`, torn down on sign-out. */
export interface View {
  show(): void;
  destroy(): void;
}

type Attrs = Record<string, string | number | boolean | undefined | null>;
type Child = Node | string | number | null | undefined | false;

/** Create an element: attributes (`false`/`null`/`undefined` are left out), then children. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K, attrs: Attrs = {}, ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === false || value === null || value === undefined) continue;
    el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, ...children);
  return el;
}

export function append(parent: Node, ...children: Child[]): void {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    parent.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Find a required element inside `root` by its data-testid. */
export function byTestId<T extends HTMLElement = HTMLElement>(root: ParentNode, id: string): T {
  const el = root.querySelector<T>(`[data-testid="${id}"]`);
  if (!el) throw new Error(`missing element ${id}`);
  return el;
}

/** Show an error (or clear it with null) in a role=alert element. */
export function showError(el: HTMLElement, err: unknown): void {
  el.textContent = err === null ? "" : errorText(err);
  el.hidden = err === null;
}

export function errorText(err: unknown): string {
  if (err instanceof ApiError) {
    if (err.adminRequired) return "This view needs an ADMIN API key: the key you signed in with is an INFERENCE key (the API answered 401 “Admin API key required”).";
    const code = err.code ? ` (${err.code})` : "";
    return err.status ? `${err.status}: ${err.message}${code}` : err.message;
  }
  return err instanceof Error ? err.message : String(err);
}

const usdFmt = new Intl.NumberFormat("en-US", { style: "currency", currency: "USD", maximumFractionDigits: 2 });
const smallUsdFmt = new Intl.NumberFormat("en-US", { style: "currency", currency: "USD", maximumFractionDigits: 6 });

export function fmtUsd(value: number | null | undefined): string {
  if (value === null || value === undefined) return "—";
  return Math.abs(value) < 1 && value !== 0 ? smallUsdFmt.format(value) : usdFmt.format(value);
}

export function fmtNumber(value: number | null | undefined, digits = 4): string {
  if (value === null || value === undefined) return "—";
  return value.toLocaleString("en-US", { maximumFractionDigits: digits });
}

/** A date-time as `YYYY-MM-DD HH:MM` UTC (what the API stores), or "—". */
export function fmtTime(iso: string | null | undefined): string {
  if (!iso) return "—";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toISOString().slice(0, 16).replace("T", " ") + " UTC";
}

export function fmtDate(iso: string | null | undefined): string {
  return iso ? iso.slice(0, 10) : "—";
}

/** Sum with the float noise removed, for `data-total`. */
export function total(values: number[]): number {
  return Number(values.reduce((a, b) => a + b, 0).toFixed(9));
}

/** Wrap a table so it scrolls sideways on narrow screens. */
export function scrollTable(table: HTMLTableElement, label: string): HTMLDivElement {
  return h("div", { class: "table-scroll", role: "region", "aria-label": label, tabindex: 0 }, table);
}
