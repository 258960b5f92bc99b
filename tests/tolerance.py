"""Tolerances derived from floating-point precision, for tests that claim "same function".

The policy (tests/README.md has the long form): when a test claims that ctxkit computes the
same function as a reference (transformers, a plain torch formula, another ctxkit code path
that legitimately reorders arithmetic), it does not compare two float32 results with a
hand-picked ``atol=1e-5`` that one BLAS happens to meet. It compares each float32 result
with a float64 computation of the same function, and bounds the difference by

    tol = growth(depth, k) * eps(dtype) * scale,        growth = LAMBDA * depth * sqrt(k)

* ``eps(dtype)``: machine epsilon of the dtype the computation ran in (2**-23 for float32,
  2**-52 for float64). Rounding one number costs at most eps/2 relative.
* ``scale``: the magnitude of the values the rounding happens on; by default max |reference|
  over the compared elements (the max norm of the reference), which for the outputs of a
  normalised network (LayerNorm, softmax) is the size the intermediate sums work at. For a
  quantity whose error is set by something larger than itself, pass that: the logits before
  a softmax for attention probabilities (a probability moves by at most half the largest
  change of its logits), or sum |terms| for a reduction that cancels.
* ``sqrt(k)``: a k-term dot product accumulates k roundings; in the probabilistic model of
  rounding errors (Higham & Mary, SIAM J. Sci. Comput. 2019) the error grows like sqrt(k),
  not k, with high probability. ``k`` is the longest reduction in the computation (the FFN
  width of a transformer, the hidden size of an LSTM gate). BLAS kernels differ in how they
  block and order that sum (thread count, AVX2 vs AVX-512, MKL vs OpenBLAS), and this term
  covers all of those orders alike, which is what makes the bound hold on any CPU.
* ``depth``: the number of blocks (transformer layers, LSTM layers / time steps that feed
  each other) each adding its own rounding to what comes in; errors add up across them.
  Blocks of different widths: pass ``k`` as one reduction length per block, e.g.
  ``k=(1536,) * 7 + (20000,)`` for 7 MiniLM blocks and a mean over 20000 tokens; the growth
  is then LAMBDA * sum_i sqrt(k_i) (``depth * sqrt(k)`` is the case of equal blocks).
* ``LAMBDA = 2``: the confidence constant of that model, in units of eps rather than of the
  unit roundoff eps/2 (lambda = 4 in Higham & Mary's notation: a dot product exceeds
  lambda * sqrt(k) * u with probability below 2 exp(-lambda**2 / 2) ~ 7e-4, and that is
  relative to sum |x_i y_i|, usually far above the max norm of the outputs).

For k <= 16, depth 1 and scale = sum |terms| the bound is more than a probable one: it
exceeds k * eps / 2, the worst case of any summation order. Observed headroom
(OMP_NUM_THREADS 1/2/4, ATEN_CPU_CAPABILITY default/avx2/avx512): comparisons of model
outputs use at most 0.07 of their bound, small formulas (softmax sums, short dot products)
and single roundings (where the bound is close to a worst case) up to 0.25; see the table
in tests/README.md. Set ``CTXKIT_TOL_LOG=/some/file`` to append, for every
check, the test id, the name, the dtype and error / bound, to recalibrate.

The same formula with eps(float64) is the strict check: ctxkit in float64 against the
reference in float64 agree to ~1e-13 relative, so a wrong scale factor, a transposed weight,
a missing LayerNorm eps (1e-12) or a weight off by 1.001 fails it by orders of magnitude,
independently of any BLAS. Comparisons that must be bit-identical (resume == uninterrupted,
same seed twice) stay ``torch.equal``; they are not this module's business.
"""

from __future__ import annotations

import copy
import math
import os
from typing import Any

import numpy as np
import torch

LAMBDA = 2.0

__all__ = [
    "LAMBDA", "eps", "growth", "tol", "magnitude", "assert_close_to_reference", "assert_same_function", "assert_paths_agree",
    "float64", "to64", "cast_like", "through_linear",
]


def eps(dtype: Any) -> float:
    """Machine epsilon of a torch or numpy floating dtype (or of a tensor / array's dtype)."""
    if isinstance(dtype, (torch.Tensor, np.ndarray)):
        dtype = dtype.dtype
    if isinstance(dtype, torch.dtype):
        return torch.finfo(dtype).eps
    return float(np.finfo(np.dtype(dtype)).eps)


