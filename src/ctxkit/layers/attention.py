"""Attention scoring functions and multi-head attention.

The lectures build attention up in steps; each step is a module here:

* :class:`AdditiveAttention` -- the MLP score ``w_v^T tanh(W_q q + W_k k)`` (Bahdanau).
* :class:`DotProductAttention` -- the score ``q^T k`` (optionally scaled by ``1/sqrt(d)``).
* :func:`scaled_dot_product_attention` -- the scaled score with a fast path through
  :func:`torch.nn.functional.scaled_dot_product_attention` and an eager path that
  also returns the attention weights for inspection.
* :class:`MultiHeadAttention` -- per-head projections ``W_q, W_k, W_v`` (stored per role
  as one ``Linear`` covering all heads), attention per head, concat, ``W_o``.
* :class:`PackedSequences` -- a batch with its padding removed (all real tokens in one
  row); passed as the mask, attention stays within each sequence (flash "varlen").

Masks are boolean with ``True`` meaning "may attend" and broadcast against
``(batch, heads, query_len, key_len)``. Build them with :func:`padding_mask` and
:func:`causal_mask`, and combine them with ``&``.

Deployment variants (q, k and v in one GEMM over cached stacked weights, fp8 products)
are modules of their own in :mod:`ctxkit.fast`, swapped into a built model there.
"""

from __future__ import annotations

import itertools
import math
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "padding_mask",
    "causal_mask",
    "masked_softmax",
    "scaled_dot_product_attention",
    "AdditiveAttention",
    "DotProductAttention",
    "MultiHeadAttention",
    "PackedSequences",
    "varlen_attention",
]


def padding_mask(attention_mask: Tensor) -> Tensor:
    """Turn a ``(batch, key_len)`` 1/0 mask into a broadcastable boolean key mask.

    Args:
        attention_mask: ``(batch, key_len)``; non-zero marks real tokens.

    Returns:
        Bool tensor ``(batch, 1, 1, key_len)``; ``True`` where the key may be attended.
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be (batch, seq), got shape {tuple(attention_mask.shape)}")
    return attention_mask.bool()[:, None, None, :]


def causal_mask(query_len: int, key_len: Optional[int] = None, device=None) -> Tensor:
    """Lower-triangular mask so position i attends only to keys <= i.

    When ``key_len > query_len`` the queries are taken to be the *last* ``query_len``
    positions (as when a cache of earlier keys precedes them).

    Returns:
        Bool tensor ``(query_len, key_len)``.
    """
    key_len = query_len if key_len is None else key_len
    offset = key_len - query_len
    return torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(diagonal=offset)


def _to_async(t: Tensor, device) -> Tensor:
    """``t`` on ``device`` without making the host wait: a copy from pageable host memory
    would wait for the GPU to finish its earlier work, so host tensors are pinned first."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


