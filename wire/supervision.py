"""Processes that end with their supervisor: a node or a router that `corun serve` (or a Ray actor) started stops
when that process dies, however it dies (SIGKILL, the OOM killer), instead of serving on unsupervised.

Two mechanisms, either enough alone:
- Linux's parent-death signal (prctl PR_SET_PDEATHSIG): the kernel sends PARENT_DEATH_SIGNAL the moment the parent
  ends, and the process stops as on any SIGTERM (its own handler: the node's loop ends, the router closes);
- a watch thread, for where prctl is missing or the signal is lost: once the process' parent is no longer the
  supervisor it sends itself STOP_SIGNAL, and if the process still runs STOP_GRACE_S later, ends it.

NOTE: the kernel sends the parent-death signal when the *thread* that forked the process ends, even while the
supervisor lives on (a test's helper thread restarting a node, say). So it is a signal of its own, whose handler
stops the process only if its parent really changed (a child of a dead process is handed to another one).

Also the temporary directories a supervisor makes (the cluster key, the routers' metrics): named for its pid, so
that the next supervisor removes those of supervisors that died without removing their own.

Imports nothing of the project (the router and the nodes use it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
"""linux/prctl.h."""
PARENT_DEATH_SIGNAL = signal.SIGUSR2
"""The kernel's notice that the thread which started this process ended: checked, never acted on blindly."""
STOP_SIGNAL = signal.SIGTERM
"""How a supervised process is stopped once its supervisor died: the signal every launcher stops it with, so it
stops the same way (its own handler closes sockets and agents)."""
WATCH_INTERVAL_S = 0.5
"""How often the watch thread looks at the process' parent."""
STOP_GRACE_S = 10.0
"""After its supervisor died, how long a process may take to stop before the watch thread ends it (os._exit)."""


def set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel for signum when this process' parent ends (Linux); False where that is not available.

    NOTE: the kernel ties the signal to the thread that forked this process: the launchers spawn from their main
    thread, which lives as long as they do."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0


def end_with_supervisor(supervisor_pid: int) -> None:
    """Make this process end when supervisor_pid (its parent) does; call first thing in main, on the main thread.
    If the supervisor is already gone (it died before this process got here), exit now."""
    signal.signal(PARENT_DEATH_SIGNAL, lambda *_: stop_if_orphaned(supervisor_pid))
    signalled = set_parent_death_signal(PARENT_DEATH_SIGNAL)
    if os.getppid() != supervisor_pid:
        logger.error("supervisor %d is gone (parent now %d): exiting", supervisor_pid, os.getppid())
        os._exit(1)
    if not signalled:
        logger.warning("no parent-death signal on this platform: watching supervisor %d every %.1f s",
                       supervisor_pid, WATCH_INTERVAL_S)
    threading.Thread(target=watch_supervisor, args=(supervisor_pid,), name="supervisor watch", daemon=True).start()


def stop_if_orphaned(supervisor_pid: int) -> None:
    """PARENT_DEATH_SIGNAL's handler: stop (STOP_SIGNAL to this process) if the supervisor is gone."""
    if os.getppid() != supervisor_pid:
        logger.error("supervisor %d died: stopping", supervisor_pid)
        os.kill(os.getpid(), STOP_SIGNAL)


def watch_supervisor(supervisor_pid: int) -> None:
    while os.getppid() == supervisor_pid:
        time.sleep(WATCH_INTERVAL_S)
    logger.error("supervisor %d died: stopping", supervisor_pid)
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), STOP_SIGNAL)
    time.sleep(STOP_GRACE_S)
    logger.error("still running %.0f s after the supervisor died: exiting", STOP_GRACE_S)
    os._exit(1)


def make_owned_dir(prefix: str) -> Path:
    """A new private temporary directory named for this process (PREFIX{pid}-XXXX), after removing those that
    processes now dead left with the same prefix (SIGKILL, the OOM killer: nobody ran their cleanup)."""
    remove_orphaned_dirs(prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))


def remove_orphaned_dirs(prefix: str, directory: str | Path | None = None) -> list[Path]:
    """Remove this user's PREFIX{pid}-* directories whose pid no longer runs; -> those removed."""
    removed = []
    for path in Path(directory or tempfile.gettempdir()).glob(f"{prefix}*"):
        pid = owner_pid(path, prefix)
        if pid is None or pid_alive(pid):
            continue
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.getuid():
                shutil.rmtree(path)
                removed.append(path)
    return removed


def owner_pid(path: Path, prefix: str) -> int | None:
    head, dash, _ = path.name.removeprefix(prefix).partition("-")
    return int(head) if dash and head.isdigit() else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # NOTE: another user's process holds the pid now: not ours to judge
        return True
    return True
