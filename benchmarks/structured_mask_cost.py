"""Issue 24: what structured outputs add to a decode step: filling N rows' next-token bitmasks (xgrammar, CPU) and
applying them to the [N, vocab] logits (corun.structured.apply_token_bitmask: a copy of the logits and xgrammar's
kernel on the constrained rows; CPU, and CUDA when there is one).

Every row has its own matcher of one JSON schema, each at its own point of the document (advanced by tokens drawn
among the allowed ones, seeded), and each measured step advances every row by one such token, as decoding does.
Two fills: one row at a time (GrammarMatcher.fill_next_token_bitmask, as corun/structured.py's fallback) and
xgrammar's BatchGrammarMatcher (threads over rows; what Grammars.bitmask uses).

Vocabularies: the tiny model's (--model DIR, an HF tokenizer) and a synthetic byte vocabulary of --vocab-size
tokens (default 151,936, Qwen3's), for lack of a real 150k tokenizer offline: the 256 bytes, JSON punctuation
pieces, and seeded random pieces of 2-12 characters (letters, digits, spaces, punctuation) with the length
spread of a BPE vocabulary. A real tokenizer's cost may differ (its pieces decide how many tokens a grammar
state must check one by one).

    python -m benchmarks.structured_mask_cost [--model DIR] [--rows 256] [--steps 32] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time

import torch

from benchmarks.report import emit
from corun.structured import apply_token_bitmask

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"]},
    "score": {"type": "number"}, "active": {"type": "boolean"}},
    "required": ["name", "age", "email", "tags", "address", "score", "active"]}
PIECE_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" * 4 + "     _-.,:;\"'{}[]()/\\!?@#"
JSON_PIECES = ['{"', '":', '",', '"}', '":"', '", "', '": ', '{', '}', '[', ']', '["', '"]', ': ', ', ', 'true',
               'false', 'null', ' "', '":[', '],"', '},"', '}}', '\n', '\n  ', '  ']


def synthetic_vocab(vocab_size: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    pieces = [bytes([b]) for b in range(256)] + [p.encode() for p in JSON_PIECES]
    seen = set(pieces)
    while len(pieces) < vocab_size - 1:
        length = min(12, max(2, int(rng.lognormvariate(1.4, 0.5))))
        piece = ("" if rng.random() < 0.6 else " ") + "".join(rng.choice(PIECE_CHARS) for _ in range(length))
        encoded = piece.encode()
        if encoded not in seen:
            seen.add(encoded)
            pieces.append(encoded)
    return pieces + [b"<|endoftext|>"]


def tokenizer_info(model_dir: str | None, vocab_size: int):
    import xgrammar

    if model_dir is not None:
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        with open(f"{model_dir}/config.json") as config:
            size = json.load(config)["vocab_size"]
        return xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=size), f"tokenizer of {model_dir}"
    vocab = synthetic_vocab(vocab_size)
    info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=[vocab_size - 1])
    return info, f"synthetic byte vocabulary of {vocab_size} tokens"


def allowed_ids(bitmask_row: torch.Tensor, vocab_size: int) -> list[int]:
    bits = (bitmask_row[:, None] >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:vocab_size].nonzero().flatten().tolist()


def advance(matcher, bitmask: torch.Tensor, row: int, vocab_size: int, rng: random.Random, stop_id: int) -> None:
    """One decoding step of a row: accept a token drawn among the allowed ones (not the stop token while others
    remain; a finished document starts over)."""
    if matcher.is_terminated():
        matcher.reset()
    matcher.fill_next_token_bitmask(bitmask, row)
    choices = [t for t in allowed_ids(bitmask[row], vocab_size) if t != stop_id] or [stop_id]
    if not matcher.accept_token(rng.choice(choices)):
        raise RuntimeError("an allowed token was refused")


def measure(info, label: str, num_rows: int, num_steps: int, threads) -> dict:
    import xgrammar

    vocab_size = info.vocab_size
    stop_id = info.stop_token_ids[0]
    compiler = xgrammar.GrammarCompiler(info, max_threads=8)
    started = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
    compile_s = time.perf_counter() - started
    rng = random.Random(1)
    matchers = [xgrammar.GrammarMatcher(compiled) for _ in range(num_rows)]
    bitmask = xgrammar.allocate_token_bitmask(num_rows, vocab_size)
    for row, matcher in enumerate(matchers):  # NOTE: each row at its own point of the document
        for _ in range(rng.randrange(0, 40)):
            advance(matcher, bitmask, row, vocab_size, rng, stop_id)
    batch = xgrammar.BatchGrammarMatcher(threads)
    loop_ms, batch_ms, accept_ms = [], [], []
    for _ in range(num_steps):
        started = time.perf_counter()
        for row, matcher in enumerate(matchers):
            matcher.fill_next_token_bitmask(bitmask, row)
        loop_ms.append((time.perf_counter() - started) * 1e3)
        started = time.perf_counter()
        batch.batch_fill_next_token_bitmask(matchers, bitmask)
        batch_ms.append((time.perf_counter() - started) * 1e3)
        started = time.perf_counter()
        for row, matcher in enumerate(matchers):
            if matcher.is_terminated():
                matcher.reset()
            choices = [t for t in allowed_ids(bitmask[row], vocab_size) if t != stop_id] or [stop_id]
            matcher.accept_token(rng.choice(choices))
        accept_ms.append((time.perf_counter() - started) * 1e3)
    return {"vocabulary": label, "vocab_size": vocab_size, "rows": num_rows, "steps": num_steps,
            "compile_s": compile_s, "fill_one_row_at_a_time_ms": summary(loop_ms),
            "fill_batch_ms": summary(batch_ms), "batch_threads": threads,
            "apply": apply_cost(num_rows, vocab_size, bitmask)}


def apply_cost(num_rows: int, vocab_size: int, bitmask: torch.Tensor) -> dict:
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    costs = {}
    for device in devices:
        logits = torch.randn(num_rows, vocab_size, device=device)
        mask = bitmask.to(device)
        times = []
        for _ in range(20):
            if device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            apply_token_bitmask(logits, mask)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - started) * 1e3)
        costs[f"{device}_ms"] = summary(times[5:])
    return costs


def summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"p50": statistics.median(ordered), "p90": ordered[int(0.9 * (len(ordered) - 1))], "max": ordered[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="an HF-format model directory whose tokenizer to measure too (tiny model)")
    parser.add_argument("--vocab-size", type=int, default=151936)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--threads", default="auto", help="BatchGrammarMatcher threads (an int or auto)")
    parser.add_argument("--out", help="write the results here (JSON)")
    args = parser.parse_args()
    threads = args.threads if args.threads == "auto" else int(args.threads)
    runs = []
    if args.model:
        runs.append(measure(*tokenizer_info(args.model, 0), args.rows, args.steps, threads))
    runs.append(measure(*tokenizer_info(None, args.vocab_size), args.rows, args.steps, threads))
    import xgrammar

    result = {"benchmark": "structured_mask_cost", "schema": SCHEMA, "host": platform.node(),
              "cpu_count": torch.get_num_threads(), "torch": torch.__version__,
              "xgrammar": getattr(xgrammar, "__version__", "0.2.8"),
              "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "runs": runs}
    emit(result, args.out)


if __name__ == "__main__":
    main()
