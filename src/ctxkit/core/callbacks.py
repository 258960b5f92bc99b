"""The hooks every training loop reports through (:class:`Callback`) and several callbacks
as one (:class:`CallbackList`). The writers behind ``--log-to`` are in
:mod:`ctxkit.training.callbacks`; the protocol lives here so that a loop below the training
package (word2vec in :mod:`ctxkit.models.static.vectors`) reports the same way."""

from __future__ import annotations

import logging
from typing import Iterable, List

__all__ = ["Callback", "CallbackList"]

logger = logging.getLogger("ctxkit")


class Callback:
    """Base class: every hook does nothing; override the ones you need.

    Hooks run on the training process (rank 0 under torchrun) between steps, so a slow
    hook slows training. An exception from a hook stops training; the run's checkpoint
    stays resumable.
    """

    def on_train_begin(self, run_info: dict) -> None:
        """Training starts (or resumes: ``run_info["resumed_at_step"]``)."""

    def on_log(self, step: int, metrics: dict) -> None:
        """A training record at optimiser step ``step``."""

    def on_eval(self, step: int, metrics: dict) -> None:
        """An evaluation after optimiser step ``step``."""

    def on_train_end(self, summary: dict) -> None:
        """Training finished normally (not called after a failure)."""

    def close(self) -> None:
        """Release files and connections; called once training stops, however it stops."""


class CallbackList(Callback):
    """Several callbacks as one: each hook reaches every callback in order.

    A hook that raises does not keep the event from the callbacks after it; the first
    exception is raised once all have run. Used as a context manager it closes every
    callback on exit, also when training fails, and a failing ``close`` does not keep the
    others from closing.
    """

    def __init__(self, callbacks: Iterable[Callback] = ()):
        self.callbacks: List[Callback] = list(callbacks)

    def _each(self, hook: str, *args) -> None:
        error = None
        for callback in self.callbacks:
            try:
                getattr(callback, hook)(*args)
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the others ran
                error = error or exc
        if error is not None:
            raise error

    def on_train_begin(self, run_info: dict) -> None:
        self._each("on_train_begin", run_info)

    def on_log(self, step: int, metrics: dict) -> None:
        self._each("on_log", step, metrics)

    def on_eval(self, step: int, metrics: dict) -> None:
        self._each("on_eval", step, metrics)

    def on_train_end(self, summary: dict) -> None:
        self._each("on_train_end", summary)

    def emit(self, record: dict) -> None:
        """Route one Trainer record (``{"event": "start"|"train"|"eval"|"end", ...}``) to its hook."""
        event, rest = record["event"], {k: v for k, v in record.items() if k != "event"}
        if event == "start":
            self.on_train_begin(rest)
        elif event == "train":
            self.on_log(rest["step"], rest)
        elif event == "eval":
            self.on_eval(rest["step"], rest)
        elif event == "end":
            self.on_train_end(rest)
        else:
            raise ValueError(f"unknown log event {event!r}")

    def close(self) -> None:
        error = None
        for callback in self.callbacks:
            try:
                callback.close()
            except Exception as exc:  # noqa: BLE001 - the others must still close
                logger.warning("closing %s failed: %s", type(callback).__name__, exc)
                error = error or exc
        if error is not None:
            raise error

    def __enter__(self) -> "CallbackList":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            if exc is None:
                raise  # training went well: the failed close is the news
            # otherwise the training error is the one to report; the close failure was logged
