"""Decode attention time by how contexts are cut, and whether a row's bits depend on its batch (a probe).

    python -m benchmarks.decode_attention_splits --out FILE

One layer of the Qwen3-8B shape (32 query heads, 8 KV heads, head_dim 128, bf16, 16-token blocks) through the
Triton paged kernel, replayed from CUDA graphs: one range per context (split 0), fixed-size ranges of each candidate
split_tokens, and mixed mode's batch-dependent split. Steps of `rows` rows of which `active` hold a context of
`context` tokens (the rest are padding rows of context 1, as a fixed-shape step pads). Also: every fixed-size split
gives a row the same bits alone as in a full batch, and how far each variant is from the float32 reference.
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.harness import timed
from corun.attention import fixed_window_decode_attention
from corun.cuda_graphs import CapturedGraphs
from corun.kernels.decode_attention import (
    paged_decode_attention,
    range_items,
    ranged_decode_attention,
    ranged_programs,
    split_kv_heuristic,
)

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16


def make_case(rows: int, active: int, context: int, window_blocks: int, gen: torch.Generator, pad_context: int = 1):
    num_blocks = active * window_blocks + 1
    k_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen, device="cuda").bfloat16()
    v_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen, device="cuda").bfloat16()
    q = torch.randn(rows, HEADS, HEAD_DIM, generator=gen, device="cuda").bfloat16()
    tables = torch.zeros(rows, window_blocks, dtype=torch.int64, device="cuda")
    tables[:active] = (torch.randperm(num_blocks - 1, generator=gen, device="cuda") + 1).view(active, window_blocks)
    lens = torch.full((rows,), pad_context, dtype=torch.int64, device="cuda")
    lens[:active] = context
    return q, k_cache, v_cache, tables, lens


def attention(num_splits: int = 1, split_tokens: int = 0, programs: int = 0):
    """-> bind(q, k, v, tables, lens) -> the call a layer makes (range ends made once, as a step shares them)."""
    scale = HEAD_DIM ** -0.5
    if not split_tokens:
        return lambda q, k, v, tables, lens: lambda: paged_decode_attention(q, k, v, tables, lens, scale, num_splits)

    def bind(q, k, v, tables, lens):
        items = range_items(lens, tables.shape[1] * BLOCK, split_tokens)
        return lambda: ranged_decode_attention(q, k, v, tables, lens, items, scale, split_tokens, programs)
    return bind


def graph_seconds(fn, layers: int = 36) -> float:
    """Per call, replayed from a CUDA graph of `layers` calls (captured as the engine captures its steps), as a
    decode step replays them: no launch cost."""
    graphs = CapturedGraphs([layers], lambda size: size, lambda size: [fn() for _ in range(size)][-1])
    graph = graphs.graphs[layers][0]
    return timed(graph.replay, 20) / layers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--splits", default="512,1024")
    parser.add_argument("--contexts", default="512,1024,2048,4096")
    parser.add_argument("--steps", default="256:256,128:128,128:32,128:8,128:2,256:64")
    parser.add_argument("--max-model-len", type=int, default=6144)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    splits = [int(s) for s in args.splits.split(",")]
    window_blocks = args.max_model_len // BLOCK
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(0)
    scale = HEAD_DIM ** -0.5
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "layer_us": [], "bits": []}
    for step in args.steps.split(","):
        rows, active = (int(x) for x in step.split(":"))
        for context in (int(c) for c in args.contexts.split(",")):
            q, k, v, tables, lens = make_case(rows, active, context, window_blocks, gen)
            variants = {"none": attention(1), "mixed": attention(split_kv_heuristic(active, KV_HEADS, sms))}
            pool = ranged_programs(1, KV_HEADS, sms)
            variants.update({f"split_{s}": attention(split_tokens=s, programs=ranged_programs(rows, KV_HEADS, sms))
                             for s in splits})
            variants.update({f"split_{s}_{how}": attention(split_tokens=s, programs=programs)
                             for s in splits for how, programs in (("pool", pool), ("rows", 0))})
            entry = {"rows": rows, "active": active, "context": context}
            for name, bind in variants.items():
                entry[name] = round(1e6 * graph_seconds(bind(q, k, v, tables, lens)), 1)
            report["layer_us"].append(entry)
            print(json.dumps(entry), flush=True)
    q, k, v, tables, lens = make_case(64, 64, 1, window_blocks, gen)
    lens = torch.randint(1, args.max_model_len, (64,), generator=gen, device="cuda")
    reference = fixed_window_decode_attention(q.float(), k.float(), v.float(), tables, lens, scale)
    variants = {"none": attention(1)}
    for split in splits:  # NOTE: a row alone runs in the pool; the row walk must give it the same bits
        variants[f"split_{split}"] = attention(split_tokens=split, programs=ranged_programs(1, KV_HEADS, sms))
        variants[f"split_{split}_rows"] = attention(split_tokens=split, programs=0)
    for name, bind in variants.items():
        batched = bind(q, k, v, tables, lens)()
        alone_bind = variants[name.removesuffix("_rows")]
        alone = [alone_bind(q[i:i + 1], k, v, tables[i:i + 1], lens[i:i + 1])()[0] for i in range(8)]
        report["bits"].append({"variant": name, "alone_equals_batched": all(
            torch.equal(a, batched[i]) for i, a in enumerate(alone)),
            "max_abs_error_vs_fp32": float((batched.float() - reference).abs().max())})
        print(json.dumps(report["bits"][-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
