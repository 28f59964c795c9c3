#!/usr/bin/env bash
# Create a bearer token straight in the database (the first operator token has to come from
# here; later ones from `amc tokens create`). Prints the token once.
# Usage: scripts/token.sh operator|client|host [HOST_ID]
#   DATABASE_URL selects the server; without it, the embedded one of `make run` (.amc/pgdata).
# Into a file, only its owner may read it from the start:
#   scripts/token.sh host lab1 | install -m 0600 /dev/stdin host-agent.token
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
role=${1:?usage: token.sh operator|client|host [HOST_ID]}
args=(tokens create --role "$role" --data-dir "${AMC_DATA_DIR:-$here/../.amc/pgdata}")
[ -n "${2:-}" ] && args+=(--host-id "$2")
exec "$here/../.venv/bin/control-plane" "${args[@]}"
