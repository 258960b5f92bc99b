"""Sparse Transformer attention (Child et al., 2019): the *strided* and *fixed* factorised
patterns, run by a block-sparse kernel (PyTorch's FlexAttention).

Each query position ``i`` attends to the union of two sets ``A1 ∪ A2`` of key positions
``j`` (stride ``l``, causal: ``j <= i`` throughout):

* strided: ``A1 = {j : i - j < l}`` (the previous ``l`` positions, ``i`` itself included),
  ``A2 = {j : (i - j) mod l == 0}`` (every ``l``-th position back);
* fixed: ``A1 = {j : floor(j / l) == floor(i / l)}`` (the query's own block of ``l``),
  ``A2 = {j : j mod l in {l - c, ..., l - 1}}`` (the last ``c`` "summary" positions of
  every block).

**Heads.** Every head attends to the union (the paper's "merged" variant, one softmax over
``A1 ∪ A2``), so a pattern drops into any multi-head layer unchanged. The paper's other
variants (one set per layer, or per head) are not offered.

**Why the kernel does not just run the pattern's ``mask_mod``.** A block-sparse kernel skips
a 128 x 128 tile of the score matrix only when no pair in it may attend, and neither
pattern leaves such tiles in sequence order: every 128 consecutive queries of the strided
pattern reach every earlier position through ``A2``, and a summary position of the fixed
pattern lies in every earlier key tile. So each pattern runs in coordinates where it is
block-sparse (:class:`SparseLayout`), with the same result:

* fixed: one call over the keys ``[summary keys gathered, all keys]``: the query's own block
  in the second part (block-diagonal), the summary keys of *other* blocks in the first
  (``n c / l`` keys, not ``n``): about ``c / 128 + 1 / n_tiles`` of causal attention's tiles;
* strided: two calls. ``A1`` in sequence order (a band: two tiles per query tile), and
  ``A2 \\ A1`` with queries, keys and values reordered column-major (position ``r l + c``
  as row ``r``, column ``c``: ``A2`` is then the same column, earlier rows, i.e.
  block-diagonal); the two partial softmaxes are merged exactly through their
  log-sum-exps (the sets are disjoint).

**Execution.** CUDA: each kind's whole computation (gathers or reordering, the
``flex_attention`` calls, the merge) as one ``torch.compile``-d function, compiled once per
process (FlexAttention is only fast compiled); a model that is itself being compiled gets
the plain function, which the outer compile fuses. CPU: eager ``flex_attention`` for
inference (an unfused reference implementation, fine for tests); FlexAttention has no CPU
backward, so when an input needs a gradient on CPU the same function runs as dense SDPA
with the pattern's boolean mask (:meth:`SparsePattern.dense`). FlexAttention appeared in
torch 2.5: on older torch this module imports, and using a pattern raises a
:class:`UserError`.

**Speed** (benchmarks/sparse_attention.py, H200, bf16, 8 heads x 64, l = 128, forward +
backward): at batch 1 about 1 ms whatever the length up to 16384 (launch-bound), so flash
causal SDPA is faster up to 4096 and the sparse kernel about 2x faster at 16384; at batch 8
flash is still 2.3x faster at 2048 and the sparse kernel 2x faster at 8192. Peak memory is
linear in the length, like flash (a dense boolean mask is quadratic).

Use a pattern as the ``mask`` of :class:`~ctxkit.layers.attention.MultiHeadAttention`
(and so of ``TransformerEncoderLayer`` / ``TransformerEncoder``): the layer projects q, k,
v, calls :meth:`SparsePattern.attend` and applies its output projection. Build the pattern
once and reuse it: block masks are cached per (pattern, seq_len, device, block size), and
the compiled functions are specialised per sequence length and grad mode (Dynamo's
recompile limit, 8 by default for each pattern kind, bounds how many such combinations one
process compiles; past it FlexAttention runs eagerly, correct but with dense memory).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.errors import UserError

# FlexAttention's module imports torch._dynamo (about 1.5 s of CPU): it is loaded on first
# use of a pattern (_require_flex), not with ctxkit. The names stay module globals so that
# the compiled functions below see them as constants.
BlockMask = create_block_mask = flex_attention = AuxRequest = None  # type: ignore[assignment,misc]

__all__ = ["SparsePattern", "SparseLayout", "LayoutPart", "flex_attention_available", "FLEX_MIN_TORCH"]

FLEX_MIN_TORCH = "2.5"
KINDS = ("strided", "fixed")


def flex_attention_available() -> bool:
    """Whether this torch has FlexAttention (torch >= 2.5); imports nothing heavy."""
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def _require_flex() -> None:
    """Load FlexAttention (once), or raise a clear error on a torch without it."""
    global BlockMask, create_block_mask, flex_attention, AuxRequest
    if flex_attention is not None:
        return
    if not flex_attention_available():
        raise UserError(f"sparse attention patterns need FlexAttention, which arrived in torch {FLEX_MIN_TORCH}; "
                        f"this is torch {torch.__version__} (pip install 'torch>={FLEX_MIN_TORCH}')")
    flex = importlib.import_module("torch.nn.attention.flex_attention")  # lazy: pulls in torch._dynamo
    BlockMask, create_block_mask, flex_attention = flex.BlockMask, flex.create_block_mask, flex.flex_attention
    AuxRequest = getattr(flex, "AuxRequest", None)  # torch >= 2.9: return_lse is deprecated for return_aux


# ----------------------------------------------------------------------------------------
# Mask functions. Each takes FlexAttention's (b, h, q_idx, kv_idx) and broadcasts over
# tensors of indices; the factories are cached so that equal patterns share one function
# object (a compiled kernel is specialised on the mask function it was traced with).


@functools.lru_cache(maxsize=None)
def _sequence_mask_mod(kind: str, stride: int, summary: int, causal: bool) -> Callable:
    """``A1 ∪ A2`` in sequence coordinates (the paper's definition)."""
    l, c = stride, summary

    def strided(b, h, q_idx, kv_idx):
        d = q_idx - kv_idx
        near = (d < l) & (d >= 0) if causal else (d < l) & (d > -l)
        on_stride = d % l == 0  # floor modulo: also right for d < 0
        return (near | on_stride) & (d >= 0) if causal else near | on_stride

    def fixed(b, h, q_idx, kv_idx):
        same_block = q_idx // l == kv_idx // l
        is_summary = kv_idx % l >= l - c
        allowed = same_block | is_summary
        return allowed & (kv_idx <= q_idx) if causal else allowed

    return strided if kind == "strided" else fixed


@functools.lru_cache(maxsize=None)
def _local_mask_mod(stride: int, causal: bool) -> Callable:
    """Strided ``A1`` in sequence coordinates: a band of width ``stride``."""

    def local(b, h, q_idx, kv_idx):
        d = q_idx - kv_idx
        return (d >= 0) & (d < stride) if causal else (d < stride) & (d > -stride)

    return local


@functools.lru_cache(maxsize=None)
def _column_mask_mod(rows: int, stride: int, seq_len: int, causal: bool) -> Callable:
    """Strided ``A2 \\ A1`` in column-major coordinates: index ``p = col * rows + row`` stands
    for position ``row * stride + col``; same column, another row (an earlier one if causal)."""

    def columns(b, h, q_idx, kv_idx):
        same_col = q_idx // rows == kv_idx // rows
        q_row, kv_row = q_idx % rows, kv_idx % rows
        if causal:  # earlier rows of a real query's column are real positions
            return same_col & (kv_row < q_row)
        kv_pos = kv_row * stride + kv_idx // rows
        return same_col & (kv_row != q_row) & (kv_pos < seq_len)

    return columns


@functools.lru_cache(maxsize=None)
def _fixed_mask_mod(stride: int, summary: int, n_summary: int, offset: int, causal: bool) -> Callable:
    """Fixed pattern over the keys ``[summary keys (n_summary, padded to offset), all keys]``:
    summary keys of other blocks (earlier ones if causal), then the query's own block."""
    l, c = stride, summary

    def fixed(b, h, q_idx, kv_idx):
        q_block = q_idx // l
        s_block = kv_idx // c  # block of summary key number kv_idx
        from_summary = (kv_idx < n_summary) & ((s_block < q_block) if causal else (s_block != q_block))
        j = kv_idx - offset
        from_block = (kv_idx >= offset) & (j // l == q_block)
        if causal:
            from_block = from_block & (j <= q_idx)
        return from_summary | from_block

    return fixed


# ----------------------------------------------------------------------------------------
# Layouts: what the kernel runs.


@dataclass(frozen=True)
class LayoutPart:
    """One FlexAttention call of a layout.

    Attributes:
        name: ``"local"`` / ``"columns"`` (strided) or ``"summary+block"`` (fixed).
        mask_mod: the mask in this call's own (query, key) coordinates.
        q_len, kv_len: the call's query and key lengths.
        block_mask: the FlexAttention :class:`BlockMask` built from ``mask_mod``.
    """

    name: str
    mask_mod: Callable
    q_len: int
    kv_len: int
    block_mask: "BlockMask"

    def nonempty_blocks(self) -> int:
        """Score tiles the kernel computes (partly or fully unmasked ones)."""
        bm = self.block_mask
        full = bm.full_kv_num_blocks
        return int(bm.kv_num_blocks.sum()) + (int(full.sum()) if full is not None else 0)

    def dense(self, device=None) -> Tensor:
        """The call's mask as a bool ``(q_len, kv_len)`` tensor."""
        q = torch.arange(self.q_len, device=device)[:, None]
        k = torch.arange(self.kv_len, device=device)[None, :]
        return self.mask_mod(0, 0, q, k).expand(self.q_len, self.kv_len)


@dataclass(frozen=True)
class SparseLayout:
    """The kernel calls of a :class:`SparsePattern` at one sequence length and block size.

    Attributes:
        pattern: the pattern.
        seq_len: sequence length ``n``.
        block_size: FlexAttention's tile size.
        parts: one :class:`LayoutPart` (fixed) or two (strided: ``local``, ``columns``).
        index: fixed: ``(offset,)`` positions gathered as the summary keys (padding points at
            position 0 and is masked); None for strided.
        padded_len: strided: ``n`` rounded up to a multiple of the stride (the column-major
            call's length); ``n`` for fixed.
    """

    pattern: "SparsePattern"
    seq_len: int
    block_size: int
    parts: Tuple[LayoutPart, ...]
    index: Optional[Tensor] = None
    padded_len: int = 0

    def nonempty_blocks(self) -> int:
        """Score tiles computed over all the layout's calls."""
        return sum(p.nonempty_blocks() for p in self.parts)

    def causal_blocks(self) -> int:
        """Score tiles of dense causal attention at this length (full attention for a
        non-causal pattern): what a flash kernel computes."""
        t = -(-self.seq_len // self.block_size)
        return t * (t + 1) // 2 if self.pattern.causal else t * t

    def attend(self, query: Tensor, key: Tensor, value: Tensor, kernel: Optional[Callable] = None) -> Tensor:
        """Run the layout's calls and combine them.

        Args:
            query, key, value: ``(batch, heads, seq_len, head_dim)``.
            kernel: ``kernel(q, k, v, part, need_lse) -> (out, lse or None)`` for a
                :class:`LayoutPart`; defaults to FlexAttention. (Tests pass a dense reference
                to check the reordering and the merge, gradients included, where
                FlexAttention has no backward.)

        Returns:
            ``(batch, heads, seq_len, head_dim)``.
        """
        l = self.pattern.stride
        rows = self.padded_len // l
        if kernel is not None:
            if self.pattern.kind == "fixed":
                return _fixed_maths(query, key, value, self.parts[0], self.index, kernel)
            return _strided_maths(query, key, value, self.parts[0], self.parts[1], l, rows, kernel)
        masks = [p.block_mask for p in self.parts]
        if self.pattern.kind == "fixed":
            return _run(_fixed_flex, query)(query, key, value, masks[0], self.index)
        return _run(_strided_flex, query)(query, key, value, masks[0], masks[1], l, rows)


def _to_columns(x: Tensor, stride: int, rows: int) -> Tensor:
    """``(batch, heads, n, d)`` -> ``(batch, heads, rows * stride, d)`` column-major
    (zero-padded to ``rows * stride`` positions)."""
    x = F.pad(x, (0, 0, 0, rows * stride - x.size(2)))
    b, h, _, d = x.shape
    return x.view(b, h, rows, stride, d).transpose(2, 3).reshape(b, h, rows * stride, d)


def _from_columns(x: Tensor, stride: int, rows: int, seq_len: int) -> Tensor:
    """Inverse of :func:`_to_columns`, cut back to ``seq_len`` positions."""
    b, h, _, d = x.shape
    return x.view(b, h, stride, rows, d).transpose(2, 3).reshape(b, h, rows * stride, d)[:, :, :seq_len]


def _device_key(device) -> str:
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


# A dict lookup (and a one-off build): never traced into a compiled graph. torch._disable_dynamo
# is torch.compiler.disable without importing torch._dynamo at decoration time (1.5 s of CPU).
@torch._disable_dynamo
@functools.lru_cache(maxsize=64)
def _layout(pattern: "SparsePattern", seq_len: int, device: str, block_size: int) -> SparseLayout:
    _require_flex()
    l, causal = pattern.stride, pattern.causal

    def part(name: str, mask_mod: Callable, q_len: int, kv_len: int) -> LayoutPart:
        bm = create_block_mask(mask_mod, None, None, q_len, kv_len, device=device, BLOCK_SIZE=block_size)
        return LayoutPart(name, mask_mod, q_len, kv_len, bm)

    if pattern.kind == "strided":
        rows = -(-seq_len // l)
        parts = (part("local", _local_mask_mod(l, causal), seq_len, seq_len),
                 part("columns", _column_mask_mod(rows, l, seq_len, causal), rows * l, rows * l))
        return SparseLayout(pattern, seq_len, block_size, parts, None, rows * l)
    c = pattern.summary
    pos = torch.arange(-(-seq_len // l), device=device)[:, None] * l + torch.arange(l - c, l, device=device)[None, :]
    pos = pos.flatten()
    pos = pos[pos < seq_len]  # increasing, so summary key s is position (s // c) * l + l - c + s % c
    n_summary = pos.numel()
    offset = -(-n_summary // block_size) * block_size  # the block part starts on a tile boundary
    index = F.pad(pos, (0, offset - n_summary))
    mask_mod = _fixed_mask_mod(l, c, n_summary, offset, causal)
    return SparseLayout(pattern, seq_len, block_size, (part("summary+block", mask_mod, seq_len, offset + seq_len),), index, seq_len)


# ----------------------------------------------------------------------------------------
# Kernels.

def _strided_maths(q: Tensor, k: Tensor, v: Tensor, local, columns, stride: int, rows: int, kernel: Callable) -> Tensor:
    """Strided: ``A1`` in sequence order, ``A2 \\ A1`` column-major, merged through the
    log-sum-exps (``local`` / ``columns``: what ``kernel`` takes for each call)."""
    out_a, lse_a = kernel(q, k, v, local, True)
    qc, kc, vc = [_to_columns(t, stride, rows) for t in (q, k, v)]
    out_b, lse_b = kernel(qc, kc, vc, columns, True)
    n = q.size(2)
    out_b = _from_columns(out_b, stride, rows, n)
    lse_b = _from_columns(lse_b[..., None], stride, rows, n)[..., 0]
    # Two softmaxes over disjoint key sets, merged exactly: weights exp(lse_x - lse), in
    # float32 at least (bf16 outputs, float32 lse) and in float64 for float64 inputs.
    acc = torch.promote_types(q.dtype, torch.float32)
    lse_a, lse_b = lse_a.to(acc), lse_b.to(acc)
    lse = torch.logaddexp(lse_a, lse_b)
    out = out_a.to(acc) * (lse_a - lse).exp()[..., None] + out_b.to(acc) * (lse_b - lse).exp()[..., None]
    return out.to(q.dtype)


def _fixed_maths(q: Tensor, k: Tensor, v: Tensor, part, index: Tensor, kernel: Callable) -> Tensor:
    """Fixed: one call over the keys ``[summary keys gathered, all keys]``."""
    k2 = torch.cat([k.index_select(2, index), k], dim=2)
    v2 = torch.cat([v.index_select(2, index), v], dim=2)
    return kernel(q, k2, v2, part, False)[0]


def _flex_call(q: Tensor, k: Tensor, v: Tensor, block_mask, need_lse: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """One FlexAttention call; ``(out, lse or None)``."""
    if not need_lse:
        return flex_attention(q, k, v, block_mask=block_mask), None
    if AuxRequest is not None:
        out, aux = flex_attention(q, k, v, block_mask=block_mask, return_aux=AuxRequest(lse=True))
        return out, aux.lse
    return flex_attention(q, k, v, block_mask=block_mask, return_lse=True)


def _strided_flex(q, k, v, local_mask, columns_mask, stride: int, rows: int) -> Tensor:
    return _strided_maths(q, k, v, local_mask, columns_mask, stride, rows, _flex_call)


def _fixed_flex(q, k, v, block_mask, index) -> Tensor:
    return _fixed_maths(q, k, v, block_mask, index, _flex_call)


_COMPILED: dict = {}


def _run(fn: Callable, query: Tensor) -> Callable:
    """``fn`` as it should run for ``query``'s device.

    CUDA: ``torch.compile(fn)``, built once per process, so the FlexAttention calls become
    fused Triton kernels (the FlexAttention docs: eager flex_attention is a slow reference)
    and the reordering and merge around them fuse too. One compiled function per pattern
    kind: Dynamo counts recompilations per function, so each kind has its own budget of
    specialisations (sequence lengths x grad modes). Inside a model that is itself being
    compiled, plain ``fn``: the outer compile fuses it. CPU: ``fn`` eagerly, FlexAttention's
    unfused reference implementation (fine for tests).
    """
    if torch.compiler.is_compiling():
        return fn
    if query.is_cuda:
        if fn not in _COMPILED:
            _COMPILED[fn] = torch.compile(fn, dynamic=False)
        return _COMPILED[fn]
    return functools.partial(_quiet, fn)


def _quiet(fn: Callable, *args):
    with warnings.catch_warnings():  # eager on CPU is deliberate (see _run)
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return fn(*args)


# ----------------------------------------------------------------------------------------
# The public pattern.


@dataclass(frozen=True)
class SparsePattern:
    """A factorised sparse attention pattern of the Sparse Transformer.

    Pass it as ``mask=`` to :class:`~ctxkit.layers.attention.MultiHeadAttention` (or a
    Transformer layer / stack built on it) for self-attention over full-length sequences:
    no padding mask is combined with it (for a causal pattern right padding is harmless,
    since no real query looks at a later position), and attention dropout, attention
    weights and KV caches are not supported on this path (for cached decoding pass
    ``pattern.dense(new, past=cached)`` as an ordinary boolean mask instead).

    Args:
        kind: ``"strided"`` or ``"fixed"`` (module docstring for the sets).
        stride: ``l``, the stride (strided) or block length (fixed); about ``sqrt(n)``.
        causal: keys ``j <= i`` only (the paper's autoregressive setting). With False the
            sets are taken both ways: strided ``|i - j| < l`` or ``(i - j) mod l == 0``;
            fixed: own block, or a summary position of any block.
        summary: ``c``, summary positions per block (fixed only); default ``max(1, l // 16)``,
            the paper's ``c = 8`` for ``l = 128``.
        block_size: FlexAttention tile size used by :meth:`attend` (128 suits CUDA).
    """

    kind: str
    stride: int
    causal: bool = True
    summary: Optional[int] = None
    block_size: int = 128

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UserError(f"unknown sparse attention pattern {self.kind!r}; choose one of {', '.join(KINDS)}")
        if not isinstance(self.stride, int) or isinstance(self.stride, bool) or self.stride < 1:
            raise UserError(f"stride must be a positive integer, got {self.stride!r}")
        if self.kind == "strided" and self.summary is not None:
            raise UserError("summary (c) belongs to the fixed pattern; the strided pattern has none")
        if self.kind == "fixed":
            c = max(1, self.stride // 16) if self.summary is None else self.summary
            if not isinstance(c, int) or not 1 <= c <= self.stride:
                raise UserError(f"summary must be an integer in 1..stride={self.stride}, got {c!r}")
            object.__setattr__(self, "summary", c)
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise UserError(f"block_size must be a positive integer, got {self.block_size!r}")

    def mask_mod(self, b, h, q_idx, kv_idx):
        """FlexAttention mask function of the pattern in sequence coordinates: True where
        query ``q_idx`` may attend key ``kv_idx`` (``A1 ∪ A2``). Broadcasts over index tensors."""
        return _sequence_mask_mod(self.kind, self.stride, self.summary or 0, self.causal)(b, h, q_idx, kv_idx)

    def dense(self, seq_len: int, device=None, *, past: int = 0) -> Tensor:
        """The pattern as a boolean mask (True = may attend), the reference for the kernel.

        Args:
            seq_len: number of queries.
            device: where to build it.
            past: queries are positions ``past .. past + seq_len - 1`` and keys ``0 ..
                past + seq_len - 1`` (decoding with a cache of ``past`` positions).

        Returns:
            Bool ``(seq_len, past + seq_len)``.
        """
        q = torch.arange(past, past + seq_len, device=device)[:, None]
        k = torch.arange(past + seq_len, device=device)[None, :]
        return self.mask_mod(0, 0, q, k).expand(seq_len, past + seq_len)

    def block_mask(self, seq_len: int, device=None, block_size: Optional[int] = None) -> SparseLayout:
        """The block-sparse layout the kernel runs at ``seq_len`` (cached per pattern, length,
        device and block size): its FlexAttention block masks and tile counts."""
        if seq_len < 1:
            raise UserError(f"seq_len must be positive, got {seq_len}")
        return _layout(self, int(seq_len), _device_key(device), int(block_size or self.block_size))

    def attend(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """Sparse self-attention ``softmax(q k^T / sqrt(d) + mask) v`` over the pattern.

        Args:
            query, key, value: ``(batch, heads, seq, head_dim)``, the same ``seq``.

        Returns:
            ``(batch, heads, seq, head_dim)``.
        """
        _require_flex()
        if query.dim() != 4 or key.shape[:3] != query.shape[:3] or value.shape[:3] != query.shape[:3]:
            raise UserError(f"sparse attention takes (batch, heads, seq, head_dim) self-attention inputs of one length, got "
                            f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}")
        n = query.size(2)
        if not query.is_cuda and any(t.requires_grad for t in (query, key, value)):
            if torch.is_grad_enabled():  # FlexAttention has no CPU backward: the same function, densely
                return F.scaled_dot_product_attention(query, key, value, attn_mask=_dense_cached(self, n, _device_key(query.device)))
            query, key, value = query.detach(), key.detach(), value.detach()  # no graph is recorded anyway
        return self.block_mask(n, query.device).attend(query, key, value)

    def __repr__(self) -> str:
        extra = f", summary={self.summary}" if self.kind == "fixed" else ""
        return f"SparsePattern({self.kind!r}, stride={self.stride}{extra}, causal={self.causal})"


@torch._disable_dynamo  # (as above)
@functools.lru_cache(maxsize=16)
def _dense_cached(pattern: SparsePattern, seq_len: int, device: str) -> Tensor:
    return pattern.dense(seq_len, device)
