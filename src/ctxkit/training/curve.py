"""``curve.png`` of a run folder: the training loss per step and every evaluation so far.

The :class:`~ctxkit.training.Trainer` draws it after the last epoch and, at most every
``CURVE_EVERY_S`` seconds of training, between epochs (a drawing takes 0.3-1 s: a run of many
short epochs would otherwise spend its time here). Where the device does the training work
(background checkpoints: a GPU) the redraws between epochs go on a thread, so the device keeps
stepping; the final drawing waits for one still running, so the last ``curve.png`` is complete.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from ..core.deps import missing

__all__ = ["CurveDrawer"]

logger = logging.getLogger("ctxkit")


class CurveDrawer:
    """Draws a run's ``curve.png`` (rank 0).

    Args:
        out_dir: the run folder (the picture's title is its name).
        main_metric: the evaluation metric drawn beside the loss (None: the loss alone).
        say: how a one-line note reaches the user (matplotlib missing).
    """

    def __init__(self, out_dir: Path, main_metric: Optional[str], say: Callable[[str], None]):
        self.out_dir, self.main_metric, self.say = Path(out_dir), main_metric, say
        self.drawn_at: Optional[float] = None  # when the last drawing started (time.time())
        self._thread: Optional[threading.Thread] = None
        self._said_missing = False

    def draw(self, history: list, losses: list, background: bool = False) -> None:
        """Draw now; ``background``: on a thread, skipped while the previous one still draws.
        A drawing in the foreground first waits for one on the thread."""
        if self._thread is not None:
            if background and self._thread.is_alive():
                return
            self._thread.join()
            self._thread = None
        self.drawn_at = time.time()
        if missing(["matplotlib"]):  # the curve is a convenience: log.jsonl holds the same numbers
            if not self._said_missing:
                self.say("curve.png not drawn: matplotlib is not installed (pip install 'ctxkit[plots]')")
                self._said_missing = True
            return
        from ..core.plots import plot_training_curve  # lazy: matplotlib (the plots extra) only when a curve is drawn

        args = ([(i + 1, float(v)) for i, v in enumerate(losses)], list(history), self.main_metric, self.out_dir / "curve.png")
        if not background:
            plot_training_curve(*args, title=self.out_dir.name)
            return

        def run() -> None:
            try:
                plot_training_curve(*args, title=self.out_dir.name)
            except Exception as err:  # noqa: BLE001 - a convenience; the run goes on (the final draw reports)
                logger.warning("curve.png not redrawn: %s", err)

        self._thread = threading.Thread(target=run, name="ctxkit-curve", daemon=True)
        self._thread.start()
