// The Control page (/control?host_id=H&serial=S[&maintenance=1]): an operator drives a
// phone in an interactive session (/api/control), on its live screen (screen.js) fitted
// to the window's height, with the phone's keys and the computer's keyboard (keyboard.js),
// the phone's details, a screenshot to download, and Start again once it ended. A refusal
// says why in words, with what can be done (the busy phone's task, a maintenance session on
// a cordoned phone), and no screen.

import { ADMIN_API, TERMINAL, call } from "./api.js";
import { enumName, h, hostLink, span, statusOf, taskLink, took } from "./dom.js";
import { HARDWARE, NAVIGATION, keyButtons, listenKeys } from "./keyboard.js";
import { android, condition, heldAs, model, takesWork } from "./phones.js";
import { LiveScreen, openSocket, refusalOf, stopWatch } from "./screen.js";
import { refresh, showLogin } from "./shell.js";

// A press that moves less than this share of the screen's width is a tap, not a swipe.
const TAP_SLOP = 0.02;
// The phone's details (battery, heat) are read again this often while the page is shown.
const DETAILS_EVERY_MS = 30_000;

// What a refusal means, in words (the control plane's message says the rest).
const REFUSED = {
  FAILED_PRECONDITION: "This phone cannot be controlled now",
  NOT_FOUND: "There is no such phone",
  PERMISSION_DENIED: "Your token may not control phones",
  RESOURCE_EXHAUSTED: "Your token has as many sessions open as it may",
  INVALID_ARGUMENT: "This address does not name a phone rightly",
  UNAVAILABLE: "The control plane did not answer",
};
const said = (err) => `${REFUSED[err.code] || "Refused"}: ${err.message}`;

// What an action was, as the log says it: tap (540, 1200), type "hello", key BACK.
function actionText(a) {
  if (a.tap) return `tap (${a.tap.x}, ${a.tap.y})`;
  if (a.swipe) return `swipe (${a.swipe.x1}, ${a.swipe.y1}) → (${a.swipe.x2}, ${a.swipe.y2})`;
  if (a.type) return `type "${a.type.text}"`;
  if (a.key) return `key ${a.key}`;
  if (a.rotate) return `rotate ${a.rotate}`;
  return "?";
}

// One operator's session on one phone, for as long as the page shows it.
class ControlSession {
  constructor(hostId, serial, record, maintenance) {
    Object.assign(this, { hostId, serial, record, maintenance });
    this.query = `host_id=${encodeURIComponent(hostId)}&serial=${encodeURIComponent(serial)}`;
    this.ready = false;
    this.ended = false;
    this.socket = null;
    this.device = null;
    this.screen = new LiveScreen(this.query);
    this.screen.canvas.tabIndex = 0;
    this.status = h("p", { id: "control-status", class: "muted" }, "asking for the phone…");
    this.refusal = h("div", { id: "control-refusal" });
    this.log = h("ol", { id: "action-log", class: "action-log" });
    this.facts = h("dl", { class: "grid phone-details", id: "phone-details" });
    this.controls = [];
    const control = (el) => { this.controls.push(el); return el; };
    const text = h("input", { name: "text", "aria-label": "text to type", placeholder: "text to type", size: 24 });
    const typed = h("form", { class: "inline", id: "type-form", onsubmit: (event) => {
      event.preventDefault();
      if (text.value && this.send({ type: { text: text.value } })) text.value = "";
    } }, control(text), control(h("button", { type: "submit" }, "Type")));
    this.end = h("button", { type: "button", class: "danger", id: "end-session", disabled: true,
                             onclick: () => this.close("you ended it") }, "End session");
    this.again = h("button", { type: "button", id: "start-again", hidden: true, onclick: startAgain }, "Start again");
    this.shot = control(h("button", { type: "button", id: "screenshot", onclick: () => this.download() }, "Screenshot"));
    this.body = h("div", { class: "control", hidden: true },
      this.screen.root,
      h("div", { class: "control-side" },
        h("p", { class: "muted" }, "Click the screen to tap there, drag to swipe. With the screen focused, ",
          "type on your keyboard: text, Enter, Backspace, the arrows; Esc is Back."),
        h("div", { class: "keys" }, keyButtons(NAVIGATION, (m) => this.send(m), control)),
        h("div", { class: "keys" }, keyButtons(HARDWARE, (m) => this.send(m), control)),
        typed,
        h("div", { class: "keys" }, this.shot, this.end, this.again),
        h("h2", {}, "Phone"), this.facts,
        h("h2", {}, "Actions"), this.log));
    this.root = h("div", { class: "control-page" },
      h("h1", {}, maintenance ? "Maintenance: " : "Control ", h("span", { class: "mono" }, serial), " on ", hostLink(hostId)),
      this.status, this.refusal, this.body);
    this.enable(false);
    this.listen(this.screen.canvas);
    listenKeys(this.screen.canvas, (m) => this.send(m));
  }

