// The AMC operator console: one script, no build step. Every figure comes from the
// control plane's JSON mapping of amc.v1.Scheduler (/api/amc.v1.Scheduler/<Method>), with
// the same roles, validation and messages as the gRPC API; /api/events says what changed;
// /api/artifacts/<task>/<artifact> serves the files steps kept (through GetArtifact).
"use strict";

const API = "/api/amc.v1.Scheduler/";
const ADMIN_API = "/api/amc.v1.Admin/";
const ARTIFACT_API = "/api/artifacts/";
const TOKEN_KEY = "amc.token";
const TERMINAL = new Set(["done", "failed", "cancelled"]);
const STATUSES = ["queued", "assigned", "dispatched", "done", "failed", "cancelled"];

// -- small helpers ---------------------------------------------------------------------------

function h(tag, attrs, ...children) {
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

const enumName = (prefix, value) => (value || "").replace(prefix, "").toLowerCase();
const statusOf = (task) => enumName("TASK_STATUS_", task.status);
const badge = (name) => h("span", { class: `badge s-${name}` }, name || "-");
const taskLink = (id) => h("a", { class: "mono", href: `/tasks/${id}` }, id);
const hostLink = (id) => h("a", { href: `/hosts/${encodeURIComponent(id)}` }, id);

// A time as ISO 8601 in the browser's zone, to the second, with the zone's offset
// (2026-03-01T09:15:02+01:00): what `amc` prints for the same time in the same zone.
function when(ts) {
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
function took(duration) {
  if (!duration) return "-";
  const total = parseFloat(duration);
  if (total < 60) return `${total.toFixed(1)}s`;
  return `${Math.floor(total / 60)}m${(total % 60).toFixed(1).padStart(4, "0")}s`;
}

function age(ts) {
  if (!ts) return "-";
  const s = Math.max(0, (Date.now() - new Date(ts).getTime()) / 1000);
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${Math.round(s % 60)}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

function labels(map) {
  const entries = Object.entries(map || {}).sort();
  if (!entries.length) return h("span", { class: "muted" }, "-");
  return h("span", { class: "labels" }, entries.map(([k, v]) => h("span", {}, `${k}=${v}`)));
}

function selectorText(sel) {
  const parts = sel && sel.serial ? [`serial=${sel.serial}`] : [];
  for (const [k, v] of Object.entries((sel && sel.labels) || {}).sort()) parts.push(`${k}=${v}`);
  return parts.join(" ") || "any device";
}

function specSummary(spec) {
  if (spec && spec.session) return "interactive session";
  if (spec && spec.workflow) {
    const steps = spec.workflow.steps || [];
    return `workflow: ${steps.map((s) => s.name).join(", ")}`;
  }
  const actions = (spec && spec.actions && spec.actions.actions) || [];
  return actions.map((a) => Object.keys(a)[0]).join(", ") || "-";
}

function table(headers, rows, attrs) {
  return h("table", attrs || {},
    h("thead", {}, h("tr", {}, headers.map((name) => h("th", {}, name)))),
    h("tbody", {}, rows));
}

// -- the API ---------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function call(method, body, api = API) {
  let response;
  try {
    response = await fetch(api + method, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: JSON.stringify(body || {}),
    });
  } catch (err) {
    throw new ApiError(0, "UNAVAILABLE", `the control plane did not answer (${err.message})`);
  }
  let data;
  try {
    data = await response.json();
  } catch {
    data = { code: "INTERNAL", message: `unexpected answer (HTTP ${response.status})` };
  }
  if (!response.ok) throw new ApiError(response.status, data.code, data.message);
  return data;
}

// -- artifacts: fetched with the token (an <img src> could not send it), shown from blob: URLs --

// artifact id -> {url: its blob: URL, sha256: as computed here, or ""} once fetched
// (artifacts never change); the fetches under way.
const artifactUrls = new Map();
const artifactFetches = new Map();

function forgetArtifacts() {
  for (const { url } of artifactUrls.values()) URL.revokeObjectURL(url);
  artifactUrls.clear();
  artifactFetches.clear();
}

async function fetchArtifact(a) {
  const path = `${ARTIFACT_API}${encodeURIComponent(a.task_id)}/${encodeURIComponent(a.artifact_id)}`;
  const response = await fetch(path, { headers: authHeaders() });
  if (!response.ok) {
    let message = `HTTP ${response.status}`;
    try { message = (await response.json()).message; } catch { /* keep the status */ }
    throw new Error(message);
  }
  const data = await response.arrayBuffer();
  // Checked again here where the browser can (crypto.subtle: https and loopback).
  let sha256 = "";
  if (window.crypto && crypto.subtle) {
    const digest = await crypto.subtle.digest("SHA-256", data);
    sha256 = Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
    if (sha256 !== a.sha256) throw new Error(`the bytes received have sha256 ${sha256}, not ${a.sha256}`);
  }
  const url = URL.createObjectURL(new Blob([data], { type: a.content_type }));
  artifactUrls.set(a.artifact_id, { url, sha256 });
}

// Give every element of the page showing `a` its bytes, fetching them once.
function loadArtifact(a) {
  if (artifactUrls.has(a.artifact_id) || artifactFetches.has(a.artifact_id)) return;
  const fetching = fetchArtifact(a)
    .then(() => fillArtifact(a.artifact_id))
    .catch((err) => {
      for (const el of main().querySelectorAll(`[data-artifact="${a.artifact_id}"] .artifact-error`)) {
        el.textContent = `not loaded: ${err.message}`;
      }
    })
    .finally(() => artifactFetches.delete(a.artifact_id));
  artifactFetches.set(a.artifact_id, fetching);
}

function fillArtifact(id) {
  for (const box of main().querySelectorAll(`[data-artifact="${id}"]`)) fillBox(box, artifactUrls.get(id));
}

function fillBox(box, { url, sha256 }) {
  for (const link of box.querySelectorAll("a")) link.href = url;
  for (const img of box.querySelectorAll("img")) img.src = url;
  if (sha256) {
    box.dataset.checked = sha256;
    box.querySelector(".checked").textContent = " ✓ checked";
  }
}

function size(n) {
  const bytes = Number(n || 0);
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

// A step's kept files but the screen recording (shown in a section of its own: screen.js).
const keptFiles = (s) => (s.artifacts || []).filter((a) => !isRecording(a));

function artifactView(a) {
  const image = (a.content_type || "").startsWith("image/");
  const name = `${a.kind}-${a.artifact_id}.${image ? "png" : "xml"}`;
  const shown = image
    ? h("a", { class: "thumb", target: "_blank", title: "open full size" },
      h("img", { alt: `${a.kind} of step ${a.step_name || a.step_index}` }))
    : h("span", {}, h("a", { class: "open", target: "_blank" }, `${a.kind} XML`), " · ",
      h("a", { class: "save", download: name }, "save"));
  const box = h("div", { class: "artifact", "data-artifact": a.artifact_id, "data-kind": a.kind },
    shown,
    h("div", { class: "artifact-facts" }, `${a.kind} · ${size(a.size_bytes)} · sha256 `,
      h("span", { class: "mono", title: a.sha256 }, a.sha256), h("span", { class: "checked" })),
    h("div", { class: "artifact-error error-text" }));
  if (artifactUrls.has(a.artifact_id)) fillBox(box, artifactUrls.get(a.artifact_id));
  else loadArtifact(a);
  return box;
}

// -- live updates: server-sent events, read with fetch so the token goes in a header -----------

let liveRun = 0;
let liveAbort = null;

function stopLive() {
  liveRun++;
  if (liveAbort) liveAbort.abort();
  liveAbort = null;
}

// The indicator says how the page's event stream is: "connecting…", "live" (changes
// arrive), "offline" (the control plane cannot be reached) or "not live" (signed out).
const LIVE_TEXT = { wait: "connecting…", on: "live", off: "offline", idle: "not live" };

function setLive(state) {
  const el = document.getElementById("live");
  el.className = `live ${state}`;
  el.textContent = LIVE_TEXT[state];
}

async function listen(onEvent, onConnect) {
  stopLive();
  const run = liveRun;
  let backoff = 500;
  while (run === liveRun) {
    try {
      liveAbort = new AbortController();
      const response = await fetch("/api/events", { headers: authHeaders(), signal: liveAbort.signal });
      if (response.status === 401 || response.status === 403) {
        setLive("idle");
        return;
      }
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done || run !== liveRun) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let kind = "", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event: ")) kind = line.slice(7);
            else if (line.startsWith("data: ")) data = line.slice(6);
          }
          if (kind === "hello") {
            setLive("on");
            backoff = 500;
            onConnect();
          } else if (kind) {
            onEvent(kind, data);
          }
        }
      }
    } catch {
      // reconnect below
    }
    if (run !== liveRun) return;
    setLive("off");
    await new Promise((resolve) => setTimeout(resolve, backoff));
    backoff = Math.min(backoff * 2, 10000);
  }
}

