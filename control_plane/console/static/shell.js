// The page around the views: which view the path names, reading and redrawing it when
// the event stream says something it shows changed, the sign-in form, the token in the
// header, and errors. A view is {nav, title(params), load(params), render(data, params),
// wants(kind, data, params), every?, leave?} (leave: what stops when it is left); console.js
// names them (`start`).

import { ApiError, TOKEN_KEY } from "./api.js";
import { forgetArtifacts } from "./artifacts.js";
import { h, main } from "./dom.js";
import { listen, setLive, stopLive } from "./events.js";
import { disableActions, isOffline, setOffline } from "./offline.js";

export function showError(err) {
  const page = main();
  if (err.status === 401) return showLogin(err.message);
  if (err.status === 403) {
    page.replaceChildren(h("div", { class: "refusal", role: "alert" },
      h("b", {}, "Refused"), err.message,
      h("p", { class: "muted" }, "Your token's role cannot see this page.")));
    return;
  }
  page.replaceChildren(h("div", { class: "error", role: "alert" },
    h("b", {}, err.code ? `${err.code}: ` : ""), err.message));
}

export function showLogin(reason) {
  stopLive();
  setLive("idle");
  const input = h("input", { type: "password", id: "token", autocomplete: "off",
                             placeholder: "amc_…", "aria-label": "token" });
  const form = h("form", { class: "login", onsubmit: (event) => {
    event.preventDefault();
    if (!input.value.trim()) return;
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    route();
  } },
  h("h1", {}, "Sign in"),
  sessionStorage.getItem(TOKEN_KEY) ? h("p", { class: "error" }, reason) : null,
  h("p", {}, "This control plane needs a token: an operator token, or a client token ",
    "(tasks only; no Farm or Queue page). It is kept for this browser tab's session."),
  input, h("button", { type: "submit" }, "Use token"));
  main().replaceChildren(form);
  input.focus();
}

function renderWho() {
  const who = document.getElementById("who");
  const token = sessionStorage.getItem(TOKEN_KEY);
  who.replaceChildren();
  if (!token) return;
  who.append(`token ${token.slice(0, 12)}…`, h("button", { class: "plain", onclick: () => {
    sessionStorage.removeItem(TOKEN_KEY);
    route();
  } }, "forget"));
}

// -- routing and refreshing ------------------------------------------------------------------

let current = null;
// The view has drawn its data (not only "loading…" or an error) since it was routed to.
let shown = false;
let loading = false;
let again = false;
let timer = null;
// A view with `every` (ms) is also re-read that often while it is shown.
let poll = null;
// path -> [view, params] or [null, {}]; and what stops when a page is left (start).
let match = () => [null, {}];
let leave = () => {};

// A form that sends one call with the reason typed in it: its button off while the call
// runs; then what `send` answers in `message` and the page read again, or the call's
// error (the button on again, to retry).
export function reasonForm(attrs, { reason, button, message }, send) {
  const say = (text, failed) => {
    message.textContent = text;
    message.classList.toggle("error-text", failed);
    message.classList.toggle("muted", !failed);
  };
  return h("form", { ...attrs, onsubmit: async (event) => {
    event.preventDefault();
    button.disabled = true;
    try {
      say(await send(reason.value), false);
      refresh();
    } catch (err) {
      say(`${err.code}: ${err.message}`, true);
      button.disabled = false;
    }
  } }, reason, button, message);
}

export async function refresh() {
  if (!current) return;
  if (loading) { again = true; return; }
  loading = true;
  const [view, params] = current;
  try {
    const data = await view.load(params);
    if (current && current[0] === view) redraw(view.render(data, params).filter(Boolean));
  } catch (err) {
    // Nobody answered: what the page shows stays, greyed out (offline.js), unless it has
    // nothing to show yet.
    if (err instanceof ApiError && err.status === 0 && shown) setOffline(true);
    else if (err instanceof ApiError) showError(err);
    else showError(new ApiError(0, "INTERNAL", err.message));
  } finally {
    // The indicator follows the event stream, whatever this page's read said (a task
    // not found is an answer from a live control plane); signed out, there is none.
    if (!liveStarted && !document.getElementById("token")) startLive();
    loading = false;
    if (again) { again = false; refresh(); }
  }
}

// An input's identity across redraws: its name and its label (a page may have several
// inputs of one name, e.g. the Host page's reason for the host and one per released phone).
function inputKey(el) {
  return `${el.name}\u0000${el.getAttribute("aria-label") || ""}`;
}

function redraw(nodes) {
  // What someone is typing survives a live update, in the input it was typed in.
  const typed = new Map();
  for (const el of main().querySelectorAll("input[name]")) {
    if (el.type === "checkbox") {
      if (el.checked !== el.hasAttribute("checked")) typed.set(inputKey(el), el.checked);
    } else if (el.value !== (el.getAttribute("value") || "")) {
      typed.set(inputKey(el), el.value);
    }
  }
  const active = document.activeElement;
  const focused = active && active.name && main().contains(active) ? inputKey(active) : null;
  main().replaceChildren(...nodes);
  shown = true;
  for (const el of main().querySelectorAll("input[name]")) {
    const key = inputKey(el);
    if (typed.has(key) && el.type === "checkbox") el.checked = typed.get(key);
    else if (typed.has(key)) el.value = typed.get(key);
    if (key === focused) el.focus();
  }
  if (isOffline()) disableActions();
}

function soon() {
  // Changes come in bursts: one re-read for all of them.
  clearTimeout(timer);
  timer = setTimeout(refresh, 200);
}

let liveStarted = false;

function startLive() {
  liveStarted = true;
  listen((kind, data) => {
    if (current && current[0].wants(kind, data, current[1])) soon();
  }, soon);
}

export function route() {
  const [view, params] = match(location.pathname);
  renderWho();
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", view !== null && a.dataset.nav === view.nav);
  }
  if (!view) {
    main().replaceChildren(h("div", { class: "error" }, `Nothing at ${location.pathname}.`));
    return;
  }
  document.title = `${view.title(params)} · AMC`;
  if (!current || current[0] !== view || current[1].id !== params.id) {
    forgetArtifacts();
    leave();
    if (current && current[0].leave) current[0].leave();
  }
  current = [view, params];
  liveStarted = false;
  stopLive();
  clearInterval(poll);
  poll = view.every ? setInterval(() => { if (current && current[0] === view) refresh(); }, view.every) : null;
  main().replaceChildren(h("p", { class: "muted" }, "loading…"));
  shown = false;
  refresh();
}

// `views(path)`: the view the path names and its params; `onLeave()`: stop what a page
// left behind (its screens).
export function start(views, onLeave) {
  match = views;
  leave = onLeave;
  window.addEventListener("popstate", route);
  window.addEventListener("DOMContentLoaded", route);
}
