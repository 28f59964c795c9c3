// The Apps page (/apps): the app library — every app with its package, version, minimum
// SDK, size, sha256 (its id) and who uploaded it when; an upload form (the file's bytes to
// /api/library/apps with the SHA-256 the browser computed, checked again by the control
// plane) and a Remove button per app (operators: any; clients: their own or their team's).

import { LIBRARY_API, ApiError, authHeaders, call } from "./api.js";
import { h, size, table, when } from "./dom.js";
import { refresh } from "./shell.js";

// What the last upload or removal said, kept across the redraws that follow it.
let said = { text: "", failed: false };

export const Apps = {
  nav: "apps",
  title: () => "Apps",
  load: () => call("ListApps", {}, LIBRARY_API),
  render({ apps = [] }) {
    const rows = apps.map((a) => h("tr", { "data-app": a.app_id },
      h("td", { class: "package" }, a.package),
      h("td", { class: "version" }, `${a.version_name} (${a.version_code})`),
      h("td", { class: "min-sdk" }, a.min_sdk || "-"),
      h("td", { class: "size" }, size(a.size_bytes)),
      h("td", { class: "sha256 mono", title: a.app_id }, a.app_id),
      h("td", { class: "uploaded-by" }, a.team ? `${a.uploaded_by} (${a.team})` : a.uploaded_by),
      h("td", { class: "uploaded-at" }, when(a.uploaded_at)),
      h("td", {}, h("button", { type: "button", class: "danger", onclick: () => remove(a) }, "Remove"))));
    return [
      h("h1", {}, "Apps"),
      uploadForm(),
      apps.length
        ? table(["package", "version", "min SDK", "size", "sha256 (id)", "uploaded by", "uploaded", ""], rows, { id: "apps" })
        : h("p", { class: "muted" }, "The library has no apps yet: upload an APK above, or `amc apps upload FILE`."),
      h("p", { class: "muted" }, "A task installs one with its install_app action or its spec's apps: ",
        "by id, or by package (the newest upload of it)."),
    ];
  },
  // The library changes through this page or another client: nothing on the event stream.
  wants: () => false,
};

function say(text, failed) {
  said = { text, failed };
}

function uploadForm() {
  // No `name`: the page's redraw keeps what named inputs hold, which a file input refuses.
  const file = h("input", { type: "file", accept: ".apk,application/vnd.android.package-archive", "aria-label": "APK file" });
  const button = h("button", { type: "submit" }, "Upload");
  const message = h("span", { id: "upload-message", class: said.failed ? "error-text" : "muted" }, said.text);
  return h("form", { class: "inline", id: "upload", onsubmit: async (event) => {
    event.preventDefault();
    const chosen = file.files && file.files[0];
    if (!chosen) return;
    button.disabled = true;
    message.className = "muted";
    message.textContent = `uploading ${chosen.name}…`;
    try {
      const app = await upload(chosen);
      say(`kept ${app.package} ${app.version_name} as ${app.app_id.slice(0, 12)}…`, false);
    } catch (err) {
      say(`${err.code}: ${err.message}`, true);
    }
    refresh();
  } }, file, button, message);
}

async function upload(file) {
  if (!(window.crypto && crypto.subtle)) {
    throw new ApiError(0, "FAILED_PRECONDITION",
      "this browser computes a file's SHA-256 on HTTPS or loopback only: use `amc apps upload`");
  }
  const digest = await crypto.subtle.digest("SHA-256", await file.arrayBuffer());
  const sha256 = [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
  let response;
  try {
    response = await fetch("/api/library/apps", {
      method: "POST",
      headers: { "Content-Type": "application/octet-stream", "X-Amc-Sha256": sha256,
                 "X-Amc-File-Name": encodeURIComponent(file.name), ...authHeaders() },
      body: file,
    });
  } catch (err) {
    throw new ApiError(0, "UNAVAILABLE", `the control plane did not answer (${err.message})`);
  }
  const data = await response.json().catch(() => ({ code: "INTERNAL", message: `HTTP ${response.status}` }));
  if (!response.ok) throw new ApiError(response.status, data.code, data.message);
  return data;
}

async function remove(app) {
  if (!confirm(`Remove ${app.package} ${app.version_name} from the library?`)) return;
  try {
    await call("DeleteApp", { app_id: app.app_id }, LIBRARY_API);
    say(`removed ${app.package} ${app.version_name}`, false);
  } catch (err) {
    say(`${err.code}: ${err.message}`, true);
  }
  refresh();
}
