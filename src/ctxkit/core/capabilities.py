"""What a model, a collate function or a gradient sync declares it can do.

The training, inference and decoding code asks these questions of objects it is handed (it
knows no model family): can this model compute its last layer at chosen positions, decode
one token over a static cache, be captured in a CUDA graph; does this collate function take
a key; does this model copy host tensors to its device itself. Each answer is a class
attribute that the class sets on purpose, and each question is a :class:`typing.Protocol`
here, so a reader finds in one place what a new model or collator must declare to get the
behaviour, and :func:`declares` is the one way to ask.

A protocol's flag attributes must be present *and* true (a class may say ``False`` on
purpose, e.g. a model whose packed sequences keep their lengths on the host).
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, runtime_checkable

__all__ = ["CarriesState", "ComputesAtPositions", "DeclaresPrecision", "GraphCapturable", "KeyedCollator", "StaticCacheDecoder",
           "TakesHostInputs", "WarmsUp", "declared_precision", "declares"]


@runtime_checkable
class ComputesAtPositions(Protocol):
    """An encoder whose ``forward(..., output_positions=(batch, n))`` runs its last layer at
    those positions only (:class:`~ctxkit.models.bert.model.BertModel`): a sentence head
    asks for [CLS] alone."""

    supports_output_positions: bool


@runtime_checkable
class CarriesState(Protocol):
    """A model trained by truncated backpropagation through time: ``forward(**batch, state=S)``
    continues from the state the previous batch left (None at an epoch's start) and returns
    the next one as ``out["state"]`` (a tensor, a tuple or list of them, or None). The
    Trainer then runs a :class:`~ctxkit.training.steps.StatefulStep`: batches in stream order,
    the state detached between steps, cleared at each epoch's start and kept in checkpoints."""

    carries_state: bool


@runtime_checkable
class StaticCacheDecoder(Protocol):
    """A causal LM whose ``forward`` takes one token over a static KV cache (CUDA-graph and
    continuous-batching decoding)."""

    supports_static_cache: bool


@runtime_checkable
class GraphCapturable(Protocol):
    """A module that says whether a training step through it can be captured in a CUDA graph
    (``cuda_graph_safe = False`` when it syncs with the host, e.g. packed RNN sequences).
    Modules that say nothing are capturable."""

    cuda_graph_safe: bool


@runtime_checkable
class KeyedCollator(Protocol):
    """A collate function called as ``collate(features, key=(epoch, index[, rank]))`` whose
    randomness (e.g. MLM masks) depends on the key alone, so batches can be collated in any
    order, in worker processes, and a resumed run draws the same ones."""

    keyed: bool

    def __call__(self, features: Any, key: Any = None) -> Any: ...


@runtime_checkable
class TakesHostInputs(Protocol):
    """A model that copies pinned host tensors into its own device buffers (the GPU encoder's
    captured graphs): ``predict`` hands it host batches."""

    takes_host_inputs: bool


@runtime_checkable
class DeclaresPrecision(Protocol):
    """A model built to run at one precision (``"bf16"``, ``"fp32"`` or ``"native"``: its own
    dtypes, no autocast), which wins over the precision ``predict`` is called with."""

    inference_precision: str


@runtime_checkable
class WarmsUp(Protocol):
    """A model that prepares itself for batches up to a size (compiles, captures graphs), so
    a server can do it before its first request."""

    def warm_up(self, max_batch: int) -> Any: ...


def declares(obj: Any, protocol: type) -> bool:
    """Whether ``obj`` has every member of ``protocol`` and its flags (bool attributes) are
    true. Not for use inside a compiled ``forward`` (ask once, outside it)."""
    if not isinstance(obj, protocol):
        return False
    flags = [name for name, kind in getattr(protocol, "__annotations__", {}).items() if kind in ("bool", bool)]
    return all(getattr(obj, name) is True for name in flags)


def declared_precision(model: Any) -> Optional[str]:
    """The precision ``model`` declares (:class:`DeclaresPrecision`), or None."""
    return model.inference_precision if isinstance(model, DeclaresPrecision) else None
