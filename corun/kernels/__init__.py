"""Triton kernels for CUDA: paged decode attention (with and without split-KV) and a batch-invariant matmul.

Imported only on CUDA hosts; the CPU path never needs Triton.
"""
