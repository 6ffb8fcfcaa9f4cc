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
KV hand-off, a GPU per node: fitted (per request + per token, least squares) to the committed KV READ of one
request's adjacent blocks between two idle processes on GPU 0 (h200_kv_transfer.json: zcopy y, the default progress
thread; 1024, 4096 and 16384 tokens: 0.24, 0.58 and 1.9 ms). NOTE: a read between two GPUs was not measured; the
idle same-GPU READ stands in for it.
Shared GPU (1P1D on one GPU): the hand-off is the mean READ, post to poll, under the ShareGPT-like load of the front
door bench (h200_front_door_before_push.json: 256 requests at t = 0, 21 ms; BurstGPT-like 27 ms). The stretches come
from h200_cluster_1p1d.json, where the 1P1D cluster and the colocated engine (prefill token budget 0: every prompt
prefilled back to back) ran the same 256 requests at t = 0 on GPU 0: the decode step is the ratio of the TPOT p50s on
1024x2048 (every row decoding in both), the prefill the mean ratio of the TTFT p50s (half the prefills queued ahead
in both; the 1P1D's hand-off is milliseconds of seconds).
Prefill token budget: the bench engine's auto budget (max_num_batched_tokens, 8192), what a colocated node of that
config runs with today.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from corun.kv_cache import bytes_per_block
from corun.models.decoder import DecoderLM
from corun.models.presets import preset_config
from planner.perf_profile import DecodePoint, KVHandoff, PerformanceProfile, PrefillPoint, SharedGPU
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
        self.block_bytes = bytes_per_block(self.arch, self.block_size, dtype)
        self.kv_bytes_per_token = self.block_bytes // self.block_size
        self.usable_blocks = self.usable_blocks_of(engine["cache"]["memory_budget_bytes"])

    def usable_blocks_of(self, kv_bytes: int) -> int:
        """Blocks a KV budget of kv_bytes holds, less the null block (corun/block_manager.py)."""
        return kv_bytes // self.block_bytes - 1

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


def idle_kv_handoff() -> KVHandoff:
    rows = [row for row in load("h200_kv_transfer.json")["summary"]
            if row["cuda_ipc_get_zcopy"] == "y" and row["layout"] == "adjacent"]
    tokens = np.array([int(row["case"].split("-")[-2]) for row in rows], dtype=float)
    seconds = np.array([row["agent_median_seconds"] for row in rows])
    per_token, per_request = np.polyfit(tokens, seconds, 1)
    return KVHandoff(float(f"{per_request:.4g}"), float(f"{per_token:.4g}"),
                     "h200_kv_transfer.json: READ between two idle processes on one H200 (zcopy y, adjacent blocks), "
                     f"{', '.join(f'{int(n)} tokens {1e3 * s:.2f} ms' for n, s in zip(tokens, seconds))}; "
                     "between two GPUs not measured")


def shared_gpu(shape: BenchShape) -> SharedGPU:
    """shape: the engine runs' (the same preset, dtype and block size as the 1P1D run's)."""
    front_door = load("h200_front_door_before_push.json")["kv_handoff"]
    handoff = KVHandoff(front_door["sharegpt"]["kv_handoff_ms_mean"] / 1e3, 0.0,
                        "h200_front_door_before_push.json: mean READ (post to poll) of 1P1D on one H200 under the "
                        f"ShareGPT-like load; BurstGPT-like {front_door['burstgpt']['kv_handoff_ms_mean']:.1f} ms")
    report = load("h200_cluster_1p1d.json")
    modes = report["modes"]
    cluster = modes["cluster_1p1d"]
    engine = next(runs for name, runs in modes.items() if name.startswith("colocated_corun"))
    decode_stretch = cluster["1024x2048"]["tpot_ms"]["p50"] / engine["1024x2048"]["tpot_ms"]["p50"]
    prefill_stretch = float(np.mean([cluster[w]["ttft_s"]["p50"] / engine[w]["ttft_s"]["p50"]
                                     for w in ("burstgpt", "1024x2048")]))
    return SharedGPU(round(decode_stretch, 3), round(prefill_stretch, 3), handoff,
                     "h200_cluster_1p1d.json: 1P1D on one H200 against the colocated engine, 256 requests at t = 0: "
                     "decode stretch = TPOT p50 ratio on 1024x2048, prefill stretch = mean TTFT p50 ratio (burstgpt, "
                     "1024x2048); the decode node's KV: its --decode-kv-cache-mib there",
                     decode_kv_capacity_tokens=shape.usable_blocks_of(report["command"]["decode_kv_cache_mib"] * 2**20)
                     * shape.block_size)


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
               + ", h200_decode_step_profile.json",
        prefill_token_budget=sched["max_num_batched_tokens"], kv_handoff=idle_kv_handoff(),
        shared_gpu=shared_gpu(shape))


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
