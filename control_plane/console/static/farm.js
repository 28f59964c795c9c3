// The Farm page (hosts -> phones, counts) and the Host page (/hosts/<id>: its phones, its
// latest tasks, its operator events, and the buttons that cordon, drain, uncordon it or
// release a phone); both offer Control on an idle ready phone.

import { ADMIN_API, call } from "./api.js";
import {
  badge, counts, enumName, h, hostLink, labels, statusOf, table, taskLink, when,
} from "./dom.js";
import { reasonForm, refresh } from "./shell.js";

export const Farm = {
  nav: "farm",
  title: () => "Farm",
  load: () => call("ListHosts", {}),
  render({ hosts = [] }) {
    const devices = hosts.flatMap((host) => host.devices || []);
    const online = devices.filter((d) => enumName("DEVICE_STATE_", d.state) === "device");
    const busy = devices.filter((d) => d.task_id);
    // A phone takes no new work when it is cordoned itself or its host is (or drains).
    const cordoned = hosts.flatMap((host) =>
      (host.devices || []).filter((d) => d.cordoned || host.cordoned || host.draining));
    // Online but held by its condition (charging, too hot, ...): its host's probes say so.
    const held = online.filter((d) => condition(d) !== "ready");
    const rows = [];
    for (const host of hosts) {
      rows.push(h("tr", { class: "host-row", "data-host": host.host_id },
        h("td", {}, hostLink(host.host_id)),
        h("td", { class: "host-state" }, connection(host), hostWork(host) ? [" ", hostWork(host)] : "",
          h("div", { class: "seen muted" }, `last seen ${when(host.last_seen_at)}`)),
        h("td", { colspan: 3 }, labels(host.labels)),
        h("td", { colspan: 2 }, "")));
      for (const d of host.devices || []) rows.push(deviceRow(d, controlLink(host, d)));
    }
    return [
      h("h1", {}, "Farm"),
      counts([
        ["hosts connected", `${hosts.filter((x) => x.connected).length} / ${hosts.length}`, "hosts-connected"],
        ["devices online", online.length, "devices-online"],
        ["busy", busy.length, "devices-busy"],
        ["hosts cordoned", hosts.filter((x) => x.cordoned).length, "hosts-cordoned"],
        ["devices cordoned", cordoned.length, "devices-cordoned"],
        ["devices held", held.length, "devices-held"],
        ["offline / other", devices.length - online.length, "devices-offline"],
      ]),
      hosts.length
        ? table(["host / device", "state", "model", "sdk", "labels", "task", ""], rows, { class: "devices" })
        : h("p", { class: "muted" }, "No host has registered yet."),
    ];
  },
  wants: (kind) => kind === "task" || kind === "host" || kind === "resync",
};

// Whether a host takes work: a `draining` or `cordoned` badge (amc hosts drain / cordon).
function hostWork(host) {
  if (host.draining) return badge("draining");
  if (host.cordoned) return badge("cordoned");
  return "";
}

// A badge that says what it means on its own: `connected` or `disconnected`.
const connection = (host) => badge(host.connected ? "connected" : "disconnected");

// A device's condition as its host's probes last saw it: `ready` (also when never probed),
// or what holds it (`charging_hold`, `too_hot`, `unresponsive`, ...).
const condition = (d) => (d.condition ? enumName("DEVICE_CONDITION_", d.condition) : "ready");

// Its condition's badge (none when ready; the reason on hover) and the facts behind it.
function health(d) {
  const cond = condition(d);
  const facts = [];
  if (d.battery_percent !== undefined) facts.push(`${d.battery_percent}%${d.charging ? " charging" : ""}`);
  if (d.temperature_celsius !== undefined) facts.push(`${Math.round(d.temperature_celsius)} °C`);
  const shown = [];
  if (cond !== "ready") shown.push(" ", h("span", { class: `badge s-${cond}`, title: d.condition_reason || "" }, cond));
  if (facts.length) shown.push(h("div", { class: "health muted" }, facts.join(" · ")));
  return shown;
}

// `action`: what the row's last cell offers (the Host page's Release for a quarantined phone).
function deviceRow(d, action = "") {
  const state = enumName("DEVICE_STATE_", d.state);
  return h("tr", { "data-serial": d.serial },
    h("td", { class: "serial" }, d.serial),
    h("td", {}, badge(state), d.cordoned ? [" ", badge("cordoned")] : "", health(d)),
    h("td", {}, d.model || "-", d.manufacturer ? h("span", { class: "muted" }, ` (${d.manufacturer})`) : ""),
    h("td", {}, d.sdk || "-"),
    h("td", {}, labels(d.labels)),
    h("td", {}, d.task_id ? taskLink(d.task_id) : h("span", { class: "muted" }, "idle")),
    h("td", {}, action));
}

