"""Fine-tuning tasks: GLUE / your own tables, CoNLL-2003 NER, SQuAD-style QA.

``get_task(name, **options)`` builds one; every task is registered here, explicitly.
"""

from __future__ import annotations

from typing import Callable, Dict

from .base import Task, evaluate_run, finetune, load_run, load_task, save_run_model
from ..core.errors import UnknownNameError

__all__ = ["TASKS", "Task", "get_task", "finetune", "evaluate_run", "load_run", "load_task", "save_run_model"]


def _glue(name: str) -> Callable[..., Task]:
    def build(**options) -> Task:
        from .text import GlueClassificationTask

        return GlueClassificationTask(name, **options)

    return build


def _table(**options) -> Task:
    from .text import TableClassificationTask

    return TableClassificationTask(**options)


def _conll(**options) -> Task:
    from .ner import ConllNerTask

    return ConllNerTask(**options)


def _squad(version: int) -> Callable[..., Task]:
    def build(**options) -> Task:
        from .qa import SquadTask

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
