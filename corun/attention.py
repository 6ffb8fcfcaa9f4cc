"""Attention over the paged KV cache. Every reduction is request-local; split-KV only in mixed mode on CUDA.

- per-request (CPU, and fixed_shape's prompt chunks everywhere): each request's queries against its own KV, one call per
  request (SDPA on CPU, FlashAttention on CUDA), so the shapes a request sees depend only on that request (its
  chunk length and context length);
- varlen prompts (mixed mode on CUDA): every prompt chunk of a mixed step in one FlashAttention varlen launch
  per layer, keys gathered from the cache, as vLLM's FlashAttention backend runs prefill (batch-dependent: the
  launch's split-KV heuristic sees the whole step);
- batched decode rows (CUDA): the Triton paged kernel (corun/kernels/decode_attention.py), one program per
  (row, kv head) over the row's own blocks in a fixed order; mixed mode splits contexts by batch size, as
  FlashAttention does, which is what makes it batch-dependent;
- fixed-window (torch): the same math as the Triton kernel over a fixed window of blocks, for CPU tests of the
  batched path (num_kv_splits = 0);
- packed prompt rows (batch_invariant mode; fixed_shape's bucketed and packed prefill on CUDA): the query-tiled Triton
  kernel (corun/kernels/prefill_attention.py), one launch for every sequence in the step, each reading only its
  own KV with tiles aligned at its position 0, driven by device tensors (PackedPrefillMeta) so it can be
  captured in a CUDA graph.
"""

from __future__ import annotations

import functools
from dataclasses import KW_ONLY, dataclass, field

import torch
import torch.nn.functional as F

from corun.packed_prefill import PackedPrefillMeta


@dataclass
class VarlenPrompts:
    """A step's prompt segments as one variable-length attention launch: query rows [first_row, first_row +
    num_rows) segment after segment; each segment's keys and values gathered from the cache (this step's are
    written before attention) by (block, offset), segment after segment."""

    first_row: int
    num_rows: int
    query_starts: torch.Tensor  # [num_segments + 1] int32: cumulative query counts from 0
    key_starts: torch.Tensor  # [num_segments + 1] int32: cumulative context lengths from 0
    key_blocks: torch.Tensor  # [key_starts[-1]] int64
    key_offsets: torch.Tensor  # [key_starts[-1]] int64
    max_query_len: int
    max_context_len: int

    def to(self, device) -> VarlenPrompts:
        return VarlenPrompts(self.first_row, self.num_rows, self.query_starts.to(device), self.key_starts.to(device),
                             self.key_blocks.to(device), self.key_offsets.to(device), self.max_query_len,
                             self.max_context_len)


@dataclass
class RequestSegment:
    """One request's query tokens (a prompt chunk, or a single decode token) inside a flattened batch."""

    query_start: int
    num_query_tokens: int
    context_len: int
    """Tokens of this request in the KV cache once this step's tokens are written."""
    block_table: torch.Tensor  # [num_blocks_of_request] int64


@dataclass
class AttentionMetadata:
    """Where a step's tokens write KV and what each reads.

    Rows covered by neither the fixed window nor a segment are padding: they read and write only the null block
    and their attention output is zero.
    """

    slot_blocks: torch.Tensor  # [num_tokens] int64; padding rows point at the null block
    slot_offsets: torch.Tensor  # [num_tokens] int64
    num_window_rows: int = 0
    """Rows [0, num_window_rows) use the fixed-window decode kernel."""
    window_block_tables: torch.Tensor | None = None  # [num_window_rows, window_blocks] int64
    window_context_lens: torch.Tensor | None = None  # [num_window_rows] int64
    _: KW_ONLY  # NOTE: the options below are named at every call: a positional slip once turned a pack into a flag
    segments: tuple[RequestSegment, ...] = ()
    num_kv_splits: int = 0
    """Decode kernel for the window rows: 0 = the torch fixed-window path; n >= 1 = the Triton paged kernel
    with n splits of each context (1 = no split-KV)."""
    kv_split_tokens: int = 0
    """With the Triton kernel: > 0 cuts each context into ranges of this many tokens instead (fixed_shape's
    SchedulerConfig.decode_kv_split_tokens), a function of the request alone."""
    window_range_items: object | None = field(default=None, init=False, repr=False)  # RangeItems (Triton's module)
    """The ranged kernel's item list, made by the first layer and shared by the others (one per forward)."""
    packed_prefill: PackedPrefillMeta | None = None
    """Prompt rows through the packed paged kernel instead of per-segment SDPA: its reduction order for a token
    depends only on the token's position, so a token's result does not depend on how its prompt was chunked
    (batch_invariant mode's budget cuts depend on co-runners) or on what shares the forward (packed prefill)."""
    varlen_prompts: VarlenPrompts | None = None
    """Prompt rows through one varlen FlashAttention launch instead of per-segment calls (mixed mode, CUDA)."""
    whole_prompt: bool = False
    """Every row belongs to one prompt's first chunk, from position 0, with padding rows after it (fixed_shape's
    bucketed prefill): causal SDPA over this step's K and V, as an unpadded first chunk gets. The padding comes
    last, so causality keeps every real row from attending to it; fixed shapes, so a CUDA graph captures it."""


