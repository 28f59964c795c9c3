// Rendering helpers every page uses: elements, badges, links, and times, durations and
// sizes written as `amc` writes them.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// The element a page draws into.
export const main = () => document.getElementById("page");

// An enum value as proto JSON writes it, without its prefix, in lower case (a value this
// page does not know, sent as its number by a newer control plane, as `#9`).
export const enumName = (prefix, value) =>
  typeof value === "number" ? `#${value}` : String(value || "").replace(prefix, "").toLowerCase();
export const statusOf = (task) => enumName("TASK_STATUS_", task.status);
export const badge = (name) => h("span", { class: `badge s-${name}` }, name || "-");
export const taskLink = (id) => h("a", { class: "mono", href: `/tasks/${id}` }, id);
export const hostLink = (id) => h("a", { href: `/hosts/${encodeURIComponent(id)}` }, id);

// A time as ISO 8601 in the browser's zone, to the second, with the zone's offset
// (2026-03-01T09:15:02+01:00): what `amc` prints for the same time in the same zone.
export function when(ts) {
  if (!ts) return "-";
  const d = new Date(ts);
  if (isNaN(d) || d.getTime() <= 0) return "-";
  const two = (n) => String(n).padStart(2, "0");
  const offset = -d.getTimezoneOffset();
  const zone = `${offset < 0 ? "-" : "+"}${two(Math.floor(Math.abs(offset) / 60))}:${two(Math.abs(offset) % 60)}`;
  return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())}` +
    `T${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}${zone}`;
}

// How long a step took, rounded as `amc` rounds it: 0.6s, 12.3s, 1m02.3s.
export function took(duration) {
  if (!duration) return "-";
  const total = parseFloat(duration);
  if (total < 60) return `${total.toFixed(1)}s`;
  return `${Math.floor(total / 60)}m${(total % 60).toFixed(1).padStart(4, "0")}s`;
}

// How long since `since` (a proto JSON timestamp), as `took` writes a duration.
export function elapsed(since) {
  const seconds = Math.max(0, (Date.now() - new Date(since).getTime()) / 1000);
  return took(`${seconds}s`);
}

export function age(ts) {
  if (!ts) return "-";
  const s = Math.max(0, (Date.now() - new Date(ts).getTime()) / 1000);
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${Math.round(s % 60)}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

// A proto JSON duration ("300s", "1.500s") as a spec file writes it: 5m, 1.5s, 1h30m.
export function span(duration) {
  const total = parseFloat(duration);
  const hours = Math.floor(total / 3600), minutes = Math.floor((total % 3600) / 60);
  const secs = Math.round((total % 60) * 1000) / 1000;
  const out = (hours ? `${hours}h` : "") + (minutes ? `${minutes}m` : "");
  return secs || !out ? `${out}${secs}s` : out;
}

export function size(n) {
  const bytes = Number(n || 0);
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

export function labels(map) {
  const entries = Object.entries(map || {}).sort();
  if (!entries.length) return h("span", { class: "muted" }, "-");
  return h("span", { class: "labels" }, entries.map(([k, v]) => h("span", {}, `${k}=${v}`)));
}

// A step as people read it, as `amc` writes it (amc_common/steps.py): numbered from 1 (the
// wire's index is a position from 0), with its name: `step 3 (evidence)`, `step 3/5`.
export const stepNumber = (index) => (index || 0) + 1;
export function stepLabel(index, name, count) {
  return `step ${stepNumber(index)}${count ? `/${count}` : ""}${name ? ` (${name})` : ""}`;
}

// What a task is, in a few words: its actions, its workflow's steps, or for a session who
// opened it, from the metadata its opener gives it: the console's Control (`control:
// console`, `operator`), an MCP client (`control: mcp`, `mcp_client`), or else a program
// over the API (the client library, `amc_client`, or any gRPC client).
export function taskWhat(task) {
  const spec = task.spec || {};
  if (!spec.session) return specSummary(spec);
  const meta = task.metadata || {};
  const by = task.submitted_by ? ` (${task.submitted_by})` : "";
  let what = `session opened over the API${by}`;
  if (meta.control === "console") what = `console Control session${meta.operator ? ` of ${meta.operator}` : by}`;
  else if (meta.control === "mcp") what = `MCP session of ${meta.mcp_client || "an MCP client"}${by}`;
  return spec.session.maintenance ? `maintenance: ${what}` : what;
}

// Why a task is where it is, in one line: a failed task's error, a cancelled one's reason,
// a queued one's wait; "" when there is nothing to say.
export function taskWhy(task) {
  const error = task.result && task.result.error;
  if (error) return error;
  if (task.cancel_requested_at) return `cancel: ${task.cancel_reason || "no reason given"}`;
  return task.pending_reason || "";
}

// How long a task has taken from its submission: to its end, or so far.
export function taskDuration(task) {
  const end = task.finished_at ? new Date(task.finished_at).getTime() : Date.now();
  const seconds = Math.max(0, (end - new Date(task.created_at).getTime()) / 1000);
  return took(`${seconds}s`);
}

export function specSummary(spec) {
  if (spec && spec.session) return "interactive session";
  if (spec && spec.workflow) {
    const steps = spec.workflow.steps || [];
    return `workflow: ${steps.map((s) => s.name).join(", ")}`;
  }
  const actions = (spec && spec.actions && spec.actions.actions) || [];
  return actions.map((a) => Object.keys(a)[0]).join(", ") || "-";
}

export function table(headers, rows, attrs) {
  return h("table", attrs || {},
    h("thead", {}, h("tr", {}, headers.map((name) => h("th", {}, name)))),
    h("tbody", {}, rows));
}

export function counts(items) {
  return h("div", { class: "counts" },
    items.map(([label, value, id]) => h("div", { class: "count", id }, h("b", {}, value), label)));
}
