#!/usr/bin/env bash
# A demo against a running farm (`make run` in another terminal): submit a workflow and
# follow it to done and fetch its screenshot, then submit a long task, watch it, and cancel it mid-run.
# Usage: scripts/demo.sh            (AMC_ADDR / AMC_TOKEN as for `amc`)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
amc="${AMC:-$here/../.venv/bin/amc}"

echo "== the farm"
"$amc" hosts

echo "== a workflow, followed to the end, and the screenshot it kept"
workflow=$("$amc" submit "$here/examples/login-workflow.yaml" --wait -o json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["task_id"])')
"$amc" get "$workflow"
"$amc" artifacts "$workflow"
shot=$(mktemp --suffix=.png)
"$amc" artifact "$workflow" evidence -o "$shot"

echo "== a long task, cancelled while it runs"
task=$("$amc" submit "$here/examples/long-task.yaml" -o json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["task_id"])')
echo "submitted $task"
"$amc" watch "$task" &
watcher=$!
sleep 2
"$amc" cancel "$task" --reason "demo"
status=0
wait "$watcher" || status=$?
echo "watch ended with exit code $status (9: cancelled)"