  enable(on) {
    for (const el of this.controls) el.disabled = !on;
  }

  start() {
    const path = `/api/control?${this.query}${this.record ? "&record=1" : ""}${this.maintenance ? "&maintenance=1" : ""}`;
    const socket = openSocket(path);
    let opened = false;
    socket.onopen = () => {
      opened = true;
      this.body.hidden = false;
      this.end.disabled = false;
      this.screen.start();
      this.details();
      this.timer = setInterval(() => this.details(), DETAILS_EVERY_MS);
      this.sizer = setInterval(() => this.drawFacts(), 1000);
    };
    socket.onmessage = (event) => this.take(JSON.parse(event.data));
    socket.onclose = async () => {
      this.enable(false);
      if (!opened) {
        const err = await refusalOf(path, "the control session could not be opened");
        if (err.status === 401) {
          if (Control.session === this) Control.session = null;  // signed in, it asks again
          showLogin(err.message);
        } else {
          await this.refused(err);
        }
        return;
      }
      if (!this.ended) this.say("The session's connection closed.", this.taskId);
      this.over();
    };
    this.socket = socket;
  }

  // Refused before it opened: why, in words, and what can be done; no screen.
  async refused(err) {
    this.ended = true;
    this.status.replaceChildren();
    const actions = [];
    if (!["PERMISSION_DENIED", "UNAUTHENTICATED"].includes(err.code)) {
      const host = await this.readHost();
      const d = this.device;
      if (d && d.task_id) {
        actions.push(h("span", {}, "It runs task ", taskLink(d.task_id), " "),
          h("a", { class: "button", href: `/tasks/${d.task_id}?watch=1` }, "Watch its task"));
      } else if (d && host && !takesWork(host, d) && !this.maintenance) {
        actions.push(h("a", { class: "button maintenance", href: `/control?${this.query}&maintenance=1` }, "Control (maintenance)"));
      }
      actions.push(h("button", { type: "button", class: "plain", onclick: startAgain }, "Try again"));
      if (host) actions.push(h("span", {}, "Host ", hostLink(this.hostId)));
    }
    actions.push(h("a", { href: "/" }, "the Farm"));
    this.refusal.replaceChildren(h("div", { class: "refusal", role: "alert" },
      h("b", {}, REFUSED[err.code] || "Refused"), err.message,
      h("p", { class: "refusal-actions" }, actions.flatMap((a) => [a, " "]))));
  }

  async readHost() {
    try {
      const { host } = await call("GetHost", { host_id: this.hostId, events: 1 }, ADMIN_API);
      this.device = (host.devices || []).find((d) => d.serial === this.serial) || null;
      return host;
    } catch {
      return null;
    }
  }

  async details() {
    await this.readHost();
    this.drawFacts();
  }

  // The phone as its host last reported it, and its screen as its frames say.
  drawFacts() {
    const d = this.device || {};
    const c = this.screen.canvas;
    const seen = c.dataset.seq !== undefined;
    const rows = [
      ["model", this.device ? model(d) : "-"],
      ["Android", this.device ? android(d.sdk).replace("Android ", "") : "-"],
      ["resolution", seen ? `${c.width} × ${c.height}` : "-"],
      ["battery", d.battery_percent !== undefined ? `${d.battery_percent}%${d.charging ? ", charging" : ""}` : "-"],
      ["temperature", d.temperature_celsius !== undefined ? `${Math.round(d.temperature_celsius)} °C` : "-"],
      ["condition", this.device ? heldAs(condition(d)) : "-"],
    ];
    this.facts.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", { "data-field": k }, v)]));
  }

  // The screen as shown now, in the phone's pixels, as a PNG file.
  download() {
    const c = this.screen.canvas;
    if (c.dataset.seq === undefined) return;
    c.toBlob((blob) => {
      const stamp = new Date().toISOString().replace(/[-:]/g, "").replace(/\..*/, "");
      const a = h("a", { href: URL.createObjectURL(blob), download: `${this.serial}-${stamp}.png` });
      a.click();
      setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
    }, "image/png");
  }

