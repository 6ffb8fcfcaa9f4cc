"""The planner's H200 profile (Qwen3-8B shape, bf16, N = 256), derived from the bench JSONs in benchmarks/results.

    python -m benchmarks.derive_h200_profile --out benchmarks/results/h200_planner_profile.json

Decode points: each fixed_shape run's median full decode step (engine step: inputs, graph replay, sampling, host work)
with its total context, recovered from the floor the bench printed beside it. That floor is
max(bytes / copy bandwidth, FLOPs / GEMM rate) with bytes = weight bytes + KV bytes per token * total context;
the byte term is checked to be the larger one, and inverted with the run's measured bandwidth and the preset's
shape (1024x128 comes out at 256 rows * 1088 tokens, its mean context, exactly). The decode-step profile adds its
engine step at 256 rows of ~1035 tokens. Left out: 4096x128 (its steps mix 188 and 68 active rows, so the median
step and median floor belong to different steps).
Prefill points: every request arrives at t = 0 and fixed_shape admits and prefills while a slot and KV are free, so the
k-th first token comes after k isolated prefills: TTFT p50 and p99, divided by their rank among the admitted
requests, are one prefill each. Only runs with the fused SDPA prompt attention count (h200_bench_rerun.json):
1024x128 (all 256 admitted) and 4096x2048 (129 admitted: the KV limit); 4096x128 ran first, so its first
prefills carry the warm-up.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from corun.kv_cache import bytes_per_block
from corun.models.decoder import DecoderLM
from corun.models.presets import preset_config
from planner.perf_profile import DecodePoint, PerformanceProfile, PrefillPoint
from wire.config import canonical_mode_spec

RESULTS = Path(__file__).parent / "results"
DECODE_RUNS = (("h200_bench_rerun.json", "1024x128"), ("h200_bench_rerun.json", "4096x2048"),
               ("h200_bench_1024.json", "1024x128"), ("h200_bench_1024.json", "1024x2048"),
               ("h200_bench_1024.json", "burstgpt"))
PREFILL_RUNS = (("h200_bench_rerun.json", "1024x128"), ("h200_bench_rerun.json", "4096x2048"))
PROFILE_ROWS, PROFILE_CONTEXT = 256, 1035
"""benchmarks/decode_step_profile.py: 256 prompts of 1024 tokens, timed over about the next 20 tokens."""


class BenchShape:
    """Bytes a decode step reads, from the bench's engine config (the random preset, its dtype and KV budget)."""

    def __init__(self, engine: dict):
        self.arch = preset_config(engine["model"])
        dtype = getattr(torch, engine["dtype"])
        with torch.device("meta"):
            model = DecoderLM(self.arch, engine["scheduler"]["max_model_len"])
        # NOTE: the same weights as benchmarks.harness.step_floor counts (the embedding table is a gather, not a read)
        self.num_weights = sum(p.numel() for n, p in model.named_parameters()
                               if "embed_tokens" not in n or self.arch.tie_word_embeddings)
        self.elem = torch.empty((), dtype=dtype).element_size()
        self.block_size = engine["cache"]["block_size"]
        block_bytes = bytes_per_block(self.arch, self.block_size, dtype)
        self.kv_bytes_per_token = block_bytes // self.block_size
        self.usable_blocks = engine["cache"]["memory_budget_bytes"] // block_bytes - 1

    def context_from_floor(self, floor_s: float, num_rows: float, hardware: dict) -> int:
        context = (floor_s * hardware["copy_bytes_per_s"] - self.num_weights * self.elem) / self.kv_bytes_per_token
        attention_flops = 4 * self.arch.num_layers * self.arch.num_heads * self.arch.head_dim * context
        flops_s = (2 * num_rows * self.num_weights + attention_flops) / hardware["bf16_flops_per_s"]
        if flops_s >= floor_s:
            raise ValueError("this floor is FLOP-bound: it does not give the context")
        return round(context)

    def num_admitted(self, num_requests: int, max_num_seqs: int, num_tokens: int) -> int:
        blocks = -(-num_tokens // self.block_size)
        return min(num_requests, max_num_seqs, self.usable_blocks // blocks)


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def modes_of(report: dict) -> dict:
    """A report's runs by mode spec, each spec under its mode's name now: the results were written when fixed_shape
    was called corun (wire.config.OLD_NAMES)."""
    return {canonical_mode_spec(spec): runs for spec, runs in report["modes"].items()}


def decode_points() -> list[DecodePoint]:
    points = []
    for name, workload in DECODE_RUNS:
        report = load(name)
        step = modes_of(report)["fixed_shape"][workload]["decode_step"]
        rows = step["median_active_rows"]
        context = BenchShape(report["engine"]).context_from_floor(step["floor_ms"] / 1e3, rows, report["hardware"])
        points.append(DecodePoint(round(rows), context, step["median_ms"] / 1e3))
    profile = modes_of({"modes": load("h200_decode_step_profile.json")})["fixed_shape"]
    points.append(DecodePoint(PROFILE_ROWS, PROFILE_ROWS * PROFILE_CONTEXT, profile["engine_step_ms"] / 1e3))
    return points


def prefill_points() -> list[PrefillPoint]:
    points = []
    for name, workload in PREFILL_RUNS:
        report = load(name)
        num_in, num_out = (int(x) for x in workload.split("x"))
        sched = report["engine"]["scheduler"]
        run = modes_of(report)["fixed_shape"][workload]
        admitted = BenchShape(report["engine"]).num_admitted(run["num_requests"], sched["max_num_seqs"],
                                                            num_in + num_out)
        for quantile, key in ((0.5, "p50"), (0.99, "p99")):
            rank = min(admitted - 1, int(quantile * admitted)) + 1  # NOTE: harness.percentile's index, 1-based
            points.append(PrefillPoint(num_in, run["ttft_s"][key] / rank))
    return points


def derive_profile() -> PerformanceProfile:
    engine = load("h200_bench_rerun.json")["engine"]
    shape, sched = BenchShape(engine), engine["scheduler"]
    return PerformanceProfile(
        max_num_seqs=sched["max_num_seqs"], prefill_chunk_size=sched["prefill_chunk_size"],
        prefill_points=tuple(prefill_points()), decode_points=tuple(decode_points()),
        kv_capacity_tokens=shape.usable_blocks * shape.block_size, max_model_len=sched["max_model_len"],
        block_size=shape.block_size,
        source="benchmarks/derive_h200_profile.py: H200, random:qwen3-8b bf16, N=256, from "
               + ", ".join(sorted({name for name, _ in DECODE_RUNS + PREFILL_RUNS}))
               + ", h200_decode_step_profile.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    profile = derive_profile()
    text = json.dumps(profile.to_dict(), indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
