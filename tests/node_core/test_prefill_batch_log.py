"""--log-prefill-batches (NodeSettings.log_prefill_batches): a line per prefill forward of a node, SGLang's "Prefill
batch" line, with the forward's start on the monotonic clock that a benchmark's client processes share."""

import logging
import time

from benchmarks.forward_timeline import forwards_in
from colocated_node.server import ColocatedServer
from launch.local import free_port
from prefill_node.server import PrefillServer
from tests.colocated_node.test_colocated_server import first_tokens_in_order
from tests.node_sockets import router_socket, small_engine
from wire import protocol
from wire.config import NodeConfig
from wire.sampling_params import SamplingParams


def prompts_logged(model_dir: str, caplog, log: bool) -> tuple[list[tuple[int, ...]], ColocatedServer]:
    """Three prompts (of 40 tokens: 3 chunks of 16 each) through a colocated node -> the logged lines' numbers: (seq,
    new, finishing, tokens, cached tokens, decode rows, queue) per forward."""
    node = ColocatedServer(NodeConfig("colocated", "colocated-log", small_engine(model_dir),
                                      port=free_port("127.0.0.1"), log_prefill_batches=log))
    params = SamplingParams(temperature=0.6, seed=3, max_tokens=2, ignore_eos=True)
    try:
        with caplog.at_level(logging.INFO, logger="node_core.server"), router_socket(node.config.address) as router:
            first_tokens_in_order(node, router, [protocol.GenerateRequest(f"r{i}", list(range(10 + i, 50 + i)), params)
                                                 for i in range(3)])
        # NOTE: read by the benchmark's own parser (benchmarks/forward_timeline.py), so the two cannot drift apart
        keys = ("seq", "new", "finishing", "tokens", "cached_tokens", "decode_rows", "queue")
        return [tuple(forward[key] for key in keys) for forward in forwards_in(caplog.messages)], node
    finally:
        node.close()


def test_each_prefill_forward_is_logged_with_its_prompts_and_tokens(tiny_model_dir, caplog):
    """One line per prefill forward; its chunks' tokens add up to the prompts' (3 x 40), each prompt starts once and
    finishes once. Inverse: without the setting, no line."""
    lines, node = prompts_logged(tiny_model_dir, caplog, log=True)
    assert len(lines) == node.num_prefill_forwards > 1
    assert sum(line[3] for line in lines) == 3 * 40
    assert sum(line[1] for line in lines) == sum(line[2] for line in lines) == 3
    caplog.clear()
    lines, _ = prompts_logged(tiny_model_dir, caplog, log=False)
    assert lines == []


def test_a_prefill_node_logs_its_forwards_too(tiny_model_dir, caplog):
    """The prefill node's forwards: two prompts of 40 tokens, each started and finished once; the queue is the
    node's waiting prompts. Inverse: without the setting, no line."""
    def logged(log: bool) -> list[dict]:
        node = PrefillServer(NodeConfig("prefill", "prefill-log", small_engine(tiny_model_dir),
                                        port=free_port("127.0.0.1"), log_prefill_batches=log))
        params = SamplingParams(temperature=0.6, seed=3, max_tokens=2, ignore_eos=True)
        try:
            with caplog.at_level(logging.INFO, logger="node_core.server"), \
                    router_socket(node.config.address) as router:
                for i in range(2):
                    router.send(protocol.encode(protocol.PrefillRequest(f"p{i}", list(range(10 + i, 50 + i)), params)))
                results, deadline = [], time.monotonic() + 30
                while len(results) < 2:
                    node.step()
                    while router.poll(0):
                        results.append(protocol.decode(router.recv_multipart()[-1]))
                    assert time.monotonic() < deadline, f"{len(results)} of 2 prompts came back"
            assert all(isinstance(result, protocol.PrefillResult) for result in results), results
            return forwards_in(caplog.messages)
        finally:
            node.close()

    lines = logged(True)
    assert sum(line["tokens"] for line in lines) == 2 * 40
    assert sum(line["new"] for line in lines) == sum(line["finishing"] for line in lines) == 2
    assert all(line["decode_rows"] == 0 for line in lines)
    caplog.clear()
    assert logged(False) == []
