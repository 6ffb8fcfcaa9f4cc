"""Issue 25: lm-eval's multiple-choice task through the router, the prefix cache on against off.

A multiple-choice loglikelihood task written here (lm-eval's local-completions model: each choice is a request
with echo, logprobs and max_tokens 0, whose prompt logprobs score it): every question follows one shared passage,
as a few-shot or reading-comprehension task's do, and has 4 choices. One 1P1D cluster on the model with the
cache on, one with it off, the same task on each: the logged samples must be identical, and the time is what the
cache saves.

    python -m benchmarks.lm_eval_prefix_cache --model DIR [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.http_bench import metric_samples, prefix_cache_hit_rate
from benchmarks.report import emit
from launch.cluster import free_port
from launch.local import LocalCluster, LocalClusterConfig
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

TASK = "corun_shared_context_mc"
WORDS = ("the a river house seven people green city dog cat numbers slowly quickly mat blue on sat light morning "
         "reads").split()


def write_task(directory: Path, num_questions: int, passage_words: int, seed: int = 0) -> None:
    """The task's yaml and data in directory: num_questions docs, each the shared passage then its question, with
    4 choices."""
    rng = random.Random(seed)
    passage = " ".join(rng.choice(WORDS) for _ in range(passage_words))
    with open(directory / f"{TASK}.jsonl", "w") as data:
        for _ in range(num_questions):
            question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10)))
            choices = [" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) for _ in range(4)]
            data.write(json.dumps({"passage": passage, "question": question, "choices": choices,
                                   "answer": rng.randrange(4)}) + "\n")
    (directory / f"{TASK}.yaml").write_text(
        f"task: {TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {TASK}.jsonl\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{passage}}\\nQuestion: {{question}}\\n"
        "Answer:\"\ndoc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{answer}}\"\nmetric_list:\n  - metric: acc\n")


def start(model_dir: str, cache_on: bool, chunk: int, port: int) -> LocalCluster:
    engine = EngineConfig(model=model_dir,
                          scheduler=SchedulerConfig(max_num_seqs=32, max_model_len=1024, prefill_chunk_size=chunk),
                          cache=CacheConfig(memory_budget_bytes=64 * 2**20, enable_prefix_caching=cache_on))
    return LocalCluster(LocalClusterConfig(engine, served_model_name="corun-tiny", num_prefill=1, num_decode=1,
                                           port=port)).start()


def evaluate(url: str, model_dir: str, task_dir: Path, num_concurrent: int) -> tuple[list, float]:
    """(the logged samples, seconds) of the task against the cluster at url."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    model_args = (f"base_url={url}/v1/completions,model=corun-tiny,tokenizer_backend=huggingface,"
                  f"tokenizer={model_dir},num_concurrent={num_concurrent},max_retries=1")
    cwd = os.getcwd()
    os.chdir(task_dir)  # NOTE: the task's data_files are relative to it
    try:
        started = time.perf_counter()
        # NOTE: include_defaults False: lm-eval's own tasks go unindexed (some 10 s of reading their YAML files)
        tasks = TaskManager(include_path=str(task_dir), include_defaults=False)
        results = lm_eval.simple_evaluate(model="local-completions", model_args=model_args, tasks=[TASK],
                                          log_samples=True, task_manager=tasks)
        seconds = time.perf_counter() - started
    finally:
        os.chdir(cwd)
    return [(s["doc_id"], s["resps"], s["filtered_resps"]) for s in results["samples"][TASK]], seconds


def metrics(url: str) -> dict[str, list[float]]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        return metric_samples(response.read().decode())


def run(model_dir: str, num_questions: int = 16, passage_words: int = 120, chunk: int = 64,
        num_concurrent: int = 1, warm_up: bool = True) -> dict:
    """Both clusters, one after the other, on one task; -> the figures and whether the samples are identical.
    warm_up False (a test's samples, not timings): each cluster runs the task once, from a fresh cache."""
    with tempfile.TemporaryDirectory() as task_dir:
        write_task(Path(task_dir), num_questions, passage_words)
        runs, samples = {}, {}
        for name, cache_on in (("cache_off", False), ("cache_on", True)):
            cluster = start(model_dir, cache_on, chunk, free_port("127.0.0.1"))
            try:
                if warm_up:
                    evaluate(cluster.url, model_dir, Path(task_dir), num_concurrent)  # NOTE: fills the cache too
                if warm_up and cache_on:  # NOTE: measured cold: the passage enters the cache during the measured run
                    urllib.request.urlopen(urllib.request.Request(f"{cluster.url}/reset_prefix_cache", data=b"",
                                                                  method="POST"), timeout=30).close()
                before = metrics(cluster.url)
                samples[name], seconds = evaluate(cluster.url, model_dir, Path(task_dir), num_concurrent)
                hit_rate = prefix_cache_hit_rate(before, metrics(cluster.url))["hit_rate"]
            finally:
                cluster.stop()
            runs[name] = {"seconds": round(seconds, 3), "requests": 4 * num_questions, "hit_rate": hit_rate}
    return {"benchmark": "lm_eval_prefix_cache", "task": TASK, "questions": num_questions, "choices": 4,
            "passage_words": passage_words, "prefill_chunk_size": chunk, "num_concurrent": num_concurrent,
            "host": platform.node(), "cpu_count": os.cpu_count(), "runs": runs,
            "speedup": round(runs["cache_off"]["seconds"] / runs["cache_on"]["seconds"], 3),
            "samples_identical": samples["cache_on"] == samples["cache_off"], "samples": samples["cache_on"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--passage-words", type=int, default=120)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--num-concurrent", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args()
    result = run(args.model, args.questions, args.passage_words, args.chunk, args.num_concurrent)
    result["command"] = ("python -m benchmarks.lm_eval_prefix_cache --model DIR " + " ".join(
        f"--{flag} {value}" for flag, value in (("questions", args.questions), ("passage-words", args.passage_words),
                                                ("chunk", args.chunk), ("num-concurrent", args.num_concurrent))))
    emit({k: v for k, v in result.items() if k != "samples"}, args.out)


if __name__ == "__main__":
    main()
