"""The two processes of the NIXL test: a prefill node holding patterned blocks and a decode node pulling them.

Each reports back through its multiprocessing Pipe (errors as a traceback string, never a hang) and then waits
for "exit" while still calling into NIXL, since with no progress thread a notification leaves only then.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable

from tests.transfer import scenario
from transfer.agent import KVTransferAgent


def recv_within(conn, timeout_s: float, keep_alive: Callable[[], object] = lambda: None):
    """conn.recv() with a deadline, calling keep_alive() (NIXL progress) while waiting."""
    deadline = time.monotonic() + timeout_s
    while not conn.poll(0.001):
        keep_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing received within {timeout_s} s")
    return conn.recv()


def run_prefill(conn) -> None:
    _report_errors(conn, _prefill)


def run_decode(conn) -> None:
    _report_errors(conn, _decode)


def _prefill(conn) -> None:
    kv = scenario.patterned_kv()
    agent = KVTransferAgent(scenario.PREFILL_NAME, kv)
    conn.send(scenario.peer_info(agent))
    notifications = scenario.wait_for_notifications(agent, 1)
    conn.send({"notifications": notifications, "counters": agent.counters.as_dict()})
    recv_within(conn, scenario.TIMEOUT_S, agent.new_notifications)
    agent.close()


def _decode(conn) -> None:
    kv = scenario.empty_kv()
    agent = KVTransferAgent(scenario.DECODE_NAME, kv)
    info = recv_within(conn, scenario.TIMEOUT_S, agent.new_notifications)
    result = scenario.pull_blocks(agent, info)
    conn.send({**result, "kv": kv.numpy(), "block_nbytes": agent.block_nbytes})
    recv_within(conn, scenario.TIMEOUT_S, agent.new_notifications)
    agent.close()


def _report_errors(conn, body: Callable) -> None:
    try:
        body(conn)
    except BaseException:
        conn.send({"error": traceback.format_exc()})
        raise
