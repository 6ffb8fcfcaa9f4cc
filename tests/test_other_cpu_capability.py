"""The numerics tests (marker `numerics`) a second time, in a child pytest under another CPU capability than this
process's: AVX2 kernels on an AVX-512 host, ATen's default kernels and MKL's SSE4.2 ones elsewhere.

A test that asserts one CPU's rounding instead of the property (a decode size that happens to be kept, a golden
compared bitwise under the wrong key) then fails in CI, not on the next host with other kernels. `.ci/run` runs
the README's single pytest command, so the second run lives inside the suite.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).parent
CHILD_ENV = "CORUN_OTHER_CPU_CAPABILITY_RUN"
"""Set in the child: it must not start a child of its own (it deselects this module by marker as well)."""
OUTPUT_TAIL_LINES = 80


def other_capability_env(capability: str) -> dict[str, str] | None:
    """Variables that make ATen and MKL take kernels below `capability`; None below which there are none."""
    if capability == "AVX512":
        return {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    if capability != "DEFAULT":
        return {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
    return None


@pytest.fixture(scope="module")
def child_env() -> dict[str, str]:
    if os.environ.get(CHILD_ENV):
        pytest.skip("this is the other-capability run itself")
    extra = other_capability_env(torch.backends.cpu.get_cpu_capability())
    if extra is None:
        pytest.skip("this process already runs ATen's default kernels: there is no capability below them")
    return os.environ | extra | {CHILD_ENV: "1"}


def run_python(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, cwd=TESTS.parent, capture_output=True, text=True)


def other_capability_summary(env: dict[str, str]) -> str:
    return " ".join(f"{name}={env[name]}" for name in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS"))


def numerics_modules(session) -> list[str]:
    """The modules of this session's numerics tests (the child collects those alone: collecting every module took
    it several seconds more), or all of tests/ where this session collected none (this module run alone)."""
    modules = sorted({str(item.path) for item in session.items if item.get_closest_marker("numerics") is not None})
    return modules or [str(TESTS)]


def tail(result: subprocess.CompletedProcess) -> str:
    return "\n".join((result.stdout + result.stderr).splitlines()[-OUTPUT_TAIL_LINES:])


def test_the_child_really_runs_another_cpu_capability(child_env):
    """Else the second run would repeat the first one's rounding and prove nothing."""
    result = run_python(["-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"], child_env)
    assert result.returncode == 0, tail(result)
    assert result.stdout.strip() != torch.backends.cpu.get_cpu_capability()


@pytest.mark.slow
@pytest.mark.long_pole
@pytest.mark.timeout(1800)  # NOTE: the child's own tests each have pytest's 600 s hang guard
def test_numerics_tests_pass_under_another_cpu_capability(child_env, request):
    result = run_python(["-m", "pytest", "-q", "-m", "numerics", "-p", "no:cacheprovider",
                         *numerics_modules(request.session)], child_env)
    exit_code = result.returncode  # NOTE: 5 (nothing collected) fails too: a marker nobody carries is a no-op
    assert exit_code == 0, f"the numerics tests under {other_capability_summary(child_env)}:\n{tail(result)}"
