"""Prefill cost by prompt length and prefill path, next to its floors (issue 8's targets).

    python -m benchmarks.prefill_cost --model random:qwen3-8b --device cuda --dtype bfloat16 --out FILE

Per path (a bench mode spec: natural isolated prefill, bucketed CUDA graphs, packed) and prompt length L:
- alone_ms: one request alone, max_tokens 1 (token 1 sampled), best of --repeats;
- batch_tok_per_s: 8192 / L prompts in one go (isolated paths prefill them one by one; packed fills T rows);
- floors: the weight read (weight bytes / measured copy bandwidth) and the GEMM work (2 x weights x L FLOP at
  the measured bf16 GEMM rate, and at the H200's 780 TFLOP/s as the issue counts it).
- on CUDA, the same prompt alone after --rest-seconds of an idle GPU (rested_ms, best of --repeats), and the GEMM rate
  the GPU sustains after a second of GEMMs: a GPU's clock drops under sustained load (stop 57's H100 ran a 4,096-token
  prefill's GEMMs and attention ~6% slower from the second prefill on, its memory-bound kernels no slower), and the
  burst GEMM rate is measured rested. So beside gemm_rate_fraction (back-to-back prefills against the burst rate):
  gemm_rate_fraction_rested (both rested) and gemm_rate_fraction_sustained (both under load), with the SM clock
  read after each (sm_clock_mhz).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import time

import torch

from benchmarks.harness import gpu_name, measure_hardware, scheduler_for, timed
from corun.engine import LLMEngine
from wire.config import CacheConfig, EngineConfig, SchedulerConfig, canonical_mode_spec
from wire.sampling_params import SamplingParams

PATHS = "fixed_shape:prefill_buckets=none,fixed_shape,fixed_shape:prefill_pack_tokens=2048:prefill_pack_seqs=16"
"""Natural eager, the defaults (bucketed graphs on CUDA), packed."""
NOMINAL_FLOPS = 780e12


def run_until_done(engine: LLMEngine, prompts: list[list[int]]) -> float:
    """Seconds to prefill every prompt (max_tokens 1: each finishes at its first token)."""
    params = SamplingParams(temperature=0.6, seed=1, max_tokens=1, ignore_eos=True)
    if engine.config.device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"p{time.perf_counter_ns()}-{i}", prompt, params)
    while engine.has_unfinished():
        engine.step()  # NOTE: sampling reads token ids to the host: every step ends synchronised
    return time.perf_counter() - start


def measure_path(engine: LLMEngine, lengths: list[int], repeats: int, hardware: dict, weight_bytes: int,
                 rest_s: float) -> dict:
    rng, vocab = random.Random(0), engine.runner.model.cfg.vocab_size
    results = {}
    for length in lengths:
        prompt = [rng.randrange(vocab) for _ in range(length)]
        run_until_done(engine, [prompt])  # NOTE: warm-up (lazy kernel set-up, allocator)
        alone = min(run_until_done(engine, [prompt]) for _ in range(repeats))
        clocks = {"sm_clock_mhz_back_to_back": sm_clock_mhz()}
        rested = None
        if hardware:
            rested = min(rested_run(engine, prompt, rest_s, clocks) for _ in range(repeats))
        batch = [[rng.randrange(vocab) for _ in range(length)] for _ in range(max(1, 8192 // length))]
        batch_s = run_until_done(engine, batch)
        results[length] = {"alone_ms": round(1e3 * alone, 3),
                           "batch_tok_per_s": round(len(batch) * length / batch_s)} | floors(
            length, alone, hardware, weight_bytes, rested) | ({} if rested is None else clocks)
    return results


def rested_run(engine: LLMEngine, prompt: list[int], rest_s: float, clocks: dict) -> float:
    time.sleep(rest_s)
    clocks["sm_clock_mhz_rested"] = sm_clock_mhz()
    return run_until_done(engine, [prompt])


def sm_clock_mhz() -> int | None:
    """The GPU's SM clock now (nvidia-smi; None without it)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return int(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def sustained_gemm_rate(device: str, warm_s: float = 1.0, repeats: int = 50) -> float:
    """bf16 FLOP/s of 8192-cube GEMMs after warm_s of them (measure_hardware's rate is a rested burst)."""
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    torch.cuda.synchronize()
    end = time.perf_counter() + warm_s
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
    return 2 * 8192**3 / timed(lambda: a @ a, repeats)


