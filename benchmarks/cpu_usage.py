"""CPU time of processes and of the host, read from /proc (Linux), and the facts of the host a run used."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads) so far; 0.0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    # NOTE: after the ")" that ends the command name: field 3 (state) is fields[0], utime (14) and stime (15)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S


def memory_mib(pid: int) -> dict[str, float]:
    """Resident memory now (VmRSS) and at its peak so far (VmHWM), MiB; {} once the process is gone."""
    found = {}
    for line in read_lines(f"/proc/{pid}/status"):
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found["rss_mib" if name == "VmRSS" else "peak_rss_mib"] = round(int(value.split()[0]) / 1024, 1)
    return found


def descendants(pid: int) -> list[int]:
    """pid's children, their children, ... (a router's parser workers)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        parents.setdefault(parent, []).append(int(entry))
    found, frontier = [], [pid]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found.extend(children)
        frontier.extend(children)
    return found


def tree_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds of pid and each live descendant, by pid (a descendant that exits between two readings takes its
    time with it: compare readings per pid, as cpu_delta does)."""
    return {p: process_cpu_seconds(p) for p in [pid, *descendants(pid)]}


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU spent between two tree_cpu_seconds readings (a process new in `after` counts from 0)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def host_cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs so far (/proc/stat's first line; idle and iowait are not busy)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]
    total = sum(values[:8])  # NOTE: guest time is already inside user time
    return total - idle, total


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float:
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total else 0.0


def host_facts() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in read_lines("/proc/cpuinfo")
                  if line.startswith("model name")), platform.processor())
    return {"nproc": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(), "cpu_model": model,
            "kernel": platform.release(), "python": sys.version.split()[0], "git_commit": git_commit()}


def listen_overflows() -> int | None:
    """The host's count of connections its listen queues had no room for (Linux's TcpExt ListenOverflows: each a
    dropped SYN, which the client retries after 1 s); None where the host does not say."""
    rows = [line.split() for line in read_lines("/proc/net/netstat") if line.startswith("TcpExt:")]
    if len(rows) < 2 or "ListenOverflows" not in rows[0]:
        return None
    return int(rows[1][rows[0].index("ListenOverflows")])


def read_lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.readlines()
    except OSError:
        return []


def git_commit() -> str | None:
    """HEAD, with "+dirty" when the work tree has changes (the numbers are for that tree)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (commit + "+dirty" if dirty else commit) or None
