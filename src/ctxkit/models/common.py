"""What every model family shares: :class:`Preset` (a named architecture with one line for
``ctxkit list-models``). The families themselves are listed in :mod:`.families`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["Preset", "PaperNames"]


class PaperNames:
    """For configs whose stored fields keep their paper's and checkpoint format's names
    (``d_model``, ``n_layers``, ``n_heads``, ``d_inner``: Transformer-XL, XLNet): the common
    names of :mod:`.families` as read-only views, and ``replace``."""

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

    def replace(self, **changes):
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


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
