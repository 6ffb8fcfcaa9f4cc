"""A colocated node with packed prefill joins its decode steps to its prefill forwards (decode_rides_prefill) where its
runner verified the pair, and serves the engine's bits: the node's loop runs the joined forward, not only LLM's."""

import dataclasses
import time

import pytest

from colocated_node.server import ColocatedServer
from corun import LLM
from launch.local import free_port
from tests.conftest import varied_prompts
from tests.node_sockets import router_socket, small_engine
from wire import protocol
from wire.config import CacheConfig, NodeConfig
from wire.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.7, seed=11, max_tokens=6, logprobs=2, ignore_eos=True)


def packed_engine(model_dir: str):
    engine = small_engine(model_dir)
    return dataclasses.replace(engine, cache=CacheConfig(num_blocks=400), scheduler=dataclasses.replace(
        engine.scheduler, prefill_pack_tokens=64, prefill_pack_seqs=3))


def served(server: ColocatedServer, prompts: list[list[int]]) -> dict[str, tuple[list[int], list]]:
    """Every prompt sent at once; -> request id -> (token ids, logprobs) as streamed."""
    outputs = {f"r{i}": ([], []) for i in range(len(prompts))}
    with router_socket(server.config.address) as router:
        for request_id, prompt in zip(outputs, prompts, strict=True):
            router.send(protocol.encode(protocol.GenerateRequest(request_id, prompt, PARAMS)))
        finished, deadline = set(), time.monotonic() + 120
        while len(finished) < len(prompts):
            server.receive(timeout_ms=10)
            if server.busy():
                server.step()
            while router.poll(0):
                for event in protocol.decode(router.recv_multipart()[-1]).events:
                    outputs[event.request_id][0].extend(event.token_ids)
                    outputs[event.request_id][1].extend(event.logprobs or [])
                    if event.finish_reason is not None:
                        finished.add(event.request_id)
            assert time.monotonic() < deadline, f"finished {sorted(finished)} only"
    return outputs


def test_a_colocated_node_joins_decode_steps_to_prefill_forwards_and_keeps_the_engines_bits(tiny_model_dir):
    config = packed_engine(tiny_model_dir)
    engine = LLM.from_config(config)
    prompts = [engine.tokenizer.encode(text) for text in varied_prompts(10, seed=31, max_words=40)]
    expected = [(o.outputs[0].token_ids, list(o.outputs[0].logprobs)) for o in
                (engine.generate([prompt], PARAMS)[0] for prompt in prompts)]  # NOTE: each alone
    server = ColocatedServer(NodeConfig("colocated", "colocated-j", config, port=free_port("127.0.0.1")))
    try:
        if not server.runner.joined_shapes:
            pytest.skip("no (decode, pack) pair matched the forwards apart on this CPU: nothing runs joined")
        assert list(served(server, prompts).values()) == expected
        assert server.runner.num_joined_forwards > 0  # NOTE: else the comparison could pass with every step apart
    finally:
        server.close()
