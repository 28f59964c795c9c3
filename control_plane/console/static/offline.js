// Offline: the control plane cannot be reached (the event stream lost it, or a read found
// nobody answering). The page keeps what it last showed, greyed out and with every action
// off (buttons, inputs, the links that act), under a banner saying since when; it turns
// live again by itself once the event stream is back, and the page is read again.

import { age, when } from "./dom.js";

let since = null;
let ticker = null;

export const isOffline = () => since !== null;

// Turn offline on (kept from the first time it was seen) or off.
export function setOffline(on) {
  if (on === isOffline()) return;
  since = on ? new Date() : null;
  document.body.classList.toggle("offline", on);
  clearInterval(ticker);
  ticker = on ? setInterval(say, 1000) : null;
  say();
  if (on) disableActions();
  else enableActions();
}

function say() {
  const banner = document.getElementById("offline");
  banner.hidden = !isOffline();
  if (!isOffline()) return;
  const at = since.toISOString();
  banner.textContent = `Offline: the control plane has not answered since ${when(at)} (${age(at)} ago). ` +
    "What this page shows is as of then, and its actions are off until it is back.";
}

// Every control of the page off, marked so that coming back turns on only those.
export function disableActions(root = document.getElementById("page")) {
  if (!isOffline()) return;
  for (const el of root.querySelectorAll("button, input, select, textarea")) {
    if (el.disabled) continue;
    el.disabled = true;
    el.dataset.offline = "";
  }
}

function enableActions() {
  for (const el of document.querySelectorAll("[data-offline]")) {
    el.disabled = false;
    delete el.dataset.offline;
  }
}
