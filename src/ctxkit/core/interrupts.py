"""Training runs that get interrupted, shared by every training loop (the Trainer, the ELMo
biLM, Transformer-XL and word2vec loops).

* :class:`StopSignals`: SIGTERM and SIGUSR1 (what SLURM, Kubernetes and systemd send before
  a kill) ask the loop to stop after the current step, so that it writes its checkpoint
  and ends; a second signal stops at once.
* :func:`resume_or_start`: what ``--resume`` does with a run folder. A command that
  crashed before its first checkpoint can simply be run again with ``--resume``: it starts
  from the beginning with a one-line note. Only a finished run whose checkpoint is gone is
  refused, since starting again would train over it.

It sits in ``core`` so that loops below ``training`` (word2vec in ``models``) can use it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Callable, Optional, Sequence

from tqdm.auto import tqdm

from .errors import UserError
from .run_state import has_checkpoint

__all__ = ["StopSignals", "leave_stop_signals_to_parent", "resume_or_start"]

logger = logging.getLogger("ctxkit")


class StopSignals:
    """While a training loop runs, SIGTERM and SIGUSR1 ask it to stop after the current step
    (``received`` names the signal); a second one stops at once (``KeyboardInterrupt``, whose
    durable writes leave no debris). Installed only from the main thread (Python's rule);
    the previous handlers come back on exit.

    Args:
        unit: what the loop finishes before it stops, for the message ("step", "batch").
    """

    NAMES = ("SIGTERM", "SIGUSR1")

    def __init__(self, unit: str = "step"):
        self.unit = unit
        self.received: Optional[str] = None
        self._previous: dict = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for name in self.NAMES:
                if hasattr(signal, name):
                    self._previous[getattr(signal, name)] = signal.signal(getattr(signal, name), self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            raise KeyboardInterrupt(f"a second {signal.Signals(signum).name}")
        self.received = signal.Signals(signum).name
        # On a line of its own while tqdm bars are drawn (otherwise it is glued to a bar).
        with tqdm.external_write_mode(file=sys.stderr):
            logger.info("%s received: stopping after this %s (send it again to stop at once)", self.received, self.unit)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def leave_stop_signals_to_parent(worker_id: int = 0) -> None:
    """In a data-loader worker process: ignore SIGTERM and SIGUSR1.

    Schedulers and ``timeout`` signal the whole process group, workers included. A worker
    killed by the signal makes torch raise in the training process ("DataLoader worker ...
    is killed by signal: Terminated") while it is stopping gracefully; ignoring it leaves the
    stop to :class:`StopSignals` in the parent, which shuts its loaders down as it ends (a
    worker also exits by itself when its parent is gone). SIGKILL still ends a worker.
    """
    for name in StopSignals.NAMES:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)


def resume_or_start(checkpoint: os.PathLike, finished: Sequence[os.PathLike] = (), legacy: Optional[os.PathLike] = None,
                    say: Optional[Callable[[str], None]] = None) -> bool:
    """Whether ``--resume`` continues from ``checkpoint``, or starts from the beginning.

    Args:
        checkpoint: the folder :func:`~ctxkit.core.run_state.save_checkpoint` writes.
        finished: files only a finished run leaves (``results.json``, the output vectors):
            with one of them there and no checkpoint, the run is refused, not trained over.
        legacy: the single checkpoint file of earlier versions of a loop, also resumed from.
        say: where the one-line note goes (default: the ``ctxkit`` logger, at INFO).

    Returns:
        True when a complete checkpoint is there to resume from; False (after the note)
        for a run that crashed before its first checkpoint was complete.

    Raises:
        UserError: a finished run whose checkpoint is gone.
    """
    if has_checkpoint(checkpoint) or (legacy is not None and Path(legacy).is_file()):
        return True
    done = next((Path(p) for p in finished if Path(p).exists()), None)
    if done is not None:
        raise UserError(f"{done}: from a finished run with no checkpoint left to resume from ({checkpoint}); write to another "
                        "--out (or drop --resume to start it again)")
    (say or logger.info)(f"{checkpoint}: no complete checkpoint to resume from: starting from the beginning")
    return False
