"""Fused q/k/v projection: the roles that read one input as one GEMM over a cached
concatenation of their weights.

:class:`~ctxkit.layers.attention.MultiHeadAttention` projects queries, keys and values
with three ``Linear`` layers, as the lecture writes them. When two or three of them read
the same tensor (all three in self-attention; keys and values of a memory), one matrix
product with the weights stacked, ``[W_q; W_k; W_v] x``, does the same work: a 3x wider
GEMM keeps a GPU busier than three narrow ones, and the input is read once. The
parameters stay separate, so checkpoints keep their per-role layout.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..layers.attention import MultiHeadAttention
from ._swap import swap

__all__ = ["FusedQKVAttention", "fuse_qkv", "prepare_inference"]


class FusedQKVAttention(MultiHeadAttention):
    """:class:`~ctxkit.layers.attention.MultiHeadAttention` whose projections of a shared
    input run as one GEMM over their concatenated weights.

    Why a cache: in training the concatenation is redone at every call (cheap next to the
    GEMM, and the parameters change every step). In inference it is kept and reused until
    a weight changes (its version counter moves), since decoding one token at a time
    would otherwise copy the three matrices per token; the cached tensors are marked
    static so a graph compiled with dynamic shapes keeps their sizes. Inside a compiled
    inference graph the cache is read without the version check (which would break the
    graph): concatenate first, eagerly (:func:`prepare_inference`).

    ``fused_qkv``, when set to a module mapping ``embed_dim -> 3 * embed_dim`` (an fp8
    GEMM, :func:`ctxkit.fast.fp8.convert_to_fp8`), computes self-attention's q, k, v instead.

    Same parameters, same ``state_dict`` as the plain layer: swap it in with :func:`fuse_qkv`.
    """

    # The product of an input and the concatenated weights (a subclass may compute it
    # differently: ctxkit.fast.rows for one-row decoding).
    _linear = staticmethod(F.linear)

    def _project(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        """Per-head q, k, v, each ``(batch, heads, len, head_dim)``, one GEMM per distinct input."""
        key = query if key is None else key
        value = key if value is None else value
        fused = getattr(self, "fused_qkv", None)  # one module for all three (e.g. fp8: ctxkit.fast.fp8)
        if fused is not None and key is query and value is query:
            return tuple(self._split_heads(t) for t in fused(query).split(self.embed_dim, dim=-1))  # type: ignore[return-value]
        groups: list = []  # [(input, [projections reading it])], in q, k, v order
        for proj, x in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value)):
            if groups and groups[-1][0] is x:
                groups[-1][1].append(proj)
            else:
                groups.append((x, [proj]))
        out = []
        for x, projs in groups:
            if len(projs) == 1 or not all(isinstance(p.weight, Tensor) for p in projs):
                # Quantised projections (torch.ao dynamic int8: weight() is a method) run one by one.
                y = torch.cat([p(x) for p in projs], dim=-1) if len(projs) > 1 else projs[0](x)
            else:
                y = self._linear(x, *self._fused(projs))
            out.extend(self._split_heads(t) for t in y.split([p.out_features for p in projs], dim=-1))
        return out[0], out[1], out[2]

    def project_kv(self, key: Tensor, value: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """Per-head keys and values ``(batch, heads, key_len, head_dim)`` of a memory that
        stays fixed over many queries (pass them back as ``static_kv``)."""
        value = key if value is None else value
        if value is key and isinstance(self.k_proj.weight, Tensor) and isinstance(self.v_proj.weight, Tensor):
            k, v = self._linear(key, *self._fused([self.k_proj, self.v_proj])).split(self.embed_dim, dim=-1)
        else:
            k, v = self.k_proj(key), self.v_proj(value)
        return self._split_heads(k), self._split_heads(v)

    def _fused(self, projs) -> Tuple[Tensor, Optional[Tensor]]:
        """The concatenated weight and bias of ``projs``.

        With autograd on (training) they are concatenated at every call: the gradient then
        flows back into the separate parameters, and an optimiser step changes them
        between calls anyway. Without autograd (inference) the concatenation is kept, one
        per projection set (q/k/v, or k/v when the queries are a subset), because decoding
        one token at a time would otherwise copy the matrices per token. It is rebuilt
        when a weight changes: the key holds each parameter's identity, version counter
        (moved by every in-place update, e.g. ``load_state_dict`` or an optimiser step),
        device and dtype.
        """
        which = tuple(id(p) for p in projs)
        caches = getattr(self, "_fused_cache", None) or {}
        if torch.compiler.is_compiling() and not torch.is_grad_enabled():
            # Inside a compiled inference graph: reuse the concatenation an eager call made
            # (checking versions would break the graph); StaticDecoder and prepare_inference
            # run one first.
            cached = caches.get(which)
            if cached is not None:
                return cached[1]
        params = [p.weight for p in projs] + [p.bias for p in projs if p.bias is not None]
        if torch.is_grad_enabled():
            # Only when set: creating the attribute in the first compiled training step
            # would fail the graph's guard on it in the second and trace the model again.
            if getattr(self, "_fused_cache", None) is not None:
                self._fused_cache = None
        else:
            # Whether the compiler is loaded is part of the key: matrices cached before it
            # was (an eager server's first request) were not marked static below, so a
            # compiled graph must not take them as inputs.
            key = tuple((id(p), p._version, p.device, p.dtype) for p in params) + ("torch._dynamo" in sys.modules,)
            cached = caches.get(which)
            if cached is not None and cached[0] == key:
                return cached[1]
        weight = torch.cat([p.weight for p in projs])
        bias = torch.cat([p.bias for p in projs]) if projs[0].bias is not None else None
        if not torch.is_grad_enabled():
            if not torch.compiler.is_compiling() and key[-1]:
                # A graph compiled with dynamic shapes would otherwise treat the cached
                # matrices' sizes as symbols (and fail to split the result by them). Only
                # once the compiler is loaded: importing it costs 2.8 s, which eager
                # inference (ctxkit serve's first request) would pay for nothing.
                for t in (weight, bias):
                    if t is not None:
                        torch._dynamo.mark_static(t)
            self._fused_cache = {**caches, which: (key, (weight, bias))}
        return weight, bias

    def train(self, mode: bool = True) -> "FusedQKVAttention":
        """Switch mode and drop the inference cache: weights may have changed in ways the
        version check cannot see (a replayed CUDA graph writes the parameters without moving
        their version counters; found when a graphed pretraining run's held-out evaluation
        kept using the q/k/v of its first evaluation). The attribute is removed, not set to
        None, so a compiled training graph sees the module as it first traced it."""
        self.__dict__.pop("_fused_cache", None)
        return super().train(mode)

    def prepare_inference(self) -> None:
        """Concatenate the self-attention projections now, outside any compiled graph, so
        every compiled inference graph reuses one static copy (call under no_grad)."""
        projs = [self.q_proj, self.k_proj, self.v_proj]
        if getattr(self, "fused_qkv", None) is None and all(type(p) is nn.Linear for p in projs):
            self._fused(projs)


def fuse_qkv(model: nn.Module) -> int:
    """Swap every :class:`~ctxkit.layers.attention.MultiHeadAttention` in ``model``
    (subclasses included, e.g. Transformer-XL's relative attention) to its fused form, in
    place; idempotent. Returns how many attention modules are fused."""
    count = 0
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            swap(module, FusedQKVAttention)
            count += 1
    return count


@torch.no_grad()
def prepare_inference(model: nn.Module) -> None:
    """Fill every fused attention module's weight cache now (see :class:`FusedQKVAttention`)."""
    for module in model.modules():
        if isinstance(module, FusedQKVAttention):
            module.prepare_inference()


def varying_shape_attention(device: torch.device):
    """A context in which ``F.scaled_dot_product_attention`` on ``device`` uses only kernels
    that need no per-shape set-up: on CUDA, flash, memory-efficient and math, not cuDNN.

    cuDNN's attention builds an execution plan for every new (batch, heads, query, key) shape
    and caches it: free for training's fixed shapes, ~100 ms of host time for each prompt
    chunk of a generation server, whose query and key lengths change with every request
    (issue 40: 91 % of the decoding thread's time went there on an H200). Elsewhere: no-op.
    """
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return sdpa_kernel(backends)