// -- pages -----------------------------------------------------------------------------------

const main = () => document.getElementById("page");

function showError(err) {
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

function showLogin(reason) {
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

function counts(items) {
  return h("div", { class: "counts" },
    items.map(([label, value, id]) => h("div", { class: "count", id }, h("b", {}, value), label)));
}

const Farm = {
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

// Release a quarantined phone (or one its recovery ladder is on): Admin ReleaseDevice, as
// `amc devices release` (operator role), the reason recorded in the host's events. Its host
// then probes it and reports its condition.
function releaseForm(host, d) {
  if (!["quarantined", "recovering"].includes(condition(d))) return "";
  const reason = h("input", { name: "reason", placeholder: "reason", "aria-label": `release ${d.serial} reason`, size: 16 });
  const message = h("span", { class: "muted release-message" });
  const button = h("button", { type: "submit" }, "Release");
  return h("form", { class: "inline release", onsubmit: async (event) => {
    event.preventDefault();
    button.disabled = true;
    try {
      await call("ReleaseDevice", { host_id: host.host_id, serial: d.serial, reason: reason.value }, ADMIN_API);
      message.className = "muted release-message";
      message.textContent = "released: its host probes it";
      refresh();
    } catch (err) {
      message.className = "error-text release-message";
      message.textContent = `${err.code}: ${err.message}`;
      button.disabled = false;
    }
  } }, reason, button, message);
}

// The queue as the control plane last counted it (every few seconds: GetQueue's and
// ListFairShares' `counted_at`), by selector and by fairness key; re-read on every change
// and every few seconds, since the counts move between changes too.
const Queue = {
  nav: "queue",
  title: () => "Queue",
  async load() {
    const [queue, shares] = await Promise.all([
      call("GetQueue", {}),
      call("ListFairShares", {}, ADMIN_API),
    ]);
    return { ...queue, shares: shares.shares || [] };
  },
  render({ groups = [], total = 0, counted_at, shares = [] }) {
    const rows = groups.map((g) => h("tr", {},
      h("td", {}, selectorText(g.selector)),
      h("td", {}, g.count),
      h("td", {}, age(g.oldest_queued_at)),
      h("td", {}, `${g.devices_idle} idle · ${g.devices_busy} busy · ${g.devices_unavailable} unavailable`),
      h("td", {}, g.waiting_because),
      h("td", {}, h("a", { href: `/tasks?status=queued${labelQuery(g.selector)}` }, "tasks"))));
    const keys = shares.map((s) => h("tr", { "data-key": s.fairness_key },
      h("td", { class: "key" }, s.fairness_key),
      h("td", { class: "queued" }, s.queued),
      h("td", { class: "running" }, s.running),
      h("td", { class: "cap" }, s.max_devices ?? "-"),
      h("td", { class: "weight" }, s.weight),
      h("td", { class: "oldest" }, age(s.oldest_queued_at))));
    return [
      h("h1", {}, "Queue"),
      counts([["queued tasks", total, "queued-total"], ["selectors", groups.length, "queue-groups"],
        ["fairness keys", shares.length, "queue-keys"]]),
      groups.length
        ? table(["selector", "tasks", "oldest", "matching devices", "why they wait", ""], rows)
        : h("p", { class: "muted" }, "Nothing is queued."),
      h("h2", {}, "Fairness keys"),
      shares.length
        ? table(["fairness key", "queued", "running", "cap", "weight", "oldest wait"], keys, { id: "fair-shares" })
        : h("p", { class: "muted" }, "No fairness key has tasks queued or running, or a share set."),
      h("p", { class: "muted", id: "counted" }, counted_at
        ? `Counted ${when(counted_at)}; the control plane counts the queue every few seconds.`
        : "Not counted yet; the control plane counts the queue every few seconds."),
    ];
  },
  wants: (kind) => true,
  every: 5000,
};

function labelQuery(sel) {
  const first = Object.entries((sel && sel.labels) || {})[0];
  return first ? `&label=${encodeURIComponent(`${first[0]}=${first[1]}`)}` : "";
}

const Tasks = {
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
    field("q", f.text, "id, request id or metadata"),
    h("button", { type: "submit" }, "Filter"));
    const tasks = data.tasks || [];
    const rows = tasks.map((t) => h("tr", { "data-task": t.task_id },
      h("td", { class: "id" }, taskLink(t.task_id)),
      h("td", { class: "status" }, badge(statusOf(t))),
      h("td", {}, `${t.attempt}/${t.max_attempts}`),
      h("td", {}, t.priority),
      h("td", {}, t.host_id ? [hostLink(t.host_id), ` / ${t.device_serial}`] : "-"),
      h("td", {}, when(t.created_at)),
      h("td", {}, specSummary(t.spec))));
    const pager = h("div", { class: "pager" },
      this.tokens.length > 1 ? h("button", { class: "plain", onclick: () => { this.tokens.pop(); refresh(); } }, "← newer") : null,
      data.next_page_token ? h("button", { class: "plain", onclick: () => { this.tokens.push(data.next_page_token); refresh(); } }, "older →") : null);
    return [
      h("h1", {}, "Tasks"), form,
      tasks.length ? table(["task", "status", "attempt", "priority", "where", "created", "spec"], rows, { class: "tasks" })
                   : h("p", { class: "muted" }, "No task matches."),
      pager,
    ];
  },
  wants: (kind) => kind === "task" || kind === "resync",
};

// A proto JSON duration ("300s", "1.500s") as a spec file writes it: 5m, 1.5s, 1h30m.
function span(duration) {
  const total = parseFloat(duration);
  const hours = Math.floor(total / 3600), minutes = Math.floor((total % 3600) / 60);
  const secs = Math.round((total % 60) * 1000) / 1000;
  const out = (hours ? `${hours}h` : "") + (minutes ? `${minutes}m` : "");
  return secs || !out ? `${out}${secs}s` : out;
}

const Task = {
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
        ["where", task.host_id ? [hostLink(task.host_id), ` / ${task.device_serial}`] : null],
        ["selector", selectorText(task.selector)],
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
      h("td", {}, s.index || 0), h("td", {}, s.name), h("td", {}, badge(enumName("STEP_STATUS_", s.status))),
      h("td", {}, took(s.duration)),
      h("td", {}, s.output ? h("pre", {}, s.output) : "", s.error ? h("pre", { class: "error-text" }, s.error) : "",
        Object.keys(s.data || {}).length ? labels(s.data) : "",
        keptFiles(s).length ? h("div", { class: "artifacts" }, keptFiles(s).map(artifactView)) : "")));
    if (progress && progress.running_since) {
      steps.push(h("tr", { class: "running-step" },
        h("td", {}, progress.running_index || 0), h("td", {}, progress.running_name),
        h("td", {}, badge("running")),
        h("td", {}, h("span", { class: "elapsed", "data-since": progress.running_since }, elapsed(progress.running_since))),
        h("td", { class: "muted" }, "running now")));
    }
    return [
      h("h1", {}, "Task ", h("span", { class: "mono" }, params.id), " ", h("span", { id: "task-status" }, badge(status))),
      cancel, watchPanel(task), grid,
      ...recordingSection(task, done),
      h("h2", {}, "Steps"),
      steps.length ? table(["#", "step", "status", "took", "output / error / kept files"], steps, { class: "steps" })
                   : h("p", { class: "muted" }, progress ? "No step has ended yet." : "No step results yet."),
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

// How long since `since` (a proto JSON timestamp), as `took` writes a duration.
function elapsed(since) {
  const seconds = Math.max(0, (Date.now() - new Date(since).getTime()) / 1000);
  return took(`${seconds}s`);
}

// `2 of 5 steps done; running step 3 checkout for 4.2s` (as `amc get` says it).
function progressText(p) {
  const text = [`${(p.steps || []).length} of ${p.step_count || 0} steps done`];
  if (p.running_since) {
    text.push(`; running step ${(p.running_index || 0) + 1} `, h("b", {}, p.running_name || ""), " for ",
      h("span", { class: "elapsed", "data-since": p.running_since }, elapsed(p.running_since)));
  }
  return h("span", {}, ...text);
}

// The running step's time ticks between the page's reads.
setInterval(() => {
  for (const el of document.querySelectorAll(".elapsed[data-since]")) el.textContent = elapsed(el.dataset.since);
}, 1000);

function cancelForm(task) {
  const reason = h("input", { name: "reason", placeholder: "reason", "aria-label": "cancel reason", size: 32 });
  const message = h("span", { class: "muted", id: "cancel-message" },
    task.cancel_requested_at ? "cancellation requested; the host stops at the next step" : "");
  const button = h("button", { class: "danger", type: "submit" }, "Cancel task");
  return h("form", { class: "inline", id: "cancel", onsubmit: async (event) => {
    event.preventDefault();
    button.disabled = true;
    try {
      await call("CancelTask", { task_id: task.task_id, reason: reason.value });
      message.textContent = "cancellation requested";
      refresh();
    } catch (err) {
      message.className = "error-text";
      message.textContent = `${err.code}: ${err.message}`;
      button.disabled = false;
    }
  } }, reason, button, message);
}

const Host = {
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

// -- routing and refreshing ------------------------------------------------------------------

let current = null;
let loading = false;
let again = false;
let timer = null;
// A view with `every` (ms) is also re-read that often while it is shown.
let poll = null;

function match(path) {
  let m;
  if (path === "/" || path === "/farm") return [Farm, {}];
  if (path === "/queue") return [Queue, {}];
  if (path === "/tasks") return [Tasks, {}];
  if ((m = path.match(/^\/tasks\/([^/]+)$/))) return [Task, { id: decodeURIComponent(m[1]) }];
  if ((m = path.match(/^\/hosts\/([^/]+)$/))) return [Host, { id: decodeURIComponent(m[1]) }];
  if (path === "/control") return [Control, {}];
  return [null, {}];
}

async function refresh() {
  if (!current) return;
  if (loading) { again = true; return; }
  loading = true;
  const [view, params] = current;
  try {
    const data = await view.load(params);
    if (current && current[0] === view) redraw(view.render(data, params).filter(Boolean));
  } catch (err) {
    if (err instanceof ApiError) showError(err);
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
    if (el.value !== (el.getAttribute("value") || "")) typed.set(inputKey(el), el.value);
  }
  const active = document.activeElement;
  const focused = active && active.name && main().contains(active) ? inputKey(active) : null;
  main().replaceChildren(...nodes);
  for (const el of main().querySelectorAll("input[name]")) {
    const key = inputKey(el);
    if (typed.has(key)) el.value = typed.get(key);
    if (key === focused) el.focus();
  }
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

function route() {
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
    stopScreens();  // screen.js
  }
  current = [view, params];
  liveStarted = false;
  stopLive();
  clearInterval(poll);
  poll = view.every ? setInterval(() => { if (current && current[0] === view) refresh(); }, view.every) : null;
  main().replaceChildren(h("p", { class: "muted" }, "loading…"));
  refresh();
}

window.addEventListener("popstate", route);
window.addEventListener("DOMContentLoaded", route);
