"""Relative multi-head attention of Transformer-XL (Dai et al. 2019).

With queries at absolute positions ``i`` (the segment) and keys at ``j`` (memory then
segment), the score of head ``h`` is the sum of four terms::

    A_ij =  q_i^T k_j                 (a) content-based addressing
          + q_i^T W_kR R_(i-j)        (b) content-dependent positional bias
          + u^T k_j                   (c) global content bias
          + v^T W_kR R_(i-j)          (d) global positional bias

with ``q_i = W_q E_xi``, ``k_j = W_kE E_xj``, ``R`` the sinusoidal encoding of a
*relative* distance and ``u, v`` learned per head. Grouped as
``(q_i + u)^T k_j + (q_i + v)^T W_kR R_(i-j)``, the first part is one matrix product and
the second is a matrix product against all ``klen`` distances followed by
:func:`rel_shift`, which moves every row to its own distances in O(1) extra memory.

The fast path is exact only where key ``j`` is not in the future of query ``i`` (the
causal part): the other entries hold leftovers of the shift and must be masked, which
Transformer-XL's causal mask always does.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import MultiHeadAttention, masked_softmax

__all__ = ["rel_shift", "relative_distance_index", "RelativeMultiHeadAttention"]


def rel_shift(x: Tensor) -> Tensor:
    """Turn scores against distances into scores against key positions.

    ``x[..., i, c]`` is the score of query ``i`` against the relative encoding in row ``c``
    of ``pos_emb``, whose rows hold the distances ``klen-1, klen-2, ..., 0`` (descending).
    Query ``i`` of the segment sits at absolute position ``i + mlen`` (``mlen = klen -
    qlen`` memory positions precede it), so key ``j`` is at distance ``i + mlen - j`` and
    needs column ``c = qlen - 1 - i + j``: row ``i`` must move left by ``qlen - 1 - i``.

    The trick: pad one zero column on the left, ``(qlen, klen + 1)``; read the same
    memory as ``(klen + 1, qlen)``; drop the first row; read it back as ``(qlen, klen)``.
    Dropping ``qlen`` elements from the front of the flattened buffer while each row is
    one element longer than the output rows shifts row ``i`` by exactly ``qlen - 1 - i``.

    Args:
        x: ``(..., qlen, klen)`` scores against distances (``klen >= qlen``).

    Returns:
        ``(..., qlen, klen)`` with ``out[..., i, j] = x[..., i, j + qlen - 1 - i]`` for
        every ``j <= i + klen - qlen`` (the causal part); the remaining entries are
        meaningless and must be masked.
    """
    *lead, qlen, klen = x.shape
    padded = F.pad(x, (1, 0))  # (..., qlen, klen + 1), contiguous
    padded = padded.view(*lead, klen + 1, qlen)
    return padded[..., 1:, :].reshape(*lead, qlen, klen)


def relative_distance_index(qlen: int, klen: int, device=None) -> Tensor:
    """Row of ``pos_emb`` (distances ``klen-1 .. 0``) for every query/key pair.

    Returns:
        Long tensor ``(qlen, klen)``: ``klen - 1 - (i + mlen - j)``, clamped into range so
        that future keys (negative distances, always masked) read distance 0.
    """
    i = torch.arange(qlen, device=device)[:, None] + (klen - qlen)
    j = torch.arange(klen, device=device)[None, :]
    return (klen - 1 - (i - j)).clamp(0, klen - 1)


class RelativeMultiHeadAttention(MultiHeadAttention):
    """Multi-head attention with Transformer-XL's relative positional scores and memory.

    Reuses :class:`MultiHeadAttention`'s ``q_proj``/``k_proj``/``v_proj``/``out_proj``
    (one GEMM for the roles sharing an input once :func:`ctxkit.fast.fuse_qkv` is applied) and adds ``r_proj`` (``W_kR``) and the biases
    ``u``/``v``.

    Args:
        embed_dim: model width.
        num_heads: heads; must divide ``embed_dim``.
        dropout: dropout on the attention weights (``dropatt``).
        bias: biases in the q/k/v/r/output projections (the reference code has none).
        u: ``(num_heads, head_dim)`` content bias to share with other layers, or None to
            own one.
        v: ``(num_heads, head_dim)`` positional bias to share, or None to own one.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = False,
                 u: Optional[nn.Parameter] = None, v: Optional[nn.Parameter] = None):
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias)
        self.r_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        shape = (num_heads, self.head_dim)
        for name, given in (("u", u), ("v", v)):
            if given is not None and tuple(given.shape) != shape:
                raise ValueError(f"{name} must be {shape}, got {tuple(given.shape)}")
        # A shared Parameter is registered in every layer; parameters() de-duplicates it.
        self.u = u if u is not None else nn.Parameter(torch.zeros(shape))
        self.v = v if v is not None else nn.Parameter(torch.zeros(shape))

    def forward(  # type: ignore[override]
        self,
        x: Tensor,
        pos_emb: Tensor,
        memory: Optional[Tensor] = None,
        mask: Optional[Tensor] = None,
        need_weights: bool = False,
        direct: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Attend from the segment to ``[memory; segment]``.

        Args:
            x: segment ``(batch, qlen, embed_dim)``; the queries.
            pos_emb: ``(klen, embed_dim)`` encodings of the distances ``klen-1 .. 0``
                where ``klen = mlen + qlen``.
            memory: ``(batch, mlen, embed_dim)`` cached states of the previous segments
                (keys and values only), or None.
            mask: bool ``(qlen, klen)`` or ``(batch, 1, qlen, klen)``; True = may attend.
                Must exclude future keys (see :func:`rel_shift`).
            need_weights: also return the attention weights.
            direct: compute the four terms one by one with explicit distances (a slow
                reference for tests).

        Returns:
            ``(output (batch, qlen, embed_dim), weights (batch, heads, qlen, klen) or None)``.
        """
        if memory is not None and memory.size(1) > 0:
            context = torch.cat([memory.to(x.dtype), x], dim=1)
        else:
            context = x  # same object: ctxkit.fast's FusedQKVAttention projects q, k, v in one GEMM
        batch, qlen, _ = x.shape
        klen = context.size(1)
        if pos_emb.shape != (klen, self.embed_dim):
            raise ValueError(f"pos_emb must be ({klen}, {self.embed_dim}), got {tuple(pos_emb.shape)}")
        q, k, val = self._project(x, context, context)  # (batch, heads, len, head_dim)
        r = self.r_proj(pos_emb).view(klen, self.num_heads, self.head_dim).transpose(0, 1)  # (heads, klen, head_dim)
        if direct:
            scores = self._direct_scores(q, k, r)
        else:
            content = torch.matmul(q + self.u[:, None, :], k.transpose(-2, -1))  # terms (a) + (c)
            position = rel_shift(torch.matmul(q + self.v[:, None, :], r.transpose(-2, -1)))  # terms (b) + (d)
            scores = content + position
        scores = scores * (1.0 / math.sqrt(self.head_dim))
        weights = masked_softmax(scores, mask)
        attn = F.dropout(weights, p=self.dropout, training=self.training) if self.dropout > 0 else weights
        out = torch.matmul(attn, val).transpose(1, 2).reshape(batch, qlen, self.embed_dim)
        return self.out_proj(out), (weights if need_weights else None)

    def _direct_scores(self, q: Tensor, k: Tensor, r: Tensor) -> Tensor:
        """The four terms of ``A_ij`` one by one, with ``R_(i-j)`` gathered per pair.

        Args:
            q: ``(batch, heads, qlen, head_dim)``.
            k: ``(batch, heads, klen, head_dim)``.
            r: ``(heads, klen, head_dim)`` projected encodings of distances ``klen-1 .. 0``.

        Returns:
            ``(batch, heads, qlen, klen)`` unscaled scores.
        """
        qlen, klen = q.size(2), k.size(2)
        r_ij = r[:, relative_distance_index(qlen, klen, device=q.device)]  # (heads, qlen, klen, head_dim)
        term_a = torch.einsum("bhid,bhjd->bhij", q, k)
        term_b = torch.einsum("bhid,hijd->bhij", q, r_ij)
        term_c = torch.einsum("hd,bhjd->bhj", self.u, k)[:, :, None, :]
        term_d = torch.einsum("hd,hijd->hij", self.v, r_ij)[None]
        return term_a + term_b + term_c + term_d