  // Closing the socket ends the session (done) and frees the phone.
  close(why) {
    if (this.ended) return;
    this.ended = true;
    if (this.socket) this.socket.close(1000);
    this.say(`Session ended: ${why}; the phone is free again.`, this.taskId);
    this.over();
  }

  // Over, however it ended: nothing acts any more, and it may be started again.
  over() {
    this.ended = true;
    this.enable(false);
    this.end.disabled = true;
    this.again.hidden = false;
    clearInterval(this.timer);
    clearInterval(this.sizer);
    this.screen.stop();
  }

  say(text, taskId) {
    this.status.replaceChildren(text, ...(taskId ? [" Task ", taskLink(taskId)] : []));
  }

  take(message) {
    if (message.task) {
      const task = message.task;
      this.taskId = task.task_id;
      const status = statusOf(task);
      if (TERMINAL.has(status)) {
        const error = task.result && task.result.error ? `: ${task.result.error}` : "";
        this.say(`Session ended ${status}${error}.`, task.task_id);
        this.over();
      } else if (status === "dispatched") {
        this.ready = true;
        this.enable(true);
        const recorded = this.record ? ", its screen recorded" : "";
        const idle = task.spec.session && task.spec.session.idle_timeout;
        const ends = idle ? ` It ends after ${span(idle)} without an action, or when this page closes.` : "";
        const kind = this.maintenance ? "a maintenance session" : "an interactive session";
        this.say(`Controlling ${this.serial}: ${kind}${recorded}.${ends}`, task.task_id);
      } else {
        this.say(`Waiting for the phone (${status})${task.pending_reason ? `: ${task.pending_reason}` : ""}.`, task.task_id);
      }
    } else if (message.step) {
      const step = message.step;
      const status = enumName("STEP_STATUS_", step.status);
      this.note(`${actionText(message.action)} → ${status} ${took(step.duration)}${step.error ? `: ${step.error}` : ""}`,
        status === "ok" ? "" : "error-text");
    } else if (message.error) {
      this.note(said(message.error), "error-text");
    }
  }

  note(text, cls) {
    this.log.append(h("li", { class: cls }, text));
    this.log.scrollTop = this.log.scrollHeight;
  }

  send(action) {
    if (!this.ready || this.ended || !this.socket || this.socket.readyState !== WebSocket.OPEN) return false;
    this.socket.send(JSON.stringify(action));
    return true;
  }

  // A click taps where it lands, a drag swipes, both in the phone's pixels.
  listen(canvas) {
    let down = null;
    canvas.addEventListener("pointerdown", (event) => {
      if (!this.ready || this.ended) return;
      event.preventDefault();
      canvas.focus();
      canvas.setPointerCapture(event.pointerId);
      down = { ...this.screen.point(event), at: performance.now() };
    });
    canvas.addEventListener("pointerup", (event) => {
      if (!down) return;
      const up = this.screen.point(event);
      const start = down;
      down = null;
      if (Math.hypot(up.x - start.x, up.y - start.y) < TAP_SLOP * canvas.width) {
        this.send({ tap: { x: start.x, y: start.y } });
      } else {
        const ms = Math.min(3000, Math.max(100, Math.round(performance.now() - start.at)));
        this.send({ swipe: { x1: start.x, y1: start.y, x2: up.x, y2: up.y, duration_ms: ms } });
      }
    });
    canvas.addEventListener("pointercancel", () => { down = null; });
  }
}

// A new session on the same phone (after End session, or a refusal).
function startAgain() {
  stopScreens();
  refresh();
}

export const Control = {
  nav: "farm",
  title: () => "Control",
  session: null,
  load: async () => ({}),
  render() {
    const q = new URLSearchParams(location.search);
    const hostId = q.get("host_id") || "", serial = q.get("serial") || "";
    const record = q.get("record") === "1", maintenance = q.get("maintenance") === "1";
    if (!hostId || !serial) {
      return [h("div", { class: "error", role: "alert" }, "This address names no phone: /control?host_id=H&serial=S")];
    }
    const s = this.session;
    if (!s || s.hostId !== hostId || s.serial !== serial || s.record !== record || s.maintenance !== maintenance) {
      stopScreens();
      this.session = new ControlSession(hostId, serial, record, maintenance);
      this.session.start();
    }
    return [this.session.root];
  },
  // The session's socket says what changes; the page is never redrawn under the operator.
  wants: () => false,
};

// Leaving a page: its screens stop (shell.js's route calls this).
export function stopScreens() {
  stopWatch();
  if (Control.session) {
    Control.session.close("the page was left");
    Control.session = null;
  }
}
