// The Control page (/control?host_id=H&serial=S): an operator drives an idle phone in an
// interactive session (/api/control), on its live screen (screen.js).

import { TERMINAL } from "./api.js";
import { enumName, h, hostLink, span, statusOf, taskLink, took } from "./dom.js";
import { LiveScreen, openSocket, refusalOf, stopWatch } from "./screen.js";
import { showLogin } from "./shell.js";

// A press that moves less than this share of the screen's width is a tap, not a swipe.
const TAP_SLOP = 0.02;

const KEY_BUTTONS = [["Back", "BACK"], ["Home", "HOME"], ["App switch", "APP_SWITCH"]];

// What an action was, as the log says it: tap (540, 1200), type "hello", key BACK.
function actionText(a) {
  if (a.tap) return `tap (${a.tap.x}, ${a.tap.y})`;
  if (a.swipe) return `swipe (${a.swipe.x1}, ${a.swipe.y1}) → (${a.swipe.x2}, ${a.swipe.y2})`;
  if (a.type) return `type "${a.type.text}"`;
  if (a.key) return `key ${a.key}`;
  return "?";
}

// One operator's session on one phone, for as long as the page shows it.
class ControlSession {
  constructor(hostId, serial, record) {
    this.hostId = hostId;
    this.serial = serial;
    this.record = record;
    this.query = `host_id=${encodeURIComponent(hostId)}&serial=${encodeURIComponent(serial)}`;
    this.ready = false;
    this.ended = false;
    this.socket = null;
    this.screen = new LiveScreen(this.query);
    this.status = h("p", { id: "control-status", class: "muted" }, "asking for the phone…");
    this.log = h("ol", { id: "action-log", class: "action-log" });
    this.controls = [];
    const button = (label, key) => this.control(h("button", { type: "button", "data-key": key,
      onclick: () => this.send({ key }) }, label));
    const text = h("input", { name: "text", "aria-label": "text to type", placeholder: "text to type", size: 24 });
    const typed = h("form", { class: "inline", id: "type-form", onsubmit: (event) => {
      event.preventDefault();
      if (text.value && this.send({ type: { text: text.value } })) text.value = "";
    } }, this.control(text), this.control(h("button", { type: "submit" }, "Type")));
    this.end = h("button", { type: "button", class: "danger", id: "end-session", onclick: () => this.close("you ended it") }, "End session");
    this.root = h("div", { class: "control-page" },
      h("h1", {}, "Control ", h("span", { class: "mono" }, serial), " on ", hostLink(hostId)),
      this.status,
      h("div", { class: "control" },
        this.screen.root,
        h("div", { class: "control-side" },
          h("p", { class: "muted" }, "Click the screen to tap there, drag to swipe."),
          h("div", { class: "keys" }, KEY_BUTTONS.map(([label, key]) => button(label, key))),
          typed, this.end,
          h("h2", {}, "Actions"), this.log)));
    this.enable(false);
    this.listen(this.screen.canvas);
  }

  control(el) {
    this.controls.push(el);
    return el;
  }

  enable(on) {
    for (const el of this.controls) el.disabled = !on;
  }

  start() {
    const path = `/api/control?${this.query}${this.record ? "&record=1" : ""}`;
    const socket = openSocket(path);
    let opened = false;
    socket.onopen = () => {
      opened = true;
      this.screen.start();
    };
    socket.onmessage = (event) => this.take(JSON.parse(event.data));
    socket.onclose = async () => {
      this.enable(false);
      if (!opened) {
        const err = await refusalOf(path, "the control session could not be opened");
        if (Control.session === this) Control.session = null;  // a new page asks again
        if (err.status === 401) showLogin(err.message);
        else this.say(h("span", { class: "error-text", role: "alert" }, `${err.code}: ${err.message}`));
        return;
      }
      if (!this.ended) this.say("The session's connection closed.");
      this.ended = true;
      this.screen.stop();
    };
    this.socket = socket;
  }

  // Closing the socket ends the session (done) and frees the phone.
  close(why) {
    if (this.ended) return;
    this.ended = true;
    this.enable(false);
    this.end.disabled = true;
    if (this.socket) this.socket.close(1000);
    this.screen.stop();
    this.say(`Session ended: ${why}; the phone is free again.`, this.taskId);
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
        this.ended = true;
        this.enable(false);
        this.end.disabled = true;
        this.screen.stop();
        const error = task.result && task.result.error ? `: ${task.result.error}` : "";
        this.say(`Session ended ${status}${error}.`, task.task_id);
      } else if (status === "dispatched") {
        this.ready = true;
        this.enable(true);
        const recorded = this.record ? ", its screen recorded" : "";
        const idle = task.spec.session && task.spec.session.idle_timeout;
        const ends = idle ? ` It ends after ${span(idle)} without an action, or when this page closes.` : "";
        this.say(`Controlling ${this.serial}: an interactive session${recorded}.${ends}`, task.task_id);
      } else {
        this.say(`Waiting for the phone (${status})${task.pending_reason ? `: ${task.pending_reason}` : ""}.`, task.task_id);
      }
    } else if (message.step) {
      const step = message.step;
      const status = enumName("STEP_STATUS_", step.status);
      this.note(`${actionText(message.action)} → ${status} ${took(step.duration)}${step.error ? `: ${step.error}` : ""}`,
        status === "ok" ? "" : "error-text");
    } else if (message.error) {
      this.note(`${message.error.code}: ${message.error.message}`, "error-text");
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

export const Control = {
  nav: "farm",
  title: () => "Control",
  session: null,
  load: async () => ({}),
  render() {
    const q = new URLSearchParams(location.search);
    const hostId = q.get("host_id") || "", serial = q.get("serial") || "";
    const record = q.get("record") === "1";
    if (!hostId || !serial) {
      return [h("div", { class: "error", role: "alert" }, "INVALID_ARGUMENT: name the phone: /control?host_id=H&serial=S")];
    }
    const s = this.session;
    if (!s || s.hostId !== hostId || s.serial !== serial || s.record !== record) {
      stopScreens();
      this.session = new ControlSession(hostId, serial, record);
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