def write_kv(k_cache, v_cache, k, v, meta: AttentionMetadata) -> None:
    """k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim]; k, v: [num_tokens, kv_heads, head_dim]."""
    k_cache[meta.slot_blocks, meta.slot_offsets] = k
    v_cache[meta.slot_blocks, meta.slot_offsets] = v


def fixed_window_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float):
    """q: [rows, heads, head_dim] -> [rows, heads, head_dim]; every row reads the whole window."""
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    keys = k_cache[block_tables].flatten(1, 2)  # [rows, window, kv_heads, head_dim]
    values = v_cache[block_tables].flatten(1, 2)
    q = q.view(num_rows, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.matmul(q, keys.permute(0, 2, 3, 1)) * scale  # [rows, kv_heads, group, window]
    positions = torch.arange(keys.shape[1], device=q.device)
    masked = positions[None, :] >= context_lens[:, None]  # [rows, window]
    scores = scores.masked_fill(masked[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    out = torch.matmul(probs, values.permute(0, 2, 1, 3))  # [rows, kv_heads, group, head_dim]
    return out.reshape(num_rows, num_heads, head_dim)


def request_attention(q, k, v, k_cache, v_cache, segment: RequestSegment, scale: float):
    """q: [tokens, heads, head_dim]; k, v: this step's [tokens, kv_heads, head_dim] (already in the cache)."""
    if segment.context_len == segment.num_query_tokens:
        return causal_attention(q, k, v, scale)
    keys = k_cache[segment.block_table].flatten(0, 1)[: segment.context_len]
    values = v_cache[segment.block_table].flatten(0, 1)[: segment.context_len]
    return causal_attention(q, keys, values, scale)


FLASH_DTYPES = (torch.float16, torch.bfloat16)
"""What FlashAttention takes; float32 on CUDA (GPU tests) goes through SDPA's fused kernels."""


def causal_attention(q, keys, values, scale: float):
    """q: [tokens, heads, head_dim], the last `tokens` positions of a context whose keys, values are [context,
    kv_heads, head_dim]; query i sees keys 0 .. context - tokens + i. -> [tokens, heads, head_dim]."""
    if q.is_cuda and q.dtype in FLASH_DTYPES:
        # NOTE: FlashAttention directly: its causal mask is aligned at the last key (what a later chunk needs),
        # it reads grouped kv heads as they are, and no backend is chosen per shape. SDPA, measured on the H200:
        # an explicit mask sends later chunks to the memory-efficient kernel, expanded kv heads cost copies, and
        # its backend choice for a new shape cost up to 0.8 s (benchmarks/results/h200_piecewise_fresh_shapes.log)
        return torch.ops.aten._flash_attention_forward(
            q[None], keys[None], values[None], None, None, q.shape[0], keys.shape[0], 0.0, True, False,
            scale=scale)[0][0]
    num_new, context = q.shape[0], keys.shape[0]
    mask, causal = None, num_new == context
    if 1 < num_new < context:
        rows = torch.arange(num_new, device=q.device)[:, None] + (context - num_new)
        mask = torch.arange(context, device=q.device)[None, :] <= rows  # [tokens, context]
    if q.is_cuda:
        return _fused_sdpa(q, keys, values, mask, causal, scale)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
        attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True,
    )  # [heads, tokens, head_dim]
    return out.transpose(0, 1)


def _fused_sdpa(q, keys, values, mask, causal: bool, scale: float):
    """SDPA in the form its fused CUDA kernels (flash, memory-efficient) accept: 4-D, kv heads expanded.

    NOTE: measured on the H200: 3-D or enable_gqa inputs fall back to the math kernel, which materialises the
    [heads, tokens, context] scores: 0.57 s to prefill a 4096-token prompt of the 8B shape instead of ~0.1 s.
    """
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
        attn_mask=None if mask is None else mask[None, None], is_causal=causal, scale=scale,
    )  # [1, heads, tokens, head_dim]
    return out[0].transpose(0, 1)


def varlen_prompt_attention(q, k_cache, v_cache, prompts: VarlenPrompts, scale: float):
    """q: the prompt rows [prompts.num_rows, heads, head_dim] -> their attention output, one launch on CUDA (elsewhere,
    and for float32, one causal_attention per segment over the same gathered keys: the CPU tests' reference)."""
    # NOTE: indexed by (block, offset), never through k_cache.flatten(0, 1): a layer's cache is a strided view of
    # the block-major KV (corun/kv_cache.py), which flatten would copy whole, every layer (measured on the H200:
    # mixed mode's 1024x2048 run fell from 6,182 to 1,476 tok/s that way)
    keys = k_cache[prompts.key_blocks, prompts.key_offsets]  # [total keys, kv_heads, head_dim]
    values = v_cache[prompts.key_blocks, prompts.key_offsets]
    if q.is_cuda and q.dtype in FLASH_DTYPES:
        return torch.ops.aten._flash_attention_forward(
            q, keys, values, prompts.query_starts, prompts.key_starts, prompts.max_query_len,
            prompts.max_context_len, 0.0, True, False, scale=scale)[0]
    out = torch.empty_like(q)
    query_starts, key_starts = prompts.query_starts.tolist(), prompts.key_starts.tolist()
    for i in range(len(query_starts) - 1):
        rows, cols = slice(query_starts[i], query_starts[i + 1]), slice(key_starts[i], key_starts[i + 1])
        out[rows] = causal_attention(q[rows], keys[cols], values[cols], scale)
    return out


def attention(q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float, kv_written: bool = False):
    """q: [num_tokens, heads, head_dim]; writes k, v to the cache, returns [num_tokens, heads, head_dim].

    kv_written: k and v are in the cache already (the fused RoPE kernel wrote them, corun/kernels/fused_ops.py)."""
    if not kv_written:
        write_kv(k_cache, v_cache, k, v, meta)
    if meta.whole_prompt:
        return causal_attention(q, k, v, scale)
    if meta.num_window_rows == q.shape[0]:
        return decode_rows_attention(q, k_cache, v_cache, meta, scale)
    out = torch.zeros_like(q)
    if meta.num_window_rows:
        rows = slice(0, meta.num_window_rows)
        out[rows] = decode_rows_attention(q[rows], k_cache, v_cache, meta, scale)
    if meta.packed_prefill is not None:
        from corun.kernels.prefill_attention import packed_prefill_attention  # NOTE: Triton only on CUDA hosts

        packed_prefill_attention(q, k_cache, v_cache, meta.packed_prefill, scale, out)
    elif meta.varlen_prompts is not None:
        prompts = meta.varlen_prompts
        rows = slice(prompts.first_row, prompts.first_row + prompts.num_rows)
        out[rows] = varlen_prompt_attention(q[rows], k_cache, v_cache, prompts, scale)
    # NOTE: segments beside a packed pack: the decode rows of a joined forward on CPU (per-request attention)
    for seg in meta.segments:
        rows = slice(seg.query_start, seg.query_start + seg.num_query_tokens)
        out[rows] = request_attention(q[rows], k[rows], v[rows], k_cache, v_cache, seg, scale)
    return out


def decode_rows_attention(q, k_cache, v_cache, meta: AttentionMetadata, scale: float):
    if meta.num_kv_splits == 0:
        return fixed_window_decode_attention(
            q, k_cache, v_cache, meta.window_block_tables, meta.window_context_lens, scale)
    from corun.kernels import decode_attention as kernels  # NOTE: Triton only on CUDA hosts

    tables, lens = meta.window_block_tables, meta.window_context_lens
    if not meta.kv_split_tokens:
        return kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, meta.num_kv_splits)
    if meta.window_range_items is None:
        meta.window_range_items = kernels.range_items(lens, tables.shape[1] * k_cache.shape[1], meta.kv_split_tokens)
    programs = kernels.ranged_programs(len(q), k_cache.shape[2], num_sms(q.device))
    return kernels.ranged_decode_attention(q, k_cache, v_cache, tables, lens, meta.window_range_items, scale,
                                           meta.kv_split_tokens, programs)


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (Triton's interpreter on CPU: a nominal two)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2
