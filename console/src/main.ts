// Entry point: sign-in, hash routing between the three views, sign-out.

import "./style.css";
import { errorText, type View } from "./dom";
import { createKeysView } from "./keys";
import { createPlaygroundView } from "./playground";
import { renderSignIn, resume, signOut } from "./session";
import { createUsageView } from "./usage";

const ROUTES = {
  usage: { title: "Usage", create: createUsageView },
  keys: { title: "API keys", create: createKeysView },
  playground: { title: "Playground", create: createPlaygroundView },
} as const;
type Route = keyof typeof ROUTES;
const DEFAULT_ROUTE: Route = "usage";

const signInRoot = document.getElementById("sign-in-root")!;
const main = document.getElementById("main")!;
const views = new Map<Route, View>();
let signedIn = false;

function isRoute(name: string): name is Route {
  return Object.hasOwn(ROUTES, name);
}

function section(route: Route): HTMLElement {
  return document.getElementById(`view-${route}`)!;
}

function setSignedIn(value: boolean): void {
  signedIn = value;
  for (const el of document.querySelectorAll<HTMLElement>("[data-signed-in]")) el.hidden = !value;
  signInRoot.hidden = value;
}

/** Show the view named by the hash (an unknown hash, such as #main, leaves the view as it is). */
function route(moveFocus: boolean): void {
  if (!signedIn) return;
  const name = location.hash.slice(1);
  const current = [...views.keys()].find((r) => !section(r).hidden);
  const target: Route = isRoute(name) ? name : current ?? DEFAULT_ROUTE;
  for (const r of Object.keys(ROUTES) as Route[]) section(r).hidden = r !== target;
  for (const link of document.querySelectorAll<HTMLAnchorElement>("nav a")) {
    if (link.hash === `#${target}`) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `${ROUTES[target].title} · Inference console`;
  let view = views.get(target);
  if (!view) {
    view = ROUTES[target].create(section(target));
    views.set(target, view);
  }
  view.show();
  if (moveFocus) section(target).focus();
}

function enter(): void {
  setSignedIn(true);
  route(false);
}

function leave(notice = ""): void {
  for (const view of views.values()) view.destroy();
  views.clear();
  for (const r of Object.keys(ROUTES) as Route[]) section(r).hidden = true;
  setSignedIn(false);
  document.title = "Sign in · Inference console";
  renderSignIn(signInRoot, enter, notice);
}

document.querySelector<HTMLButtonElement>('[data-testid="sign-out"]')!.addEventListener("click", () => {
  signOut();
  leave();
});

document.querySelector<HTMLAnchorElement>("[data-skip]")!.addEventListener("click", (event) => {
  event.preventDefault(); // keep the hash for the router
  main.focus();
});

window.addEventListener("hashchange", () => route(true));

resume().then(
  (ok) => (ok ? enter() : leave()),
  (err: unknown) => leave(`Your saved key could not be used: ${errorText(err)}`),
);
