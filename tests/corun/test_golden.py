"""A golden file of the built-in tiny model's outputs (corun mode, float32, one CPU thread): a change in numerics
(kernels, model code, sampler, the tiny model's generator) shows up here, not only as a self-consistency pass.

Token ids must match exactly. Logprobs must match bit for bit on the CPU kind and torch version that wrote the
file (recorded in it) and within 1e-4 elsewhere (another BLAS tiling is another rounding). Rewrite it, after
checking that the change is intended, with `python -m tests.corun.test_golden`.
"""

import json
import sys
from pathlib import Path

import torch

from corun import LLM, SamplingParams
from corun.models.tiny import make_tiny_model

GOLDEN = Path(__file__).parent / "golden" / "tiny_model_outputs.json"
PROMPTS = [[7], [11, 12, 13], list(range(100, 160)), list(range(500, 700, 3))]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=8, logprobs=3, ignore_eos=True),
          SamplingParams(temperature=0.8, top_p=0.9, seed=1234, max_tokens=8, logprobs=3, ignore_eos=True)]


def machine() -> dict:
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def current_outputs(model_dir: str) -> list[dict]:
    llm = LLM(model_dir, max_num_seqs=8, max_model_len=256, prefill_chunk_size=32, num_threads=1)
    records = []
    for params in PARAMS:
        for output in llm.generate(PROMPTS, params):
            completion = output.outputs[0]
            records.append({"token_ids": completion.token_ids,
                            "logprobs": [[lp.logprob, [list(t) for t in lp.top]] for lp in completion.logprobs]})
    return records


def flat_logprobs(records: list[dict]) -> list[float]:
    return [v for r in records for lp, top in r["logprobs"] for v in [lp, *(x for _, x in top)]]


def test_tiny_model_outputs_match_the_golden_file(tiny_model_dir):
    golden = json.loads(GOLDEN.read_text())
    ours = current_outputs(tiny_model_dir)
    assert [r["token_ids"] for r in ours] == [r["token_ids"] for r in golden["outputs"]]
    assert [[t for _, top in r["logprobs"] for t, _ in top] for r in ours] == \
        [[t for _, top in r["logprobs"] for t, _ in top] for r in golden["outputs"]]
    if golden["machine"] == machine():
        assert flat_logprobs(ours) == flat_logprobs(golden["outputs"])
    else:
        torch.testing.assert_close(flat_logprobs(ours), flat_logprobs(golden["outputs"]), atol=1e-4, rtol=0)


def test_inverse_the_comparison_sees_one_rounding(tiny_model_dir):
    """The bitwise comparison fails on a change of one ulp in one logprob."""
    golden = json.loads(GOLDEN.read_text())["outputs"]
    changed = json.loads(json.dumps(golden))
    changed[1]["logprobs"][0][0] = float(torch.nextafter(torch.tensor(changed[1]["logprobs"][0][0]),
                                                         torch.tensor(0.0)))
    assert flat_logprobs(changed) != flat_logprobs(golden)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        records = current_outputs(str(make_tiny_model(Path(tmp) / "tiny")))
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({"machine": machine(), "outputs": records}) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)
