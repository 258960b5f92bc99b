"""What every model family shares: :class:`Preset` (a named architecture with one line for
``ctxkit list-models``). The families themselves are listed in :mod:`.families`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Preset"]


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
