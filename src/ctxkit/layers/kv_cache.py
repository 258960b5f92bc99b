"""A static, pre-allocated key/value cache for incremental (token-by-token) decoding.

Decoding one token at a time, self-attention needs the keys and values of every earlier
position. Recomputing them costs a full forward pass per token; the cache keeps them.
The buffers are allocated once for the longest sequence (no reallocation or copying as
the sequence grows) and filled in place; attention reads the filled prefix.

*Static mode* (:meth:`KVCache.set_static`) keeps every shape fixed for CUDA graphs: the
write position is a device tensor that advances in place, and attention reads all
``max_len`` slots, so the caller must mask the slots that are not filled yet.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = ["KVCache", "LayerKVCache"]


class KVCache:
    """Keys and values of every layer, ``(batch, heads, max_len, head_dim)`` each
    (:attr:`keys`, :attr:`values`; stored together in :attr:`kv`).

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
        # Keys and values of a layer share one buffer (2, batch, heads, max_len, head_dim):
        # a static-mode step then writes both with one kernel instead of two.
        shape = (2, batch, num_heads, max_len, head_dim)
        self.kv = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len
        self.length = 0  # positions filled so far (the same for every layer)
        self.write_index: Optional[Tensor] = None  # static mode: device tensor (1,), next slot

    @property
    def keys(self) -> list:
        """Per layer, the key buffer ``(batch, heads, max_len, head_dim)`` (a view)."""
        return [kv[0] for kv in self.kv]

    @property
    def values(self) -> list:
        """Per layer, the value buffer ``(batch, heads, max_len, head_dim)`` (a view)."""
        return [kv[1] for kv in self.kv]

    @property
    def is_static(self) -> bool:
        """True in static mode (fixed shapes; see the module docstring)."""
        return self.write_index is not None

    def set_static(self, write_index: Optional[Tensor]) -> None:
        """Enter static mode writing at ``write_index`` (a ``(1,)`` long tensor on the
        cache's device, advanced in place by :meth:`advance`), or leave it with None
        (``length`` then counts the slots filled before)."""
        if write_index is not None and (write_index.shape != (1,) or write_index.dtype != torch.long):
            raise ValueError("write_index must be a (1,) long tensor")
        self.write_index = write_index

    def layer(self, index: int) -> "LayerKVCache":
        """The view one attention layer writes to and reads from."""
        return LayerKVCache(self, index)

    def advance(self, n: int) -> None:
        """Mark ``n`` more positions as filled (after every layer has written them)."""
        if self.write_index is not None:
            self.write_index.add_(n)  # in place: a captured graph advances it on every replay
        else:
            self.length += n

    def first_rows(self, n: int) -> "KVCache":
        """A cache over rows ``0..n-1`` of this one: views of the same buffers, the same write
        index (writes through it land here), for a step that runs only those rows."""
        view = KVCache.__new__(KVCache)
        view.kv = [kv[:, :n] for kv in self.kv]
        view.max_len, view.length, view.write_index = self.max_len, self.length, self.write_index
        return view

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` of the batch (beam search: the surviving beams' parents)."""
        self.kv = [kv.index_select(1, index) for kv in self.kv]


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
        kv = self.cache.kv[self.index]
        k_buf, v_buf = kv[0], kv[1]
        if self.cache.write_index is not None:
            # Static mode: one position per step, written at a device-side index, and all
            # max_len slots returned (the caller's mask hides the unfilled ones). No
            # overflow check here: it would need the index on the host.
            if key.size(2) != 1:
                raise ValueError("a static KV cache takes one new position per step")
            kv.index_copy_(3, self.cache.write_index, torch.stack((key, value)))
            return k_buf, v_buf
        start, new = self.cache.length, key.size(2)
        end = start + new
        if end > self.cache.max_len:
            raise ValueError(f"KV cache holds {self.cache.max_len} positions; {end} needed (allocate a longer cache)")
        k_buf[:, :, start:end] = key
        v_buf[:, :, start:end] = value
        return k_buf[:, :, :end], v_buf[:, :, :end]
