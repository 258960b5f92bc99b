"""The fine-tuning tasks by name: ``get_task(name, **options)``. Every task is listed here,
explicitly (nothing registers itself at import time)."""

from __future__ import annotations

import difflib
from typing import Callable, Dict

from ..core.errors import UnknownNameError
from .base import Task
from .ner import ConllNerTask
from .qa import SquadTask
from .text import GlueClassificationTask, TableClassificationTask

__all__ = ["TASKS", "TASK_ALIASES", "get_task"]


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


#: other spellings of the tasks: Hugging Face ``datasets``' (``glue/sst2``, ``squad_v2``) and GLUE's own
TASK_ALIASES: Dict[str, str] = {
    "sst2": "sst-2", "stsb": "sts-b", "glue/sst2": "sst-2", "glue/cola": "cola", "glue/mrpc": "mrpc", "glue/stsb": "sts-b",
    "glue/qqp": "qqp", "glue/mnli": "mnli", "glue/qnli": "qnli", "glue/rte": "rte", "glue/wnli": "wnli",
    "squad_v1": "squad", "squad_v1.1": "squad", "squad1": "squad", "squad_v2": "squad2", "squad2.0": "squad2",
    "conll": "conll2003", "conll-2003": "conll2003", "ner": "conll2003",
}


def get_task(name: str, **options) -> Task:
    """Build a task by name (case-insensitive), e.g. ``get_task("sst-2")``; the ``datasets``
    spellings (``sst2``, ``stsb``, ``squad_v2``, ...) work too (:data:`TASK_ALIASES`).

    Raises:
        UnknownNameError: naming the closest known task and listing them all.
    """
    key = name.lower()
    key = TASK_ALIASES.get(key, key)
    if key not in TASKS:
        close = difflib.get_close_matches(key, list(TASKS) + list(TASK_ALIASES), n=2, cutoff=0.6)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise UnknownNameError(f"unknown task {name!r}{hint}; known tasks: {', '.join(TASKS)}")
    return TASKS[key](**options)
