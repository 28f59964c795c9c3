// The Task page's Log tab: the phone's log of the task's attempt (/api/logs/<task>, lines of
// JSON from the servicer's own StreamLogs): the log an attempt kept once it ended, or the
// running attempt's live tail, followed as the phone writes it. Filtered by priority and
// tag on the control plane; step marks (tag amc) and flagged lines (a crash, an ANR) stand
// out. The tab opens on a click and reads nothing before; its element outlives the page's
// redraws (the same one goes back in), and its reading stops when the tab closes, another
// task is shown or the page is left.

import { ARTIFACT_API, IN_FLIGHT, authHeaders } from "./api.js";
import { h, statusOf } from "./dom.js";

// Lines shown at most (the oldest go): the whole kept log is `amc logs`' or `amc artifact`'s.
const MOST_LINES = 5000;
const LEVELS = ["V", "D", "I", "W", "E", "F"];
const ENTRY = /^\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}(?:\d{3})?\s+\d+\s+\d+ ([VDIWEFA]) (.*?)\s*: (.*)$/;
const FLAGGED = /^\s*(FATAL EXCEPTION|ANR in )/;

// The tab of the task shown: {taskId, root, ...} (one at a time).
let tab = null;

export function logTab(task) {
  if (!tab || tab.taskId !== task.task_id) {
    stopLog();
    tab = makeTab(task);
  }
  tab.save.replaceChildren(...keptLogs(task).map(saveLink));
  return tab.root;
}

// The logs the task's attempts kept (each with its attempt's last step).
function keptLogs(task) {
  const steps = (task.result && task.result.steps) || [];
  return steps.flatMap((s) => s.artifacts || []).filter((a) => a.kind === "logcat");
}

// A button that saves a kept log as it is kept (gzipped text), fetched with the token.
function saveLink(a) {
  return h("button", { type: "button", class: "plain", onclick: async (event) => {
    const button = event.target;
    button.disabled = true;
    try {
      const response = await fetch(`${ARTIFACT_API}${a.task_id}/${a.artifact_id}`, { headers: authHeaders() });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const link = h("a", { href: URL.createObjectURL(await response.blob()), download: `logcat-${a.task_id}-attempt-${a.attempt}.txt.gz` });
      link.click();
      URL.revokeObjectURL(link.href);
    } catch (err) {
      button.textContent = `not saved: ${err.message}`;
    } finally {
      button.disabled = false;
    }
  } }, `save attempt ${a.attempt}'s log (.gz)`);
}

export function stopLog() {
  if (tab) {
    stopReading(tab);
    clearInterval(tab.watch);
  }
  tab = null;
}

function makeTab(task) {
  const running = IN_FLIGHT.has(statusOf(task)) || statusOf(task) === "queued";
  const t = { taskId: task.task_id, reading: null, save: h("span", { class: "inline" }) };
  t.level = h("select", { name: "log-level", "aria-label": "log priority" },
    h("option", { value: "" }, "every priority"),
    LEVELS.map((l) => h("option", { value: l }, `${l} and above`)));
  t.tag = h("input", { name: "log-tag", "aria-label": "log tag", placeholder: "tag (e.g. AndroidRuntime)", size: 22 });
  t.follow = h("input", { type: "checkbox", name: "log-follow", "aria-label": "follow the log", checked: running });
  t.state = h("span", { class: "muted", id: "log-state" }, "");
  t.lines = h("pre", { class: "phone-log", id: "log-lines", "aria-label": "phone log" });
  const form = h("form", { class: "inline", id: "log-filters", onsubmit: (event) => {
    event.preventDefault();
    read(t);
  } }, t.level, t.tag, h("label", {}, t.follow, " follow"), h("button", { type: "submit" }, "Read"), t.state);
  t.level.addEventListener("change", () => read(t));
  t.root = h("details", { id: "log-tab", class: "tab" },
    h("summary", {}, h("h2", {}, "Log")),
    h("p", { class: "muted" }, "The phone's log of the attempt: kept once it ended, live while it runs (lines marked where each step began and ended)."),
    form, t.lines, t.save);
  t.root.addEventListener("toggle", () => {
    if (t.root.open) read(t);
    else stopReading(t);
  });
  // A page left (or redrawn without the tab) stops its reading.
  t.watch = setInterval(() => {
    if (tab === t && t.reading && !t.root.isConnected) stopLog();
  }, 2000);
  return t;
}

function stopReading(t) {
  if (t.reading) t.reading.abort();
  t.reading = null;
}

function say(t, text, bad = false) {
  t.state.textContent = text;
  t.state.className = bad ? "error-text" : "muted";
}

async function read(t) {
  stopReading(t);
  const reading = new AbortController();
  t.reading = reading;
  t.lines.replaceChildren();
  const q = new URLSearchParams();
  if (t.level.value) q.set("level", t.level.value);
  for (const tag of t.tag.value.split(",").map((x) => x.trim()).filter(Boolean)) q.append("tag", tag);
  const following = t.follow.checked;
  if (following) q.set("follow", "1");
  say(t, following ? "waiting for the log…" : "reading…");
  let shown = 0;
  let caught = false;
  try {
    const response = await fetch(`/api/logs/${encodeURIComponent(t.taskId)}?${q}`, { headers: authHeaders(), signal: reading.signal });
    if (!response.ok) {
      const data = await response.json();
      say(t, `${data.code}: ${data.message}`, true);
      return;
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let at;
      while ((at = buffer.indexOf("\n")) >= 0) {
        const text = buffer.slice(0, at);
        buffer = buffer.slice(at + 1);
        if (!text) continue;
        const message = JSON.parse(text);
        if (message.code) {
          say(t, `${message.code}: ${message.message}`, true);
          return;
        }
        shown += show(t, message.lines || []);
        caught = caught || message.caught_up;
        const where = `attempt ${message.attempt} · ${shown} lines`;
        say(t, following && caught ? `${where} · following…` : where);
      }
    }
    say(t, `${t.state.textContent.replace(" · following…", "")} · ${following ? "the attempt ended" : "end of the log"}`);
  } catch (err) {
    if (err.name !== "AbortError") say(t, `the log could not be read: ${err.message}`, true);
  } finally {
    if (t.reading === reading) t.reading = null;
  }
}

// Appends `lines`, each in a span whose class says what it is; the oldest go past MOST_LINES.
function show(t, lines) {
  const atEnd = t.lines.scrollTop + t.lines.clientHeight >= t.lines.scrollHeight - 4;
  const spans = lines.map((line) => {
    const m = line.match(ENTRY);
    let kind = "note";
    if (m) kind = m[2] === "amc" ? "mark" : FLAGGED.test(m[3]) ? "flag" : `level-${m[1]}`;
    return h("span", { class: `log-line ${kind}` }, `${line}\n`);
  });
  t.lines.append(...spans);
  while (t.lines.childElementCount > MOST_LINES) t.lines.firstElementChild.remove();
  if (atEnd) t.lines.scrollTop = t.lines.scrollHeight;
  return lines.length;
}
