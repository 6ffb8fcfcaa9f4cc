#!/usr/bin/env bash
# Fresh-machine set-up: a venv in .venv with the CPU torch, then the project and its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "setup: $* ($(date +%T))"; }
step "1/4 virtual environment in .venv"
python3 -m venv .venv
. .venv/bin/activate
step "2/4 pip"
python -m pip install -q --upgrade pip
# NOTE: first, and pinned: this takes the CPU build from local disk. Installed later or unpinned (nixl-cu12/13
# and vllm ask for plain `torch`), pip would pull a multi-GB CUDA build instead.
step "3/4 torch 2.13.0 (CPU build)"
python -m pip install -q torch==2.13.0
step "4/4 corun-cluster and its test extras (ray, nixl, vllm's pieces...: the longest step)"
python -m pip install -q -e ".[test]"
step "done: .venv/bin/corun, .venv/bin/python -m pytest -q"
