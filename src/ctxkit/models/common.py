"""What every model family shares: :class:`Preset` (a named architecture with one line for
``ctxkit list-models``), and the config mixins :class:`Replaceable` and :class:`PaperNames`.
The families themselves are listed in :mod:`.families`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Preset", "Replaceable", "PaperNames"]

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
