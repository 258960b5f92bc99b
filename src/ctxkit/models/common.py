"""What every model family shares: :class:`Preset` (a named architecture with one line for
``ctxkit list-models``), the config mixins :class:`Replaceable` and :class:`PaperNames`, and
:class:`IndexableOutput`, the output mixin that reads like transformers' ``ModelOutput``.
The families themselves are listed in :mod:`.families`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, List, Tuple, TypeVar

__all__ = ["Preset", "Replaceable", "PaperNames", "IndexableOutput"]

_Config = TypeVar("_Config", bound="Replaceable")


class Replaceable:
    """``replace`` for the families' (frozen) config dataclasses.

    Callers (presets shrunk for tests,
    training loops fitting a vocabulary) derive variants with ``config.replace(...)`` rather
    than importing :mod:`dataclasses` themselves. The mixin declares no fields, so a
    dataclass that inherits it keeps exactly its own fields, defaults, equality and hash.
    """

    def replace(self: _Config, **changes: Any) -> _Config:
        """A copy with some fields changed.

        Args:
            **changes: field names and their new values.

        Returns:
            A new instance of the same class (``__post_init__`` runs again, so its checks
            apply to the changed values).
        """
        return dataclasses.replace(self, **changes)


class PaperNames(Replaceable):
    """For configs whose stored fields keep their paper's and checkpoint format's names
    (``d_model``, ``n_layers``, ``n_heads``, ``d_inner``: Transformer-XL, XLNet): the common
    names of :mod:`.families` as read-only views, and ``replace`` (from :class:`Replaceable`)."""

    @property
    def hidden_size(self) -> int:
        return self.d_model

    @property
    def num_layers(self) -> int:
        return self.n_layers

    @property
    def num_heads(self) -> int:
        return self.n_heads

    @property
    def ffn_size(self) -> int:
        return self.d_inner


@dataclass(frozen=True)
class Preset:
    """A named architecture.

    Attributes:
        name: registry name.
        config: the architecture (the family's config class).
        description: one line for ``ctxkit list-models``.
    """

    name: str
    config: Any
    description: str


class IndexableOutput:
    """Index, unpack and key access for the families' output dataclasses, as transformers'
    ``ModelOutput`` and its older tuple outputs allow.

    The values are the non-None fields, in field order (or in ``_tuple_names``, where a class
    lists the names transformers' output has, in its order): ``out[0]`` is the first
    (``last_hidden_state`` of :class:`~ctxkit.models.bert.BertOutput`), ``out[1]`` the next
    non-None one, ``out[:2]`` a tuple, ``len(out)`` how many there are, ``hidden, pooled = out``
    unpacks them, and ``out["last_hidden_state"]`` reads by name (``KeyError`` for a None
    field, as in transformers). ``keys()``, ``values()``, ``items()`` and ``to_tuple()`` list
    them, so ``dict(out)`` works too. Attribute access is unchanged.

    Unlike ``ModelOutput`` (an ordered dict), iterating yields the values, not the names: the
    habit this serves is ``last_hidden_state, pooler_output = model(...)``, which in
    transformers needs ``return_dict=False``; ``"name" in out`` still asks for a name. The mixin
    declares no fields, so a dataclass that inherits it keeps its own fields and equality.
    """

    _tuple_names: Tuple[str, ...] = ()  # no annotation in subclasses: not a dataclass field

    def _names(self) -> Tuple[str, ...]:
        return self._tuple_names or tuple(f.name for f in dataclasses.fields(self))

    def keys(self) -> List[str]:
        """Names of the non-None values, in order."""
        return [name for name in self._names() if getattr(self, name) is not None]

    def values(self) -> List[Any]:
        """The non-None values, in order."""
        return [getattr(self, name) for name in self.keys()]

    def items(self) -> List[Tuple[str, Any]]:
        """``(name, value)`` of the non-None values, in order."""
        return [(name, getattr(self, name)) for name in self.keys()]

    def to_tuple(self) -> tuple:
        """The non-None values as a tuple (what transformers returns with ``return_dict=False``)."""
        return tuple(self.values())

    def __getitem__(self, key):
        if isinstance(key, str):
            if key in self.keys():
                return getattr(self, key)
            raise KeyError(f"{key!r}: this {type(self).__name__} holds {self.keys()}")
        return self.to_tuple()[key]

    def __iter__(self):
        return iter(self.to_tuple())

    def __len__(self) -> int:
        return len(self.keys())

    def __contains__(self, key) -> bool:
        return key in self.keys()