def growth(depth: int = 1, k: Any = 1) -> float:
    """LAMBDA * depth * sqrt(k): rounding-error growth of ``depth`` chained blocks whose longest
    reduction has ``k`` terms; with ``k`` a sequence (one length per block, ``depth`` left at
    1), LAMBDA * sum_i sqrt(k_i). See the module docstring for why each factor is there."""
    ks = [k] if isinstance(k, (int, float)) else list(k)
    if depth < 1 or not ks or min(ks) < 1 or (depth > 1 and len(ks) > 1):
        raise ValueError(f"depth >= 1 and k >= 1 (or one k per block with depth 1), got depth={depth}, k={k}")
    return LAMBDA * depth * sum(math.sqrt(x) for x in ks)


def tol(dtype: Any, scale: Any, *, depth: int = 1, k: Any = 1):
    """The bound ``growth(depth, k) * eps(dtype) * scale``.

    ``scale`` is a number (max norm) or a tensor broadcastable to the compared values (a
    per-element magnitude, e.g. ``magnitude(ref, per_element=True)``)."""
    return growth(depth, k) * eps(dtype) * scale


def magnitude(reference: Any, *, mask: Any = None, per_element: bool = False, floor: float | None = None):
    """Scale of a reference: max |reference| (over ``mask``), or per element |reference| plus
    ``floor`` (default: 1e-3 of the max, so that values near zero keep a bound set by the
    sums they came from)."""
    ref = _as_tensor(reference).double()
    if mask is not None:
        ref = ref[_as_tensor(mask).bool()]
    top = ref.abs().max().item() if ref.numel() else 0.0
    if not per_element:
        return max(top, torch.finfo(torch.float64).tiny)
    return ref.abs() + (1e-3 * top if floor is None else floor)


def through_linear(weight: Any, input_scale: float) -> float:
    """Scale of the outputs of a linear layer (a task head) whose input carries rounding
    errors at ``input_scale`` (e.g. max |hidden state|): max_i ||W_i||_2 * input_scale.

    The input's errors have random signs, so the layer sums them like the terms of a dot
    product (the sqrt(k) model): row i turns errors of size e into about ||W_i||_2 * e, not
    sum |W_ij| * e. Use it where the output is much smaller than what it was computed from
    (logits of a freshly initialised head read from hidden states of size ~10)."""
    w = _as_tensor(weight).double()
    return float(w.norm(dim=-1).max()) * float(input_scale)


