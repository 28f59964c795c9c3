// Live updates: /api/events' server-sent events, read with fetch so the token goes in a
// header, and the header's indicator of how the stream is.

import { authHeaders } from "./api.js";
import { setOffline } from "./offline.js";

let liveRun = 0;
let liveAbort = null;

export function stopLive() {
  liveRun++;
  if (liveAbort) liveAbort.abort();
  liveAbort = null;
}

// The indicator says how the page's event stream is: "connecting…", "live" (changes
// arrive), "offline" (the control plane cannot be reached) or "not live" (signed out).
const LIVE_TEXT = { wait: "connecting…", on: "live", off: "offline", idle: "not live" };

export function setLive(state) {
  const el = document.getElementById("live");
  el.className = `live ${state}`;
  el.textContent = LIVE_TEXT[state];
  // Offline greys the page out and turns its actions off; live again turns them back on.
  if (state === "off") setOffline(true);
  else if (state === "on" || state === "idle") setOffline(false);
}

export async function listen(onEvent, onConnect) {
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
