"""Helper processes of a benchmark (a router, fake nodes) that never outlive it.

Each child leads a process group of its own, so that stopping it also stops what it started (the router's parser
workers); and it gets SIGTERM from the kernel when the benchmark dies, even by SIGKILL (PR_SET_PDEATHSIG), so a
crashed or killed run leaves no process holding a port and a core.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import time

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Runs in the child between fork and exec."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start_child(command: list[str], log_path: str, stdout=subprocess.DEVNULL,
                env: dict[str, str] | None = None) -> subprocess.Popen:
    """command in a new session (its own process group), stderr to log_path; env: its environment (None: ours)."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, stdout=stdout, stderr=log, start_new_session=True,
                                preexec_fn=die_with_parent, env=env)


def read_json_line(process: subprocess.Popen, timeout_s: float, what: str) -> dict:
    """The first line a child prints on stdout (its address), as JSON; RuntimeError if it exits or is silent."""
    deadline = time.monotonic() + timeout_s
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([process.stdout], [], [], remaining)[0]:
            raise RuntimeError(f"{what} printed no address within {timeout_s:g} s")
        byte = os.read(process.stdout.fileno(), 1)  # NOTE: unbuffered: a buffer would hide bytes from select
        if not byte:
            raise RuntimeError(f"{what} exited ({process.wait()}) before printing its address")
        line += byte
    return json.loads(line)


def stop_child(process: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM to its group, SIGKILL to whatever of the group is left after grace_s."""
    signal_group(process, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    # NOTE: also when the leader exited in time: a worker it started may still be there
    signal_group(process, signal.SIGKILL)
    process.wait()


def signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass
