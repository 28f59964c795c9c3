// The files steps kept, on the Task page: fetched with the token (an <img src> could not
// send it), checked, and shown from blob: URLs; and a task's screen recording.

import { ARTIFACT_API, TERMINAL, authHeaders } from "./api.js";
import { h, main, size, statusOf, stepLabel } from "./dom.js";

// artifact id -> {url: its blob: URL, sha256: as computed here, or ""} once fetched
// (artifacts never change); the fetches under way.
const artifactUrls = new Map();
const artifactFetches = new Map();

// Leaving a task's page: its blob: URLs go.
export function forgetArtifacts() {
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
  for (const video of box.querySelectorAll("video")) video.src = url;
  if (sha256) {
    box.dataset.checked = sha256;
    box.querySelector(".checked").textContent = " ✓ checked";
  }
}

// A step's kept files but the screen recording (shown in a section of its own, below) and
// the run's phone log (the Log tab's: log.js).
export const keptFiles = (s) => (s.artifacts || []).filter((a) => !isRecording(a) && a.kind !== "logcat");

export function artifactView(a) {
  const type = a.content_type || "";
  const image = type.startsWith("image/");
  const video = type.startsWith("video/");
  const name = `${a.kind}-${a.artifact_id}.${image ? "png" : video ? "mp4" : "xml"}`;
  const shown = image
    ? h("a", { class: "thumb", target: "_blank", title: "open full size" },
      h("img", { alt: `${a.kind} of ${stepLabel(a.step_index, a.step_name)}` }))
    : video
      ? h("span", { class: "video" },
        h("video", { class: "recording", controls: "", muted: "", playsinline: "", preload: "auto",
          "aria-label": `${a.kind} of ${stepLabel(a.step_index, a.step_name)}` }),
        h("a", { class: "save", download: name }, "save"))
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

// -- a task's screen recording ---------------------------------------------------------------

// A task whose spec asks for it keeps a recording of its phone's screen with its run's
// last step, an MP4 of the phone's H.264 stream played in a <video>, or (a phone without a
// stream) an animated PNG the browser plays as an image: the Task page shows it in a
// section of its own (and not again among that step's kept files).
const RECORDING_KINDS = new Set(["screen_recording", "screen_video"]);

const isRecording = (a) => RECORDING_KINDS.has(a.kind);

export function recordingSection(task, steps) {
  if (!task.spec || !task.spec.record_screen) return [];
  const recordings = steps.flatMap((s) => (s.artifacts || []).filter(isRecording));
  const body = recordings.length
    ? h("div", { class: "artifacts recordings" }, recordings.map(artifactView))
    : h("p", { class: "muted" }, TERMINAL.has(statusOf(task))
      ? "No recording was kept."
      : "The screen is recorded while the task runs; the recording is kept with its last step when it ends.");
  return [h("h2", {}, "Screen recording"), body];
}
