"""Which of vLLM's OpenAI tests the harness does not run (EXCLUDED, each with its reason), and what each failure
of the others is (FAILURES): a real incompatibility, an assumption about vLLM's test model or flags, or an
optional endpoint. Node ids are relative to the vendored root (vLLM's own paths)."""

from __future__ import annotations

REAL = "real incompatibility"
VLLM_MODEL = "assumes vLLM's model or flags"
OPTIONAL = "optional endpoint"

OPENAI = "tests/entrypoints/openai/"
EXCLUDED: dict[str, str] = {
    OPENAI + "test_metrics.py::test_abort_metrics_reset":
        "a race with the model's speed: it reads the running requests 0.5 s after sending 3 x 100 tokens, which the "
        "tiny model on CPU finishes in 0.4-0.6 s through `corun serve` (0.6 s measured on a loaded host): it passed "
        "or failed by the host's load (running 0, kv usage 0.0 once they had finished)",
    OPENAI + "test_metrics.py::test_metrics_exist_run_batch":
        "vLLM's batch runner (python -m vllm.entrypoints.openai.run_batch) with an embedding model: not a server test",
}
"""nodeid (or nodeid without its parameters) -> why it is not run."""

EXCLUDED_PARAMETERS: dict[str, str] = {
    "-multimodal]": "the multimodal model (SmolVLM) and its image input: CoRun serves text models",
    "[--enable-chunked-prefill-": "a vLLM flag (CoRun always prefills long prompts in chunks): the same server as ''",
    "[--disable-frontend-multiprocessing-": "a vLLM flag with no CoRun counterpart: the same server as ''",
    "[--show-hidden-metrics-for-version=": "vLLM's deprecated metrics (gpu_cache_usage_perc, ...), shown by a vLLM "
                                           "flag: CoRun never had them",
}
"""A part of a nodeid's parameters -> why those parametrizations are not run (the others of the test are)."""


def excluded(nodeid: str) -> str | None:
    """Why nodeid is not run, or None."""
    reason = EXCLUDED.get(nodeid) or EXCLUDED.get(nodeid.split("[")[0])
    return reason or next((why for part, why in EXCLUDED_PARAMETERS.items() if part in nodeid), None)

BASIC, COMPLETION, TOOLS = OPENAI + "basic/", OPENAI + "completion/test_completion.py::", \
    OPENAI + "chat_completion/test_completion_with_function_calling.py::"
FORCED = ("a forced call (required or named; compact JSON, as vLLM's disable_any_whitespace) gets no tool_calls: "
          "the random-weight tiny model writes one JSON string value until the length limit (seen: 932 tokens "
          "inside \"city\"). vLLM 0.32 (.venv-vllm) on the tiny model with the named call's schema does the same "
          "(4 seeds of 4 run to 932 tokens): string values are unbounded in vLLM's schema too; a trained model "
          "closes them")
FAILURES: dict[str, tuple[str, str]] = {
    TOOLS + "test_named_tool_use": (
        VLLM_MODEL, "asks 1,000 tokens past a 63-token prompt: beyond the 1,024-token context `corun serve` gives "
                    "the tiny model (vLLM serves Qwen3-0.6B at 40k)"),
    COMPLETION + "test_single_completion":
        (VLLM_MODEL, "prompt_tokens == 6 is opt-125m's tokenizer (the tiny model's gives 7)"),
    COMPLETION + "test_parallel_no_streaming":
        (VLLM_MODEL, "asserts samples end at different lengths: a trained model's EOS within 50 tokens"),
    COMPLETION + "test_parallel_streaming":
        (VLLM_MODEL, "asserts samples end at different lengths: a trained model's EOS within 50 tokens"),
}
"""nodeid (or without parameters) -> (kind, one-line reason) of a failure seen on this branch."""


def tool_use_kind(thinking: str, choice: str) -> tuple[str, str]:
    """test_function_tool_use[enable_thinking-tool_choice-stream-model]."""
    if thinking == "True":
        return VLLM_MODEL, "asserts reasoning text: a trained thinking model and vLLM's --reasoning-parser qwen3"
    if choice == "auto":
        return VLLM_MODEL, "asserts the model chose to call a tool (tool_choice auto): a trained model"
    return VLLM_MODEL, FORCED


FAILURES.update({f"{TOOLS}test_function_tool_use[{thinking}-{choice}-{stream}-Qwen/Qwen3-0.6B]":
                 tool_use_kind(thinking, choice)
                 for thinking in ("True", "False") for choice in ("auto", "required", "tool_choice2")
                 for stream in ("True", "False")})


def classify(nodeid: str) -> tuple[str, str]:
    return FAILURES.get(nodeid) or FAILURES.get(nodeid.split("[")[0]) or ("unclassified", "")
