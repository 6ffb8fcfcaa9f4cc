"""Triton kernels for CUDA: paged decode attention (with and without split-KV), a batch-invariant matmul, the
sampler's fused Gumbel-max, and the fused token-wise ops of a decoder layer (fused_ops.py).

Imported only on CUDA hosts; the CPU path never needs Triton.
"""
