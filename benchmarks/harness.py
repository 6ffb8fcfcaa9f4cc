"""`corun bench`: synthetic workloads through one engine per mode, measured like a serving benchmark.

Requests arrive as `vllm bench serve` sends them (planner.workloads.Arrivals: all at t=0 by default, as in
model evaluation and RL rollouts; or Poisson/gamma arrivals at --request-rate). Per mode and workload: output
tokens/s, TTFT (from each request's arrival) and TPOT p50/p99, goodput under --goodput SLO targets, the prefill
path and forward counts of the run, and the median time of full decode steps next to the step's floor:
max(bytes of weights and KV read / measured copy bandwidth, FLOPs / measured bf16 GEMM rate).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from corun.cublas import apply_cublas_split_k
from corun.engine import LLMEngine
from corun.request import Request
from planner.slo import checked_target_ms
from planner.workloads import DEFAULT_ARRIVALS, Arrivals, Workload, check_fits, make_prompts
from wire.config import EngineConfig, SchedulerConfig, canonical_mode_spec
from wire.engine_args import parse_buckets, parse_switch

GOODPUT_KEYS = {"ttft": "ttft_ms", "tpot": "tpot_ms"}
"""--goodput key -> SLOTargets field (vLLM's names; e2el is not measured here)."""


@dataclass(frozen=True)
class RequestOutcome:
    finished: bool
    ttft_s: float | None
    """From the request's arrival to its first token; None if it made none."""
    tpot_s: float | None
    """Mean gap between its later tokens; None with fewer than two tokens."""


@dataclass(frozen=True)
class SLOTargets:
    """Goodput targets (vLLM's --goodput): a request is good if it finished and meets every target given."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def __post_init__(self):
        for name, value in self.describe().items():
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"goodput target {name} must be a positive number of milliseconds, got {value}")

    def describe(self) -> dict[str, float]:
        return {name: value for name, value in dataclasses.asdict(self).items() if value is not None}

    def is_met(self, outcome: RequestOutcome) -> bool:
        # NOTE: a request of one output token has no TPOT; like vLLM (which counts it as 0) it meets any target.
        ttft_ok = self.ttft_ms is None or (outcome.ttft_s is not None and 1e3 * outcome.ttft_s <= self.ttft_ms)
        tpot_ok = self.tpot_ms is None or outcome.tpot_s is None or 1e3 * outcome.tpot_s <= self.tpot_ms
        return outcome.finished and ttft_ok and tpot_ok


def parse_goodput(pairs: Sequence[str] | None) -> SLOTargets:
    """`ttft:<ms>` and/or `tpot:<ms>` (separate arguments or comma-joined) -> SLOTargets; ValueError if bad."""
    targets: dict[str, float] = {}
    for pair in (p for item in pairs or () for p in item.split(",")):
        key, sep, value = pair.partition(":")
        if not sep or key not in GOODPUT_KEYS:
            raise ValueError(f"--goodput: expected ttft:<ms> or tpot:<ms>, got {pair!r}")
        if GOODPUT_KEYS[key] in targets:
            raise ValueError(f"--goodput: {key} given twice")
        try:
            milliseconds = float(value)
        except ValueError:
            raise ValueError(f"--goodput {pair!r}: {value!r} is not a number of milliseconds") from None
        targets[GOODPUT_KEYS[key]] = checked_target_ms(f"--goodput {key}", milliseconds)
    return SLOTargets(**targets)


def count_good(outcomes: Sequence[RequestOutcome], slo: SLOTargets) -> int:
    return sum(slo.is_met(outcome) for outcome in outcomes)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def measure_hardware(device: str) -> dict:
    """Copy bandwidth (bytes read + written per second) and bf16 GEMM rate, measured here and now."""
    if not device.startswith("cuda"):
        return {}
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    copy_s = timed(lambda: dst.copy_(src))
    gemm_s = timed(lambda: a @ a)
    return {"copy_bytes_per_s": 2 * src.numel() / copy_s, "bf16_flops_per_s": 2 * 8192**3 / gemm_s}


def gpu_name(cublas_split_k: bool = EngineConfig.cublas_split_k) -> str:
    """The GPU's name for a report. Starting CUDA for it fixes cuBLAS's workspace for the process, so the engines a
    probe builds afterwards run the cuBLAS setting they were given (the default unless the probe says otherwise)."""
    apply_cublas_split_k(cublas_split_k)
    return torch.cuda.get_device_name()


def timed(fn, repeats: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def step_floor(engine: LLMEngine, context_lens: list[int], num_rows: int, hardware: dict) -> float:
    """Seconds a decode step of num_rows rows over these contexts cannot beat on this GPU."""
    cfg, model = engine.runner.model.cfg, engine.runner.model
    elem = next(model.parameters()).element_size()
    weights = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n or cfg.tie_word_embeddings)
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * elem
    num_bytes = weights * elem + kv_per_token * sum(context_lens)
    flops = 2 * num_rows * weights + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * sum(context_lens)
    return max(num_bytes / hardware["copy_bytes_per_s"], flops / hardware["bf16_flops_per_s"])


@dataclass
class Trace:
    """What one run saw, in seconds from its start; requests are added in arrival order."""

    arrival_at: tuple[float, ...]
    requests: list[Request] = field(default_factory=list)
    first_at: dict[str, float] = field(default_factory=dict)
    last_at: dict[str, float] = field(default_factory=dict)
    decode_steps: list[tuple[float, list[int]]] = field(default_factory=list)
    token_gaps: list[float] = field(default_factory=list)
    """Between each request's consecutive tokens: the engine's ITL, which a stream through the router can match at
    best (a prefill forward between two decode steps is a gap here too)."""

    def next_arrival(self) -> float:
        return self.arrival_at[len(self.requests)] if len(self.requests) < len(self.arrival_at) else math.inf

    @property
    def truncated(self) -> bool:
        """Cut short: some requests never arrived, or were aborted."""
        return len(self.requests) < len(self.arrival_at) or any(r.finish_reason == "abort" for r in self.requests)

    def outcomes(self) -> list[RequestOutcome]:
        return [RequestOutcome(r.finish_reason not in (None, "abort"), self.ttft(r, at), self.tpot(r))
                for r, at in zip(self.requests, self.arrival_at)]

    def ttft(self, request: Request, arrived_at: float) -> float | None:
        first = self.first_at.get(request.request_id)
        return None if first is None else first - arrived_at

    def tpot(self, request: Request) -> float | None:
        num_gaps = len(request.output_token_ids) - 1
        rid = request.request_id
        return (self.last_at[rid] - self.first_at[rid]) / num_gaps if num_gaps > 0 else None


def run_workload(engine: LLMEngine, workload: Workload, hardware: dict, seed: int = 0,
                 max_seconds: float | None = None, arrivals: Arrivals = DEFAULT_ARRIVALS,
                 slo: SLOTargets = SLOTargets(), label: str = "") -> dict:
    """Add each request once its arrival time has passed and run them all to their end, or until max_seconds
    pass; then the rest (arrived or not) count as unfinished and the result is marked truncated (its tokens/s
    then covers the tokens made so far, TPOT the tokens each request made)."""
    prompts = make_prompts(workload, engine.runner.model.cfg.vocab_size, seed)
    warm_up(engine, prompts)
    engine.reset_prefix_cache()  # NOTE: the run starts cold: the warm-up's prompts share its prefixes
    cache = prefix_cache_of(engine)
    queried_before, hits_before = (cache.num_queried_tokens, cache.num_hit_tokens) if cache else (0, 0)
    trace = Trace(arrivals.times(len(prompts)))
    counts_before, rows_before = engine.runner.forward_counts(), dict(engine.runner.decode_rows_histogram)
    prefill_rows_before = dict(getattr(engine.runner, "prefill_rows_histogram", {}))  # NOTE: the vLLM runner: none
    retries_before = allocator_retries()
    preemptions_before = getattr(engine.scheduler, "num_preemptions", 0)  # NOTE: the vLLM engine's: none
    elapsed = serve_arrivals(engine, prompts, trace, math.inf if max_seconds is None else max_seconds,
                             label or workload.name)
    counts_after, rows_after = engine.runner.forward_counts(), engine.runner.decode_rows_histogram
    return summarize(engine, trace, elapsed, hardware, slo) | {
        "arrivals": arrivals.describe(), "prefill_path": engine.runner.prefill_path,
        "forward_counts": {name: counts_after[name] - counts_before[name] for name in counts_after},
        "decode_sizes": engine.runner.decode_sizes,
        "joined_pairs": len(getattr(engine.runner, "joined_shapes", ())),
        "decode_steps_by_rows": {rows: n - rows_before.get(rows, 0) for rows, n in sorted(rows_after.items())},
        "prefill_forwards_by_rows": {rows: n - prefill_rows_before.get(rows, 0) for rows, n in sorted(
            getattr(engine.runner, "prefill_rows_histogram", {}).items())},
        "truncated": trace.truncated, "allocator_retries": allocator_retries() - retries_before,
        "num_preemptions": getattr(engine.scheduler, "num_preemptions", 0) - preemptions_before,
        **prefix_cache_summary(engine, queried_before, hits_before)}


def prefix_cache_of(engine):
    """The engine's prefix cache; None when off (or on the vLLM backend's engine, which has no block manager here)."""
    return getattr(getattr(engine, "block_manager", None), "prefix_cache", None)


def prefix_cache_summary(engine: LLMEngine, queried_before: int, hits_before: int) -> dict:
    """The run's prefix cache hit rate: prompt tokens served from the cache over those looked up (vLLM's counters;
    0 with the cache off)."""
    cache = prefix_cache_of(engine)
    queried = cache.num_queried_tokens - queried_before if cache else 0
    hits = cache.num_hit_tokens - hits_before if cache else 0
    return {"prefix_caching": cache is not None, "prefix_cache_queried_tokens": queried,
            "prefix_cache_hit_tokens": hits, "hit_rate": round(hits / queried, 4) if queried else 0.0}


def allocator_retries() -> int:
    """CUDA allocations that failed and were retried after freeing the allocator's cache (each one synchronises
    the device): a run with many is bound by GPU memory, not by its kernels."""
    return torch.cuda.memory_stats().get("num_alloc_retries", 0) if torch.cuda.is_available() else 0


WARM_UP_REQUESTS = 8


def warm_up_prompts(prompts: list) -> list:
    """The warm-up's share of a workload's prompts: the longest among its first 64, and its first."""
    return sorted(prompts[:64], key=lambda p: len(p[1]))[-WARM_UP_REQUESTS // 2:] + prompts[:WARM_UP_REQUESTS // 2]


def warm_up(engine: LLMEngine, prompts: list) -> None:
    """A few of the workload's prompts (its longest among them) for 2 tokens each, before the clock starts: kernels
    that compile at first use (Triton's eager ones, cuBLAS's handles) would otherwise be paid by whichever mode of a
    bench runs first (measured on the H200: BurstGPT-like at t = 0, the same mode gave 3,616 tok/s first in one run
    and 4,785 second in the next)."""
    for i, (_, token_ids, params) in enumerate(warm_up_prompts(prompts)):
        engine.add_request(f"warm-up-{i}", token_ids, dataclasses.replace(params, max_tokens=2, min_tokens=0))
    while engine.has_unfinished():
        engine.step()


PROGRESS_EVERY_S = 15.0


def serve_arrivals(engine: LLMEngine, prompts: list, trace: Trace, deadline: float, label: str = "") -> float:
    """The measured loop; returns its seconds. Past the deadline every request still running is aborted."""
    start = time.perf_counter()
    next_progress = PROGRESS_EVERY_S
    while len(trace.requests) < len(prompts) or engine.has_unfinished():
        now = time.perf_counter() - start
        if now > next_progress:  # NOTE: a line now and then, so a run of minutes is not silent
            num_finished = sum(r.finish_reason is not None for r in trace.requests)
            print(f"corun bench: {label}: {num_finished}/{len(prompts)} requests finished after {now:.0f} s",
                  file=sys.stderr, flush=True)
            next_progress += PROGRESS_EVERY_S
        if now > deadline:
            for request in trace.requests:
                engine.abort_request(request)
            break
        while trace.next_arrival() <= now:
            trace.requests.append(engine.add_request(*prompts[len(trace.requests)]))
        if engine.has_unfinished():
            timed_step(engine, trace, start)
        else:  # NOTE: idle until the next arrival (or the deadline): the gap is part of the measured run
            time.sleep(max(0.0, min(trace.next_arrival(), deadline) - now))
    return time.perf_counter() - start


def timed_step(engine: LLMEngine, trace: Trace, start: float) -> None:
    decoding = [r for r in engine.scheduler.running if not r.is_prefilling]
    context_lens = [r.num_tokens for r in decoding]
    step_start = time.perf_counter()
    sampled = engine.step()
    now = time.perf_counter()
    # NOTE: a pure decode step samples exactly the requests that were decoding (ids, not list scans)
    if sampled and {id(s.request) for s in sampled} == {id(r) for r in decoding}:
        trace.decode_steps.append((now - step_start, context_lens))
    at = now - start
    for item in sampled:
        rid = item.request.request_id
        last = trace.last_at.get(rid)
        if last is None:
            trace.first_at[rid] = at
        else:
            trace.token_gaps.append(at - last)
        trace.last_at[rid] = at


def outcome_summary(outcomes: Sequence[RequestOutcome], num_requests: int, num_tokens: int, elapsed: float,
                    slo: SLOTargets) -> dict:
    """The schema every bench result shares (engines here, a cluster through `corun bench --url`)."""
    ttfts = [o.ttft_s for o in outcomes if o.ttft_s is not None]
    tpots = [o.tpot_s for o in outcomes if o.tpot_s is not None]
    num_good = count_good(outcomes, slo)
    return {"num_requests": num_requests, "num_finished": sum(o.finished for o in outcomes),
            "output_tokens": num_tokens, "seconds": round(elapsed, 3),
            "output_tok_per_s": round(num_tokens / elapsed, 1),
            "ttft_s": {"p50": round(percentile(ttfts, 0.5), 4), "p99": round(percentile(ttfts, 0.99), 4)},
            "tpot_ms": {"p50": round(1e3 * percentile(tpots, 0.5), 3), "p99": round(1e3 * percentile(tpots, 0.99), 3)},
            "num_good": num_good, "goodput_req_per_s": round(num_good / elapsed, 3), "slo_targets": slo.describe()}


def summarize(engine: LLMEngine, trace: Trace, elapsed: float, hardware: dict, slo: SLOTargets) -> dict:
    num_tokens = sum(len(r.output_token_ids) for r in trace.requests)
    result = outcome_summary(trace.outcomes(), len(trace.arrival_at), num_tokens, elapsed, slo)
    result["itl_ms"] = {"p50": round(1e3 * percentile(trace.token_gaps, 0.5), 3),
                        "p99": round(1e3 * percentile(trace.token_gaps, 0.99), 3)}
    result["num_decode_steps"] = len(trace.decode_steps)
    result["rows_per_decode_step"] = round(statistics.fmean(len(c) for _, c in trace.decode_steps), 1) \
        if trace.decode_steps else None
    if trace.decode_steps and hardware:
        result["decode_step"] = decode_step_summary(engine, trace.decode_steps, hardware)
    return result


def decode_step_summary(engine: LLMEngine, decode_steps: list[tuple[float, list[int]]], hardware: dict) -> dict:
    n = engine.config.scheduler.max_num_seqs
    full = [(t, ctx) for t, ctx in decode_steps if len(ctx) >= 0.9 * n] or decode_steps
    step_s = statistics.median(t for t, _ in full)
    rows = n if engine.config.scheduler.mode == "fixed_shape" else statistics.median(len(c) for _, c in full)
    floor_s = statistics.median(step_floor(engine, ctx, int(rows), hardware) for _, ctx in full)
    return {"median_ms": round(1e3 * step_s, 3), "floor_ms": round(1e3 * floor_s, 3),
            "over_floor": round(step_s / floor_s, 2), "median_active_rows": statistics.median(len(c) for _, c in full),
            "steps_measured": len(full), "tail": tail_summary(decode_steps, n)}


def tail_summary(decode_steps: list[tuple[float, list[int]]], max_num_seqs: int) -> dict:
    """Steps of at most N/8 rows: the tail of a t = 0 run, where step time is no longer the full step's."""
    tail = [(t, ctx) for t, ctx in decode_steps if ctx and len(ctx) <= max_num_seqs // 8]
    if not tail:
        return {"steps": 0}
    by_rows: dict[int, list[float]] = {}
    for t, ctx in tail:
        by_rows.setdefault(len(ctx), []).append(t)
    return {"steps": len(tail), "seconds": round(sum(t for t, _ in tail), 3),
            "median_ms": round(1e3 * statistics.median(t for t, _ in tail), 3),
            "mean_ms": round(1e3 * statistics.fmean(t for t, _ in tail), 3),
            "p90_ms": round(1e3 * percentile([t for t, _ in tail], 0.9), 3),
            "max_ms": round(1e3 * max(t for t, _ in tail), 3),
            "median_active_rows": statistics.median(len(c) for _, c in tail),
            "median_longest_context": statistics.median(max(c) for _, c in tail),
            # NOTE: where a tail's total differs while its median does not: steps, seconds and median per row count
            "by_active_rows": {rows: {"steps": len(ts), "seconds": round(sum(ts), 4),
                                      "median_ms": round(1e3 * statistics.median(ts), 3)}
                               for rows, ts in sorted(by_rows.items())}}


def progress_line(mode: str, workload: str, result: dict) -> str:
    """One line per (mode, workload) for stderr, so long device runs show where they are."""
    ttft, tpot = result["ttft_s"], result["tpot_ms"]
    cut_short = " TRUNCATED" if result["truncated"] else ""
    served = ""
    if "itl_ms" in result:  # NOTE: the engine's token gaps, or a stream's through the router (corun bench --url)
        served = f", ITL p50/p99 {result['itl_ms']['p50']}/{result['itl_ms']['p99']} ms"
        if result.get("router_cpu_us_per_token") is not None:
            served += f", router CPU {result['router_cpu_us_per_token']} us/token"
    return (f"corun bench: {mode} {workload} rate={result['arrivals']['request_rate']} "
            f"prefill={result['prefill_path']}: {result['output_tok_per_s']} tok/s, TTFT p50/p99 "
            f"{ttft['p50']}/{ttft['p99']} s, TPOT p99 {tpot['p99']} ms{served}, goodput "
            f"{result['goodput_req_per_s']} req/s ({result['num_good']}/{result['num_requests']} good){cut_short}")


def scheduler_for(base: SchedulerConfig, spec: str) -> SchedulerConfig:
    """A mode spec: 'mode' or 'mode:field=value:...' with SchedulerConfig fields, so that variants of one mode
    run side by side in one bench, e.g. fixed_shape:prefill_buckets=none:decode_step_sizes=none (the paper's shapes)
    or mixed:piecewise_graphs=off (eager mixed steps). A mode's old name (wire.config.OLD_NAMES) is taken too."""
    mode, *settings = spec.split(":")
    overrides: dict = {"mode": mode}
    for setting in settings:
        name, sep, value = setting.partition("=")
        if not sep or name not in {f.name for f in dataclasses.fields(SchedulerConfig)} or name == "mode":
            raise ValueError(f"mode spec {spec!r}: expected field=value with a SchedulerConfig field, got {setting!r}")
        if name.endswith(("_buckets", "_sizes")):
            overrides[name] = parse_buckets(value)
        elif isinstance(getattr(base, name), bool):
            overrides[name] = parse_switch({"true": "on", "false": "off"}.get(value, value))
        else:
            overrides[name] = int(value)
    return dataclasses.replace(base, **overrides)


def run_bench(base: EngineConfig, modes: list[str], workloads: list[Workload], out: str | None = None,
              max_seconds: float | None = None, *, arrivals: Arrivals = DEFAULT_ARRIVALS,
              slo: SLOTargets = SLOTargets()) -> dict:
    for workload in workloads:  # NOTE: before any model loads: a too-long workload would fail mid-run
        check_fits(workload, base.scheduler.max_model_len)
    modes = [canonical_mode_spec(spec) for spec in modes]  # NOTE: the report names every mode by its name now
    # NOTE: the GPU's name first: it applies the cuBLAS setting before measure_hardware's GEMMs start cuBLAS
    gpu = gpu_name(base.cublas_split_k) if base.device.startswith("cuda") else None
    hardware = measure_hardware(base.device)
    report = {"engine": dataclasses.asdict(base), "hardware": hardware, "torch": torch.__version__, "gpu": gpu,
              "arrivals": arrivals.describe(), "slo_targets": slo.describe(), "prefill_paths": {}, "modes": {}}
    for mode in modes:
        config = dataclasses.replace(base, scheduler=scheduler_for(base.scheduler, mode))
        print(f"corun bench: building the {mode} engine", file=sys.stderr, flush=True)
        started = time.perf_counter()
        engine = LLMEngine(config)
        report["prefill_paths"][mode], report["modes"][mode] = engine.runner.prefill_path, {}
        report.setdefault("resolved", {})[mode] = {  # NOTE: the dtype, N and the KV cache as the engine ran them
            "dtype": engine.config.dtype, "max_num_seqs": engine.config.scheduler.max_num_seqs,
            "num_kv_blocks": engine.runner.kv_cache.num_blocks,
            "kv_cache_mib": engine.runner.kv_cache.data.nbytes // 2**20,
            "start_up_s": round(time.perf_counter() - started, 1)}  # NOTE: load, graphs, start-up probes
        for workload in workloads:
            result = run_workload(engine, workload, hardware, max_seconds=max_seconds, arrivals=arrivals, slo=slo,
                                  label=f"{mode} {workload.name}")
            report["modes"][mode][workload.name] = result
            print(progress_line(mode, workload.name, result), file=sys.stderr, flush=True)
            if out:  # NOTE: written after every workload, so a run cut short still leaves its results
                with open(out, "w") as f:
                    json.dump(report, f, indent=2, default=str)
        del engine
        gc.collect()  # NOTE: the engine's reference cycles too, so that the next one finds its GPU memory free
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return report
