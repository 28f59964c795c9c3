// A phone as operators read it on the Farm and Host pages: its state in one word (ready,
// busy, cleaning, held, offline, cordoned), the facts behind it, the task it runs (its step, for how
// long, who submitted it, and a Watch button), Control (a maintenance Control on a cordoned
// phone or a drained host's), and the buttons that cordon, uncordon or release it.

import { ADMIN_API, call } from "./api.js";
import { elapsed, enumName, h, stepLabel, taskLink, taskWhat } from "./dom.js";
import { refresh } from "./shell.js";

// A device's condition as its host's probes last saw it: `ready` (also when never probed),
// or what holds it (`charging_hold`, `too_hot`, a condition newer than this page, ...).
export const condition = (d) => (d.condition ? enumName("DEVICE_CONDITION_", d.condition) : "ready");

// What holds a phone, in words; a condition this page does not know reads as its own name.
const HELD_AS = {
  charging_hold: "charging", too_hot: "too hot", low_storage: "low on storage",
  unresponsive: "unresponsive", booting: "booting", recovering: "recovering",
  quarantined: "quarantined", offline: "offline",
};
export const heldAs = (c) => HELD_AS[c] || c.replace(/_/g, " ");

// Whether the phone's host gives it work: not when the phone, or its host, is cordoned (a
// drain cordons the host too).
export const takesWork = (host, d) => !host.cordoned && !host.draining && !d.cordoned;

// The phone's state in one word, and why: `offline` (its host is gone, adb does not see it
// as `device`, or its probe finds it offline), `busy` (it runs a task), `cleaning` (its host
// cleans it after a lease: the task it cleans after on hover), `held` (another condition
// keeps it from work), `cordoned` (idle and well, but given no work), `ready`.
export function phoneState(host, d) {
  const adb = enumName("DEVICE_STATE_", d.state);
  const c = condition(d);
  if (!host.connected) return { word: "offline", why: "its host is not connected" };
  if (adb !== "device") return { word: "offline", why: `adb sees it ${adb}` };
  if (d.task_id) return { word: "busy", why: `it runs task ${d.task_id}` };
  if (c === "offline") return { word: "offline", why: d.condition_reason || "its host's probe finds it offline" };
  if (c === "cleaning") return { word: "cleaning", why: d.condition_reason || "its host cleans it after a lease" };
  if (c !== "ready") return { word: "held", why: [heldAs(c), d.condition_reason].filter(Boolean).join(": ") };
  if (!takesWork(host, d)) return { word: "cordoned", why: cordonedWhy(host, d) };
  return { word: "ready", why: "idle, taking work" };
}

function cordonedWhy(host, d) {
  if (d.cordoned) return "the phone is cordoned";
  return host.draining ? "its host is drained" : "its host is cordoned";
}

// The word as a badge (why on hover), and beside it what else is true: cordoned (a busy or
// held phone), its condition (a busy one).
export function stateBadges(host, d) {
  const s = phoneState(host, d);
  const out = [h("span", { class: `badge state s-${s.word}`, title: s.why }, s.word)];
  const c = condition(d);
  if (s.word === "held" || (s.word === "busy" && c !== "ready")) {
    out.push(" ", h("span", { class: `badge s-${c}`, title: d.condition_reason || "" }, heldAs(c)));
  }
  if (s.word !== "cordoned" && s.word !== "offline" && !takesWork(host, d)) {
    out.push(" ", h("span", { class: "badge s-cordoned", title: cordonedWhy(host, d) }, "cordoned"));
  }
  return out;
}

// Android's version of an API level (the phone reports its SDK level).
const ANDROID = {
  21: "5.0", 22: "5.1", 23: "6", 24: "7.0", 25: "7.1", 26: "8.0", 27: "8.1", 28: "9", 29: "10",
  30: "11", 31: "12", 32: "12L", 33: "13", 34: "14", 35: "15", 36: "16",
};
export const android = (sdk) => (sdk ? `Android ${ANDROID[sdk] || "?"} (SDK ${sdk})` : "Android ?");

export function model(d) {
  return [d.model || "unknown model", d.manufacturer ? ` (${d.manufacturer})` : ""].join("");
}

