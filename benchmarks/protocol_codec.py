"""`python -m benchmarks.protocol_codec`: what wire.protocol's encode + decode costs for the two messages that
dominate the wire: a decode step's StepTokens (256 events, one token each; without and with logprobs, 5
alternatives) and a 1024-token PrefillRequest. Best of --repeats runs of --number round trips each; prints one
JSON object (microseconds per round trip, per event for StepTokens, and the encoded size).
"""

from __future__ import annotations

import argparse
import inspect
import json
import timeit

from wire import protocol
from wire.outputs import TokenLogprobs
from wire.sampling_params import SamplingParams

NUM_EVENTS = 256
NUM_PROMPT_TOKENS = 1024
PARAMS = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=128, seed=11, logprobs=5)


def step_tokens(with_logprobs: bool) -> protocol.StepTokens:
    events = []
    for i in range(NUM_EVENTS):
        logprobs = [TokenLogprobs(1000 + i, -0.25, tuple((1000 + i + k, -0.25 - k) for k in range(5)))]
        events.append(protocol.TokenEvent(f"cmpl-{i:032x}", [1000 + i], logprobs if with_logprobs else None,
                                          None, index=i % 2))
    return protocol.StepTokens(events)


def prefill_request() -> protocol.PrefillRequest:
    tokens = list(range(1000, 1000 + NUM_PROMPT_TOKENS))
    # NOTE: before protocol version 14 the request's seed was a field beside params (as well as params.seed)
    if "seed" in inspect.signature(protocol.PrefillRequest).parameters:
        return protocol.PrefillRequest("cmpl-prefill", tokens, PARAMS, 11)
    return protocol.PrefillRequest("cmpl-prefill", tokens, PARAMS)


def best_us(message, number: int, repeats: int) -> tuple[float, int]:
    data = protocol.encode(message)
    assert protocol.decode(data) == message
    times = timeit.repeat(lambda: protocol.decode(protocol.encode(message)), number=number, repeat=repeats)
    return min(times) / number * 1e6, len(data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.protocol_codec", description=__doc__)
    parser.add_argument("--number", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    result = {"protocol_version": protocol.PROTOCOL_VERSION}
    for name, message in (("step_tokens", step_tokens(False)), ("step_tokens_logprobs", step_tokens(True))):
        us, size = best_us(message, args.number, args.repeats)
        result[name] = {"us": round(us, 1), "us_per_event": round(us / NUM_EVENTS, 3), "bytes": size}
    us, size = best_us(prefill_request(), args.number, args.repeats)
    result["prefill_request_1024"] = {"us": round(us, 1), "bytes": size}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
