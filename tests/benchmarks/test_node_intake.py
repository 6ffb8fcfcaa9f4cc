"""benchmarks/node_intake.py: one receive takes in every request of a burst, and its time is measured."""

from benchmarks.node_intake import receive_seconds
from wire import protocol
from wire.sampling_params import SamplingParams


def test_one_receive_takes_in_the_whole_burst(tiny_model_dir):
    params = SamplingParams(temperature=0.0, max_tokens=1, seed=1)
    messages = [protocol.encode(protocol.GenerateRequest(f"r{i}", list(range(10, 60)), params)) for i in range(8)]
    assert receive_seconds(tiny_model_dir, messages) > 0  # NOTE: it raises where fewer than 8 were taken in
