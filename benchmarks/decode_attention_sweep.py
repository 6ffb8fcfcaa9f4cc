"""Launch-parameter sweep of the no-split paged decode kernel at the Qwen3-8B shape, against copy bandwidth.

    python -m benchmarks.decode_attention_sweep --rows 256 --contexts 1030,3000 --out sweep.json

The KV cache has the engine's block-major layout (blocks hold every layer; here 4 layers to bound memory) and
each row's blocks are scattered at random, as after hours of serving. Each config is checked against the
default launch (same math, another reduction order: differences at bf16 rounding level) and timed with CUDA
events; achieved bandwidth = K and V bytes the rows read / kernel time.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton.testing

from benchmarks.report import emit
from corun.kernels.decode_attention import DEFAULT_LAUNCH, LaunchConfig, paged_decode_attention


def make_case(rows: int, context: int, heads: int, kv_heads: int, head_dim: int, block_size: int, device: str,
              dtype=torch.bfloat16, layers: int = 4, seed: int = 0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    blocks_per_row = -(-context // block_size)
    num_blocks = rows * blocks_per_row + 1
    cache = torch.randn(num_blocks, layers, 2, block_size, kv_heads, head_dim, generator=gen).to(device, dtype)
    tables = (torch.randperm(num_blocks - 1, generator=gen)[: rows * blocks_per_row] + 1).view(rows, -1)
    q = torch.randn(rows, heads, head_dim, generator=gen).to(device, dtype)
    lens = torch.full((rows,), context, dtype=torch.int64)
    return q, cache[:, 1, 0], cache[:, 1, 1], tables.to(device), lens.to(device)


def sweep(case, configs: list[LaunchConfig], scale: float) -> list[dict]:
    q, k_cache, v_cache, tables, lens = case
    kv_bytes = 2 * int(lens.sum()) * k_cache.shape[2] * k_cache.shape[3] * k_cache.element_size()
    reference = paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, 1, DEFAULT_LAUNCH).float()
    results = []
    for config in configs:
        try:
            out = paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, 1, config)
            ms = triton.testing.do_bench(
                lambda c=config: paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, 1, c),
                warmup=10, rep=60)
        except Exception as error:  # NOTE: configs over the shared-memory or register budget fail to compile
            results.append({**vars(config), "error": str(error).splitlines()[0][:200]})
            continue
        results.append({**vars(config), "ms": round(ms, 4), "GB_per_s": round(kv_bytes / ms / 1e6, 1),
                        "max_abs_diff_vs_default": float((out.float() - reference).abs().max())})
        print(json.dumps(results[-1]), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--contexts", default="1030,3000")
    parser.add_argument("--tiles", default="16,32,64,128")
    parser.add_argument("--warps", default="2,4,8")
    parser.add_argument("--stages", default="1,2,3,4")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    configs = [LaunchConfig(t, w, s) for t, w, s in itertools.product(
        *(map(int, getattr(args, name).split(",")) for name in ("tiles", "warps", "stages")))]
    report = {"default": vars(DEFAULT_LAUNCH), "rows": args.rows, "shape": "32 q / 8 kv heads, head_dim 128, bf16",
              "gpu": torch.cuda.get_device_name() if device == "cuda" else None, "contexts": {}}
    if device == "cuda":
        src = torch.empty(2**30, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        report["copy_GB_per_s"] = round(2 * src.numel() / triton.testing.do_bench(lambda: dst.copy_(src)) / 1e6, 1)
        del src, dst
    for context in map(int, args.contexts.split(",")):
        case = make_case(args.rows, context, 32, 8, 128, 16, device)
        report["contexts"][context] = sweep(case, configs, 128**-0.5)
        del case
        torch.cuda.empty_cache() if device == "cuda" else None
    emit(report, args.out)


if __name__ == "__main__":
    main()
