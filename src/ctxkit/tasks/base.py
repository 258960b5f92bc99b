"""The task interface every fine-tuning task implements (:class:`Task`).

The concrete tasks (:mod:`.text`, :mod:`.ner`, :mod:`.qa`) subclass it, :mod:`.registry`
names them, and :mod:`.runs` drives them (fine-tune, evaluate, load a run folder).
"""

from __future__ import annotations

import os
from typing import Dict, List, Sequence, Tuple

from torch import nn

__all__ = ["Task"]


class Task:
    """Interface of a fine-tuning task; subclasses fill it in for one task family.

    Attributes:
        name: registry name (``sst-2``, ``conll2003``, ``squad``...).
        main_metric: metric that picks the best epoch.
        train_split: split name used for training.
        eval_splits: split names evaluated after training (the first one each epoch).
        group_factor: default length grouping of training batches (see
            :class:`~ctxkit.training.TrainConfig`).
    """

    name: str = ""
    group_factor: int = 50
    main_metric: str = ""
    train_split: str = "train"
    eval_splits: Tuple[str, ...] = ("dev",)

    def options(self) -> dict:
        """JSON-serialisable options that rebuild this task via ``get_task(name, **options)``."""
        return {}

    def load(self, data: os.PathLike, split: str) -> list:
        """Read the examples of one split from the task's data folder or file."""
        raise NotImplementedError

    # SQuAD-style tasks split one file (by article) into train and dev; with a separate
    # evaluation file every question of each file is used instead (split "all").
    splits_one_file: bool = False

    def describe_split(self, data: os.PathLike, split: str) -> str:
        """Where ``split`` is read from, for messages (the reader's file when it knows it)."""
        return f"{data} ({split} split)"

    def prepare(self, train_examples: list) -> None:
        """Fix anything learned from the training data (e.g. the label set)."""

    def check(self, examples: list, source: str, training: bool) -> None:
        """Check a split against the task before any compute is spent.

        Args:
            examples: the split's examples.
            source: where they were read from (for messages).
            training: the training split (warn about oddities) or an evaluation split
                (labels the model cannot predict are a :class:`UserError`).
        """

    def build_model(self, encoder: nn.Module) -> nn.Module:
        """The encoder plus this task's head; has ``.encoder`` and ``.head``."""
        raise NotImplementedError

    def featurize(self, tokenizer, examples: list, train: bool) -> List[dict]:
        """Feature dicts for the trainer and for :func:`ctxkit.training.predict`."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, tokenizer, examples: list, batch_size: int = 128, device: str = "auto") -> Tuple[Dict[str, float], object]:
        """Return ``(metrics, predictions)`` on labelled examples."""
        raise NotImplementedError

    def predict_lines(self, model: nn.Module, tokenizer, lines: Sequence[str], batch_size: int = 64, device: str = "auto") -> List[dict]:
        """Predictions for raw input lines (``ctxkit predict``), one JSON-able dict each."""
        raise NotImplementedError

    def requires(self) -> Tuple[str, ...]:
        """Import names of the optional packages this task's metrics need (:mod:`ctxkit.core.deps`)."""
        return ()

    def input_format(self) -> str:
        """What one input line of ``ctxkit predict`` holds for this task (for help and errors)."""
        return "one text per line"

    def clean_input(self, lines: Sequence[Tuple[int, str]], source: str, extra_columns: str = "error") -> List[str]:
        """Check ``(line number, text)`` inputs against :meth:`input_format` before any compute.

        Args:
            lines: the non-empty input lines with their 1-based line numbers.
            source: the input's name (a file, or ``<stdin>``) for messages.
            extra_columns: "error" (a :class:`UserError` naming ``source:line``) or "drop"
                (keep the columns the task reads, with one warning counting the lines).

        Returns:
            The lines to pass to :meth:`predict_lines`.
        """
        return [text for _, text in lines]
