import functools
import os
import random
import subprocess
import sys

import pytest

from corun.models.tiny import make_tiny_model

WORDS = ("the a cat dog sat ran on under mat house river quickly slowly green blue seven numbers people "
         "city morning night light sound water reads writes model token answer question because and or").split()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The built-in tiny float32 Qwen3 (random weights, BPE tokenizer), made once per test session."""
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-model")))


def varied_prompts(num: int, seed: int, min_words: int = 3, max_words: int = 120) -> list[str]:
    """Prompts of very different lengths (some longer than the tests' prefill chunk)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))) for _ in range(num)]


MKL_DEFAULT_MODE = "AUTO"
"""MKL_CBWR for the inverse checks marked mkl_default_mode (see run_under_mkl_default_mode)."""


def run_under_mkl_default_mode(item, nodeid: str) -> None:
    """The test in a child pytest with MKL's default reproducibility mode, every other variable as here.

    NOTE: the engine sets MKL's strict mode (corun.CPU_BLAS_REPRODUCIBILITY) for the contract's sake: a GEMM row's
    bits then depend neither on its position nor, on the CPUs measured, on the row count. The inverse checks show
    that the comparisons can fail on this machine, so they run where a row count still changes bits."""
    env = {**os.environ, "MKL_CBWR": MKL_DEFAULT_MODE}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", nodeid], env=env,
                            cwd=item.config.rootpath, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"under MKL_CBWR={MKL_DEFAULT_MODE}:\n{result.stdout[-3000:]}{result.stderr[-1000:]}")


@pytest.hookimpl(tryfirst=True)  # NOTE: before xdist's own, which names each test's group from its marks
def pytest_collection_modifyitems(config, items):
    import torch

    items.sort(key=lambda item: item.get_closest_marker("long_pole") is None)  # NOTE: stable: the rest keep order
    for item in items:  # NOTE: under `--dist loadgroup` a module runs on one worker: its module fixtures start once
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if os.environ.get("MKL_CBWR") != MKL_DEFAULT_MODE:
        for item in items:
            if item.get_closest_marker("mkl_default_mode") is not None:
                # NOTE: the id as collected: under xdist's loadgroup the item's own id gains its group's name
                item.runtest = functools.partial(run_under_mkl_default_mode, item, item.nodeid)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (pytest -m gpu on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    # NOTE: without a GPU, Triton kernels run in Triton's CPU interpreter (set before anything imports triton).
    import os

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
