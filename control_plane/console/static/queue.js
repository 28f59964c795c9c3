// The Queue page: the queue by selector and by fairness key, and each key's share of the
// phones, which an operator sets here as `amc queue set` does (SetFairShare).

import { ADMIN_API, ApiError, call } from "./api.js";
import { age, counts, h, table, when } from "./dom.js";
import { refresh } from "./shell.js";

// The queue as the control plane last counted it (every few seconds: GetQueue's and
// ListFairShares' `counted_at`), by selector and by fairness key; re-read on every change
// and every few seconds, since the counts move between changes too.
export const Queue = {
  nav: "queue",
  title: () => "Queue",
  async load() {
    // Both at once; a refusal names the first call's (GetQueue's), whichever came back
    // first, so the page says the same thing every time.
    const [queue, shares] = await Promise.allSettled([
      call("GetQueue", {}),
      call("ListFairShares", {}, ADMIN_API),
    ]);
    for (const answer of [queue, shares]) {
      if (answer.status === "rejected") throw answer.reason;
    }
    return { ...queue.value, shares: shares.value.shares || [] };
  },
  render({ groups = [], total = 0, counted_at, shares = [] }) {
    const rows = groups.map((g) => h("tr", {},
      h("td", {}, g.selector_text),
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
      h("td", { class: "oldest" }, age(s.oldest_queued_at)),
      h("td", {}, shareForm(s.fairness_key, s))));
    return [
      h("h1", {}, "Queue"),
      counts([["queued tasks", total, "queued-total"], ["selectors", groups.length, "queue-groups"],
        ["fairness keys", shares.length, "queue-keys"]]),
      groups.length
        ? table(["selector", "tasks", "oldest", "matching devices", "why they wait", ""], rows)
        : h("p", { class: "muted" }, "Nothing is queued."),
      h("h2", {}, "Fairness keys"),
      shares.length
        ? table(["fairness key", "queued", "running", "cap", "weight", "oldest wait", "share"], keys, { id: "fair-shares" })
        : h("p", { class: "muted" }, "No fairness key has tasks queued or running, or a share set."),
      h("div", { class: "new-share" }, h("b", {}, "Another key's share: "), shareForm("", null)),
      h("p", { class: "muted", id: "counted" }, counted_at
        ? `Counted ${when(counted_at)}; the control plane counts the queue every few seconds.`
        : "Not counted yet; the control plane counts the queue every few seconds."),
    ];
  },
  // Every change may move the counts.
  wants: () => true,
  every: 5000,
};

function labelQuery(sel) {
  const first = Object.entries((sel && sel.labels) || {})[0];
  return first ? `&label=${encodeURIComponent(`${first[0]}=${first[1]}`)}` : "";
}

// The keys whose share form is open, and what each form last said, kept across the page's
// redraws (it is read again every few seconds); "new": the new key's form.
const editing = new Set();
const said = new Map();

// Set a key's share as `amc queue set` does: a weight (1 to 1000), a cap of phones or no
// cap, and why; what is left empty stays as it is. The same checks before it is sent (a cap
// and no cap, or nothing at all, is refused), and the control plane's own (SetFairShare:
// operators only, each field's range), whose refusal is shown as it words it.
function shareForm(key, share) {
  const id = key || "new";
  const input = (name, attrs) => h("input", { name, "aria-label": `${id} ${name}`, ...attrs });
  const keyInput = key ? null : input("key", { placeholder: "fairness key", size: 14 });
  const weight = input("weight", { type: "number", min: 1, max: 1000, size: 5, placeholder: share ? String(share.weight) : "weight" });
  const cap = input("cap", { type: "number", min: 0, size: 5, placeholder: share && share.max_devices !== undefined ? String(share.max_devices) : "cap" });
  const noCap = input("no-cap", { type: "checkbox" });
  const reason = input("reason", { placeholder: "reason", size: 14 });
  const told = said.get(id) || { text: "", failed: false };
  const message = h("span", { class: `share-message ${told.failed ? "error-text" : "muted"}` }, told.text);
  const say = (text, failed) => {
    said.set(id, { text, failed });
    message.className = `share-message ${failed ? "error-text" : "muted"}`;
    message.textContent = text;
  };
  const save = h("button", { type: "submit", class: "small" }, "Set");
  const form = h("form", { class: "inline share", "data-share": id, novalidate: true, onsubmit: async (event) => {
    event.preventDefault();
    save.disabled = true;
    try {
      const request = shareRequest(key || keyInput.value.trim(), weight.value, cap.value, noCap.checked, reason.value);
      const { share: set } = await call("SetFairShare", request, ADMIN_API);
      say(`set: weight ${set.weight}, ${set.max_devices === undefined ? "no cap" : `cap ${set.max_devices}`}`, false);
      for (const el of [weight, cap, reason, keyInput].filter(Boolean)) el.value = "";
      noCap.checked = false;
      editing.delete(id);
      refresh();
    } catch (err) {
      say(`${err.code}: ${err.message}`, true);
    } finally {
      save.disabled = false;
    }
  } }, keyInput, "weight ", weight, " cap ", cap, h("label", {}, noCap, " no cap"), reason, save, message);
  if (!key) return form;
  const details = h("details", { open: editing.has(id) }, h("summary", {}, "Edit"), form);
  details.addEventListener("toggle", () => (details.open ? editing.add(id) : editing.delete(id)));
  return details;
}

// SetFairShare's request from the form, refused here as `amc queue set` refuses it.
function shareRequest(key, weight, cap, noCap, reason) {
  const bad = (message) => new ApiError(400, "INVALID_ARGUMENT", message);
  if (!key) throw bad("fairness_key: required: the key (a team) whose share to set");
  if (cap !== "" && noCap) throw bad("give a cap or no cap, not both");
  if (weight === "" && cap === "" && !noCap) throw bad("nothing to set: give a weight, a cap or no cap");
  const request = { fairness_key: key, reason };
  if (weight !== "") request.weight = Number(weight);
  if (cap !== "") request.max_devices = Number(cap);
  if (noCap) request.clear_max_devices = true;
  return request;
}
