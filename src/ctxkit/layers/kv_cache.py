"""A static, pre-allocated key/value cache for incremental (token-by-token) decoding.

Decoding one token at a time, self-attention needs the keys and values of every earlier
position. Recomputing them costs a full forward pass per token; the cache keeps them.
The buffers are allocated once for the longest sequence (no reallocation or copying as
the sequence grows) and filled in place; attention reads the filled prefix.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

__all__ = ["KVCache", "LayerKVCache"]


class KVCache:
    """Keys and values of every layer, ``(batch, heads, max_len, head_dim)`` each.

    Args:
        num_layers: layers that attend causally to their own past.
        batch: sequences decoded together (beams included).
        num_heads, head_dim: the attention geometry.
        max_len: longest total length (prompt + new tokens).
        dtype, device: of the buffers (match the model's activations).

    Use: run the model on the prompt, then on each new token, with the same cache; the
    model calls :meth:`layer` per layer and :meth:`advance` once per forward pass.
    """

    def __init__(self, num_layers: int, batch: int, num_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype = torch.float32, device=None):
        shape = (batch, num_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len
        self.length = 0  # positions filled so far (the same for every layer)

    def layer(self, index: int) -> "LayerKVCache":
        """The view one attention layer writes to and reads from."""
        return LayerKVCache(self, index)

    def advance(self, n: int) -> None:
        """Mark ``n`` more positions as filled (after every layer has written them)."""
        self.length += n

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` of the batch (beam search: the surviving beams' parents)."""
        for buffers in (self.keys, self.values):
            for i, buf in enumerate(buffers):
                buffers[i] = buf.index_select(0, index)


class LayerKVCache:
    """One layer's slice of a :class:`KVCache`."""

    def __init__(self, cache: KVCache, index: int):
        self.cache = cache
        self.index = index

    def update(self, key: Tensor, value: Tensor) -> Tuple[Tensor, Tensor]:
        """Store the new positions and return all keys and values so far.

        Args:
            key, value: ``(batch, heads, new, head_dim)`` for the positions being added.

        Returns:
            ``(keys, values)``, each ``(batch, heads, past + new, head_dim)``.

        Raises:
            ValueError: when the cache would overflow ``max_len``.
        """
        start, new = self.cache.length, key.size(2)
        end = start + new
        if end > self.cache.max_len:
            raise ValueError(f"KV cache holds {self.cache.max_len} positions; {end} needed (allocate a longer cache)")
        k_buf, v_buf = self.cache.keys[self.index], self.cache.values[self.index]
        k_buf[:, :, start:end] = key
        v_buf[:, :, start:end] = value
        return k_buf[:, :, :end], v_buf[:, :, :end]
