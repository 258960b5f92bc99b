"""Fine-tuning tasks: GLUE / your own tables, CoNLL-2003 NER, SQuAD-style QA.

``get_task(name, **options)`` builds one (:mod:`.registry` lists every task, explicitly);
:mod:`.runs` fine-tunes, evaluates and loads run folders; :class:`.base.Task` is the interface.
"""

from .base import Task
from .registry import TASKS, get_task
from .runs import evaluate_run, finetune, load_run, load_task, push_run, save_run_model

__all__ = ["TASKS", "Task", "get_task", "finetune", "evaluate_run", "load_run", "load_task", "push_run", "save_run_model"]