def floors(length: int, alone_s: float, hardware: dict, weight_bytes: int, rested_s: float | None = None) -> dict:
    if not hardware:
        return {}
    flops = 2 * (weight_bytes // 2) * length
    read_ms, gemm_ms = 1e3 * weight_bytes / hardware["copy_bytes_per_s"], 1e3 * flops / hardware["bf16_flops_per_s"]
    nominal_ms = 1e3 * flops / NOMINAL_FLOPS
    result = {"weight_read_floor_ms": round(read_ms, 3), "gemm_floor_ms": round(gemm_ms, 3),
              "nominal_floor_ms": round(nominal_ms, 3), "over_weight_read": round(1e3 * alone_s / read_ms, 2),
              "over_floor": round(1e3 * alone_s / max(read_ms, gemm_ms), 2),
              "gemm_rate_fraction": round(gemm_ms / (1e3 * alone_s), 3),
              "nominal_rate_fraction": round(nominal_ms / (1e3 * alone_s), 3)}
    if rested_s is not None:
        result["rested_ms"] = round(1e3 * rested_s, 3)
        result["gemm_rate_fraction_rested"] = round(gemm_ms / (1e3 * rested_s), 3)
    if "bf16_flops_per_s_sustained" in hardware:
        sustained_ms = 1e3 * flops / hardware["bf16_flops_per_s_sustained"]
        result["gemm_rate_fraction_sustained"] = round(sustained_ms / (1e3 * alone_s), 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="random:qwen3-8b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--paths", default=PATHS, help="comma-separated bench mode specs")
    parser.add_argument("--lengths", default="16,64,128,256,512,1024,2048,4096")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--prefill-chunk-size", type=int, default=2048)
    parser.add_argument("--kv-cache-mib", type=int, default=24000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rest-seconds", type=float, default=2.0,
                        help="CUDA: the idle time before each rested run (rested_ms)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    # NOTE: the GPU's name first: it applies the default cuBLAS setting (no split-K) before measure_hardware's GEMMs
    # start cuBLAS, so every path measures what the engine runs by default
    gpu = gpu_name() if torch.cuda.is_available() else None
    hardware = measure_hardware(args.device)
    if hardware:
        hardware |= {"sm_clock_mhz_after_burst": sm_clock_mhz(),
                     "bf16_flops_per_s_sustained": sustained_gemm_rate(args.device),
                     "sm_clock_mhz_after_sustained": sm_clock_mhz()}
    base = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_model_len=max(lengths) + 16,
                           prefill_chunk_size=args.prefill_chunk_size)
    report = {"gpu": gpu, "hardware": hardware,
              "command": vars(args), "paths": {}}
    for spec in map(canonical_mode_spec, args.paths.split(",")):
        config = EngineConfig(model=args.model, dtype=args.dtype, device=args.device,
                              scheduler=scheduler_for(base, spec),
                              cache=CacheConfig(memory_budget_bytes=args.kv_cache_mib * 2**20,
                                                enable_prefix_caching=False))  # NOTE: prompts repeat: no hits
        engine = LLMEngine(config)
        weight_bytes = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
        report["paths"][spec] = {"prefill_path": engine.runner.prefill_path,
                                 "lengths": measure_path(engine, lengths, args.repeats, hardware, weight_bytes,
                                                         args.rest_seconds)}
        print(spec, json.dumps(report["paths"][spec]), flush=True)
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
