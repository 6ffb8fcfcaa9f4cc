"""Which GEMM row counts give every row the bits it gets at a reference row count, on this GPU (a probe).

    python -m benchmarks.gemm_row_invariance --out FILE

For each projection shape of the Qwen3-8B decoder and each row count M: F.linear(x[:M], w) against the same rows
of F.linear(x[:ref], w), compared bitwise, with cuBLAS's reduced-precision bf16 reductions allowed (torch's default)
and not. A row count whose every shape agrees with the reference could carry any mix of rows (decode rows beside
prompt rows) without changing a row's bits; the decode-size probe asks the same of whole decode steps.

--cublas-split-k: the process's cuBLAS setting (EngineConfig.cublas_split_k; off, the default since stop 37, cuBLAS
has no workspace and picks no split-K kernel). cuBLAS reads it once per process: one run per setting. With split-K
the H200 gave two row classes ({128, 160, 224, 256} and {192, 320..8448}, stop 33); without it, whether every row
count from 16 agrees is the question behind steps that carry prompt rows beside the decode rows.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from benchmarks.harness import gpu_name, timed

QWEN3_8B_SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (24576, 4096),
                   "down_proj": (4096, 12288), "lm_head": (151936, 4096)}
"""(out_features, in_features) of each matmul of a Qwen3-8B layer, and the LM head."""


def agreement(weights: dict[str, torch.Tensor], x: torch.Tensor, sizes: list[int], ref: int) -> dict:
    """-> {size: {shape: rows equal to the reference's (all rows both compute)}}"""
    result = {}
    for name, w in weights.items():
        xin = x[:, :w.shape[1]]
        reference = F.linear(xin[:ref], w)
        for size in sizes:
            rows = min(size, ref)
            out = F.linear(xin[:size], w)
            result.setdefault(size, {})[name] = bool(torch.equal(out[:rows], reference[:rows]))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,8,16,32,64,96,128,160,192,224,256,320,384,512,768,1024,1280,1536,"
                                           "2048,2304,3072,4096,4352,6144,8192,8448")
    parser.add_argument("--refs", default="256,2048,8192")
    parser.add_argument("--cublas-split-k", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    gpu = gpu_name(args.cublas_split_k)  # NOTE: before the first GEMM, which fixes cuBLAS's workspace
    sizes, refs = [int(s) for s in args.sizes.split(",")], [int(s) for s in args.refs.split(",")]
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = {name: torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
               for name, shape in QWEN3_8B_SHAPES.items()}
    x = torch.randn(max(sizes + refs), 12288, generator=gen, device="cuda", dtype=torch.bfloat16)
    report = {"gpu": gpu, "torch": torch.__version__, "cublas_split_k": args.cublas_split_k, "runs": []}
    for reduced in (True, False):
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced
        for ref in refs:
            table = agreement(weights, x, sizes, ref)
            report["runs"].append({"allow_bf16_reduced_precision_reduction": reduced, "reference_rows": ref,
                                   "agree": {str(s): sorted(k for k, ok in v.items() if ok) for s, v in table.items()},
                                   "all_agree": [s for s, v in table.items() if all(v.values())]})
            print(reduced, ref, report["runs"][-1]["all_agree"], flush=True)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    report["ms"] = {name: {str(s): round(1e3 * timed(lambda: F.linear(x[:s, :w.shape[1]], w), 10), 4)
                           for s in sizes} for name, w in weights.items()}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
