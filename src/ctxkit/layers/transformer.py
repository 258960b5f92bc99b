"""Transformer blocks: add & norm, encoder layer, decoder layer, encoder stack.

Both residual arrangements are supported by :class:`AddNorm`:

* post-norm (original Transformer, BERT): ``x = LayerNorm(x + Dropout(f(x)))``
* pre-norm (GPT-2, most modern models): ``x = x + Dropout(f(LayerNorm(x)))``
  plus one final LayerNorm after the stack, which :class:`TransformerEncoder` adds.

Deployment variants (a bf16 residual stream, an encoder compiled in segments) are modules
of their own in :mod:`ctxkit.fast`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .attention import MultiHeadAttention, causal_mask
from .ffn import PositionwiseFFN

__all__ = ["AddNorm", "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder", "EncoderOutput"]


class AddNorm(nn.Module):
    """Residual connection around a sub-layer, with LayerNorm after (post) or before (pre).

    Args:
        dim: feature size.
        dropout: dropout on the sub-layer output before the residual add.
        norm_first: pre-norm if True, post-norm if False.
        eps: LayerNorm epsilon.
    """

    def __init__(self, dim: int, dropout: float = 0.0, norm_first: bool = False, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """Apply ``sublayer`` with the residual and the norm.

        Args:
            x: ``(batch, seq, dim)``.
            sublayer: maps ``(batch, seq, dim)`` to the same shape.
        """
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class TransformerEncoderLayer(nn.Module):
    """Self-attention then position-wise FFN, each wrapped in :class:`AddNorm`.

    Args:
        dim: model width.
        num_heads: attention heads.
        ffn_dim: FFN inner size.
        dropout: residual dropout (after attention output and FFN output).
        attention_dropout: dropout on attention weights.
        activation: FFN activation name.
        norm_first: pre-norm (True) or post-norm (False, BERT).
        eps: LayerNorm epsilon (1e-12 in BERT).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation: str = "gelu",
        norm_first: bool = False,
        eps: float = 1e-5,
    ):
        super().__init__()
        self.self_attn = MultiHeadAttention(dim, num_heads, dropout=attention_dropout)
        self.self_attn_res = AddNorm(dim, dropout, norm_first, eps)
        self.ffn = PositionwiseFFN(dim, ffn_dim, activation)
        self.ffn_res = AddNorm(dim, dropout, norm_first, eps)

    def forward(self, x: Tensor, mask: Optional[Tensor] = None, need_weights: bool = False,
                query_index: Optional[Tensor] = None, cache=None) -> Tuple[Tensor, Optional[Tensor]]:
        """Encode.

        Args:
            x: ``(batch, seq, dim)``.
            mask: bool broadcastable to ``(batch, heads, seq, seq)``; True = attend. With
                ``query_index`` it must broadcast over the query axis (a key-padding mask).
            need_weights: also return the attention weights.
            query_index: ``(batch, n)`` positions whose outputs are wanted. Every position
                still serves as key and value, but queries, the FFN and the norms run
                only at these ``n`` positions (the same values as the full layer there).
                A pretraining loss that reads only the masked positions and [CLS] needs
                nothing else from the last layer.
            cache: this layer's :class:`~ctxkit.layers.kv_cache.LayerKVCache` (decoding).

        Returns:
            ``(x (batch, seq or n, dim), weights (batch, heads, seq or n, seq) or None)``.
        """
        weights = None
        keys = None  # None: self-attention over x itself
        if query_index is not None:
            keys = self.self_attn_res.norm(x) if self.self_attn_res.norm_first else x
            x = x.gather(1, query_index[..., None].expand(-1, -1, x.size(-1)))

        def attend(h: Tensor) -> Tensor:
            nonlocal weights
            out, weights = self.self_attn(h, keys, mask=mask, need_weights=need_weights, cache=cache)
            return out

        x = self.self_attn_res(x, attend)
        x = self.ffn_res(x, self.ffn)
        return x, weights


class TransformerDecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder (cross) attention, then FFN.

    Args: as :class:`TransformerEncoderLayer`, plus
        memory_dim: width of the encoder output (defaults to ``dim``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        eps: float = 1e-5,
        memory_dim: Optional[int] = None,
    ):
        super().__init__()
        self.self_attn = MultiHeadAttention(dim, num_heads, dropout=attention_dropout)
        self.self_attn_res = AddNorm(dim, dropout, norm_first, eps)
        self.cross_attn = MultiHeadAttention(dim, num_heads, dropout=attention_dropout, key_dim=memory_dim)
        self.cross_attn_res = AddNorm(dim, dropout, norm_first, eps)
        self.ffn = PositionwiseFFN(dim, ffn_dim, activation)
        self.ffn_res = AddNorm(dim, dropout, norm_first, eps)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Optional[Tensor] = None,
        memory_mask: Optional[Tensor] = None,
        need_weights: bool = False,
        cache=None,
        memory_kv: Optional[Tuple[Tensor, Tensor]] = None,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """Decode one layer.

        Args:
            x: target states ``(batch, tgt_len, dim)``.
            memory: encoder output ``(batch, src_len, memory_dim)``.
            self_mask: bool mask for self-attention; None means causal. Pass an explicit
                mask (e.g. causal & target padding) to override.
            memory_mask: bool mask over source keys, e.g. ``padding_mask(src_attention_mask)``.
            need_weights: also return self- and cross-attention weights.
            cache: this layer's :class:`~ctxkit.layers.kv_cache.LayerKVCache` for the
                self-attention (incremental decoding; pass an explicit ``self_mask``
                over cached + new keys, or None when one new position sees them all).
            memory_kv: ``self.cross_attn.project_kv(memory)`` computed once per source
                batch; saves projecting the memory again at every decoding step.

        Returns:
            ``(x, self_weights (batch, heads, tgt, tgt) or None, cross_weights (batch, heads, tgt, src) or None)``.
        """
        if self_mask is None and not (cache is not None and x.size(1) == 1):
            past = cache.cache.length if cache is not None else 0
            self_mask = causal_mask(x.size(1), past + x.size(1), device=x.device)
        self_weights = cross_weights = None

        def self_attend(h: Tensor) -> Tensor:
            nonlocal self_weights
            out, self_weights = self.self_attn(h, mask=self_mask, need_weights=need_weights, cache=cache)
            return out

        def cross_attend(h: Tensor) -> Tensor:
            nonlocal cross_weights
            out, cross_weights = self.cross_attn(h, memory, memory, mask=memory_mask, need_weights=need_weights, static_kv=memory_kv)
            return out

        x = self.self_attn_res(x, self_attend)
        x = self.cross_attn_res(x, cross_attend)
        x = self.ffn_res(x, self.ffn)
        return x, self_weights, cross_weights


@dataclass
class EncoderOutput:
    """What :class:`TransformerEncoder` returns.

    Attributes:
        last_hidden_state: ``(batch, seq, dim)``.
        hidden_states: input plus every layer's output, each ``(batch, seq, dim)``, when requested.
        attentions: per layer ``(batch, heads, seq, seq)``, when requested.
    """

    last_hidden_state: Tensor
    hidden_states: Optional[Tuple[Tensor, ...]] = None
    attentions: Optional[Tuple[Tensor, ...]] = None


