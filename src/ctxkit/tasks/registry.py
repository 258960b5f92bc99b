"""The fine-tuning tasks by name: ``get_task(name, **options)``. Every task is listed here,
explicitly (nothing registers itself at import time)."""

from __future__ import annotations

from typing import Callable, Dict

from ..core.errors import UnknownNameError
from .base import Task
from .ner import ConllNerTask
from .qa import SquadTask
from .text import GlueClassificationTask, TableClassificationTask

__all__ = ["TASKS", "get_task"]


def _glue(name: str) -> Callable[..., Task]:
    def build(**options) -> Task:
        return GlueClassificationTask(name, **options)

    return build


def _table(**options) -> Task:
    return TableClassificationTask(**options)


def _conll(**options) -> Task:
    return ConllNerTask(**options)


def _squad(version: int) -> Callable[..., Task]:
    def build(**options) -> Task:
        options.setdefault("version", version)
        return SquadTask(**options)

    return build


TASKS: Dict[str, Callable[..., Task]] = {
    **{name.lower(): _glue(name) for name in ("SST-2", "CoLA", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI")},
    "table": _table,
    "conll2003": _conll,
    "squad": _squad(1),
    "squad2": _squad(2),
}


def get_task(name: str, **options) -> Task:
    """Build a task by name (case-insensitive), e.g. ``get_task("sst-2")``.

    Raises:
        KeyError: listing the known task names.
    """
    key = name.lower()
    if key not in TASKS:
        raise UnknownNameError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[key](**options)
