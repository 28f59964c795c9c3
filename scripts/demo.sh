#!/usr/bin/env bash
# A demo against a running farm (`make run` in another terminal): submit a workflow and
# follow it to done and fetch its screenshot, then submit a long task, watch it, and cancel it mid-run.
# Usage: scripts/demo.sh [FILE]      (AMC_ADDR / AMC_TOKEN as for `amc`)
#   AMC_DEMO_PAUSE: seconds the long task runs before the demo cancels it (2)
#   FILE: keep the workflow's screenshot there; without it the screenshot is fetched into a
#   temporary folder, its size shown, and removed with the folder.
# It leaves nothing behind, also when a step fails or it is interrupted (Ctrl-C): its
# temporary folder is removed, its background watch stopped, and a task of its that has
# not ended is cancelled.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
amc="${AMC:-$here/../.venv/bin/amc}"

scratch=$(mktemp -d)
watcher=""
running=""   # the demo's task that has not ended yet, if any
clean_up() {
  local status=$?
  trap - EXIT INT TERM
  if [ -n "$watcher" ]; then
    kill "$watcher" 2>/dev/null || true
    wait "$watcher" 2>/dev/null || true
  fi
  if [ -n "$running" ]; then
    "$amc" cancel "$running" --reason "demo stopped" >/dev/null 2>&1 || true
    echo "cancelled $running (the demo stopped)"
  fi
  rm -rf "$scratch"
  exit "$status"
}
trap clean_up EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

task_id() { python3 -c 'import json,sys; print(json.load(sys.stdin)["task_id"])'; }

echo "== the farm"
"$amc" hosts

echo "== a workflow, followed to the end, and the screenshot it kept"
running=$("$amc" submit "$here/examples/login-workflow.yaml" -o json | task_id)
workflow=$running
"$amc" watch "$workflow"
running=""
"$amc" get "$workflow"
"$amc" artifacts "$workflow"
"$amc" artifact "$workflow" evidence -o "${1:-$scratch/evidence.png}"

echo "== a long task, cancelled while it runs"
running=$("$amc" submit "$here/examples/long-task.yaml" -o json | task_id)
task=$running
echo "submitted $task"
"$amc" watch "$task" &
watcher=$!
sleep "${AMC_DEMO_PAUSE:-2}"  # the long task runs this long before it is cancelled
"$amc" cancel "$task" --reason "demo"
running=""
status=0
wait "$watcher" || status=$?
watcher=""
echo "watch ended with exit code $status (9: cancelled)"