class TransformerEncoder(nn.Module):
    """A stack of :class:`TransformerEncoderLayer` (plus a final norm when pre-norm).

    Args:
        num_layers: depth.
        dim, num_heads, ffn_dim, dropout, attention_dropout, activation, norm_first, eps:
            passed to every layer.
    """

    def __init__(
        self,
        num_layers: int,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation: str = "gelu",
        norm_first: bool = False,
        eps: float = 1e-5,
    ):
        super().__init__()
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(dim, num_heads, ffn_dim, dropout, attention_dropout, activation, norm_first, eps)
            for _ in range(num_layers)
        )
        # Pre-norm leaves the residual stream un-normalised; one last norm fixes its scale.
        self.final_norm = nn.LayerNorm(dim, eps=eps) if norm_first else None
        # Activation checkpointing: keep only each layer's input and recompute the layer
        # in the backward pass (about a third more compute for a fraction of the memory).
        self.checkpoint_layers = False

    def forward(
        self,
        x: Tensor,
        mask: Optional[Tensor] = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        output_positions: Optional[Tensor] = None,
        cache=None,
    ) -> EncoderOutput:
        """Run every layer.

        Args:
            x: ``(batch, seq, dim)``.
            mask: bool broadcastable to ``(batch, heads, seq, seq)``.
            output_hidden_states: collect the input and each layer's output.
            output_attentions: collect attention weights (eager path; slower).
            output_positions: ``(batch, n)``; compute the last layer only at these
                positions (see ``TransformerEncoderLayer``), so ``last_hidden_state`` is
                ``(batch, n, dim)``.
            cache: a :class:`~ctxkit.layers.kv_cache.KVCache` (causal decoding): ``x``
                holds only the new positions, ``mask`` spans cached + new keys, and the
                cache advances by ``x.size(1)``.
        """
        hidden: List[Tensor] = [x] if output_hidden_states else []
        attentions: List[Tensor] = []
        new_positions = x.size(1)
        x = self._run_layers(x, 0, len(self.layers), mask, hidden, attentions, output_attentions, output_positions, cache)
        if cache is not None:
            cache.advance(new_positions)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if output_hidden_states:
                hidden[-1] = x
        return EncoderOutput(
            last_hidden_state=x,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )

    def _run_layers(self, x: Tensor, start: int, stop: int, mask, hidden: List[Tensor], attentions: List[Tensor],
                    output_attentions: bool, output_positions: Optional[Tensor], cache) -> Tensor:
        """Run layers ``start .. stop - 1``, appending to ``hidden`` / ``attentions``."""
        last = len(self.layers) - 1
        for i in range(start, stop):
            layer = self.layers[i]
            index = output_positions if i == last else None
            if self.checkpoint_layers and self.training and torch.is_grad_enabled():
                x, weights = checkpoint(layer, x, mask, output_attentions, index, use_reentrant=False)
            else:
                x, weights = layer(x, mask=mask, need_weights=output_attentions, query_index=index,
                                   cache=cache.layer(i) if cache is not None else None)
            if hidden:  # holds the input when hidden states are wanted
                hidden.append(x)
            if output_attentions:
                attentions.append(weights)
        return x


class TransformerDecoder(nn.Module):
    """A stack of :class:`TransformerDecoderLayer` (plus a final norm when pre-norm).

    Args: as :class:`TransformerEncoder`, plus ``memory_dim`` (encoder width, default ``dim``).
    """

    def __init__(self, num_layers: int, dim: int, num_heads: int, ffn_dim: int, dropout: float = 0.1, attention_dropout: float = 0.1,
                 activation: str = "relu", norm_first: bool = False, eps: float = 1e-5, memory_dim: Optional[int] = None):
        super().__init__()
        self.layers = nn.ModuleList(
            TransformerDecoderLayer(dim, num_heads, ffn_dim, dropout, attention_dropout, activation, norm_first, eps, memory_dim)
            for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(dim, eps=eps) if norm_first else None

    def forward(self, x: Tensor, memory: Tensor, self_mask: Optional[Tensor] = None, memory_mask: Optional[Tensor] = None,
                cache=None, need_weights: bool = False, memory_kv: Optional[List[Tuple[Tensor, Tensor]]] = None
                ) -> Tuple[Tensor, List[Optional[Tensor]]]:
        """Decode.

        Args:
            x: target states ``(batch, tgt_len, dim)`` (only the new positions with a cache).
            memory: encoder output ``(batch, src_len, memory_dim)``.
            self_mask: bool self-attention mask; None = causal (over cached + new keys).
            memory_mask: bool mask over source keys, e.g. ``padding_mask(src_mask)``.
            cache: a :class:`~ctxkit.layers.kv_cache.KVCache` with one entry per layer;
                it advances by ``tgt_len``.
            need_weights: also return each layer's cross-attention weights (eager path).
            memory_kv: per layer, the memory's keys/values from :meth:`project_memory`.

        Returns:
            ``(x (batch, tgt_len, dim), cross-attention weights per layer or Nones)``.
        """
        cross = []
        for i, layer in enumerate(self.layers):
            x, _, weights = layer(x, memory, self_mask, memory_mask, need_weights=need_weights,
                                  cache=cache.layer(i) if cache is not None else None,
                                  memory_kv=memory_kv[i] if memory_kv is not None else None)
            cross.append(weights)
        if cache is not None:
            cache.advance(x.size(1))
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, cross

    def project_memory(self, memory: Tensor) -> List[Tuple[Tensor, Tensor]]:
        """Every layer's cross-attention keys/values of ``memory``, for ``memory_kv``."""
        return [layer.cross_attn.project_kv(memory) for layer in self.layers]

