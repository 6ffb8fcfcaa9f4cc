"""A vLLM node and a native node never read each other's KV: the handshake's compat info differs in kv_layout (vLLM's
version, its per-layer layout and the hash of every vLLM setting), and so do the fingerprints."""

import json
import subprocess

import pytest

from tests.vllm_backend.conftest import REPO, VLLM_PYTHON, requires_vllm

pytestmark = [pytest.mark.slow, requires_vllm]

SCRIPT = """
import json, sys
from wire.config import CacheConfig, EngineConfig
from node_core.server import kv_layout
from node_core.serving import engine_fingerprint
configs = {name: EngineConfig(model=sys.argv[1], backend=name, cache=CacheConfig(block_size=32))
           for name in ("native", "vllm")}
configs["vllm_n8"] = EngineConfig(model=sys.argv[1], backend="vllm", cache=CacheConfig(block_size=32),
                                  scheduler=configs["vllm"].scheduler.__class__(max_num_seqs=8))
print(json.dumps({name: [kv_layout(c), engine_fingerprint(c, "digest")] for name, c in configs.items()}))
"""


def test_vllm_and_native_nodes_refuse_each_others_kv(tiny_model_dir):
    result = subprocess.run([str(VLLM_PYTHON), "-c", SCRIPT, tiny_model_dir], capture_output=True, text=True,
                            timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    (native_layout, native_print), (vllm_layout, vllm_print) = facts["native"], facts["vllm"]
    assert vllm_layout.startswith("vllm 0.32.0") and native_layout != vllm_layout and native_print != vllm_print
    assert facts["vllm_n8"][0] != vllm_layout  # NOTE: another vLLM setting (N), another hash
