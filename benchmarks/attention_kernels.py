"""Prompt attention kernels at the Qwen3-8B shape, side by side (a probe for issue 20's 4096-token prefill figure).

    python -m benchmarks.attention_kernels --out FILE

Times one layer's causal prompt attention (32 q heads, 8 kv heads, head_dim 128, bf16) through torch's
FlashAttention-2 (what isolated prefill calls), cuDNN's attention through SDPA (kv heads expanded, and with
enable_gqa where it is accepted), and corun's packed Triton kernel (what packed prefill calls), for one prompt alone
and for packs of several. Reports ms, TFLOP/s (causal), whether two runs give the same bits, and the largest
difference from FlashAttention-2.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.harness import timed
from corun.kernels.prefill_attention import packed_prefill_attention
from corun.packed_prefill import PackedPrefillMeta, max_prefill_tiles, packed_prefill_tiles

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16


def causal_tflops(lengths: list[int], seconds: float) -> float:
    flops = sum(4 * n * (n + 1) / 2 * HEAD_DIM * HEADS for n in lengths)
    return round(flops / seconds / 1e12, 1)


def flash_varlen(q, k, v, lengths: list[int], scale: float):
    starts = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=q.device)
    return torch.ops.aten._flash_attention_forward(q, k, v, starts, starts, max(lengths), max(lengths), 0.0, True,
                                                   False, scale=scale)[0]


def cudnn_expanded(q, k, v, lengths: list[int], scale: float):
    out, start = torch.empty_like(q), 0
    for n in lengths:
        rows = slice(start, start + n)
        keys = k[rows].repeat_interleave(HEADS // KV_HEADS, dim=1)
        values = v[rows].repeat_interleave(HEADS // KV_HEADS, dim=1)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o = F.scaled_dot_product_attention(q[rows].transpose(0, 1)[None], keys.transpose(0, 1)[None],
                                               values.transpose(0, 1)[None], is_causal=True, scale=scale)
        out[rows] = o[0].transpose(0, 1)
        start += n
    return out


def cudnn_gqa(q, k, v, lengths: list[int], scale: float):
    out, start = torch.empty_like(q), 0
    for n in lengths:
        rows = slice(start, start + n)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o = F.scaled_dot_product_attention(q[rows].transpose(0, 1)[None], k[rows].transpose(0, 1)[None],
                                               v[rows].transpose(0, 1)[None], is_causal=True, scale=scale,
                                               enable_gqa=True)
        out[rows] = o[0].transpose(0, 1)
        start += n
    return out


def triton_packed(q, k, v, lengths: list[int], scale: float):
    total = sum(lengths)
    blocks_each = [-(-n // BLOCK) for n in lengths]
    k_cache = torch.zeros(sum(blocks_each) + 1, BLOCK, KV_HEADS, HEAD_DIM, dtype=q.dtype, device=q.device)
    v_cache = torch.zeros_like(k_cache)
    tables = torch.zeros(len(lengths), max(blocks_each), dtype=torch.int64, device=q.device)
    first_block, start = 1, 0
    for i, n in enumerate(lengths):
        ids = torch.arange(first_block, first_block + blocks_each[i], device=q.device)
        tables[i, :blocks_each[i]] = ids
        positions = torch.arange(n, device=q.device)
        k_cache[ids[positions // BLOCK], positions % BLOCK] = k[start:start + n]
        v_cache[ids[positions // BLOCK], positions % BLOCK] = v[start:start + n]
        first_block += blocks_each[i]
        start += n
    query_starts = [0] + list(torch.tensor(lengths).cumsum(0)[:-1].tolist())
    tile_seqs, tile_starts = packed_prefill_tiles([0] * len(lengths), lengths, max_prefill_tiles(total, len(lengths)))

    def ints(values):
        return torch.tensor(values, dtype=torch.int32, device=q.device)

    meta = PackedPrefillMeta(ints(query_starts), ints([0] * len(lengths)), ints(lengths), tables, ints(tile_seqs),
                             ints(tile_starts))
    out = torch.empty_like(q)
    return lambda: packed_prefill_attention(q, k_cache, v_cache, meta, scale, out) or out


def measure(lengths: list[int]) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    total, scale = sum(lengths), HEAD_DIM ** -0.5
    q = torch.randn(total, HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(total, KV_HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(total, KV_HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    kernels = {
        "flash2": lambda: flash_varlen(q, k, v, lengths, scale),
        "cudnn_expanded": lambda: cudnn_expanded(q, k, v, lengths, scale),
        "cudnn_gqa": lambda: cudnn_gqa(q, k, v, lengths, scale),
        "triton_packed": triton_packed(q, k, v, lengths, scale),
    }
    reference = kernels["flash2"]().clone()
    row = {}
    for name, fn in kernels.items():
        try:
            first = fn().clone()
            second = fn().clone()
            seconds = timed(fn, 20)
        except Exception as e:  # noqa: BLE001 - a probe reports what a backend refuses
            row[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            continue
        row[name] = {"ms": round(1e3 * seconds, 4), "tflops": causal_tflops(lengths, seconds),
                     "same_bits_twice": bool(torch.equal(first, second)),
                     "max_abs_diff_vs_flash2": float((first.float() - reference.float()).abs().max())}
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--packs", default="4096;1024;8x1024;32x256;2x2048")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "shape": [HEADS, KV_HEADS, HEAD_DIM], "packs": {}}
    for spec in args.packs.split(";"):
        count, _, length = spec.rpartition("x")
        lengths = [int(length)] * int(count or 1)
        report["packs"][spec] = measure(lengths)
        print(spec, json.dumps(report["packs"][spec]), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
