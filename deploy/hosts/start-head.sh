#!/usr/bin/env bash
# Start the Ray head on this host, with token auth (Ray 2.60): makes ~/.ray/auth_token if there is none.
#   bash deploy/hosts/start-head.sh            # then copy ~/.ray/auth_token to every worker host
# Env: RAY_PORT (6379), RAY_NUM_CPUS / RAY_NUM_GPUS (Ray's detection when unset), RAY_RESOURCES (JSON, e.g.
# '{"corun_prefill": 1}' to pin a role here).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
ray="$repo/.venv/bin/ray"
[ -s "$HOME/.ray/auth_token" ] || "$ray" get-auth-token --generate > /dev/null
args=(--head --port "${RAY_PORT:-6379}" --include-dashboard false)
[ -n "${RAY_NUM_CPUS:-}" ] && args+=(--num-cpus "$RAY_NUM_CPUS")
[ -n "${RAY_NUM_GPUS:-}" ] && args+=(--num-gpus "$RAY_NUM_GPUS")
[ -n "${RAY_RESOURCES:-}" ] && args+=(--resources "$RAY_RESOURCES")
RAY_AUTH_MODE=token "$ray" start "${args[@]}"
echo "head up; workers: copy $HOME/.ray/auth_token, then bash deploy/hosts/start-worker.sh $(hostname -I | awk '{print $1}'):${RAY_PORT:-6379} TOKEN_FILE"
