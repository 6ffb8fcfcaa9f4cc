"""A burst of connections while the router is busy waits in its listen queue (RouterSettings.listen_backlog), not
for a SYN retry: with aiohttp's default of 128, the connections past it had their SYN dropped and connected only
after a second (the retransmission timeout), which a t = 0 burst of requests saw as its TTFT p99."""

import selectors
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.router.harness import RouterHarness

pytestmark = pytest.mark.timeout(120)
BURST = 400
"""Connections opened at once: past aiohttp's 128, within the default 2048."""
HOLD_S = 4.0
"""How long the router's loop is held (accepting nothing): past the first SYN retry (1 s)."""
CONNECT_WAIT_S = 2.0
"""Connections that complete within this, while the loop is held: the kernel's handshakes alone."""
SOMAXCONN = Path("/proc/sys/net/core/somaxconn")


def connections_made(port: int, count: int, wait_s: float) -> int:
    """Open count connections to port at once (non-blocking); how many are established within wait_s."""
    sockets, made = [], 0
    selector = selectors.DefaultSelector()
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            sockets.append(sock)
            selector.register(sock, selectors.EVENT_WRITE)
        deadline = time.monotonic() + wait_s
        while selector.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                selector.unregister(key.fileobj)
                made += key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        return made
    finally:
        selector.close()
        for sock in sockets:
            sock.close()


def burst_while_held(model_dir: str, candidate_ids: list[int], **config) -> int:
    with RouterHarness(model_dir, candidate_ids, **config) as router:
        router.wait_until_healthy()
        router.block_loop(HOLD_S)
        return connections_made(urlsplit(router.base_url).port, BURST, CONNECT_WAIT_S)


@pytest.fixture(scope="module", autouse=True)
def host_queue_holds_the_burst():
    if not SOMAXCONN.exists() or int(SOMAXCONN.read_text()) < BURST:
        pytest.skip(f"the host caps listen queues below {BURST} (net.core.somaxconn), or does not say")


def test_a_burst_past_128_connects_while_the_router_is_busy(tiny_model_dir, word_token_ids):
    assert burst_while_held(tiny_model_dir, word_token_ids) == BURST


def test_inverse_at_aiohttps_default_backlog_the_burst_past_it_waits_for_a_syn_retry(tiny_model_dir,
                                                                                  word_token_ids):
    made = burst_while_held(tiny_model_dir, word_token_ids, listen_backlog=128)
    assert made < BURST, "the comparison cannot fail: every connection got in even with a queue of 128"
