"""Run in .venv-vllm by the tests here: the vLLM engine under fixed_shape or mixed mode, prompts alone, together,
and one needle request arriving while a background batch runs (or, together_only, the batch alone). Prints one JSON
object; logprobs as float.hex().

Given a list of jobs, runs each on its own engine, one after the other in this process, and prints the list of
their objects: vLLM's imports and its first engine's start-up are most of a short job's time. The jobs must share
the mode and the thread count: vLLM reads its environment (the KV split, the thread binding) once, at the first
engine's start, and caches it for the process."""

from __future__ import annotations

import json
import os
import sys


def run_job(job: dict) -> dict:
    from corun.vllm_backend.engine import VllmEngine
    from wire.config import CacheConfig, EngineConfig, SchedulerConfig
    from wire.sampling_params import SamplingParams

    config = EngineConfig(
        model=job["model"], backend="vllm", num_threads=job["threads"], seed=0,
        scheduler=SchedulerConfig(mode=job["mode"], max_num_seqs=job["max_num_seqs"],
                                  max_model_len=job.get("max_model_len", 1024), prefill_chunk_size=job["chunk"],
                                  max_num_batched_tokens=job["chunk"]),
        cache=CacheConfig(block_size=32, memory_budget_bytes=job.get("kv_mib", 256) * 2**20))
    engine = VllmEngine(config)
    counter = iter(range(10**9))

    def run(groups: list[list[dict]], steps_between: int) -> list[dict]:
        """Each group is added steps_between engine steps after the previous one; -> outputs in request order."""
        requests = []
        for group in groups:
            for spec in group:
                params = SamplingParams(**spec["params"])
                requests.append(engine.add_request(f"r{next(counter)}", spec["prompt"], params))
            for _ in range(steps_between):
                engine.step()
        while engine.has_unfinished():
            engine.step()
        return [record(r) for r in requests]

    def record(request) -> dict:
        def entry(lp):
            return None if lp is None else [lp.token_id, lp.logprob.hex(), [[t, v.hex()] for t, v in lp.top]]

        return {"tokens": request.output_token_ids, "finish_reason": request.finish_reason,
                "logprobs": [lp.logprob.hex() for lp in request.output_logprobs],
                "top": [entry(lp)[2] for lp in request.output_logprobs],
                "prompt_logprobs": [entry(lp) for lp in request.prompt_logprobs]}

    prompts = job["requests"]
    if job.get("together_only"):  # NOTE: the colocated reference of test_nodes.py, and the admission test
        together = run([prompts], 0)
        counts = engine.counts()
        return {"together": together, "max_decode_batch": counts.max_decode_batch,
                "num_preempted": counts.num_preempted}
    alone = [run([[spec]], 0)[0] for spec in prompts]
    together = run([prompts], 0)
    needle = run([job["background"], [prompts[0]]], job["needle_after_steps"])[-1]
    counts = engine.counts()
    return {"alone": alone, "together": together, "needle": needle, "forward_rows": engine.forward_rows(),
            "num_decode_steps": counts.num_decode_steps, "max_decode_batch": counts.max_decode_batch,
            "num_preempted": counts.num_preempted}


if __name__ == "__main__":
    jobs = json.loads(sys.argv[1])
    settings = {(job["mode"], job["threads"]) for job in (jobs if isinstance(jobs, list) else [jobs])}
    assert len(settings) == 1, f"one mode and thread count per process (vLLM caches its environment): {settings}"
    result = [run_job(job) for job in jobs] if isinstance(jobs, list) else run_job(jobs)
    print(json.dumps(result), flush=True)
    # NOTE: everything is printed; vLLM's teardown at interpreter exit takes 5-10 s more on a 2-core host
    os._exit(0)
