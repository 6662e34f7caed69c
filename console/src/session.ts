// The API key of this session: in memory and sessionStorage, and in localStorage only when
// "Remember on this device" is checked. Also the sign-in form.

import { api, ApiError, setAuthKey, type RateLimits } from "./api";
import { byTestId, h, showError } from "./dom";

const STORAGE_KEY = "inference-console.api-key";

let current: string | null = null;

function read(storage: Storage): string | null {
  try {
    return storage.getItem(STORAGE_KEY);
  } catch {
    return null; // storage disabled
  }
}

function write(storage: Storage, key: string | null): void {
  try {
    if (key === null) storage.removeItem(STORAGE_KEY);
    else storage.setItem(STORAGE_KEY, key);
  } catch {
    /* storage disabled: memory only */
  }
}

export function currentKey(): string | null {
  return current;
}

/** The key kept by this tab or remembered on this device, if any. */
export function storedKey(): string | null {
  return read(sessionStorage) ?? read(localStorage);
}

/** Sign in again with the key kept by this tab or device; throws when the API refuses it. */
export async function resume(): Promise<boolean> {
  const key = storedKey();
  if (!key) return false;
  try {
    await signIn(key, read(localStorage) === key);
    return true;
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) signOut(); // a refused key is forgotten
    throw err;
  }
}

/** Check a key against the API (any key type may read its own rate limits), then keep it. */
export async function signIn(key: string, remember: boolean): Promise<RateLimits> {
  const limits = await api.rateLimits(key);
  current = key;
  setAuthKey(key);
  write(sessionStorage, key);
  write(localStorage, remember ? key : null);
  return limits;
}

export function signOut(): void {
  current = null;
  setAuthKey(null);
  write(sessionStorage, null);
  write(localStorage, null);
}

/** The sign-in form; calls `onSignedIn` once the API accepted the key. */
export function renderSignIn(root: HTMLElement, onSignedIn: () => void, notice = ""): void {
  const form = h("form", { class: "card sign-in", "aria-labelledby": "sign-in-title", novalidate: true },
    h("h1", { id: "sign-in-title" }, "Sign in"),
    h("p", { class: "muted" }, "Use an API key of your account. ADMIN keys see usage and keys; INFERENCE keys can use the playground."),
    h("label", { for: "api-key" }, "API key"),
    h("input", {
      id: "api-key", name: "api-key", type: "password", "data-testid": "api-key",
      autocomplete: "off", spellcheck: "false", required: true,
    }),
    h("label", { class: "check" },
      h("input", { type: "checkbox", "data-testid": "remember-key", name: "remember" }),
      " Remember on this device"),
    h("p", { class: "error", role: "alert", "data-testid": "sign-in-error", hidden: !notice }, notice),
    h("button", { type: "submit", class: "primary", "data-testid": "sign-in" }, "Sign in"),
  );
  root.replaceChildren(form);
  const input = byTestId<HTMLInputElement>(form, "api-key");
  const remember = byTestId<HTMLInputElement>(form, "remember-key");
  const error = byTestId(form, "sign-in-error");
  const button = byTestId<HTMLButtonElement>(form, "sign-in");
  input.focus();

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (!key) {
      showError(error, new Error("Enter an API key."));
      input.focus();
      return;
    }
    button.disabled = true;
    form.setAttribute("aria-busy", "true");
    try {
      await signIn(key, remember.checked);
      input.value = "";
      onSignedIn();
    } catch (err) {
      showError(error, err);
      input.focus();
    } finally {
      button.disabled = false;
      form.removeAttribute("aria-busy");
    }
  });
}
