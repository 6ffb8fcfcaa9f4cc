"""vLLM's own OpenAI-server tests (functions, bodies and assertions unchanged) against `corun serve` on the tiny
model: tests/clients/vllm_openai/ (README.md there). Their outcomes are recorded in
benchmarks/results/cpu_vllm_openai_tests*.json; this fails when a test recorded there as passing no longer passes
(a regression), and says which newly pass (record them: the command is in each file)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clients.vllm_openai import populate
from tests.clients.vllm_openai.exclusions import excluded

ROOT = Path(__file__).resolve().parents[2]
RECORDS = sorted((ROOT / "benchmarks" / "results").glob("cpu_vllm_openai_tests*.json"))
"""main's outcomes (cpu_vllm_openai_tests.json) and those of branches that changed them (_BRANCH.json)."""
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(bool(populate.missing()), reason="vLLM's files missing from "
                                 "tests/clients/vllm_openai/upstream (populate --refetch)")]


def test_vllm_s_openai_tests_recorded_as_passing_still_pass(tmp_path):
    out = tmp_path / "outcomes.json"
    done = subprocess.run([sys.executable, "-m", "tests.clients.vllm_openai.run", "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=850)
    assert done.returncode == 0 and out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    now = {row["nodeid"]: row for row in json.loads(out.read_text())["tests"]}
    recorded = {row["nodeid"] for record in RECORDS for row in json.loads(record.read_text())["tests"]
                if row["outcome"] == "passed"}
    # NOTE: a test excluded since it was recorded (exclusions.py says why) is no regression
    regressed = [nodeid for nodeid in recorded
                 if now.get(nodeid, {}).get("outcome") != "passed" and not excluded(nodeid)]
    newly = [nodeid for nodeid, row in now.items() if row["outcome"] == "passed" and nodeid not in recorded]
    print(f"newly passing (not yet recorded): {newly}")
    assert not regressed, "\n".join(f"{n}: {now.get(n, {}).get('message', 'not run')}" for n in regressed)
