"""Which decode row counts give a row the same bits as the N-row step, on this GPU and software (a probe).

    python -m benchmarks.decode_size_probe --out FILE

For each candidate size S <= N: the first R rows of a captured S-row decode step, against the same R requests in
the captured N-row step (random KV contents and contexts), compared bitwise; and each weight shape's GEMM at S
rows against N rows. Also the replay time of each size.
"""

from __future__ import annotations

import argparse
import json
import random

import torch
import torch.nn.functional as F

from benchmarks.harness import timed
from corun.cuda_graphs import CapturedGraphs
from corun.model_runner import ModelRunner
from corun.request import Request
from corun.step_inputs import build_window_decode
from wire.config import CacheConfig, EngineConfig, SchedulerConfig
from wire.sampling_params import SamplingParams


def fake_requests(runner: ModelRunner, num: int, seed: int) -> list[Request]:
    rng, requests, next_block = random.Random(seed), [], 1
    for i in range(num):
        context = rng.randint(50, 1000)
        request = Request(f"r{i}", [rng.randrange(1000) for _ in range(context)], SamplingParams(), i, frozenset())
        num_blocks = -(-context // runner.block_size)
        request.block_ids = list(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        request.num_computed_tokens = context - 1
        requests.append(request)
    return requests


def timed_ms(fn, repeats: int = 20) -> float:
    return round(1e3 * timed(fn, repeats), 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="random:qwen3-8b")
    parser.add_argument("--sizes", default="8,16,32,48,64,96,128,160,192,224,256")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    n = max(sizes)
    config = EngineConfig(model=args.model, dtype="bfloat16", device="cuda", scheduler=SchedulerConfig(
        max_num_seqs=n, max_model_len=1024), cache=CacheConfig(num_blocks=20000))
    runner = ModelRunner(config, runs_decode=False)
    for k, v in runner.kv_cache.layers:
        k.normal_(0, 1), v.normal_(0, 1)
    graphs = CapturedGraphs(sizes, lambda size: build_window_decode([], size, runner.window_blocks,
                                                                    runner.block_size).to(runner.device),
                            lambda static: runner.window_decode_logits(static, 1))
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "step": {}, "gemm": {}}
    for num_real in (4, 8, 60):
        requests = fake_requests(runner, num_real, seed=num_real)
        reference = graphs.replay(n, build_window_decode(requests, n, runner.window_blocks, runner.block_size,
                                                         runner.table_rows))[:num_real].clone()
        for size in (s for s in sizes if s >= num_real):
            inputs = build_window_decode(requests, size, runner.window_blocks, runner.block_size, runner.table_rows)
            logits = graphs.replay(size, inputs)[:num_real]
            report["step"].setdefault(str(size), {})[f"rows{num_real}_elements_differing"] = int(
                (logits != reference).sum())
    for size in sizes:
        inputs = build_window_decode(fake_requests(runner, min(size, 4), 0), size, runner.window_blocks,
                                     runner.block_size, runner.table_rows)
        report["step"][str(size)]["replay_ms"] = timed_ms(lambda: graphs.replay(size, inputs))
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, weight in [("qkv", runner.model.layers[0].self_attn.qkv_proj.weight),
                         ("o", runner.model.layers[0].self_attn.o_proj.weight),
                         ("gate_up", runner.model.layers[0].mlp.gate_up_proj.weight),
                         ("down", runner.model.layers[0].mlp.down_proj.weight),
                         ("lm_head", (runner.model.lm_head or runner.model.embed_tokens).weight)]:
        x = torch.randn(n, weight.shape[1], generator=gen, device="cuda").to(weight.dtype)
        full = F.linear(x, weight)
        report["gemm"][f"{name}_{tuple(weight.shape)}"] = {
            str(s): int((F.linear(x[:s], weight) != full[:s]).sum()) for s in sizes}
    print(json.dumps(report, indent=1))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
