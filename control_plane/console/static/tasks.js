// The Tasks page (filtered by status, host, selector label and text; paged) and the Task
// page (/tasks/<id>: spec, progress, attempts, events, step results with the files the
// steps kept, the screen recording, Watch screen, the Log tab (log.js) and a Cancel button
// with a reason).

import { STATUSES, TERMINAL, ApiError, call } from "./api.js";
import { artifactView, keptFiles, recordingSection } from "./artifacts.js";
import {
  badge, elapsed, enumName, h, hostLink, labels, span, statusOf, stepNumber, table, taskDuration,
  taskLink, taskWhat, taskWhy, took, when,
} from "./dom.js";
import { logTab } from "./log.js";
import { watchPanel } from "./screen.js";
import { reasonForm, refresh, route } from "./shell.js";

export const Tasks = {
  nav: "tasks",
  title: () => "Tasks",
  tokens: [""],
  filters() {
    const q = new URLSearchParams(location.search);
    return { status: q.get("status") || "", host: q.get("host") || "",
             label: q.get("label") || "", text: q.get("q") || "" };
  },
  async load() {
    const f = this.filters();
    const request = { page_size: 50, page_token: this.tokens[this.tokens.length - 1] };
    if (f.status) request.statuses = [`TASK_STATUS_${f.status.toUpperCase()}`];
    if (f.host) request.host_id = f.host;
    if (f.text) request.text = f.text;
    if (f.label) {
      const at = f.label.indexOf("=");
      if (at < 1) throw new ApiError(400, "INVALID_ARGUMENT", "label: write it as key=value");
      request.selector_labels = { [f.label.slice(0, at)]: f.label.slice(at + 1) };
    }
    return call("ListTasks", request);
  },
  render(data) {
    const f = this.filters();
    const field = (name, value, placeholder) =>
      h("input", { name, value, placeholder, "aria-label": placeholder });
    const form = h("form", { class: "inline", onsubmit: (event) => {
      event.preventDefault();
      const q = new URLSearchParams();
      for (const [k, v] of new FormData(event.target)) if (v) q.set(k, v);
      history.pushState(null, "", `/tasks${q.size ? `?${q}` : ""}`);
      this.tokens = [""];
      route();
    } },
    h("select", { name: "status", "aria-label": "status" },
      h("option", { value: "" }, "any status"),
      STATUSES.map((s) => h("option", { value: s, selected: s === f.status }, s))),
    field("host", f.host, "host"), field("label", f.label, "label key=value"),
    h("input", { name: "q", value: f.text, placeholder: "id, request id or metadata", size: 30,
                 "aria-label": "id, request id or metadata" }),
    h("button", { type: "submit" }, "Filter"));
    const tasks = data.tasks || [];
    const rows = tasks.map((t) => h("tr", { "data-task": t.task_id },
      h("td", { class: "id" }, taskLink(t.task_id)),
      h("td", { class: "status" }, badge(statusOf(t))),
      h("td", {}, `${t.attempt}/${t.max_attempts}`),
      h("td", {}, t.priority),
      h("td", { class: "what" }, taskWhat(t)),
      h("td", { class: "submitter" }, t.submitted_by || "-"),
      h("td", {}, t.host_id ? [hostLink(t.host_id), ` / ${t.device_serial}`] : "-"),
      h("td", { class: "created" }, when(t.created_at)),
      h("td", { class: "duration" }, TERMINAL.has(statusOf(t))
        ? taskDuration(t) : h("span", { class: "elapsed", "data-since": t.created_at }, taskDuration(t))),
      h("td", { class: `why ${statusOf(t) === "failed" ? "error-text" : ""}` }, taskWhy(t))));
    const pager = h("div", { class: "pager" },
      this.tokens.length > 1 ? h("button", { class: "plain", onclick: () => { this.tokens.pop(); refresh(); } }, "← newer") : null,
      data.next_page_token ? h("button", { class: "plain", onclick: () => { this.tokens.push(data.next_page_token); refresh(); } }, "older →") : null);
    return [
      h("h1", {}, "Tasks"), form,
      tasks.length ? table(["task", "status", "attempt", "priority", "what", "submitted by", "where", "created", "duration", "reason / error"], rows, { class: "tasks" })
                   : h("p", { class: "muted" }, "No task matches."),
      pager,
    ];
  },
  wants: (kind) => kind === "task" || kind === "resync",
};

