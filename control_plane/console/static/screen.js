// A phone's live screen in the console (/api/screen, one binary message per frame): the
// screen itself, used by the Control page (control.js), and the Task page's "Watch screen"
// of a running task's phone.

import { ApiError, IN_FLIGHT, TOKEN_KEY, authHeaders } from "./api.js";
import { h, statusOf, when } from "./dom.js";

const SOCKET_PROTOCOL = "amc.v1";
// A browser's WebSocket cannot send an Authorization header: the token goes as a subprotocol.
const TOKEN_PROTOCOL = "amc.bearer.";

function socketUrl(path) {
  return `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}${path}`;
}

export function openSocket(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return new WebSocket(socketUrl(path), token ? [SOCKET_PROTOCOL, TOKEN_PROTOCOL + token] : [SOCKET_PROTOCOL]);
}

// Why a socket was refused before it opened: a browser does not show a refused upgrade's
// answer, so the same address is read again over HTTP, which answers the refusal as JSON
// (the server creates nothing before a socket opens).
export async function refusalOf(path, fallback) {
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

// A watch lost to trouble between the phone's host and this replica (closed 1011 with
// UNAVAILABLE: the host left the replica, a relay was lost, the replica is stopping), or a
// task's watch whose task moved to another phone (closed 1011 with ABORTED), is opened
// again by itself, after these pauses, for up to REOPEN_FOR_MS from the loss: a host
// reconnects within seconds of most faults, and a task that moved is watched on its new
// phone. Meanwhile a refusal saying the host is not (yet) connected or the task not (yet)
// running again (FAILED_PRECONDITION) or UNAVAILABLE is tried again too; any other
// refusal, or one after the window, ends it.
const REOPEN_PAUSES_MS = [500, 1000, 2000, 4000];
const REOPEN_FOR_MS = 60_000;
const TRIED_AGAIN = new Set(["UNAVAILABLE", "FAILED_PRECONDITION"]);
const REOPENED_ON_CLOSE = ["UNAVAILABLE", "ABORTED"];

// The phone's H.264 stream is asked for where this browser decodes it (WebCodecs'
// VideoDecoder: Chromium, Safari 16.4+, Firefox 130+; only on https or localhost, where a
// page is a secure context), still images elsewhere, and once a decoder failed.
const PROBE_CODEC = "avc1.42c01f";
// A decoder this many frames behind watches again (from a key frame).
const MOST_QUEUED = 30;
let h264 = null;

export function decodesH264() {
  if (typeof VideoDecoder === "undefined") return Promise.resolve(false);
  if (h264 === null) {
    h264 = VideoDecoder.isConfigSupported({ codec: PROBE_CODEC, optimizeForLatency: true })
      .then((answer) => answer.supported === true, () => false);
  }
  return h264;
}

// A phone's live screen on a canvas whose pixels are the phone's: a frame's header gives
// the phone's width and height in its own pixels (the coordinates a tap takes), and its
// picture, whatever its own size, is drawn scaled to them. Still images: the newest frame
// wins and one is decoded at a time, so a slow page skips frames instead of falling
// behind. The stream: every frame decoded in order, from a key frame on (one after a gap;
// a decoder far behind watches again).
// `query` says which phone (host_id and serial, or task_id).
export class LiveScreen {
  constructor(query) {
    this.query = query;
    this.path = `/api/screen?${query}`;
    this.canvas = h("canvas", { class: "screen", width: 360, height: 800, "aria-label": "live screen" });
    this.state = h("div", { class: "screen-state muted" }, "connecting…");
    this.root = h("div", { class: "screen-box" }, this.canvas, this.state);
    this.pending = null;
    this.drawing = false;
    this.stopped = false;
    this.socket = null;
    // While the watch is being opened again: when it was lost, and the tries since.
    this.lostAt = null;
    this.tries = 0;
    this.timer = null;
    // The stream's decoder, what it was set up for, and the headers of the frames in it.
    this.decoder = null;
    // Why the stream is not watched (its decoder failed), or false.
    this.noVideo = false;
    this.headers = new Map();
    this.lastSeq = null;
    this.awaitKey = true;
  }

  start() {
    decodesH264().then((yes) => {
      if (!this.stopped) this.open(yes && !this.noVideo ? "h264" : "image");
    });
  }

  open(codec) {
    this.closeDecoder();
    // The stream at 30 frames a second unless asked otherwise: its frames between changes
    // are a few hundred bytes, and a tap shows sooner.
    const fps = codec === "h264" && !this.path.includes("max_fps=") ? "&max_fps=30" : "";
    const socket = openSocket(`${this.path}&codec=${codec}${fps}`);
    socket.binaryType = "arraybuffer";
    let opened = false;
    socket.onopen = () => {
      opened = true;
      this.lostAt = null;
      this.tries = 0;
      this.say("waiting for the first frame…");
    };
    socket.onmessage = (event) => this.take(event.data);
    socket.onclose = async (event) => {
      if (this.stopped || this.socket !== socket) return;
      this.closeDecoder(); // no late picture of this watch over what is said next
      if (!opened) {
        const err = await refusalOf(this.path, "the live screen could not be opened");
        const why = `${err.code}: ${err.message}`;
        const inTime = this.lostAt !== null && Date.now() - this.lostAt < REOPEN_FOR_MS;
        if (inTime && TRIED_AGAIN.has(err.code)) this.reopen(why);
        else this.say(why, true);
      } else if (event.code === 1011 && REOPENED_ON_CLOSE.some((c) => event.reason.startsWith(c))) {
        this.lostAt = Date.now();
        this.reopen(`screen lost: ${event.reason}`);
      } else {
        this.say(event.reason ? `screen ended: ${event.reason}` : "screen ended", event.code !== 1000);
      }
    };
    this.socket = socket;
  }

  // Open the watch again after a pause, saying why.
  reopen(why) {
    if (this.stopped) return;
    const pause = REOPEN_PAUSES_MS[Math.min(this.tries, REOPEN_PAUSES_MS.length - 1)];
    this.tries += 1;
    this.say(`${why} · opening it again (try ${this.tries})…`, true);
    this.timer = setTimeout(() => {
      this.timer = null;
      if (!this.stopped) this.start();
    }, pause);
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    this.closeDecoder();
    if (this.socket) this.socket.close(1000);
  }

  say(text, bad = false) {
    this.state.className = `screen-state ${bad ? "error-text" : "muted"}`;
    this.state.textContent = text;
  }

  // A message: 4 bytes of header length (big-endian), the JSON header, the image or the
  // stream's frame.
  take(data) {
    if (!(data instanceof ArrayBuffer) || data.byteLength < 4) return;
    const length = new DataView(data).getUint32(0);
    const header = JSON.parse(new TextDecoder().decode(new Uint8Array(data, 4, length)));
    if (header.mime === "video/h264") {
      this.decodeVideo(header, new Uint8Array(data, 4 + length));
      return;
    }
    this.pending = { header, image: new Blob([new Uint8Array(data, 4 + length)], { type: header.mime }) };
    if (!this.drawing) this.draw();
  }

  // -- the stream (WebCodecs) --------------------------------------------------------------

  decodeVideo(header, bytes) {
    const params = header.video;
    if (params && (!this.decoder || this.decoder.codec !== params.codec)) {
      this.closeDecoder();
      const decoder = new VideoDecoder({
        output: (picture) => this.show(picture),
        error: (err) => this.videoFailed(err),
      });
      decoder.configure({
        codec: params.codec, codedWidth: params.coded_width, codedHeight: params.coded_height,
        optimizeForLatency: true,
      });
      this.decoder = { decoder, codec: params.codec };
    }
    const gap = this.lastSeq !== null && header.seq !== this.lastSeq + 1;
    this.lastSeq = header.seq;
    if (!this.decoder || this.decoder.decoder.state !== "configured") return;
    if (this.decoder.decoder.decodeQueueSize > MOST_QUEUED) {
      // Far behind: a new watch starts at a key frame (the host is asked for one).
      this.watchAgain();
      return;
    }
    if (gap) this.awaitKey = true;
    if (this.awaitKey && !header.key_frame) return;
    this.awaitKey = false;
    this.headers.set(header.pts_us, header);
    this.decoder.decoder.decode(new EncodedVideoChunk({
      type: header.key_frame ? "key" : "delta", timestamp: header.pts_us, data: bytes,
    }));
  }

  // A decoded picture, drawn at the phone's size.
  show(picture) {
    const header = this.headers.get(picture.timestamp);
    for (const at of this.headers.keys()) {
      if (at > picture.timestamp) break;
      this.headers.delete(at);
    }
    if (header && !this.stopped) {
      this.paint(picture, header);
      this.canvas.dataset.codec = "h264";
    }
    picture.close();
  }

  watchAgain() {
    const socket = this.socket;
    this.socket = null;
    if (socket) socket.close(1000);
    this.open("h264");
  }

  videoFailed(err) {
    this.closeDecoder();
    if (this.stopped) return;
    this.noVideo = `H.264 could not be decoded here (${err.message})`;
    this.say(`the H.264 stream could not be decoded (${err.message}): still images instead`, true);
    if (this.socket) this.socket.close(1000);
    this.socket = null;
    this.open("image");
  }

  closeDecoder() {
    if (this.decoder && this.decoder.decoder.state !== "closed") this.decoder.decoder.close();
    this.decoder = null;
    this.headers.clear();
    this.lastSeq = null;
    this.awaitKey = true;
  }

  // A picture (an ImageBitmap or a VideoFrame) on the canvas, at the phone's size.
  paint(picture, header) {
    if (this.canvas.width !== header.width) this.canvas.width = header.width;
    if (this.canvas.height !== header.height) this.canvas.height = header.height;
    this.canvas.getContext("2d").drawImage(picture, 0, 0, header.width, header.height);
    this.canvas.dataset.seq = header.seq;
    this.canvas.dataset.phone = `${header.host_id}/${header.serial}`;
    const kind = header.mime === "video/h264" ? " · H.264" : "";
    const fallback = this.noVideo ? ` · still images: ${this.noVideo}` : "";
    this.say(`frame ${header.seq} · ${header.width} × ${header.height} · captured ${when(new Date(header.captured_at_ms).toISOString())}${kind}${fallback}`);
  }

  async draw() {
    this.drawing = true;
    while (this.pending && !this.stopped) {
      const { header, image } = this.pending;
      this.pending = null;
      try {
        const bitmap = await createImageBitmap(image);
        this.paint(bitmap, header);
        this.canvas.dataset.codec = "image";
        bitmap.close();
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

// -- the Task page's "Watch screen" ---------------------------------------------------------

// The watch of the task page shown: {taskId, root, screen}. It outlives the page's redraws
// (the same element goes back in), and stops when the task ends or the page goes. A task
// back in the queue (its lease ended, its phone lost) keeps its watch: its screen opens
// again on the phone that takes it next (the watch closed ABORTED and is opened again).
let watch = null;

export function watchPanel(task) {
  const running = IN_FLIGHT.has(statusOf(task)) && task.host_id;
  const requeued = statusOf(task) === "queued" && watch && watch.taskId === task.task_id;
  if (!running && !requeued) {
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
  // Opened from a Watch button (the Farm page's busy phone): watching at once.
  if (new URLSearchParams(location.search).get("watch") === "1") button.click();
  return w.root;
}

export function stopWatch() {
  if (watch && watch.screen) watch.screen.stop();
  watch = null;
}
