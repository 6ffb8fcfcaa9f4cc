"""lm-eval (a client others wrote) against the cluster: its local-completions model on two tasks written into the
repo, a multiple-choice loglikelihood one (echo + logprobs + max_tokens 0) and a generate_until one, run alone
and under concurrent load: every logged sample is identical."""

from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

from tests.launch.cluster_client import start_cluster  # noqa: E402

pytestmark = pytest.mark.slow
TASKS = Path(__file__).parent / "lm_eval_tasks"


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    cluster = start_cluster(tiny_model_dir, 1, 1)
    yield cluster
    cluster.stop()


def evaluate(cluster, model_dir: str, num_concurrent: int) -> dict:
    from lm_eval.tasks import TaskManager

    model_args = (f"base_url={cluster.url}/v1/completions,model=corun-tiny,tokenizer_backend=huggingface,"
                  f"tokenizer={model_dir},num_concurrent={num_concurrent},max_retries=1")
    results = lm_eval.simple_evaluate(model="local-completions", model_args=model_args,
                                      tasks=["corun_tiny_mc", "corun_tiny_gen"], log_samples=True,
                                      task_manager=TaskManager(include_path=str(TASKS), include_defaults=False))
    return {task: [(s["doc_id"], s["resps"], s["filtered_resps"]) for s in samples]
            for task, samples in results["samples"].items()}


def test_loglikelihood_and_generate_until_are_identical_alone_and_under_load(cluster, tiny_model_dir, monkeypatch):
    monkeypatch.chdir(TASKS)  # NOTE: the tasks' data_files are relative to here
    alone = evaluate(cluster, tiny_model_dir, num_concurrent=1)
    loaded = evaluate(cluster, tiny_model_dir, num_concurrent=8)
    assert set(alone) == {"corun_tiny_mc", "corun_tiny_gen"} and all(alone.values())
    assert loaded == alone
    scores = [resp for _, resps, _ in alone["corun_tiny_mc"] for resp in resps]
    assert len(scores) == 6 * 3 and all(isinstance(r[0][0], float) for r in scores)  # NOTE: real loglikelihoods


def test_multiple_choice_with_a_shared_passage_is_identical_with_the_prefix_cache_on_and_off(tiny_model_dir):
    """Issue 25: lm-eval's loglikelihood requests (echo + logprobs) sharing a passage hit the prefix cache (their
    prompt logprobs kept with the chunks) and log the samples the cache-off cluster logs."""
    from benchmarks.lm_eval_prefix_cache import run

    result = run(tiny_model_dir, num_questions=3, passage_words=80, warm_up=False)
    assert result["samples_identical"] and len(result["samples"]) == 3
    assert result["runs"]["cache_on"]["hit_rate"] > 0.5 and result["runs"]["cache_off"]["hit_rate"] == 0
