// The Farm page, an operator's wall: every host with its phones as cards, each with a
// small live picture of its screen (thumbnails.js), its state in a word, what it runs (its
// step, for how long, who submitted it, Watch), Control, and its operations; the counts on
// top. Hosts are shown as hosts.js's Host page shows one.

import { call } from "./api.js";
import { badge, counts, h, hostLink, labels, when } from "./dom.js";
import { controlLink, health, model, android, operations, phoneState, running, stateBadges } from "./phones.js";
import { thumbnails } from "./thumbnails.js";

// A page asks for the running tasks of at most this many busy phones at once (ListTasks'
// task_ids); a farm with more shows the others by their task's link alone.
const TASKS_AT_ONCE = 500;

// The running tasks of the busy phones, by id: their step, since when, who submitted them.
export async function runningTasks(hosts) {
  const ids = hosts.flatMap((host) => (host.devices || []).map((d) => d.task_id).filter(Boolean));
  if (!ids.length) return new Map();
  const { tasks = [] } = await call("ListTasks", { task_ids: ids.slice(0, TASKS_AT_ONCE) });
  return new Map(tasks.map((t) => [t.task_id, t]));
}

// One phone's card.
export function phoneCard(host, d, tasks) {
  const state = phoneState(host, d);
  return h("div", { class: `phone s-${state.word}`, "data-serial": d.serial, "data-host": host.host_id },
    thumbnails.image(host.host_id, d.serial, state.word === "offline"),
    h("div", { class: "phone-body" },
      h("div", { class: "phone-head" }, h("span", { class: "serial" }, d.serial), " ", stateBadges(host, d)),
      h("div", { class: "muted model" }, model(d), " · ", android(d.sdk)),
      health(d),
      running(d, tasks.get(d.task_id)),
      h("div", { class: "phone-actions" }, controlLink(host, d)),
      operations(host, d)));
}

// Watch the thumbnails of the phones shown that can have one (online, on a connected host).
export function watchThumbnails(hosts) {
  thumbnails.want(hosts.flatMap((host) => (host.devices || [])
    .filter((d) => phoneState(host, d).word !== "offline")
    .map((d) => [host.host_id, d.serial])));
}

// Whether a host takes work: a `draining` or `cordoned` badge (amc hosts drain / cordon).
export function hostWork(host) {
  if (host.draining) return badge("draining");
  if (host.cordoned) return badge("cordoned");
  return "";
}

// A badge that says what it means on its own: `connected` or `disconnected`.
export const connection = (host) => badge(host.connected ? "connected" : "disconnected");

export const Farm = {
  nav: "farm",
  title: () => "Farm",
  async load() {
    const { hosts = [] } = await call("ListHosts", {});
    return { hosts, tasks: await runningTasks(hosts) };
  },
  render({ hosts, tasks }) {
    const phones = hosts.flatMap((host) => (host.devices || []).map((d) => [host, d, phoneState(host, d).word]));
    const count = (word) => phones.filter(([, , w]) => w === word).length;
    // A phone takes no new work when it is cordoned itself or its host is (or drains).
    const cordoned = phones.filter(([host, d]) => d.cordoned || host.cordoned || host.draining).length;
    watchThumbnails(hosts);
    const sections = hosts.map((host) => h("section", { class: "host", "data-host": host.host_id },
      h("div", { class: "host-row" },
        h("span", { class: "host-name" }, hostLink(host.host_id)),
        h("span", { class: "host-state" }, connection(host), hostWork(host) ? [" ", hostWork(host)] : ""),
        labels(host.labels),
        h("span", { class: "seen muted" }, `last seen ${when(host.last_seen_at)}`)),
      (host.devices || []).length
        ? h("div", { class: "phones" }, (host.devices || []).map((d) => phoneCard(host, d, tasks)))
        : h("p", { class: "muted" }, "No phone attached.")));
    return [
      h("h1", {}, "Farm"),
      counts([
        ["hosts connected", `${hosts.filter((x) => x.connected).length} / ${hosts.length}`, "hosts-connected"],
        ["phones online", phones.length - count("offline"), "devices-online"],
        ["ready", count("ready"), "devices-ready"],
        ["busy", count("busy"), "devices-busy"],
        ["cleaning", count("cleaning"), "devices-cleaning"],
        ["held", count("held"), "devices-held"],
        ["cordoned", cordoned, "devices-cordoned"],
        ["offline", count("offline"), "devices-offline"],
        ["hosts cordoned", hosts.filter((x) => x.cordoned).length, "hosts-cordoned"],
      ]),
      hosts.length ? h("div", { class: "wall" }, sections) : h("p", { class: "muted" }, "No host has registered yet."),
    ];
  },
  wants: (kind) => kind === "task" || kind === "host" || kind === "resync",
  leave: () => thumbnails.stop(),
};
