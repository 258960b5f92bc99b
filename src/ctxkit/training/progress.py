"""A progress bar that long inner loops report to without being passed one.

``evaluate`` wraps a whole evaluation in :func:`progress_bar`; the prediction loop deep
inside it (:func:`ctxkit.training.predict`) calls :func:`begin` with its number of items
and :func:`advance` per batch. Outside a ``progress_bar`` block both do nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

from tqdm.auto import tqdm

__all__ = ["progress_bar", "begin", "advance"]

_current: contextvars.ContextVar[Optional[tqdm]] = contextvars.ContextVar("ctxkit_progress", default=None)


@contextlib.contextmanager
def progress_bar(desc: str, total: Optional[int] = None, unit: str = "ex") -> Iterator[tqdm]:
    """Show a bar (on stderr) for the enclosed work; inner loops update it."""
    bar = tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=False)
    token = _current.set(bar)
    try:
        yield bar
    finally:
        _current.reset(token)
        bar.close()


def begin(total: int, unit: str = "input") -> None:
    """The enclosing bar now counts ``total`` items of ``unit`` (e.g. QA windows, not questions)."""
    bar = _current.get()
    if bar is not None:
        bar.reset(total=total)
        bar.unit = unit


def advance(n: int) -> None:
    """``n`` more items done."""
    bar = _current.get()
    if bar is not None:
        bar.update(n)
