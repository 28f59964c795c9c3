// The Control page's keys: its buttons (the phone's Back, Home, App switch, Power, the
// volume, a quarter turn either way) and the computer's own keyboard while the phone's
// screen has the focus: characters typed go as text (a burst of them as one `type`
// action), and Enter, Backspace, Delete, Tab, the arrows, Home and End as the phone's keys,
// Escape as Back. Shortcuts with Ctrl, Alt or Meta are left to the browser.

import { h } from "./dom.js";

// [label, message] of the buttons, in two rows: the navigation keys, then the hardware ones.
export const NAVIGATION = [["Back", { key: "BACK" }], ["Home", { key: "HOME" }], ["App switch", { key: "APP_SWITCH" }]];
export const HARDWARE = [
  ["Power", { key: "POWER" }], ["Volume −", { key: "VOLUME_DOWN" }], ["Volume +", { key: "VOLUME_UP" }],
  ["Rotate ⟲", { rotate: "left" }], ["Rotate ⟳", { rotate: "right" }],
];

// The computer's keys that are the phone's keys (control_plane/console/control.py's KEYS).
const KEYS = {
  Enter: "ENTER", Backspace: "DEL", Delete: "FORWARD_DEL", Tab: "TAB", Escape: "BACK",
  ArrowUp: "DPAD_UP", ArrowDown: "DPAD_DOWN", ArrowLeft: "DPAD_LEFT", ArrowRight: "DPAD_RIGHT",
  Home: "MOVE_HOME", End: "MOVE_END",
};
// Characters typed within this long of each other go as one `type` action.
const BURST_MS = 150;

// A button per [label, message] of `keys`, each sending its message.
export function keyButtons(keys, send, control) {
  return keys.map(([label, message]) => control(h("button", {
    type: "button", class: "key", "data-key": message.key || `rotate-${message.rotate}`,
    onclick: () => send(message),
  }, label)));
}

// The keyboard on `el` (the phone's screen, focusable): each key as the phone's, in order.
export function listenKeys(el, send) {
  let typed = "";
  let timer = null;
  const flush = () => {
    clearTimeout(timer);
    timer = null;
    if (typed) send({ type: { text: typed } });
    typed = "";
  };
  el.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.altKey || event.metaKey || event.isComposing) return;
    if (event.key.length === 1) {
      typed += event.key;
      clearTimeout(timer);
      timer = setTimeout(flush, BURST_MS);
    } else if (KEYS[event.key]) {
      flush();
      send({ key: KEYS[event.key] });
    } else {
      return;
    }
    event.preventDefault();
  });
  el.addEventListener("blur", flush);
}