export const Task = {
  nav: "tasks",
  title: (params) => `Task ${params.id}`,
  async load(params) {
    const [task, history] = await Promise.all([
      call("GetTask", { task_id: params.id }),
      call("ListTaskEvents", { task_id: params.id, page_size: 1000 }),
    ]);
    return { task, history };
  },
  render({ task, history }, params) {
    const status = statusOf(task);
    // A field with nothing to say is left out (a finished task has no `waiting`, a task
    // never cancelled no `cancel`), as `amc get` leaves it out.
    const grid = h("dl", { class: "grid" },
      ...[
        ["status", [badge(status), task.attempt ? ` attempt ${task.attempt} of ${task.max_attempts}` : ""]],
        ["waiting", task.pending_reason || null],
        ["progress", !TERMINAL.has(status) && task.progress ? progressText(task.progress) : null],
        ["what", taskWhat(task)],
        ["submitted by", task.submitted_by || null],
        ["where", task.host_id ? [hostLink(task.host_id), ` / ${task.device_serial}`] : null],
        ["selector", task.selector_text],
        ["priority", task.priority],
        ["queue timeout", task.queue_timeout ? span(task.queue_timeout) : null],
        ["deadline", task.deadline ? `${span(task.deadline)} per attempt` : null],
        ["request id", task.request_id || null],
        ["metadata", Object.keys(task.metadata || {}).length ? labels(task.metadata) : null],
        ["created", when(task.created_at)],
        ["updated", when(task.updated_at)],
        ["finished", task.finished_at ? when(task.finished_at) : null],
        ["cancel", task.cancel_requested_at ? `requested ${when(task.cancel_requested_at)}${task.cancel_reason ? `: ${task.cancel_reason}` : ""}` : null],
        ["error", task.result && task.result.error ? h("span", { class: "error-text" }, task.result.error) : null],
      ].filter(([, v]) => v !== null)
        .flatMap(([k, v]) => [h("dt", {}, k), h("dd", { "data-field": k }, v)]));
    const cancel = TERMINAL.has(status) ? null : cancelForm(task);
    const attempts = (history.attempts || []).map((a) => h("tr", {},
      h("td", {}, a.attempt), h("td", {}, hostLink(a.host_id)), h("td", { class: "serial" }, a.device_serial),
      h("td", { class: "mono" }, a.lease_id), h("td", {}, when(a.created_at)),
      h("td", {}, when(a.acknowledged_at)), h("td", {}, when(a.ended_at)),
      h("td", {}, badge(enumName("ATTEMPT_STATE_", a.state)))));
    const events = (history.events || []).map((e) => h("tr", {},
      h("td", {}, when(e.at)), h("td", {}, e.attempt || "-"), h("td", {}, e.kind),
      h("td", {}, e.from_status !== "TASK_STATUS_UNSPECIFIED" ? enumName("TASK_STATUS_", e.from_status) : "-"),
      h("td", {}, e.to_status !== "TASK_STATUS_UNSPECIFIED" ? badge(enumName("TASK_STATUS_", e.to_status)) : "-"),
      h("td", {}, e.detail || "")));
    // A running task's steps so far (its host reports each as it ends) and the step it
    // runs now, whose time ticks; once it ends, its result is the record.
    const progress = !TERMINAL.has(status) && task.progress ? task.progress : null;
    const done = progress ? progress.steps || [] : (task.result && task.result.steps) || [];
    const steps = done.map((s) => h("tr", {},
      h("td", {}, stepNumber(s.index)), h("td", {}, s.name), h("td", {}, badge(enumName("STEP_STATUS_", s.status))),
      h("td", {}, took(s.duration)),
      h("td", {}, s.output ? h("pre", {}, s.output) : "", s.error ? h("pre", { class: "error-text" }, s.error) : "",
        (s.warnings || []).map((w) => h("div", { class: "step-warning" }, `warning: ${w}`)),
        Object.keys(s.data || {}).length ? labels(s.data) : "",
        keptFiles(s).length ? h("div", { class: "artifacts" }, keptFiles(s).map(artifactView)) : "")));
    if (progress && progress.running_since) {
      steps.push(h("tr", { class: "running-step" },
        h("td", {}, stepNumber(progress.running_index)), h("td", {}, progress.running_name),
        h("td", {}, badge("running")),
        h("td", {}, h("span", { class: "elapsed", "data-since": progress.running_since }, elapsed(progress.running_since))),
        h("td", { class: "muted" }, "running now")));
    }
    return [
      h("h1", {}, "Task ", h("span", { class: "mono" }, params.id), " ", h("span", { id: "task-status" }, badge(status))),
      cancel,
      // The phone's screen beside the task's details, not above them.
      h("div", { class: "task-top" }, grid, watchPanel(task)),
      ...recordingSection(task, done),
      h("h2", {}, "Steps"),
      steps.length ? table(["#", "step", "status", "took", "output / error / kept files"], steps, { class: "steps" })
                   : h("p", { class: "muted" }, progress ? "No step has ended yet." : "No step results yet."),
      logTab(task),
      h("h2", {}, "Attempts"),
      attempts.length ? table(["#", "host", "device", "lease", "assigned", "acknowledged", "ended", "how"], attempts, { class: "attempts" })
                      : h("p", { class: "muted" }, "Never assigned."),
      h("h2", {}, "Events"),
      table(["time", "attempt", "event", "from", "to", "detail"], events, { class: "events" }),
      history.next_page_token ? h("p", { class: "muted" }, "Older events beyond the first 1000 are not shown.") : null,
      h("h2", {}, "Spec"),
      h("pre", {}, JSON.stringify(task.spec, null, 2)),
    ];
  },
  wants: (kind, data, params) => (kind === "task" && data === params.id) || kind === "resync",
};

