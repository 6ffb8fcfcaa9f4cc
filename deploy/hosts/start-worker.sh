#!/usr/bin/env bash
# Join this host to a Ray head, with the head's auth token (Ray 2.60 refuses a worker without it).
#   bash deploy/hosts/start-worker.sh HEAD_IP:PORT [TOKEN_FILE]   # TOKEN_FILE: a copy of the head's ~/.ray/auth_token
# Env: RAY_NUM_CPUS / RAY_NUM_GPUS, RAY_RESOURCES (JSON, e.g. '{"corun_decode": 1}'), as for the head.
set -euo pipefail
head=${1:?usage: start-worker.sh HEAD_IP:PORT [TOKEN_FILE]}
repo="$(cd "$(dirname "$0")/../.." && pwd)"
if [ -n "${2:-}" ]; then
  mkdir -p "$HOME/.ray" && install -m 600 "$2" "$HOME/.ray/auth_token"
fi
[ -s "$HOME/.ray/auth_token" ] || { echo "no $HOME/.ray/auth_token: pass the head's token file" >&2; exit 2; }
args=(--address "$head")
[ -n "${RAY_NUM_CPUS:-}" ] && args+=(--num-cpus "$RAY_NUM_CPUS")
[ -n "${RAY_NUM_GPUS:-}" ] && args+=(--num-gpus "$RAY_NUM_GPUS")
[ -n "${RAY_RESOURCES:-}" ] && args+=(--resources "$RAY_RESOURCES")
RAY_AUTH_MODE=token "$repo/.venv/bin/ray" start "${args[@]}"
