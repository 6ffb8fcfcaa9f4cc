#!/usr/bin/env bash
# Fresh-machine set-up: a venv in .venv with the CPU torch, then the project and its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# NOTE: first, and pinned: this takes the CPU build from local disk. Installed later or unpinned (nixl-cu12/13
# and vllm ask for plain `torch`), pip would pull a multi-GB CUDA build instead.
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[test]"
