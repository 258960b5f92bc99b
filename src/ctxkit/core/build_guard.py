"""Sizes a checkpoint's configuration asks for, held against the weights it ships, before a
model is built from them.

A ``config.json`` is a few bytes that can describe any model: ``"num_layers": 10000000``
next to a 100 kB weight file builds layer after layer for minutes, gigabytes deep, before
the strict load could say that the weights hold two. The loaders read the weights first
(they are bounded by the file), then:

* :func:`check_layers_held` compares each depth field with the layers the weight names
  hold, naming the field (the common case, and the clearest message);
* :func:`bounded_build` builds the model under a count of the tensor values it allocates,
  refusing the allocation that would take it far past what the weights hold (any size
  field: a vocabulary of 10**9, a context of 10**8), before that allocation happens.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode

from .checkpoint import WEIGHT_FILES, CheckpointError, check_config_against_weights, count_layers
from .errors import quote

__all__ = ["bounded_build", "check_layers_held", "held_values", "weights_file"]

# Room above the weights' own count: buffers that are not saved (sinusoid and mask tables),
# and tied matrices saved once but built twice. A model built from its own config never comes
# near it; one whose config is wrong by a large factor passes it within a few layers.
SLACK_FACTOR = 2
SLACK_VALUES = 1 << 22  # 4M values (16 MB of float32), for tiny models' fixed tables

# Factory functions whose first argument (or ``size=``) is the shape of the new tensor:
# what module constructors allocate parameters and buffers with.
_SIZED = {torch.empty, torch.zeros, torch.ones, torch.rand, torch.randn, torch.full, torch.empty_strided}


def weights_file(directory: os.PathLike) -> str:
    """The weight file of a checkpoint folder, as messages name it (the shard index of a
    sharded one)."""
    directory = Path(directory)
    for name in ("model.safetensors.index.json", *WEIGHT_FILES):
        if (directory / name).is_file():
            return str(directory / name)
    return str(directory)


def held_values(state: Mapping[str, Any]) -> int:
    """Values (elements) the weights hold: the sum of their tensors' sizes."""
    return sum(int(getattr(v, "numel", lambda: 0)()) for v in state.values())


def check_layers_held(config: Mapping[str, Any], source: str, keys: Iterable[str], fields: Mapping[str, str]) -> None:
    """Each depth field of ``config`` against the layers the weight names hold.

    Args:
        config: the parsed configuration.
        source: the configuration file, for the message.
        keys: the weight names.
        fields: field -> regular expression whose first group is a layer number in a weight
            name (``{"num_layers": r"^layers\\.(\\d+)\\."}``).

    Raises:
        CheckpointError: ``field 'num_layers' is 10000000: 10000000 layers, but the weights hold 2``.
    """
    keys = list(keys)
    for name, pattern in fields.items():
        value = config.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            continue  # a wrong type is the config class's to refuse
        check_config_against_weights(dict(config), source, {}, layers=(name, count_layers(keys, re.compile(pattern))))


def _shape_of(func, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Optional[tuple]:
    """The shape a sized factory call asks for, or None when it cannot tell."""
    size = kwargs.get("size")
    if size is None and args:
        size = args[0] if isinstance(args[0], (tuple, list, torch.Size)) else args
        if func is torch.full and not isinstance(args[0], (tuple, list, torch.Size)):
            return None
    if isinstance(size, int):
        size = (size,)
    try:
        return tuple(int(s) for s in size)
    except (TypeError, ValueError):
        return None


class _ValueBudget(TorchFunctionMode):
    """Counts the values sized factory calls allocate; past ``limit``, raises ``refuse(shape,
    total)`` instead of allocating."""

    def __init__(self, limit: int, refuse):
        super().__init__()
        self.limit, self.refuse, self.total = limit, refuse, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SIZED:
            shape = _shape_of(func, args, kwargs)
            if shape is not None:
                self.total += math.prod(max(0, s) for s in shape)
                if self.total > self.limit:
                    raise self.refuse(shape, self.total)
        return func(*args, **kwargs)


@contextlib.contextmanager
def bounded_build(config: Mapping[str, Any], source: str, weights: str, held: int,
                  state: Optional[Mapping[str, Any]] = None) -> Iterator[None]:
    """Build a model inside this block: an allocation that takes the values built past
    ``SLACK_FACTOR * held + SLACK_VALUES`` is refused before it happens.

    Args:
        config: the parsed configuration (its integer fields are named in the message).
        source: the configuration file.
        weights: the weight file(s), for the message.
        held: values the weights hold (:func:`held_values`).
        state: the weights, when at hand: a field whose value is a dimension of the refused
            tensor, larger than any dimension of theirs, is named as the one at fault.

    Raises:
        CheckpointError: in one line, naming the configuration file, the field (or the size
            fields) and the weights.
    """
    limit = SLACK_FACTOR * held + SLACK_VALUES
    largest = max((int(d) for v in (state or {}).values() for d in getattr(v, "shape", ())), default=0)

    def refuse(shape: tuple, total: int) -> CheckpointError:
        sizes = {k: v for k, v in config.items() if isinstance(v, int) and not isinstance(v, bool)}
        if state is not None:
            for name, value in sorted(sizes.items(), key=lambda kv: -kv[1]):
                # The size itself, or a small multiple of it (an LSTM's four gates in one matrix).
                if value > largest and any(d % value == 0 and d // value <= 8 for d in shape if d > 0):
                    return CheckpointError(f"{source}: field {name!r} is {quote(value)}, but no weight in {weights} has a "
                                           f"dimension over {largest}; the model it describes would not fit them")
        listed = ", ".join(f"{k} {v}" for k, v in sizes.items())
        return CheckpointError(f"{source}: its sizes describe a model of over {total:,} values, but {weights} holds "
                               f"{held:,}; a size field is wrong ({listed})")

    with _ValueBudget(limit, refuse):
        yield
