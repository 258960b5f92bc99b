"""Task checkpoints of ``transformers`` as runs: an HF folder (or Hub id) of a
``BertForSequenceClassification``, ``BertForTokenClassification`` or ``BertForQuestionAnswering``
(and their DistilBERT twins) loads with its head and its ``id2label``, so ``predict``,
``evaluate`` and ``serve`` take it as they take a folder written by ``ctxkit finetune``.

The task comes from the checkpoint's ``config.json``: ``architectures`` says which head, and
``id2label`` / ``problem_type`` which labels (``num_labels == 1`` or ``problem_type ==
"regression"`` is a regression). The head's tensors keep transformers' names
(``classifier.*``, DistilBERT's ``pre_classifier.*``, ``qa_outputs.*``), which are ctxkit's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, Optional, Tuple

from torch import nn

from ..core.checkpoint import CheckpointError, load_state_dict_strict, read_config, read_weights
from ..core.errors import UserError
from ..heads.classification import EncoderWithHead, SequenceClassificationHead, TokenClassificationHead
from ..zoo.encoders import load_encoder
from .base import Task
from .registry import get_task

__all__ = ["hf_task_kind", "hf_task", "load_hf_task_model"]

logger = logging.getLogger("ctxkit")

# architecture suffix -> what ctxkit calls the head
_KINDS = {"ForSequenceClassification": "sequence", "ForTokenClassification": "token", "ForQuestionAnswering": "qa"}
_FAMILIES = ("Bert", "DistilBert")
# what each kind's head reads of the checkpoint (transformers' names = ctxkit's)
_HEAD_PREFIXES = {"sequence": ("classifier.", "pre_classifier."), "token": ("classifier.",), "qa": ("qa_outputs.",)}


def hf_task_kind(folder: Path) -> Optional[str]:
    """``"sequence"``, ``"token"`` or ``"qa"`` for an HF task checkpoint folder, else None
    (a bare encoder, a language model, or no ``config.json``).

    Raises:
        UserError: a task architecture of a family ctxkit has no task head for (e.g. XLNet's).
    """
    if not (Path(folder) / "config.json").is_file():
        return None
    architectures = read_config(folder).get("architectures") or []
    for arch in architectures if isinstance(architectures, list) else []:
        for suffix, kind in _KINDS.items():
            if isinstance(arch, str) and arch.endswith(suffix):
                if arch[: -len(suffix)] not in _FAMILIES:
                    raise UserError(f"{folder}: a {arch} checkpoint; ctxkit runs the task heads of "
                                    f"{', '.join(f + suffix for f in _FAMILIES)}")
                return kind
    return None


def _labels(config: dict, folder: Path) -> list:
    """The label names in id order (``id2label``; ``LABEL_i`` where it has none)."""
    id2label = config.get("id2label") or {}
    try:
        table = {int(k): str(v) for k, v in id2label.items()}
    except (TypeError, ValueError, AttributeError):
        raise CheckpointError(f"{folder / 'config.json'}: id2label must map integer ids to names, got {id2label!r}") from None
    n = int(config.get("num_labels") or len(table) or 2)
    n = max(n, len(table))
    if table and sorted(table) != list(range(n)):
        raise CheckpointError(f"{folder / 'config.json'}: id2label ids {sorted(table)} are not 0..{n - 1}")
    return [table.get(i, f"LABEL_{i}") for i in range(n)]


def hf_task(folder: Path, kind: str) -> Task:
    """The ctxkit task of an HF task checkpoint (see the module docstring)."""
    config = read_config(folder)
    longest = int(config.get("max_position_embeddings") or 512)
    if kind == "qa":
        return get_task("squad", max_seq_len=min(384, longest))
    labels = _labels(config, folder)
    if kind == "token":
        return get_task("conll2003", labels=labels, max_length=min(512, longest))
    regression = config.get("problem_type") == "regression" or len(labels) == 1
    return get_task("table", labels=None if regression else labels, regression=regression, max_length=min(512, longest))


def _head_state(folder: Path, kind: str) -> Dict[str, object]:
    prefixes = _HEAD_PREFIXES[kind]
    return {k: v for k, v in read_weights(folder).items() if k.startswith(prefixes)}


def load_hf_task_model(folder: Path, kind: str, task: Task) -> Tuple[nn.Module, str]:
    """``(model, architecture)``: the checkpoint's encoder with its own head, in eval mode.

    Raises:
        CheckpointError: head tensors missing or misshaped (every key listed).
    """
    folder = Path(folder)
    head = _head_state(folder, kind)
    if not head:
        raise CheckpointError(f"{folder}: its config.json names a {kind} task model, but the weights hold no "
                              f"{' or '.join(_HEAD_PREFIXES[kind])} tensors")
    encoder = load_encoder(folder, heads_used=True)
    hidden = encoder.config.hidden_size
    if kind == "qa":
        model = task.build_model(encoder)
        load_state_dict_strict(model.head, head, source=str(folder))
    elif kind == "token":
        model = EncoderWithHead(encoder, TokenClassificationHead(hidden, len(task.labels), 0.0))
        load_state_dict_strict(model.head, head, source=str(folder))
    else:
        num = 1 if task.is_regression else len(task.labels)
        seq_head = SequenceClassificationHead(hidden, num, 0.0, pre_classifier="pre_classifier.weight" in head)
        model = EncoderWithHead(encoder, seq_head, cls_only=True)
        load_state_dict_strict(model.head, head, source=str(folder))
    arch = (read_config(folder).get("architectures") or ["?"])[0]
    return model.eval(), arch