class PackedSequences:
    """A padded batch with the padding removed: every real token in one row.

    Linear layers, norms and the FFN work per token, so on packed input they spend no
    time on padding; attention is the only place where tokens of different sequences
    meet, and it takes a ``PackedSequences`` as its mask to stay within each sequence
    (through flash attention's variable-length kernel on CUDA).

    Args:
        attention_mask: ``(batch, seq)``, 1 on real tokens. Real tokens must come first
            in each row (right padding), as tokenizers produce them.

    Attributes:
        index: ``(total,)`` flat positions of the real tokens in ``batch * seq``.
        cu_seqlens: ``(batch + 1,)`` int32 offsets of each sequence in the packed row.
        lengths: the lengths on the host (a list of ints).
        max_len: the longest length (int).
        cu_seqlens_q, max_len_q: when queries run at a subset of each sequence's
            positions (the last layer of a pretraining step, see :meth:`from_offsets`):
            their offsets per sequence and the most per sequence; else None.
    """

    lengths: Optional[List[int]] = None
    cu_seqlens_q: Optional[Tensor] = None
    max_len_q: Optional[int] = None

    def __init__(self, attention_mask: Tensor):
        if attention_mask.dim() != 2:
            raise ValueError(f"attention_mask must be (batch, seq), got shape {tuple(attention_mask.shape)}")
        mask = attention_mask.bool()
        lengths = mask.sum(1)
        # Right padding only: a hole inside a row would be packed away and shift positions.
        expected = torch.arange(mask.size(1), device=mask.device)[None, :] < lengths[:, None]
        if not torch.equal(mask, expected):
            raise ValueError("PackedSequences needs right-padded rows (real tokens first, then padding)")
        self.batch, self.seq = mask.shape
        self.lengths = lengths.tolist()
        self.max_len = max(self.lengths) if self.lengths else 0
        self.index = mask.flatten().nonzero().squeeze(1)
        self.cu_seqlens = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
        self.total = len(self.index)

    @classmethod
    def from_offsets(cls, cu_seqlens: Tensor, max_len: int, cu_seqlens_q: Optional[Tensor] = None,
                     max_len_q: Optional[int] = None) -> "PackedSequences":
        """Sequences already packed one after another in a row (a packed pretraining batch).

        Args:
            cu_seqlens: ``(segments + 1,)`` int32 offsets; the row's tail of padding is a
                segment (or several) of its own, and empty segments are allowed, so the size
                can stay fixed from batch to batch (one CUDA graph).
            max_len: a bound on every segment's length (a Python int: kernels are sized by it).
            cu_seqlens_q, max_len_q: queries at a subset of positions, per segment (see
                :class:`~ctxkit.layers.transformer.TransformerEncoderLayer`'s ``query_index``).

        Nothing is read back from the device: host lengths, which only the reference path
        (CPU) uses, are read when it needs them.
        """
        packed = object.__new__(cls)
        packed.cu_seqlens, packed.max_len = cu_seqlens, int(max_len)
        packed.cu_seqlens_q, packed.max_len_q = cu_seqlens_q, max_len_q
        return packed

    def to(self, device) -> "PackedSequences":
        """A copy whose index tensors live on ``device`` (build it from the host mask, then
        move it: the lengths are read without waiting for the GPU)."""
        moved = object.__new__(PackedSequences)
        moved.__dict__.update(self.__dict__)
        moved.index, moved.cu_seqlens = (_to_async(t, device) for t in (self.index, self.cu_seqlens))
        return moved

    def pack(self, x: Tensor) -> Tensor:
        """``(batch, seq, ...)`` -> ``(1, total, ...)``: the real tokens only."""
        return x.flatten(0, 1).index_select(0, self.index)[None]

    def unpack(self, x: Tensor) -> Tensor:
        """``(1, total, ...)`` -> ``(batch, seq, ...)`` with zeros on the padding."""
        flat = x.new_zeros((self.batch * self.seq,) + tuple(x.shape[2:]))
        flat.index_copy_(0, self.index, x[0])
        return flat.view((self.batch, self.seq) + tuple(x.shape[2:]))

    def positions(self) -> Tensor:
        """``(1, total)`` position of each packed token within its own sequence."""
        return (self.index % self.seq)[None]


def varlen_attention(query: Tensor, key: Tensor, value: Tensor, packed: PackedSequences, scale: Optional[float] = None,
                     dropout_p: float = 0.0, subset: bool = False) -> Tensor:
    """Attention within each packed sequence.

    Args:
        query: ``(total, heads, head_dim)``; with ``subset``, ``(queries, heads, head_dim)``
            segmented by ``packed.cu_seqlens_q``.
        key, value: ``(total, heads, head_dim)``.
        packed: the sequence boundaries.
        dropout_p: dropout on the attention weights (training).
        subset: the queries are a subset of each sequence's positions.

    Returns:
        Shaped like ``query``.
    """
    cu_k, max_k = packed.cu_seqlens, packed.max_len
    cu_q, max_q = (packed.cu_seqlens_q, packed.max_len_q) if subset else (cu_k, max_k)
    if subset and cu_q is None:
        raise ValueError("queries at a subset of positions need PackedSequences.from_offsets(..., cu_seqlens_q, max_len_q)")
    if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16):
        cu_q, cu_k = cu_q.to(query.device), cu_k.to(query.device)
        if not dropout_p:
            try:
                from torch.nn.attention.varlen import varlen_attn  # torch >= 2.10: flash attention 2, varlen
            except ImportError:
                varlen_attn = None
            if varlen_attn is not None:
                return varlen_attn(query, key, value, cu_q, cu_k, max_q, max_k, scale=scale)
        # Flash attention's own entry: it takes a dropout rate (and has a backward that
        # redraws the same mask from the random state it returns).
        out = torch.ops.aten._flash_attention_forward(query, key, value, cu_q, cu_k, max_q, max_k, float(dropout_p), False, False,
                                                      scale=scale)
        return out[0]
    # Reference path (CPU, fp32): one SDPA call per sequence.
    out = query.new_zeros(query.shape)
    q_at = cu_q.tolist() if subset else None
    k_at = cu_k.tolist() if packed.lengths is None else [0] + list(itertools.accumulate(packed.lengths))
    for i in range(len(k_at) - 1):
        q0, q1 = (q_at[i], q_at[i + 1]) if subset else (k_at[i], k_at[i + 1])
        if q1 == q0:
            continue
        q = query[q0:q1].transpose(0, 1)
        k, v = (t[k_at[i]:k_at[i + 1]].transpose(0, 1) for t in (key, value))
        out[q0:q1] = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale).transpose(0, 1)
    return out


