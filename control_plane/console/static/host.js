// The Host page (/hosts/<id>): its phones as the Farm page shows them (farm.js), its
// latest tasks, its operator events, and the buttons that cordon, drain or uncordon it.

import { ADMIN_API, call } from "./api.js";
import { badge, h, labels, statusOf, table, taskLink, when } from "./dom.js";
import { connection, hostWork, phoneCard, runningTasks, watchThumbnails } from "./farm.js";
import { thumbnails } from "./thumbnails.js";
import { refresh } from "./shell.js";

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
    const running = got.host ? await runningTasks([got.host]) : new Map();
    return { host: got.host, events: got.events || [], tasks: tasks.tasks || [], running };
  },
  render({ host, events, tasks, running }, params) {
    if (!host) return [h("div", { class: "error", role: "alert" }, `NOT_FOUND: no host ${params.id} has registered`)];
    watchThumbnails([host]);
    return [
      h("h1", {}, "Host ", host.host_id, " ", connection(host), " ", hostWork(host)),
      hostOperations(host),
      h("dl", { class: "grid" }, h("dt", {}, "labels"), h("dd", {}, labels(host.labels)),
        h("dt", {}, "last seen"), h("dd", {}, when(host.last_seen_at))),
      h("h2", {}, "Phones"),
      (host.devices || []).length
        ? h("div", { class: "phones" }, host.devices.map((d) => phoneCard(host, d, running)))
        : h("p", { class: "muted" }, "No phone attached."),
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
  leave: () => thumbnails.stop(),
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
