// A phone's screen in the console: the live screen (/api/screen, one binary message per
// frame), the Control page that drives an idle phone in an interactive session
// (/api/control), the Task page's "Watch screen" of a running task's phone, and the screen
// recording a task kept. Loaded after console.js, whose helpers it uses (h, call, main, ...).
"use strict";

const SOCKET_PROTOCOL = "amc.v1";
// A browser's WebSocket cannot send an Authorization header: the token goes as a subprotocol.
const TOKEN_PROTOCOL = "amc.bearer.";
const RUNNING = new Set(["assigned", "dispatched"]);
// A press that moves less than this share of the screen's width is a tap, not a swipe.
const TAP_SLOP = 0.02;

function socketUrl(path) {
  return `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}${path}`;
}

function openSocket(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return new WebSocket(socketUrl(path), token ? [SOCKET_PROTOCOL, TOKEN_PROTOCOL + token] : [SOCKET_PROTOCOL]);
}

// Why a socket was refused before it opened: a browser does not show a refused upgrade's
// answer, so the same address is read again over HTTP, which answers the refusal as JSON
// (the server creates nothing before a socket opens).
async function refusalOf(path, fallback) {
  try {
    const response = await fetch(path, { headers: authHeaders() });
    const data = await response.json();
    if (!response.ok && data.code && !String(data.message).startsWith("nothing at")) {
      return new ApiError(response.status, data.code, data.message);
    }
  } catch { /* the fallback says it */ }
  return new ApiError(0, "UNAVAILABLE", fallback);
}

// -- the live screen ---------------------------------------------------------------------------

// A phone's live screen on a canvas whose pixels are the phone's: a frame's header gives
// the phone's width and height in its own pixels (the coordinates a tap takes), and its
// image, whatever its own size, is drawn scaled to them. The newest frame wins and one is
// decoded at a time, so a slow page skips frames instead of falling behind. `query` says
// which phone (host_id and serial, or task_id).
class LiveScreen {
  constructor(query) {
    this.path = `/api/screen?${query}`;
    this.canvas = h("canvas", { class: "screen", width: 360, height: 800, "aria-label": "live screen" });
    this.state = h("div", { class: "screen-state muted" }, "connecting…");
    this.root = h("div", { class: "screen-box" }, this.canvas, this.state);
    this.pending = null;
    this.drawing = false;
    this.stopped = false;
    this.socket = null;
  }

  start() {
    const socket = openSocket(this.path);
    socket.binaryType = "arraybuffer";
    let opened = false;
    socket.onopen = () => { opened = true; this.say("waiting for the first frame…"); };
    socket.onmessage = (event) => this.take(event.data);
    socket.onclose = async (event) => {
      if (this.stopped) return;
      if (!opened) {
        const err = await refusalOf(this.path, "the live screen could not be opened");
        this.say(`${err.code}: ${err.message}`, true);
      } else {
        this.say(event.reason ? `screen ended: ${event.reason}` : "screen ended", event.code !== 1000);
      }
    };
    this.socket = socket;
  }

  stop() {
    this.stopped = true;
    if (this.socket) this.socket.close(1000);
  }

  say(text, bad = false) {
    this.state.className = `screen-state ${bad ? "error-text" : "muted"}`;
    this.state.textContent = text;
  }

  // A message: 4 bytes of header length (big-endian), the JSON header, the image.
  take(data) {
    if (!(data instanceof ArrayBuffer) || data.byteLength < 4) return;
    const length = new DataView(data).getUint32(0);
    const header = JSON.parse(new TextDecoder().decode(new Uint8Array(data, 4, length)));
    this.pending = { header, image: new Blob([new Uint8Array(data, 4 + length)], { type: header.mime }) };
    if (!this.drawing) this.draw();
  }

