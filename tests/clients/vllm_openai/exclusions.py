"""Which of vLLM's OpenAI tests the harness does not run (EXCLUDED, each with its reason), and what each failure
of the others is (FAILURES): a real incompatibility, an assumption about vLLM's test model or flags, or an
optional endpoint. Node ids are relative to the vendored root (vLLM's own paths)."""

from __future__ import annotations

REAL = "real incompatibility"
VLLM_MODEL = "assumes vLLM's model or flags"
OPTIONAL = "optional endpoint"

OPENAI = "tests/entrypoints/openai/"
EXCLUDED: dict[str, str] = {
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
TOKENIZE = OPENAI + "test_tokenization.py::"
NO_TOOLS = "tools/tool_choice other than none are refused (issue 24: tool calling)"
FORCED = ("a forced call (required or named) gets no tool_calls: the random-weight model's constrained JSON runs to "
          "the length limit, seen in the named test; not checked further")
FAILURES: dict[str, tuple[str, str]] = {
    BASIC + "test_chat_echo.py::test_chat_session_with_echo_and_continue_final_message[True]":
        (REAL, "chat echo / continue_final_message / add_generation_prompt ignored (issue 24 item 1)"),
    BASIC + "test_return_token_ids.py::test_basic_completion_with_emoji":
        (REAL, "token_ids sent though return_token_ids is false (a CoRun extra; vLLM sends null)"),
    BASIC + "test_return_token_ids.py::test_comparison_with_prompt_logprobs_and_logprobs":
        (REAL, "return_token_ids ignored: no prompt_token_ids key (issue 24 item 4)"),
    BASIC + "test_return_token_ids.py::test_chat_completion_with_emoji_and_token_ids":
        (REAL, "return_token_ids ignored: no prompt_token_ids key (issue 24 item 4)"),
    BASIC + "test_return_token_ids.py::test_chat_completion_with_tool_use":
        (REAL, "token_ids sent though return_token_ids is false (a CoRun extra; vLLM sends null)"),
    TOOLS + "test_no_args_tool_call": (REAL, NO_TOOLS + " (passes on any model: no call means content)"),
    TOOLS + "test_named_tool_use": (
        VLLM_MODEL, "asks 1,000 tokens past a 63-token prompt: beyond the 1,024-token context `corun serve` gives "
                    "the tiny model (vLLM serves Qwen3-0.6B at 40k); at 2,048 it gets further, but "
                    "test_abort_metrics_reset then fails"),
    TOOLS + "test_max_tokens_with_tool_choice_required": (REAL, NO_TOOLS + " (passes since: a cut call is no call)"),
    COMPLETION + "test_single_completion":
        (VLLM_MODEL, "prompt_tokens == 6 is opt-125m's tokenizer (the tiny model's gives 7)"),
    COMPLETION + "test_completion_truncation_side_controls_prompt_truncation":
        (REAL, "truncate_prompt_tokens/truncation_side and return_token_ids ignored (issue 24)"),
    COMPLETION + "test_prompt_logprobs_completion[facebook/opt-125m-None]":
        (REAL, "prompt_logprobs key missing where vLLM sends null (issue 24 item 4)"),
    COMPLETION + "test_parallel_no_streaming":
        (VLLM_MODEL, "asserts samples end at different lengths: a trained model's EOS within 50 tokens"),
    COMPLETION + "test_parallel_streaming":
        (VLLM_MODEL, "asserts samples end at different lengths: a trained model's EOS within 50 tokens"),
    COMPLETION + "test_batch_completions":
        (REAL, "use_beam_search is a 400 (beam search is not built)"),
    COMPLETION + "test_invalid_json_schema": (REAL, "structured_outputs ignored, so no 400 (issue 24)"),
    COMPLETION + "test_invalid_regex": (REAL, "structured_outputs ignored, so no 400 (issue 24)"),
    COMPLETION + "test_invalid_grammar": (REAL, "structured_outputs ignored, so no 400 (issue 24)"),
    TOKENIZE + "test_tokenize_completions": (REAL, "/tokenize has no token_strs key (issue 24 item 4)"),
    TOKENIZE + "test_tokenize_with_return_token_strs": (REAL, "/tokenize ignores return_token_strs (issue 24)"),
    TOKENIZE + "test_tokenize_chat":
        (REAL, "/tokenize ignores add_special_tokens/add_generation_prompt/continue_final_message (issue 24)"),
    TOKENIZE + "test_tokenize_chat_with_tools":
        (REAL, "/tokenize ignores add_special_tokens/add_generation_prompt/continue_final_message (issue 24)"),
    **{OPENAI + f"test_metrics.py::{name}": (REAL, "vLLM's metric families missing (issue 24 item 5; built on "
                                                 "branch vtests)")
       for name in ("test_metrics_counts", "test_metrics_exist")},
    OPENAI + "test_metrics.py::test_abort_metrics_reset":
        (REAL, "kv_cache_usage_perc's first sample (the decode pool) reads 0.0 while requests run: not understood"),
    **{TOKENIZE + name: (OPTIONAL, "/tokenizer_info (vLLM's --enable-tokenizer-info-endpoint)")
       for name in ("test_tokenizer_info_basic", "test_tokenizer_info_schema",
                    "test_tokenizer_info_added_tokens_structure", "test_tokenizer_info_consistency_with_tokenize",
                    "test_tokenizer_info_chat_template")},
}
"""nodeid (or without parameters) -> (kind, one-line reason) of a failure seen on main."""


def tool_use_kind(thinking: str, choice: str) -> tuple[str, str]:
    """test_function_tool_use[enable_thinking-tool_choice-stream-model]."""
    if thinking == "True":
        return VLLM_MODEL, "asserts reasoning text: a trained thinking model and vLLM's --reasoning-parser qwen3"
    if choice == "auto":
        return VLLM_MODEL, "asserts the model chose to call a tool (tool_choice auto): a trained model"
    return REAL, FORCED


FAILURES.update({f"{TOOLS}test_function_tool_use[{thinking}-{choice}-{stream}-Qwen/Qwen3-0.6B]":
                 tool_use_kind(thinking, choice)
                 for thinking in ("True", "False") for choice in ("auto", "required", "tool_choice2")
                 for stream in ("True", "False")})


def classify(nodeid: str) -> tuple[str, str]:
    return FAILURES.get(nodeid) or FAILURES.get(nodeid.split("[")[0]) or ("unclassified", "")
