// The AMC operator console: ES modules, no build step. Every figure comes from the control
// plane's JSON mapping of amc.v1.Scheduler (/api/amc.v1.Scheduler/<Method>: api.js), with
// the same roles, validation and messages as the gRPC API; /api/events says what changed
// (events.js); /api/artifacts/<task>/<artifact> serves the files steps kept (artifacts.js).
// This module names the pages; shell.js draws the one the path names.
//
//   dom.js        rendering helpers (elements, badges, links, times, durations, sizes)
//   shell.js      routing, reading and redrawing the view, sign-in, errors
//   offline.js    the page greyed out, its actions off, while the control plane is gone
//   farm.js       the Farm page (the wall)       host.js    the Host page
//   phones.js     a phone's card: state, task, Control, operations
//   thumbnails.js the phones' small live pictures, over one socket
//   queue.js      the Queue page                 tasks.js   the Tasks and Task pages
//   control.js    the Control page               keyboard.js the Control page's keys
//   screen.js     a phone's live screen, and the Task page's Watch screen
//   log.js        the Task page's Log tab (the phone's log: kept, or followed live)
//   apps.js       the Apps page (the app library: its apps, an upload, removals)

import { Apps } from "./apps.js";
import { Control, stopScreens } from "./control.js";
import { Farm } from "./farm.js";
import { Host } from "./host.js";
import { Queue } from "./queue.js";
import { start } from "./shell.js";
import { Task, Tasks } from "./tasks.js";

function match(path) {
  let m;
  if (path === "/" || path === "/farm") return [Farm, {}];
  if (path === "/queue") return [Queue, {}];
  if (path === "/tasks") return [Tasks, {}];
  if ((m = path.match(/^\/tasks\/([^/]+)$/))) return [Task, { id: decodeURIComponent(m[1]) }];
  if ((m = path.match(/^\/hosts\/([^/]+)$/))) return [Host, { id: decodeURIComponent(m[1]) }];
  if (path === "/control") return [Control, {}];
  if (path === "/apps") return [Apps, {}];
  return [null, {}];
}

start(match, stopScreens);
