"""How fast each projection of the Qwen3-8B decoder runs by row count, as torch calls it and in variants (a probe).

    python -m benchmarks.gemm_variants --out FILE

Variants: torch's default BLAS library against cuBLASLt (torch.backends.cuda.preferred_blas_library), and the fused
gate_up projection against its two halves as separate GEMMs. Reports ms and TFLOP/s per (shape, rows).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from benchmarks.gemm_row_invariance import QWEN3_8B_SHAPES
from benchmarks.harness import timed


def tflops(rows: int, out_features: int, in_features: int, seconds: float) -> float:
    return round(2 * rows * out_features * in_features / seconds / 1e12, 1)


def time_shapes(weights: dict[str, torch.Tensor], x: torch.Tensor, sizes: list[int]) -> dict:
    table = {}
    for name, w in weights.items():
        for rows in sizes:
            seconds = timed(lambda: F.linear(x[:rows, :w.shape[1]], w), 20)
            table.setdefault(name, {})[str(rows)] = {"ms": round(1e3 * seconds, 4),
                                                     "tflops": tflops(rows, *w.shape, seconds)}
        if name == "gate_up_proj":
            gate, up = w.chunk(2)
            for rows in sizes:
                xs = x[:rows, :w.shape[1]]
                seconds = timed(lambda: (F.linear(xs, gate), F.linear(xs, up)), 20)
                table.setdefault("gate_up_as_two", {})[str(rows)] = {"ms": round(1e3 * seconds, 4),
                                                                      "tflops": tflops(rows, *w.shape, seconds)}
    return table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="64,256,1024,2048,4096,8192")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = {name: torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
               for name, shape in QWEN3_8B_SHAPES.items() if name != "lm_head"}
    x = torch.randn(max(sizes), 12288, generator=gen, device="cuda", dtype=torch.bfloat16)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "libraries": {}}
    for library in ("default", "cublaslt"):
        torch.backends.cuda.preferred_blas_library("cublas" if library == "default" else library)
        report["libraries"][library] = time_shapes(weights, x, sizes)
        print(library, json.dumps({k: {s: v["tflops"] for s, v in t.items()}
                                   for k, t in report["libraries"][library].items()}), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
