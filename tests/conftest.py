import functools
import json
import os
import random
import subprocess
import sys
import tempfile

import pytest

# NOTE: before the first import of torch (its OpenMP runtime reads this once, at load), and inherited by the xdist
# workers and every process a test starts. Two workers share two cores: under libgomp's default policy a thread
# that waits at the end of a parallel region spins first, on the core the other worker (or its cluster's nodes)
# needs; the in-process engine tests ran 1.5-2x slower next to a cluster test. Passive threads sleep. The thread
# counts and each op's work split stay as they were, and with them the bits.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from corun.models.tiny import make_tiny_model  # noqa: E402

WORDS = ("the a cat dog sat ran on under mat house river quickly slowly green blue seven numbers people "
         "city morning night light sound water reads writes model token answer question because and or").split()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The built-in tiny float32 Qwen3 (random weights, BPE tokenizer), made once per test session."""
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="session")
def two_layer_tiny_model_dir(tmp_path_factory) -> str:
    """The tiny model with two of its four layers, for tests whose every forward runs in Triton's CPU interpreter
    (seconds a layer) and whose property is the step's path, not the depth: a second layer still reads the first's
    output and has KV of its own."""
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-model-two-layers"), num_hidden_layers=2))


def varied_prompts(num: int, seed: int, min_words: int = 3, max_words: int = 120) -> list[str]:
    """Prompts of very different lengths (some longer than the tests' prefill chunk)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))) for _ in range(num)]


MKL_DEFAULT_MODE = "AUTO"
"""MKL_CBWR for the inverse checks marked mkl_default_mode (see run_under_mkl_default_mode)."""
MKL_DEFAULT_MODE_REPORTS = "CORUN_MKL_DEFAULT_MODE_REPORTS"
"""Set in run_under_mkl_default_mode's child: the file its tests' reports go to, one JSON line each."""
COLLECTED_NODEID = pytest.StashKey[str]()
"""An mkl_default_mode test's id as collected: under xdist's loadgroup the item's own id gains its group's name."""
CHILD_REPORTS = pytest.StashKey[dict[str, list[dict]]]()
"""The session's mkl_default_mode children's reports, by test id as collected."""


def run_under_mkl_default_mode(item) -> None:
    """The test in a child pytest with MKL's default reproducibility mode, every other variable as here. The
    child runs the module's other such tests of this session too: its start-up (torch, the model, the module's
    fixtures) is most of an inverse check's time.

    NOTE: the engine sets MKL's strict mode (corun.CPU_BLAS_REPRODUCIBILITY) for the contract's sake: a GEMM row's
    bits then depend neither on its position nor, on the CPUs measured, on the row count. The inverse checks show
    that the comparisons can fail on this machine, so they run where a row count still changes bits."""
    reports = item.config.stash.setdefault(CHILD_REPORTS, {})
    nodeid = item.stash[COLLECTED_NODEID]
    if nodeid not in reports:
        module = [other.stash[COLLECTED_NODEID] for other in item.session.items
                  if other.path == item.path and COLLECTED_NODEID in other.stash]
        reports.update(run_mkl_default_mode_child(item.config, module))
    ended = reports[nodeid]
    failed = [report for report in ended if report["outcome"] == "failed"]
    if failed:
        pytest.fail(f"under MKL_CBWR={MKL_DEFAULT_MODE}:\n{failed[0]['text'][-3000:]}")
    skipped = [report for report in ended if report["outcome"] == "skipped"]
    if skipped:
        pytest.skip(f"under MKL_CBWR={MKL_DEFAULT_MODE}: {skipped[0]['text']}")
    if not any(report["when"] == "call" for report in ended):
        pytest.fail(f"under MKL_CBWR={MKL_DEFAULT_MODE}: the test did not run:\n{ended[0]['text'][-3000:]}")


def run_mkl_default_mode_child(config, nodeids: list[str]) -> dict[str, list[dict]]:
    """-> each test's reports (setup, call, teardown) from one child pytest under MKL_CBWR=MKL_DEFAULT_MODE; a test
    the child ended without a report of gets one failed report with the child's output."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "reports.jsonl")
        env = {**os.environ, "MKL_CBWR": MKL_DEFAULT_MODE, MKL_DEFAULT_MODE_REPORTS: path}
        # NOTE: without hypothesis' pytest plugin (~1.9 s of the child's start): no mkl_default_mode test uses
        # hypothesis, whose @given runs without the plugin anyway
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                 "-p", "no:hypothesispytest", *nodeids], env=env,
                                cwd=config.rootpath, capture_output=True, text=True, timeout=900)
        lines = open(path).read().splitlines() if os.path.exists(path) else []
    reports = {nodeid: [] for nodeid in nodeids}
    for report in map(json.loads, lines):
        reports.setdefault(report["nodeid"], []).append(report)
    output = f"{result.stdout[-3000:]}{result.stderr[-1000:]}"
    return {nodeid: ended or [{"when": "child", "outcome": "failed", "text": output}]
            for nodeid, ended in reports.items()}


def pytest_runtest_logreport(report):
    path = os.environ.get(MKL_DEFAULT_MODE_REPORTS)
    if path is not None:  # NOTE: in run_mkl_default_mode_child's child
        # NOTE: a skip's longrepr is (file, line, reason)
        text = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longreprtext
        with open(path, "a") as reports:
            reports.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                                      "text": text}) + "\n")


def group_order(items):
    """A test's place by its group's: the groups with a long_pole test first, then those with a slow one, then the
    rest as collected. The workers take groups in this order (pytest_configure turns xdist's own order off), one
    whenever the last has at most two tests left, so the longest start early and the short ones even out the
    end."""
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(group_name(item), []).append(item)
    rank = {name: (not any(t.get_closest_marker("long_pole") for t in tests),
                   not any(t.get_closest_marker("slow") for t in tests)) for name, tests in groups.items()}
    return lambda item: rank[group_name(item)]


def group_name(item) -> str:
    mark = item.get_closest_marker("xdist_group")
    return mark.args[0] if mark.args else mark.kwargs["name"]


@pytest.hookimpl(tryfirst=True)  # NOTE: before xdist's own, which names each test's group from its marks
def pytest_collection_modifyitems(config, items):
    import torch

    for item in items:  # NOTE: under `--dist loadgroup` a module runs on one worker: its module fixtures start once
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=group_order(items))  # NOTE: stable: each group's tests keep their order
    if os.environ.get("MKL_CBWR") != MKL_DEFAULT_MODE:
        for item in items:
            if item.get_closest_marker("mkl_default_mode") is not None:
                item.stash[COLLECTED_NODEID] = item.nodeid
                item.runtest = functools.partial(run_under_mkl_default_mode, item)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (pytest -m gpu on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    # NOTE: xdist's loadscope and loadgroup reorder the groups by their number of tests, longest first: the
    # several-minute other-capability run (two tests) was taken near the end, the other worker idle meanwhile
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    # NOTE: without a GPU, Triton kernels run in Triton's CPU interpreter (set before anything imports triton).
    import os

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
