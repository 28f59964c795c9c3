// The Farm and Host pages' thumbnails: a small, slow picture of each phone shown, all of
// them over one WebSocket (/api/thumbnails, control_plane/console/thumbnails.py): the page
// says which phones it shows ({"watch": [[host_id, serial], ...]}, again when that
// changes), the server sends each one's frames as /api/screen does (a few seconds apart at
// most: the host's budget for thumbnails decides) and says when one's watch ended. Only
// while the page is open and the tab visible: a hidden tab closes the socket, and with it
// every capture it asked for.

import { openSocket, refusalOf } from "./screen.js";
import { h } from "./dom.js";

const PATH = "/api/thumbnails";
// The pauses before the socket is opened again after it broke.
const REOPEN_MS = [1000, 2000, 5000, 10000];

const keyOf = (hostId, serial) => `${hostId}/${serial}`;

class Thumbnails {
  constructor() {
    this.wanted = new Map();   // key -> [host_id, serial]
    this.urls = new Map();     // key -> blob: URL of its latest frame
    this.ended = new Map();    // key -> why its watch ended
    this.socket = null;
    this.open = false;
    this.tries = 0;
    this.timer = null;
    this.running = false;
    this.note = "";
    document.addEventListener("visibilitychange", () => this.visibility());
  }

  // The phones the page shows: watched from now on (and those it no longer shows, not).
  want(phones) {
    const wanted = new Map(phones.map(([hostId, serial]) => [keyOf(hostId, serial), [hostId, serial]]));
    const same = wanted.size === this.wanted.size && [...wanted.keys()].every((k) => this.wanted.has(k));
    this.wanted = wanted;
    for (const key of this.urls.keys()) if (!wanted.has(key)) this.forget(key);
    this.running = true;
    if (!this.socket && !this.timer) this.connect();
    else if (!same) this.tell();
  }

  // The picture of one phone, as an element the page puts in its card: the latest frame,
  // or what stands for it.
  image(hostId, serial, offline) {
    const key = keyOf(hostId, serial);
    const url = this.urls.get(key);
    if (url) return h("img", { class: "thumb", src: url, alt: `${serial}'s screen`, "data-thumb": key });
    const why = offline ? "offline" : this.ended.get(key) || this.note || "…";
    return h("div", { class: "thumb empty", "data-thumb": key, title: why }, offline ? "offline" : "no picture yet");
  }

  stop() {
    this.running = false;
    clearTimeout(this.timer);
    this.timer = null;
    if (this.socket) this.socket.close(1000);
    this.socket = null;
    for (const url of this.urls.values()) URL.revokeObjectURL(url);
    this.urls.clear();
    this.ended.clear();
  }

  visibility() {
    if (!this.running) return;
    if (document.hidden) {
      if (this.socket) this.socket.close(1000);
      this.socket = null;
    } else if (!this.socket) {
      this.connect();
    }
  }

  connect() {
    this.timer = null;
    if (!this.running || document.hidden) return;
    const socket = openSocket(PATH);
    socket.binaryType = "arraybuffer";
    this.socket = socket;
    this.open = false;
    socket.onopen = () => {
      this.open = true;
      this.tries = 0;
      this.note = "";
      this.tell();
    };
    socket.onmessage = (event) => this.take(event.data);
    socket.onclose = async () => {
      if (this.socket !== socket) return;
      this.socket = null;
      if (!this.open) {
        const err = await refusalOf(PATH, "thumbnails could not be opened");
        this.note = `${err.code}: ${err.message}`;
      }
      if (!this.running || document.hidden) return;
      const pause = REOPEN_MS[Math.min(this.tries, REOPEN_MS.length - 1)];
      this.tries += 1;
      this.timer = setTimeout(() => this.connect(), pause);
    };
  }

  tell() {
    if (this.socket && this.open) this.socket.send(JSON.stringify({ watch: [...this.wanted.values()] }));
  }

  // A binary message is a frame (4 bytes of header length, the JSON header, the image); a
  // text one says a phone's watch ended ({"phone": [host_id, serial], "ended": why}).
  take(data) {
    if (typeof data === "string") {
      const message = JSON.parse(data);
      if (message.phone) this.ended.set(keyOf(...message.phone), message.ended);
      return;
    }
    if (!(data instanceof ArrayBuffer) || data.byteLength < 4) return;
    const length = new DataView(data).getUint32(0);
    const header = JSON.parse(new TextDecoder().decode(new Uint8Array(data, 4, length)));
    const key = keyOf(header.host_id, header.serial);
    if (!this.wanted.has(key)) return;
    const url = URL.createObjectURL(new Blob([new Uint8Array(data, 4 + length)], { type: header.mime }));
    const old = this.urls.get(key);
    this.urls.set(key, url);
    this.ended.delete(key);
    for (const el of document.querySelectorAll(`[data-thumb="${CSS.escape(key)}"]`)) {
      if (el.tagName === "IMG") el.src = url;
      else el.replaceWith(h("img", { class: "thumb", src: url, alt: `${header.serial}'s screen`, "data-thumb": key }));
    }
    if (old) URL.revokeObjectURL(old);
  }

  forget(key) {
    const url = this.urls.get(key);
    if (url) URL.revokeObjectURL(url);
    this.urls.delete(key);
  }
}

// The one set of thumbnails of the page shown (the Farm or a Host page).
export const thumbnails = new Thumbnails();
