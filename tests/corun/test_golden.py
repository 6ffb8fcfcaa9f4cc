"""A golden file of the built-in tiny model's outputs (fixed_shape mode, float32, one CPU thread): a change in numerics
(kernels, model code, sampler, the tiny model's generator) shows up here, not only as a self-consistency pass.

The file holds one recording per numerics key (numerics_key: the torch version, ATen's CPU capability, AMX tile
support, the CPU vendor, and the environment variables that make MKL or ATen pick other kernels): the same
key, the same kernels, the same rounding. Token ids and top-k ids must match every recording exactly. Logprobs
must match bit for bit the recording of this machine's key, and every recording within LOGPROB_ATOL (another
kernel is another rounding: AVX2, AVX-512 and AMX differ by about 1e-5 here). Record or update this machine's
entry, after checking that a change is intended, with `python -m tests.corun.test_golden`; once more with the
environment tests/test_other_cpu_capability.py gives its child, so that both of the suite's runs compare bitwise.
"""

import json
import os
import platform
import sys
from pathlib import Path

import pytest
import torch

from corun import LLM, SamplingParams
from corun.models.tiny import make_tiny_model

pytestmark = pytest.mark.numerics

GOLDEN = Path(__file__).parent / "golden" / "tiny_model_outputs.json"
PROMPTS = [[7], [11, 12, 13], list(range(100, 160)), list(range(500, 700, 3))]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=8, logprobs=3, ignore_eos=True),
          SamplingParams(temperature=0.8, top_p=0.9, seed=1234, max_tokens=8, logprobs=3, ignore_eos=True)]
KERNEL_CHOICE_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_DEBUG_CPU_TYPE",
                     "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
"""Variables that change which CPU kernels run (and so their rounding) on the same machine."""
LOGPROB_ATOL = 1e-4
"""About eight times the largest difference measured between capabilities (1.2e-5, AVX-512 vs ATen's default
kernels), far below what a changed model or sampler gives."""


def cpu_vendor() -> str:
    """MKL picks its kernels by vendor as well as by instruction set."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("vendor_id")), "")
    except OSError:
        return platform.processor()


def amx_tile_supported() -> bool | None:
    """None where this torch cannot tell."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return None if probe is None else bool(probe())


def numerics_facts() -> dict:
    facts = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
             "amx_tile": amx_tile_supported(), "cpu_vendor": cpu_vendor()}
    return facts | {name: os.environ[name] for name in KERNEL_CHOICE_ENV if name in os.environ}


def numerics_key() -> str:
    return " ".join(f"{name}={value}" for name, value in numerics_facts().items())


def load_goldens() -> dict[str, list[dict]]:
    return json.loads(GOLDEN.read_text())


def write_goldens(goldens: dict[str, list[dict]]) -> None:
    """One line per key, so that a diff shows which recordings changed."""
    lines = [f"{json.dumps(key)}: {json.dumps(records)}" for key, records in sorted(goldens.items())]
    GOLDEN.write_text("{\n" + ",\n".join(lines) + "\n}\n")


def current_outputs(model_dir: str) -> list[dict]:
    llm = LLM(model_dir, max_num_seqs=8, max_model_len=256, prefill_chunk_size=32, num_threads=1)
    records = []
    for params in PARAMS:
        for output in llm.generate(PROMPTS, params):
            completion = output.outputs[0]
            records.append({"token_ids": completion.token_ids,
                            "logprobs": [[lp.logprob, [list(t) for t in lp.top]] for lp in completion.logprobs]})
    return records


def token_ids(records: list[dict]) -> list[list[int]]:
    return [r["token_ids"] for r in records]


def top_ids(records: list[dict]) -> list[list[int]]:
    return [[t for _, top in r["logprobs"] for t, _ in top] for r in records]


def flat_logprobs(records: list[dict]) -> list[float]:
    return [v for r in records for lp, top in r["logprobs"] for v in [lp, *(x for _, x in top)]]


def assert_matches(ours: list[dict], golden: list[dict], bitwise: bool) -> None:
    assert token_ids(ours) == token_ids(golden)
    assert top_ids(ours) == top_ids(golden)
    if bitwise:
        differing = [i for i, (a, b) in enumerate(zip(flat_logprobs(ours), flat_logprobs(golden), strict=True))
                     if a != b]
        assert not differing, f"{len(differing)} logprobs differ in their bits, the first at index {differing[0]}"
    else:
        torch.testing.assert_close(torch.tensor(flat_logprobs(ours), dtype=torch.float64),
                                   torch.tensor(flat_logprobs(golden), dtype=torch.float64),
                                   atol=LOGPROB_ATOL, rtol=0)


@pytest.fixture(scope="module")
def ours(tiny_model_dir) -> list[dict]:
    return current_outputs(tiny_model_dir)


@pytest.fixture(scope="module")
def goldens() -> dict[str, list[dict]]:
    return load_goldens()


def test_tiny_model_outputs_match_every_golden_recording(ours, goldens):
    key = numerics_key()
    assert goldens, f"{GOLDEN} holds no recording"
    for recorded_key, golden in goldens.items():
        assert_matches(ours, golden, bitwise=recorded_key == key)


def test_tiny_model_outputs_match_this_machines_recording_bitwise(ours, goldens):
    key = numerics_key()
    if key not in goldens:
        pytest.skip(f"no recording under {key!r}: logprobs compared within {LOGPROB_ATOL} only "
                    "(record one with `python -m tests.corun.test_golden`)")
    assert_matches(ours, goldens[key], bitwise=True)


def any_golden(goldens: dict[str, list[dict]]) -> list[dict]:
    return goldens.get(numerics_key()) or next(iter(goldens.values()))


def changed_copy(records: list[dict]) -> list[dict]:
    return json.loads(json.dumps(records))


def test_inverse_the_bitwise_comparison_sees_one_ulp(goldens):
    golden = any_golden(goldens)
    changed = changed_copy(golden)
    first = changed[1]["logprobs"][0]
    first[0] = float(torch.nextafter(torch.tensor(first[0]), torch.tensor(0.0)))
    with pytest.raises(AssertionError, match="differ in their bits"):
        assert_matches(changed, golden, bitwise=True)
    assert_matches(changed, golden, bitwise=False)  # NOTE: one ulp is within the tolerance


def test_inverse_the_tolerant_comparison_sees_more_than_the_tolerance(goldens):
    golden = any_golden(goldens)
    changed = changed_copy(golden)
    changed[1]["logprobs"][0][0] -= 10 * LOGPROB_ATOL
    with pytest.raises(AssertionError):
        assert_matches(changed, golden, bitwise=False)


def test_inverse_either_comparison_sees_another_top_k_token(goldens):
    golden = any_golden(goldens)
    changed = changed_copy(golden)
    top = changed[2]["logprobs"][3][1]
    top[0][0], top[1][0] = top[1][0], top[0][0]
    for bitwise in (True, False):
        with pytest.raises(AssertionError):
            assert_matches(changed, golden, bitwise=bitwise)


def record_this_machine() -> str:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        records = current_outputs(str(make_tiny_model(Path(tmp) / "tiny")))
    goldens = load_goldens() if GOLDEN.exists() else {}
    key = numerics_key()
    goldens[key] = records
    GOLDEN.parent.mkdir(exist_ok=True)
    write_goldens(goldens)
    return key


if __name__ == "__main__":
    print(f"recorded {record_this_machine()!r} in {GOLDEN}", file=sys.stderr)