// Battery and heat as the host's probes last read them.
export function health(d) {
  const facts = [];
  if (d.battery_percent !== undefined) facts.push(`${d.battery_percent}%${d.charging ? " charging" : ""}`);
  if (d.temperature_celsius !== undefined) facts.push(`${Math.round(d.temperature_celsius)} °C`);
  return facts.length ? h("div", { class: "health muted" }, facts.join(" · ")) : "";
}

// What a busy phone runs: the task, its step (or what the session is) and for how long,
// who submitted it, and Watch (its Task page, watching the screen at once). `task` is the
// task as ListTasks read it, or undefined when it was not read (then only its link).
export function running(d, task) {
  if (!d.task_id) return "";
  const watch = h("a", { class: "button watch-link", href: `/tasks/${d.task_id}?watch=1`,
                         title: "the task's page, with the phone's screen" }, "Watch");
  if (!task) return h("div", { class: "running" }, h("div", { class: "running-links" }, watch, " ", taskLink(d.task_id)));
  const p = task.progress || {};
  const what = p.running_since ? stepLabel(p.running_index, p.running_name, p.step_count) : taskWhat(task);
  const since = p.running_since || task.updated_at;
  return h("div", { class: "running", "data-task": task.task_id },
    h("div", { class: "running-what" }, what),
    h("div", { class: "muted" }, "for ", h("span", { class: "elapsed", "data-since": since }, elapsed(since)),
      task.submitted_by ? [" · by ", h("b", { class: "submitter" }, task.submitted_by)] : ""),
    h("div", { class: "running-links" }, watch, " ", taskLink(task.task_id)));
}

// Control on a phone that can take it: an idle, online, ready phone of a connected host.
// One that takes work gets an ordinary session; a cordoned one (or a drained host's) a
// maintenance session (the control plane lets only operators open one); a busy or held
// phone none. The control plane checks all of it again.
export function controlLink(host, d) {
  const s = phoneState(host, d);
  if (s.word !== "ready" && s.word !== "cordoned") return "";
  const query = `host_id=${encodeURIComponent(host.host_id)}&serial=${encodeURIComponent(d.serial)}`;
  if (s.word === "ready") {
    return h("a", { class: "button control-link", href: `/control?${query}`, title: `control ${d.serial} from here` }, "Control");
  }
  return h("a", { class: "button control-link maintenance", href: `/control?${query}&maintenance=1`,
                  title: `${s.why}: a maintenance session takes it all the same` }, "Control (maintenance)");
}

// The phones whose operations are open, by host and serial: kept across the page's redraws.
const opened = new Set();

// Cordon or uncordon the phone, or release it from quarantine (or from its recovery
// ladder): the Admin calls `amc devices cordon|uncordon|release` make (operator role), the
// reason recorded with who in its host's events.
export function operations(host, d) {
  const key = `${host.host_id}/${d.serial}`;
  const c = condition(d);
  const releasable = ["quarantined", "recovering"].includes(c);
  const reason = h("input", { name: "reason", placeholder: "reason", size: 14, "aria-label": `${d.serial} reason` });
  const message = h("span", { class: "muted operation-message" });
  const act = async (method, done, button) => {
    button.disabled = true;
    try {
      await call(method, { host_id: host.host_id, serial: d.serial, reason: reason.value }, ADMIN_API);
      message.className = "muted operation-message";
      message.textContent = done;
      reason.value = "";
      refresh();
    } catch (err) {
      message.className = "error-text operation-message";
      message.textContent = `${err.code}: ${err.message}`;
      button.disabled = false;
    }
  };
  const button = (label, method, done) => {
    const b = h("button", { type: "button", class: "small" }, label);
    b.addEventListener("click", () => act(method, done, b));
    return b;
  };
  const buttons = [d.cordoned
    ? button("Uncordon", "UncordonDevice", "uncordoned: it takes work again")
    : button("Cordon", "CordonDevice", "cordoned: no new work; a running task goes on")];
  if (releasable) buttons.push(button("Release", "ReleaseDevice", "released: its host probes it"));
  const details = h("details", { class: `operate${releasable ? " release" : ""}`, open: opened.has(key) || releasable },
    h("summary", {}, releasable ? "Operate · Release" : "Operate"),
    h("form", { class: "inline", onsubmit: (e) => e.preventDefault() }, reason, ...buttons, message));
  details.addEventListener("toggle", () => {
    if (details.open) opened.add(key);
    else opened.delete(key);
  });
  return details;
}
