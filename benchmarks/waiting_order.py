"""`python -m benchmarks.waiting_order --model DIR --out FILE`: when a burst's first tokens come, by the order its
requests arrive in and the order the node starts them (corun/waiting_order.py).

Every request of a shared-prefix workload (planner/prefix_workloads.py) is added to the engine at once, grouped (a
question's choices, a conversation's turns, next to each other) or shuffled (as a burst through HTTP arrives), with
the prompts the prefix cache serves first (the default) or in arrival order (MAX_WAIT_FORWARDS 0 promotes every
prompt). Packed prefill with several chunks of a prompt per forward, as on CUDA (on this CPU the runner does not
verify multi-chunk forwards: forced here, which moves bits but not the order). The figure that matters is the step
of the median request's first token, which the host's speed does not change.

`--order-cost N` also times the order itself: N waiting prompts of 1,000 tokens that the cache does not serve,
ordered on a forward's first sight of them (one hash each: the first chunk's key) and again (the keys kept), against
hashing each prompt's whole chain.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from benchmarks.prefix_cache import vocab_of
from corun import LLM, waiting_order
from corun.request import Request
from planner.workloads import make_prompts, make_workload
from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.prefix_hash import chunk_hash_chain
from wire.sampling_params import SamplingParams

ORDERS = ("grouped", "shuffled")
STARTS = ("cached_first", "arrival")


def burst(model: str, workload: str, num_requests: int, order: str, start: str, pack_tokens: int) -> dict:
    config = EngineConfig(model=model, num_threads=1, scheduler=SchedulerConfig(
        max_model_len=1024, max_num_seqs=num_requests, prefill_chunk_size=32, prefill_pack_tokens=pack_tokens,
        prefill_pack_seqs=64), cache=CacheConfig(num_blocks=num_requests * 80))
    prompts = make_prompts(make_workload(workload, num_requests), vocab_of(config), seed=0)
    if order == "shuffled":
        random.Random(1).shuffle(prompts)
    llm = LLM.from_config(config)
    engine = llm.engine
    engine.scheduler.multi_chunk_prefill = True
    max_wait = waiting_order.MAX_WAIT_FORWARDS
    waiting_order.MAX_WAIT_FORWARDS = max_wait if start == "cached_first" else 0
    try:
        for prompt in prompts:
            engine.add_request(*prompt)
        first_step, first_s, step, begin = {}, {}, 0, time.perf_counter()
        while engine.has_unfinished():
            step += 1
            for item in engine.step():
                first_step.setdefault(item.request.request_id, step)
                first_s.setdefault(item.request.request_id, time.perf_counter() - begin)
    finally:
        waiting_order.MAX_WAIT_FORWARDS = max_wait
    steps, seconds = sorted(first_step.values()), sorted(first_s.values())
    return {"workload": workload, "order": order, "start": start, "num_requests": num_requests,
            "prefill_forwards": engine.stats.num_prefill_forwards, "first_token_step_p50": steps[len(steps) // 2],
            "ttft_s_p50": round(seconds[len(seconds) // 2], 3), "seconds": round(time.perf_counter() - begin, 3)}


def order_cost(model: str, num_waiting: int, prompt_len: int = 1000, repeats: int = 5) -> dict:
    """Milliseconds (the least of `repeats`) CachedFirst.order takes over num_waiting prompts the empty cache does not
    serve: on first sight, then again; and what hashing every prompt's whole chain would take."""
    config = EngineConfig(model=model, num_threads=1, scheduler=SchedulerConfig(
        max_model_len=2048, max_num_seqs=64, prefill_chunk_size=32), cache=CacheConfig(num_blocks=256))
    engine = LLM.from_config(config).engine
    rng, vocab = random.Random(0), vocab_of(config)
    prompts = [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(num_waiting)]
    cache = engine.block_manager.prefix_cache
    first_sight, again, chained = [], [], []
    for _ in range(repeats):
        waiting = [Request(f"r{i}", prompt, SamplingParams(), 0, frozenset()) for i, prompt in enumerate(prompts)]
        order = waiting_order.CachedFirst(engine.block_manager)
        first_sight.append(timed(lambda: order.order(waiting)))
        again.append(timed(lambda: order.order(waiting)))
        chained.append(timed(lambda: [chunk_hash_chain(prompt, cache.chunk_size, cache.salt) for prompt in prompts]))
    return {"num_waiting": num_waiting, "prompt_tokens": prompt_len, "chunk_size": cache.chunk_size,
            "order_first_sight_ms": round(1e3 * min(first_sight), 3), "order_again_ms": round(1e3 * min(again), 3),
            "whole_chains_ms": round(1e3 * min(chained), 3)}


def timed(work) -> float:
    begin = time.perf_counter()
    work()
    return time.perf_counter() - begin


def burst_parser(description: str, pack_tokens: int) -> argparse.ArgumentParser:
    """The arguments of a benchmark that runs a shared-prefix burst on the engine (this one, burst_trickle.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", required=True, help="a checkpoint directory (corun make-tiny-model)")
    parser.add_argument("--workloads", default="multiple_choice,multi_turn")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--pack-tokens", type=int, default=pack_tokens, help="prefill_pack_tokens (rows per forward)")
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = burst_parser(__doc__.split("\n\n")[0], pack_tokens=2048)
    parser.add_argument("--order-cost", type=int, default=0, metavar="N",
                        help="also time the order over N waiting prompts (0: not)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    runs = [burst(args.model, workload, args.num_requests, order, start, args.pack_tokens)
            for workload in args.workloads.split(",") for order in ORDERS for start in STARTS]
    for run in runs:
        print(json.dumps(run))
    cost = order_cost(args.model, args.order_cost) if args.order_cost else None
    if cost:
        print(json.dumps(cost))
    if args.out:
        command = "python -m benchmarks.waiting_order " + " ".join(argv)
        with open(args.out, "w") as out:
            json.dump({"command": command, "max_wait_forwards": waiting_order.MAX_WAIT_FORWARDS, "runs": runs,
                       **({"order_cost": cost} if cost else {})}, out, indent=1)


if __name__ == "__main__":
    main()