// The Farm and Host pages' "Control" on an idle ready phone of a connected host that takes
// work (operators only see those pages); the control plane checks all of it again.
function controlLink(host, d) {
  const free = host.connected && !host.cordoned && !host.draining && !d.cordoned && !d.task_id &&
    enumName("DEVICE_STATE_", d.state) === "device" && condition(d) === "ready";
  if (!free) return "";
  const query = `host_id=${encodeURIComponent(host.host_id)}&serial=${encodeURIComponent(d.serial)}`;
  return h("a", { class: "button control-link", href: `/control?${query}`, title: `control ${d.serial} from here` }, "Control");
}

// Release a quarantined phone (or one its recovery ladder is on): Admin ReleaseDevice, as
// `amc devices release` (operator role), the reason recorded in the host's events. Its host
// then probes it and reports its condition.
function releaseForm(host, d) {
  if (!["quarantined", "recovering"].includes(condition(d))) return "";
  const reason = h("input", { name: "reason", placeholder: "reason", "aria-label": `release ${d.serial} reason`, size: 16 });
  const message = h("span", { class: "muted release-message" });
  const button = h("button", { type: "submit" }, "Release");
  return reasonForm({ class: "inline release" }, { reason, button, message }, async (why) => {
    await call("ReleaseDevice", { host_id: host.host_id, serial: d.serial, reason: why }, ADMIN_API);
    return "released: its host probes it";
  });
}

export const Host = {
  nav: "farm",
  title: (params) => `Host ${params.id}`,
  async load(params) {
    const [got, tasks] = await Promise.all([
      call("GetHost", { host_id: params.id, events: 20 }, ADMIN_API).catch((err) => {
        if (err.code === "NOT_FOUND") return {};
        throw err;
      }),
      call("ListTasks", { host_id: params.id, page_size: 20 }),
    ]);
    return { host: got.host, events: got.events || [], tasks: tasks.tasks || [] };
  },
  render({ host, events, tasks }, params) {
    if (!host) return [h("div", { class: "error", role: "alert" }, `NOT_FOUND: no host ${params.id} has registered`)];
    return [
      h("h1", {}, "Host ", host.host_id, " ", connection(host), " ", hostWork(host)),
      hostOperations(host),
      h("dl", { class: "grid" }, h("dt", {}, "labels"), h("dd", {}, labels(host.labels)),
        h("dt", {}, "last seen"), h("dd", {}, when(host.last_seen_at))),
      h("h2", {}, "Devices"),
      table(["device", "state", "model", "sdk", "labels", "task", ""], (host.devices || []).map((d) => deviceRow(d, [releaseForm(host, d), controlLink(host, d)])), { class: "devices" }),
      h("h2", {}, "Latest tasks here"),
      tasks.length ? table(["task", "status", "device", "created"], tasks.map((t) => h("tr", {},
        h("td", { class: "id" }, taskLink(t.task_id)), h("td", {}, badge(statusOf(t))),
        h("td", { class: "serial" }, t.device_serial), h("td", {}, when(t.created_at)))))
        : h("p", { class: "muted" }, "No task has run here."),
      h("h2", {}, "Operator events"),
      events.length ? table(["when", "what", "device", "by", "reason"], events.map((e) => h("tr", { class: "host-event" },
        h("td", {}, when(e.at)), h("td", {}, badge(e.kind)), h("td", { class: "serial" }, e.serial || "-"),
        h("td", {}, e.actor_name ? `${e.actor_name} (${e.actor})` : e.actor), h("td", {}, e.reason || "-"))))
        : h("p", { class: "muted" }, "No operator has cordoned, drained, uncordoned or released it."),
    ];
  },
  wants: (kind, data, params) => kind === "task" || (kind === "host" && data === params.id) || kind === "resync",
};

// Cordon, drain or uncordon the host: the Admin calls `amc hosts cordon|drain|uncordon`
// make (operator role), with the reason recorded in the host's events.
function hostOperations(host) {
  const reason = h("input", { name: "reason", placeholder: "reason", "aria-label": "reason", size: 32 });
  const message = h("span", { class: "muted", id: "host-operation-message" });
  const operate = async (method, done) => {
    for (const b of form.querySelectorAll("button")) b.disabled = true;
    try {
      const answer = await call(method, { host_id: host.host_id, reason: reason.value }, ADMIN_API);
      message.className = "muted";
      message.textContent = `${done}; ${answer.leases || 0} task(s) running`;
      reason.value = "";
      refresh();
    } catch (err) {
      message.className = "error-text";
      message.textContent = `${err.code}: ${err.message}`;
      for (const b of form.querySelectorAll("button")) b.disabled = false;
    }
  };
  const button = (label, method, done, cls) =>
    h("button", { type: "button", class: cls || "", onclick: () => operate(method, done) }, label);
  const buttons = [];
  if (!host.cordoned) buttons.push(button("Cordon", "CordonHost", "cordoned: no new work"));
  if (!host.draining) buttons.push(button("Drain", "DrainHost", "draining: running tasks finish, no new work", "danger"));
  if (host.cordoned || host.draining) buttons.push(button("Uncordon", "UncordonHost", "uncordoned: takes work again"));
  const form = h("form", { class: "inline", id: "host-operations", onsubmit: (e) => e.preventDefault() },
    reason, ...buttons, message);
  return form;
}