def masked_softmax(scores: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Softmax over the last axis that gives zero weight where ``mask`` is False.

    A row whose keys are all masked returns zeros rather than NaN (such rows appear for
    padded queries with causal masks); the caller never reads them, but NaN would poison
    gradients.
    """
    if mask is None:
        return scores.softmax(dim=-1)
    # finfo.min instead of -inf keeps fully masked rows finite.
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    return weights.masked_fill(~mask.expand_as(weights).any(dim=-1, keepdim=True), 0.0)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    scale: Optional[float] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """softmax(Q K^T / sqrt(d)) V, through SDPA unless the weights are wanted.

    Args:
        query: ``(..., query_len, d)``.
        key: ``(..., key_len, d)``.
        value: ``(..., key_len, d_v)``.
        mask: bool, broadcastable to ``(..., query_len, key_len)``; True = attend.
        dropout_p: dropout on the attention weights (pass 0.0 in eval).
        need_weights: use the eager path and return the weights ``(..., query_len, key_len)``.
        scale: score scale; defaults to ``1/sqrt(d)``.

    Returns:
        ``(output (..., query_len, d_v), weights or None)``.
    """
    if not need_weights:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=scale)
        return out, None
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    weights = masked_softmax(scores, mask)
    out = torch.matmul(F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights, value)
    return out, weights


class AdditiveAttention(nn.Module):
    """Additive (MLP) attention: score(q, k) = w_v^T tanh(W_q q + W_k k).

    Works when queries and keys have different sizes, as in the RNN encoder-decoder.

    Args:
        query_size: size of each query vector.
        key_size: size of each key vector.
        hidden_size: size of the hidden tanh layer.
        dropout: dropout on the attention weights.
    """

    def __init__(self, query_size: int, key_size: int, hidden_size: int, dropout: float = 0.0):
        super().__init__()
        self.w_q = nn.Linear(query_size, hidden_size, bias=False)
        self.w_k = nn.Linear(key_size, hidden_size, bias=False)
        self.w_v = nn.Linear(hidden_size, 1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """Attend.

        Args:
            query: ``(batch, query_len, query_size)``.
            key: ``(batch, key_len, key_size)``.
            value: ``(batch, key_len, value_size)``.
            mask: bool broadcastable to ``(batch, query_len, key_len)``.

        Returns:
            ``(output (batch, query_len, value_size), weights (batch, query_len, key_len))``.
        """
        # (batch, q, 1, h) + (batch, 1, k, h) broadcasts to every query/key pair.
        features = torch.tanh(self.w_q(query).unsqueeze(2) + self.w_k(key).unsqueeze(1))
        scores = self.w_v(features).squeeze(-1)
        weights = masked_softmax(scores, mask)
        return torch.bmm(self.dropout(weights), value), weights


class DotProductAttention(nn.Module):
    """Dot-product attention: score(q, k) = q^T k, scaled by 1/sqrt(d) when ``scaled``.

    Always runs the eager path, so the weights are returned; use
    :func:`scaled_dot_product_attention` directly for speed.

    Args:
        scaled: divide scores by sqrt(d) (the Transformer's choice, which keeps the
            softmax out of saturation as d grows).
        dropout: dropout on the attention weights.
    """

    def __init__(self, scaled: bool = True, dropout: float = 0.0):
        super().__init__()
        self.scaled = scaled
        self.dropout = nn.Dropout(dropout)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """Attend.

        Args:
            query: ``(batch, query_len, d)``.
            key: ``(batch, key_len, d)``.
            value: ``(batch, key_len, d_v)``.
            mask: bool broadcastable to ``(batch, query_len, key_len)``.

        Returns:
            ``(output (batch, query_len, d_v), weights (batch, query_len, key_len))``.
        """
        scores = torch.bmm(query, key.transpose(1, 2))
        if self.scaled:
            scores = scores / math.sqrt(query.size(-1))
        weights = masked_softmax(scores, mask)
        return torch.bmm(self.dropout(weights), value), weights


class MultiHeadAttention(nn.Module):
    """Multi-head attention: h heads of scaled dot-product attention, concat, W_o.

    The per-head projections W_q^(i), W_k^(i), W_v^(i) are the row blocks of one
    ``Linear`` per role (``q_proj``, ``k_proj``, ``v_proj``), which is the same maths
    with one GEMM instead of h.

    Args:
        embed_dim: model width (query size and output size).
        num_heads: number of heads; must divide ``embed_dim``.
        dropout: dropout on the attention weights.
        key_dim: size of key inputs (defaults to ``embed_dim``; differs for cross-attention
            from a memory of another width).
        value_dim: size of value inputs (defaults to ``key_dim``).
        bias: use biases in the projections.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        key_dim: Optional[int] = None,
        value_dim: Optional[int] = None,
        bias: bool = True,
    ):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        key_dim = embed_dim if key_dim is None else key_dim
        value_dim = key_dim if value_dim is None else value_dim
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(key_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(value_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def _split_heads(self, x: Tensor) -> Tensor:
        # (batch, seq, embed) -> (batch, heads, seq, head_dim)
        batch, seq, _ = x.shape
        return x.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)

    def _project(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        """Per-head q, k, v, each ``(batch, heads, len, head_dim)``: ``q = W_q query``,
        ``k = W_k key``, ``v = W_v value`` (self-attention: all three read ``query``)."""
        key = query if key is None else key
        value = key if value is None else value
        return self._split_heads(self.q_proj(query)), self._split_heads(self.k_proj(key)), self._split_heads(self.v_proj(value))

    def project_kv(self, key: Tensor, value: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """Per-head keys and values ``(batch, heads, key_len, head_dim)`` of a memory that
        stays fixed over many queries (pass them back as ``static_kv``)."""
        value = key if value is None else value
        return self._split_heads(self.k_proj(key)), self._split_heads(self.v_proj(value))

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        mask: Optional[Tensor] = None,
        need_weights: bool = False,
        cache=None,
        static_kv: Optional[Tuple[Tensor, Tensor]] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Attend from ``query`` to ``key``/``value`` (self-attention when they are None).

        Args:
            query: ``(batch, query_len, embed_dim)``.
            key: ``(batch, key_len, key_dim)``; defaults to ``query``.
            value: ``(batch, key_len, value_dim)``; defaults to ``key``.
            mask: bool broadcastable to ``(batch, heads, query_len, key_len)``; True = attend.
                Or a :class:`PackedSequences` when ``query`` is ``(1, total, embed_dim)``
                packed tokens (self-attention within each sequence). Or an object with ``attend(q, k, v)``
                (:class:`~ctxkit.layers.sparse_attention.SparsePattern`): self-attention through its kernel.
            need_weights: run the eager path and return per-head weights.
            cache: a :class:`~ctxkit.layers.kv_cache.LayerKVCache` for incremental
                decoding: the new keys/values are stored and the queries attend to every
                cached position too (``mask`` then spans ``past + key_len`` keys).
            static_kv: per-head keys and values from :meth:`project_kv`, used instead of
                projecting ``key``/``value`` again (cross-attention while decoding).

        Returns:
            ``(output (batch, query_len, embed_dim), weights (batch, heads, query_len, key_len) or None)``.
        """
        if isinstance(mask, PackedSequences):
            # Self-attention within each sequence; a ``key`` is the same packed row when the
            # queries run at a subset of its positions (``mask.cu_seqlens_q``).
            if need_weights or cache is not None or static_kv is not None or value is not None or (key is not None and mask.cu_seqlens_q is None):
                raise ValueError("packed sequences support self-attention (queries at all positions, or at a subset given by "
                                 "cu_seqlens_q) only: no weights, cache or memory")
            q, k, v = (t[0].transpose(0, 1) for t in self._project(query, key, None))  # (total, heads, head_dim)
            out = varlen_attention(q, k, v, mask, dropout_p=self.dropout if self.training else 0.0, subset=key is not None)
            return self.out_proj(out.reshape(query.shape[:2] + (self.embed_dim,))), None
        if getattr(mask, "attend", None) is not None:  # a structured pattern with its own kernel (layers/sparse_attention.py)
            if need_weights or cache is not None or static_kv is not None or key is not None:
                raise ValueError(f"{mask!r} supports plain self-attention only (no need_weights, cache, memory or query_index)")
            if self.training and self.dropout:
                raise ValueError(f"{mask!r} has no attention dropout: build the layer with attention dropout 0 (or call eval())")
            out = mask.attend(*self._project(query, None, None))  # (batch, heads, seq, head_dim)
            return self.out_proj(out.transpose(1, 2).reshape(query.shape[:2] + (self.embed_dim,))), None
        if static_kv is not None:  # keys/values projected once (e.g. the encoder memory)
            q = self._split_heads(self.q_proj(query))
            k, v = static_kv
        else:
            q, k, v = self._project(query, key, value)
        if cache is not None:
            k, v = cache.update(k, v)  # keys/values of the earlier positions join the new ones
        dropout_p = self.dropout if self.training else 0.0
        out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=dropout_p, need_weights=need_weights)
        batch, _, query_len, _ = out.shape
        out = out.transpose(1, 2).reshape(batch, query_len, self.embed_dim)
        return self.out_proj(out), weights
