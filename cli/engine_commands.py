"""`corun make-tiny-model` and `corun generate` (offline, the colocated engine)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import get_args

from corun.models.presets import PRESETS
from wire.config import DType
from wire.engine_args import add_engine_args, engine_config_from_args
from wire.sampling_params import SamplingParams


def add_make_tiny_model(commands) -> None:
    cmd = commands.add_parser("make-tiny-model", help="write the built-in tiny random-weight Qwen3 (HF format)")
    cmd.add_argument("dir", type=Path, help="where to write the model (created if missing; its files are replaced)")
    cmd.add_argument("--seed", type=int, default=0,
                     help="seeds the tokenizer's training text and the weights: the same seed, the same model "
                          "(default: %(default)s)")
    cmd.add_argument("--dtype", default="float32", choices=get_args(DType),
                     help="the weights' dtype in model.safetensors and config.json (default: %(default)s)")
    cmd.set_defaults(run=run_make_tiny_model)


def run_make_tiny_model(args) -> int:
    from corun.models.tiny import make_tiny_model

    print(make_tiny_model(args.dir, seed=args.seed, dtype=args.dtype))
    return 0


def add_make_random_model(commands) -> None:
    cmd = commands.add_parser("make-random-model", help="a random-weight model of a preset's shape (e.g. qwen3-8b) "
                              "that the cluster serves like a checkpoint: config and tokenizer, weights drawn at load")
    cmd.add_argument("preset", help=f"the shape: {', '.join(PRESETS)}")
    cmd.add_argument("dir", type=Path, help="where to write the model (created if missing; its files are replaced)")
    cmd.add_argument("--seed", type=int, default=0,
                     help="seeds the weights drawn at load time (default: %(default)s)")
    cmd.set_defaults(run=run_make_random_model)


def run_make_random_model(args) -> int:
    from corun.models.presets import make_random_model_dir

    print(make_random_model_dir(args.preset, args.dir, seed=args.seed))
    return 0


def add_generate(commands) -> None:
    cmd = commands.add_parser("generate", help="offline generation for a file of prompts (one per line)")
    add_engine_args(cmd)
    cmd.add_argument("--prompts", required=True, help="text file, one prompt per line ('-' for stdin)")
    sampling = SamplingParams()  # NOTE: the defaults are SamplingParams' own, as every other entry point's
    cmd.add_argument("--max-tokens", type=int, default=sampling.max_tokens, help="tokens to generate per prompt")
    cmd.add_argument("--seed", type=int, default=None,
                     help="request seed for every prompt (default: derived from --base-seed and each request id)")
    cmd.add_argument("--temperature", type=float, default=sampling.temperature, help="0: greedy")
    cmd.add_argument("--top-p", type=float, default=sampling.top_p, help="nucleus sampling's probability mass")
    cmd.add_argument("--top-k", type=int, default=sampling.top_k, help="the k most likely tokens only (0: all)")
    cmd.add_argument("--logprobs", type=int, default=None,
                     help="also the log-probabilities of this many most likely tokens per position (--json)")
    cmd.add_argument("--ignore-eos", action="store_true", help="generate --max-tokens even past the EOS token")
    cmd.add_argument("--json", action="store_true", help="one JSON object per prompt on stdout")
    cmd.set_defaults(run=run_generate)


def read_prompts(path: str) -> list[str]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"no prompts in {path}")
    return prompts


def run_generate(args) -> int:
    from corun.llm import LLM

    prompts = read_prompts(args.prompts)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.seed, logprobs=args.logprobs,
                            ignore_eos=args.ignore_eos)
    llm = LLM.from_config(engine_config_from_args(args))
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    for output in outputs:
        print(json.dumps(output_record(output)) if args.json else f"{output.prompt!r} -> {output.outputs[0].text!r}")
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"{len(outputs)} requests, {num_tokens} tokens in {elapsed:.2f} s "
          f"({num_tokens / elapsed:.0f} tok/s, mode {args.mode})", file=sys.stderr)
    return 0


def output_record(output) -> dict:
    completion = output.outputs[0]
    logprobs = None
    if completion.logprobs is not None:
        logprobs = [{"token_id": lp.token_id, "logprob": lp.logprob, "top": [list(t) for t in lp.top]}
                    for lp in completion.logprobs]
    return {"request_id": output.request_id, "prompt": output.prompt, "seed": output.seed,
            "text": completion.text, "token_ids": completion.token_ids, "logprobs": logprobs,
            "finish_reason": completion.finish_reason}