def _as_tensor(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    return torch.as_tensor(np.asarray(x))


def _log(name: str, dtype: Any, ratio: float) -> None:
    path = os.environ.get("CTXKIT_TOL_LOG")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{test}\t{name}\t{dtype}\t{ratio:.4g}\n")


def _check(actual: Any, reference: Any, bound_of, *, dtype: Any, scale: Any, mask: Any, name: str, how: str) -> float:
    a, r = _as_tensor(actual), _as_tensor(reference)
    if a.shape != r.shape:
        raise AssertionError(f"{name}: shape {tuple(a.shape)} != reference shape {tuple(r.shape)}")
    dtype = a.dtype if dtype is None else dtype
    if not (a.is_floating_point() and r.is_floating_point()):
        raise AssertionError(f"{name}: compares floating-point values, got {a.dtype} and {r.dtype}")
    diff = (a.double() - r.double()).abs()
    if scale is None:
        scale = magnitude(r, mask=mask)
    elif not isinstance(scale, (int, float)):
        scale = _as_tensor(scale).double()  # per element (or a 0-d tensor)
    bound = bound_of(dtype, scale)
    bound_full = bound.expand_as(diff) if isinstance(bound, torch.Tensor) else torch.full_like(diff, float(bound))
    if mask is not None:
        m = _as_tensor(mask).bool()
        m = m.reshape(m.shape + (1,) * (diff.dim() - m.dim())).expand_as(diff)
    else:
        m = torch.ones_like(diff, dtype=torch.bool)
    finite = torch.isfinite(a) | ~m
    if not finite.all():
        idx = tuple(int(i) for i in (~finite).nonzero()[0])
        raise AssertionError(f"{name}: non-finite value {a[idx].item()} at index {idx}")
    over = (diff > bound_full) & m
    ratio_all = torch.where(m, diff / bound_full.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(diff))
    worst = ratio_all.max().item() if diff.numel() else 0.0
    _log(name, dtype, worst)
    if over.any():
        idx = tuple(int(i) for i in (ratio_all == ratio_all.max()).nonzero()[0])
        here = scale.expand_as(diff)[idx].item() if isinstance(scale, torch.Tensor) else float(scale)
        scale_txt = f"{here:.4g} (per element)" if isinstance(scale, torch.Tensor) else f"{here:.4g}"
        factor = bound_full[idx].item() / (eps(dtype) * here) if here else float("nan")
        raise AssertionError(
            f"{name}: |{how}| = {diff[idx].item():.4g} at index {idx} ({how.split(' - ')[0]} {a[idx].item():.8g}, "
            f"{how.split(' - ')[1]} {r[idx].item():.8g}) "
            f"exceeds the bound {bound_full[idx].item():.4g} = {factor:.4g} * eps({dtype}) * scale {scale_txt}; "
            f"{int(over.sum())} of {int(m.sum())} elements over the bound, worst error / bound = {worst:.3g}")
    return worst


def assert_close_to_reference(actual: Any, reference: Any, *, dtype: Any = None, scale: Any = None, depth: int = 1, k: Any = 1,
                              mask: Any = None, name: str = "value") -> float:
    """Assert ``|actual - reference| <= tol(dtype, scale, depth=depth, k=k)`` elementwise.

    ``reference`` is the float64 computation (any dtype is accepted, it is compared in
    float64); ``dtype`` is the precision ``actual`` was computed in (default: its dtype).
    ``scale`` defaults to ``magnitude(reference, mask=mask)``. ``mask`` (bool, the leading
    dims of the values, e.g. the attention mask for [batch, seq, hidden]) picks the compared
    elements. Returns the worst error / bound (under 1 when it passes). The message names the
    max error, the bound, the index and how many elements exceed it."""
    return _check(actual, reference, lambda dt, s: tol(dt, s, depth=depth, k=k), dtype=dtype, scale=scale, mask=mask, name=name,
                  how="actual - reference")


def assert_same_function(ours: Any, theirs: Any, reference: Any, *, dtype: Any = None, scale: Any = None, depth: int = 1, k: Any = 1,
                         mask: Any = None, name: str = "value", labels: tuple = ("ours", "reference implementation")) -> float:
    """Both sides of a "same function" claim, each bounded against the float64 ``reference``
    by the same derived tolerance (so they agree with each other within twice that, on
    whatever BLAS each ran). ``labels`` name the two sides in messages. Returns the worse of
    the two error / bound ratios."""
    kw = dict(dtype=dtype, scale=scale if scale is not None else magnitude(reference, mask=mask), depth=depth, k=k, mask=mask)
    return max(assert_close_to_reference(ours, reference, name=f"{name} ({labels[0]})", **kw),
               assert_close_to_reference(theirs, reference, name=f"{name} ({labels[1]})", **kw))


def assert_paths_agree(a: Any, b: Any, *, dtype: Any = None, scale: Any = None, depth: int = 1, k: Any = 1, mask: Any = None,
                       name: str = "value") -> float:
    """Two code paths of one function in the same precision, with no float64 run at hand
    (cached vs uncached, padded vs alone, windowed vs whole): each is within ``tol`` of the
    exact function, so they are within ``2 * tol`` of each other. ``scale`` defaults to
    max(|a|, |b|) over ``mask``."""
    if scale is None:
        scale = max(magnitude(a, mask=mask), magnitude(b, mask=mask))
    return _check(a, b, lambda dt, s: 2 * tol(dt, s, depth=depth, k=k), dtype=dtype, scale=scale, mask=mask, name=name, how="a - b")


def float64(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of ``model`` in eval mode (the original is untouched)."""
    return copy.deepcopy(model).double().eval()


def to64(x: Any) -> Any:
    """Cast the floating tensors of ``x`` (a tensor, or a dict / list / tuple of them) to float64;
    integer tensors (token ids, masks) and everything else pass through."""
    return _cast(x, torch.float64)


def cast_like(x: Any, model: torch.nn.Module) -> Any:
    """Cast the floating tensors of ``x`` to the dtype of ``model``'s parameters, so that one
    ``run(model)`` closure serves the float32 model and its ``float64`` copy."""
    return _cast(x, next(model.parameters()).dtype)


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.is_floating_point() else x
    if isinstance(x, dict):
        return {key: _cast(v, dtype) for key, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(v, dtype) for v in x)
    return x
