#!/usr/bin/env bash
# Stop Ray (and every CoRun node it runs) on this host.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
"$repo/.venv/bin/ray" stop --force
