"""`python -m benchmarks.burst_trickle --model DIR`: a burst's first tokens when its requests trickle in, on a
modelled GPU clock.

Through HTTP a burst of N requests reaches the node one by one, as fast as the router takes them in (about half a
millisecond each), in the order the clients' connections deliver them (shuffled); the engine bench adds them all at
once, grouped. This runs the real scheduler and prefix cache (the tiny model computes; its time is not counted) and
advances a clock by what each step would take on the GPU (a linear model of a prefill forward's rows, a flat decode
step), adding each request once the clock passes its arrival. Per workload and cache mode: the TTFT p50 of the burst
added at once (grouped, as the engine bench) and trickling in (shuffled, at --intake-ms per request), and the ratio
cache on / cache off that issue 25 asks about. The figures are a model's, not a GPU's: they say which schedule
changes the median, not by how much on a card.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys

from benchmarks.prefix_cache import vocab_of
from benchmarks.waiting_order import burst_parser
from corun import LLM
from planner.workloads import make_prompts, make_workload
from wire.config import CacheConfig, EngineConfig, SchedulerConfig


@dataclasses.dataclass(frozen=True)
class GpuClock:
    """Milliseconds a step takes: a prefill forward (decode rows riding it counted as rows), or a decode step."""

    forward_fixed_ms: float = 3.0
    forward_ms_per_row: float = 0.0205
    """An 8B-shape forward of 8,192 rows: ~171 ms (H100, bf16)."""
    decode_step_ms: float = 15.0

    def step_ms(self, prefill_rows: int, decode_rows: int) -> float:
        if prefill_rows:
            return self.forward_fixed_ms + self.forward_ms_per_row * (prefill_rows + decode_rows)
        return self.decode_step_ms if decode_rows else 0.0


def burst(model: str, workload: str, num_requests: int, cache_on: bool, trickle: bool, intake_ms: float,
          pack_tokens: int, clock: GpuClock, pack_seqs: int = 64, ramp_rows: int = 0) -> dict:
    """ramp_rows: a what-if, not a product setting: the burst's first prefill forwards hold at most ramp_rows,
    2 x ramp_rows, 4 x ... rows (fewer rows than T run at a verified smaller pack size: the same bits)."""
    config = EngineConfig(model=model, num_threads=1, scheduler=SchedulerConfig(
        max_model_len=1024, max_num_seqs=num_requests, prefill_chunk_size=32, prefill_pack_tokens=pack_tokens,
        prefill_pack_seqs=pack_seqs), cache=CacheConfig(num_blocks=num_requests * 80, enable_prefix_caching=cache_on))
    prompts = make_prompts(make_workload(workload, num_requests), vocab_of(config), seed=0)
    if trickle:
        random.Random(1).shuffle(prompts)
    arrivals = [i * intake_ms / 1e3 if trickle else 0.0 for i in range(len(prompts))]
    engine = LLM.from_config(config).engine
    engine.scheduler.multi_chunk_prefill = True  # NOTE: as on CUDA (forced: this CPU does not verify it)
    rows = {}
    schedule = engine.scheduler.schedule

    def counted_schedule():
        batch = schedule()
        rows["prefill"] = sum(chunk.num_tokens for chunk in batch.prefill_chunks)
        rows["decode"] = len(batch.decode_requests)
        return batch

    engine.scheduler.schedule = counted_schedule
    if ramp_rows:
        ramp_up(engine.scheduler, ramp_rows)
    now, added, first_at, forwards = 0.0, 0, {}, []
    while added < len(prompts) or engine.has_unfinished():
        if not engine.has_unfinished():
            now = max(now, arrivals[added])
        while added < len(prompts) and arrivals[added] <= now:
            engine.add_request(*prompts[added])
            added += 1
        rows.clear()
        sampled = engine.step()
        now += clock.step_ms(rows.get("prefill", 0), rows.get("decode", 0)) / 1e3
        for item in sampled:
            first_at.setdefault(item.request.request_id, now)
        if rows.get("prefill"):
            forwards.append({"end_s": round(now, 4), "rows": rows["prefill"], "arrived": added,
                             "first_tokens": len(first_at)})
    ttfts = sorted(first_at.values())  # NOTE: every client sends at t = 0: the intake is in its TTFT
    return {"workload": workload, "cache": "on" if cache_on else "off", "arrival": "trickle" if trickle else "at_once",
            "prefill_forwards": len(forwards), "ttft_s_p50": round(ttfts[len(ttfts) // 2], 4),
            "seconds": round(now, 4), "prefill_steps": forwards}


def ramp_up(scheduler, first_rows: int) -> None:
    """The scheduler's prefill forwards capped at first_rows, then twice that, ... (burst's --ramp-rows)."""
    prefill_chunks, num_forwards = scheduler.prefill_chunks, 0

    def capped(max_rows: int | None = None):
        nonlocal num_forwards
        cap = first_rows << min(num_forwards, 16)
        chunks = prefill_chunks(cap if max_rows is None else min(max_rows, cap))
        num_forwards += bool(chunks)
        return chunks

    scheduler.prefill_chunks = capped


def ratios(runs: list[dict]) -> dict:
    """Cache on against cache off per workload and arrival (at once, or trickling at each intake): TTFT p50 on / off
    and throughput on / off (the same requests: seconds off / on)."""
    def key(run):
        return f"{run['workload']} {run['arrival']}" + (f"_{run['intake_ms']}ms" if "intake_ms" in run else "")

    on = {key(run): run for run in runs if run["cache"] == "on"}
    off = {key(run): run for run in runs if run["cache"] == "off"}
    return {name: {"ttft_p50_x": round(on[name]["ttft_s_p50"] / off[name]["ttft_s_p50"], 3),
                   "throughput_x": round(off[name]["seconds"] / on[name]["seconds"], 3)}
            for name in on if name in off}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = burst_parser(__doc__.split("\n\n")[0], pack_tokens=8192)  # NOTE: CUDA's T
    parser.add_argument("--pack-seqs", type=int, default=64, help="prefill_pack_seqs (prompts per forward)")
    parser.add_argument("--ramp-rows", type=int, default=0,
                        help="a what-if: the first forwards hold at most this many rows, doubling each (0: off)")
    parser.add_argument("--intake-ms", default="0.5", help="the router's time per request of the burst, "
                        "comma-separated values (a trickled run each)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    clock = GpuClock()
    intakes = [float(ms) for ms in args.intake_ms.split(",")]
    runs = []
    for workload in args.workloads.split(","):
        for cache_on in (True, False):
            shape = {"pack_seqs": args.pack_seqs, "ramp_rows": args.ramp_rows}
            runs.append(burst(args.model, workload, args.num_requests, cache_on, False, 0.0, args.pack_tokens, clock,
                              **shape))
            runs += [{"intake_ms": ms, **burst(args.model, workload, args.num_requests, cache_on, True, ms,
                                               args.pack_tokens, clock, **shape)} for ms in intakes]
    for run in runs:
        print(json.dumps({key: value for key, value in run.items() if key != "prefill_steps"}))
    report = {"command": "python -m benchmarks.burst_trickle " + " ".join(argv), "clock": dataclasses.asdict(clock),
              "runs": runs, "cache_on_over_off": ratios(runs)}
    if args.out:
        with open(args.out, "w") as out:
            json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
