// The Queue page: the queue by selector and by fairness key.

import { ADMIN_API, call } from "./api.js";
import { age, counts, h, table, when } from "./dom.js";

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
      h("td", { class: "oldest" }, age(s.oldest_queued_at))));
    return [
      h("h1", {}, "Queue"),
      counts([["queued tasks", total, "queued-total"], ["selectors", groups.length, "queue-groups"],
        ["fairness keys", shares.length, "queue-keys"]]),
      groups.length
        ? table(["selector", "tasks", "oldest", "matching devices", "why they wait", ""], rows)
        : h("p", { class: "muted" }, "Nothing is queued."),
      h("h2", {}, "Fairness keys"),
      shares.length
        ? table(["fairness key", "queued", "running", "cap", "weight", "oldest wait"], keys, { id: "fair-shares" })
        : h("p", { class: "muted" }, "No fairness key has tasks queued or running, or a share set."),
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