  async draw() {
    this.drawing = true;
    while (this.pending && !this.stopped) {
      const { header, image } = this.pending;
      this.pending = null;
      try {
        const bitmap = await createImageBitmap(image);
        if (this.canvas.width !== header.width) this.canvas.width = header.width;
        if (this.canvas.height !== header.height) this.canvas.height = header.height;
        this.canvas.getContext("2d").drawImage(bitmap, 0, 0, header.width, header.height);
        bitmap.close();
        this.canvas.dataset.seq = header.seq;
        this.say(`frame ${header.seq} · ${header.width} × ${header.height} · captured ${when(new Date(header.captured_at_ms).toISOString())}`);
      } catch (err) {
        this.say(`a frame could not be shown: ${err.message}`, true);
      }
    }
    this.drawing = false;
  }

  // The phone's pixel under a pointer event: the canvas's pixels are the phone's.
  point(event) {
    const rect = this.canvas.getBoundingClientRect();
    const clamp = (v, most) => Math.min(most - 1, Math.max(0, Math.round(v)));
    return {
      x: clamp(((event.clientX - rect.left) / rect.width) * this.canvas.width, this.canvas.width),
      y: clamp(((event.clientY - rect.top) / rect.height) * this.canvas.height, this.canvas.height),
    };
  }
}

// -- the Control page: /control?host_id=H&serial=S -------------------------------------------

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

const Control = {
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

// The Farm and Host pages' "Control" on an idle ready phone of a connected host that takes
// work (operators only see those pages); the control plane checks all of it again.
function controlLink(host, d) {
  const free = host.connected && !host.cordoned && !host.draining && !d.cordoned && !d.task_id &&
    enumName("DEVICE_STATE_", d.state) === "device" && condition(d) === "ready";
  if (!free) return "";
  const query = `host_id=${encodeURIComponent(host.host_id)}&serial=${encodeURIComponent(d.serial)}`;
  return h("a", { class: "button control-link", href: `/control?${query}`, title: `control ${d.serial} from here` }, "Control");
}

// -- the Task page's "Watch screen" ---------------------------------------------------------

// The watch of the task page shown: {taskId, root, screen}. It outlives the page's redraws
// (the same element goes back in), and stops when the task stops running or the page goes.
let watch = null;

function watchPanel(task) {
  if (!RUNNING.has(statusOf(task)) || !task.host_id) {
    stopWatch();
    return null;
  }
  if (watch && watch.taskId === task.task_id) return watch.root;
  stopWatch();
  const w = { taskId: task.task_id, screen: null };
  const button = h("button", { type: "button", id: "watch-button" }, "Watch screen");
  const holder = h("div", { class: "watch-screen" });
  button.addEventListener("click", () => {
    if (w.screen) {
      w.screen.stop();
      w.screen = null;
      holder.replaceChildren();
      button.textContent = "Watch screen";
      return;
    }
    w.screen = new LiveScreen(`task_id=${encodeURIComponent(task.task_id)}`);
    holder.replaceChildren(w.screen.root);
    w.screen.start();
    button.textContent = "Stop watching";
  });
  w.root = h("div", { id: "watch" },
    h("div", { class: "inline" }, button,
      h("span", { class: "muted" }, " the phone's screen, live; watching does not touch the task")),
    holder);
  watch = w;
  return w.root;
}

function stopWatch() {
  if (watch && watch.screen) watch.screen.stop();
  watch = null;
}

// Leaving a page: its screens stop (console.js's route calls this).
function stopScreens() {
  stopWatch();
  if (Control.session) {
    Control.session.close("the page was left");
    Control.session = null;
  }
}

// -- a task's screen recording ---------------------------------------------------------------

// A task whose spec asks for it keeps a recording of its phone's screen, an animated PNG
// the browser plays as an image, with its run's last step: the Task page shows it in a
// section of its own (and not again among that step's kept files).
const RECORDING_KIND = "screen_recording";

const isRecording = (a) => a.kind === RECORDING_KIND;

function recordingSection(task, steps) {
  if (!task.spec || !task.spec.record_screen) return [];
  const recordings = steps.flatMap((s) => (s.artifacts || []).filter(isRecording));
  const body = recordings.length
    ? h("div", { class: "artifacts recordings" }, recordings.map(artifactView))
    : h("p", { class: "muted" }, TERMINAL.has(statusOf(task))
      ? "No recording was kept."
      : "The screen is recorded while the task runs; the recording is kept with its last step when it ends.");
  return [h("h2", {}, "Screen recording"), body];
}
