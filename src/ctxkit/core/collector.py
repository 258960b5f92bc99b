"""Python's cyclic garbage collector, paused for a burst of allocations.

Featurizing many texts builds a dict and a few lists per text, all kept. Each allocation of
such a container counts towards the collector's next pass, and every pass walks the young
objects and, now and then, the whole heap (a model's and torch's objects included), so on a
2-core machine about 40 % of a text task's per-text Python time went to collections that
freed nothing (docs/notes/gpu-serving.md). Reference counting still frees what the burst
drops; cycles wait for the first collection after it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

__all__ = ["collector_paused"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector inside the block; nested and concurrent blocks
    (threads) share one pause, which ends with the last of them; a collector that was off
    before stays off."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