// `2 of 5 steps done; running step 3 checkout for 4.2s` (as `amc get` says it).
function progressText(p) {
  const text = [`${(p.steps || []).length} of ${p.step_count || 0} steps done`];
  if (p.running_since) {
    text.push(`; running step ${stepNumber(p.running_index)} `, h("b", {}, p.running_name || ""), " for ",
      h("span", { class: "elapsed", "data-since": p.running_since }, elapsed(p.running_since)));
  }
  return h("span", {}, ...text);
}

// The running step's time ticks between the page's reads.
setInterval(() => {
  for (const el of document.querySelectorAll(".elapsed[data-since]")) el.textContent = elapsed(el.dataset.since);
}, 1000);

// Cancel asks first: the button opens a confirmation that names the task and wants a reason
// (recorded with the cancellation, as `amc cancel --reason`); only "Yes, cancel it" sends
// CancelTask. The confirmation survives the page's live redraws (`confirming`).
let confirming = null;

function cancelForm(task) {
  const id = task.task_id;
  if (task.cancel_requested_at) {
    return h("p", { class: "muted", id: "cancel-message" },
      "Cancellation requested; the host stops the task at its next step boundary.");
  }
  if (confirming !== id) {
    return h("form", { class: "inline", id: "cancel", onsubmit: (event) => {
      event.preventDefault();
      confirming = id;
      refresh();
    } }, h("button", { class: "danger", type: "submit" }, "Cancel task"));
  }
  const reason = h("input", { name: "reason", placeholder: "why (recorded with it)", "aria-label": "cancel reason", size: 32 });
  const message = h("span", { class: "muted", id: "cancel-message" });
  const button = h("button", { class: "danger", type: "submit" }, "Yes, cancel it");
  const keep = h("button", { type: "button", class: "plain", onclick: () => { confirming = null; refresh(); } }, "Keep it running");
  const form = reasonForm({ class: "inline confirm", id: "cancel", role: "group", "aria-label": "confirm cancel" },
    { reason, button, message }, async (why) => {
      if (!why.trim()) throw new ApiError(400, "INVALID_ARGUMENT", "say why: the reason is recorded with the cancellation");
      await call("CancelTask", { task_id: id, reason: why.trim() });
      confirming = null;
      return "cancellation requested";
    });
  form.prepend(h("b", {}, "Cancel this task?"), " Its host stops it at the next step boundary; it is not retried.");
  form.append(keep);
  return form;
}
