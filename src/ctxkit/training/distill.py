"""Knowledge distillation (Hinton et al. 2015; DistilBERT, Sanh et al. 2019): the losses, the
student built from a teacher's layers, and the objective the :class:`Trainer` optimises.

* :func:`soft_target_loss`: ``T^2 * KL(softmax(teacher / T) || softmax(student / T))``,
  averaged over the rows that count (sentences, labelled tokens, span positions). The
  ``T^2`` keeps the gradient's size independent of ``T`` (Hinton et al., section 2).
* :func:`cosine_loss`: ``1 - cos(student hidden, teacher hidden)`` per token, averaged over
  real tokens (DistilBERT's third loss; it needs equal widths).
* :func:`distilbert_loss`: DistilBERT's triple loss, ``alpha_ce * soft + alpha_mlm * MLM +
  alpha_cos * cosine`` (their defaults 5, 2, 1 and ``T = 2``).
* :func:`student_from_teacher`: a BERT-family encoder keeping some of the teacher's layers
  (``every_other_layer``: DistilBERT's initialisation), with its embeddings and pooler.
* :class:`DistillationObjective`: wraps a task model (the student) so that
  ``forward(**batch, teacher_logits=...)`` returns ``alpha * soft + (1 - alpha) * hard``; the
  teacher's logits come with the batch (computed once, cached on disk; see
  :mod:`ctxkit.tasks.distill`), so no teacher runs during training.
"""

from __future__ import annotations

import copy
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import UserError

#: the label of a transfer-set row (text the teacher labels, no gold label): soft loss only
UNLABELLED = -100

__all__ = ["UNLABELLED", "soft_target_loss", "cosine_loss", "distilbert_loss", "student_from_teacher", "every_other_layer",
           "DistillationObjective"]


def soft_target_loss(student: Tensor, teacher: Tensor, temperature: float = 2.0, mask: Optional[Tensor] = None) -> Tensor:
    """``T^2 * KL(p_teacher || p_student)`` with both distributions softened by ``T``.

    Args:
        student: logits ``(..., classes)``.
        teacher: logits of the same shape.
        temperature: ``T`` > 0.
        mask: ``(...)`` bool / 0-1: the rows that count (e.g. labelled tokens); None: all.

    Returns:
        A scalar: the mean over counted rows of ``T^2 * sum_c p_t (log p_t - log p_s)``.
    """
    if temperature <= 0:
        raise UserError(f"temperature must be > 0, got {temperature}")
    if student.shape != teacher.shape:
        raise UserError(f"student logits {tuple(student.shape)} and teacher logits {tuple(teacher.shape)} differ")
    log_p_s = F.log_softmax(student.float() / temperature, dim=-1)
    log_p_t = F.log_softmax(teacher.float() / temperature, dim=-1)
    per_row = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1) * temperature ** 2
    if mask is None:
        return per_row.mean()
    mask = mask.to(per_row.dtype)
    return (per_row * mask).sum() / mask.sum().clamp(min=1)


def cosine_loss(student: Tensor, teacher: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Mean over counted tokens of ``1 - cos(student_i, teacher_i)``; hidden states ``(batch, seq, d)``."""
    per_token = 1 - F.cosine_similarity(student.float(), teacher.float(), dim=-1)
    if mask is None:
        return per_token.mean()
    mask = mask.to(per_token.dtype)
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def distilbert_loss(student_logits: Tensor, teacher_logits: Tensor, labels: Tensor, student_hidden: Tensor,
                    teacher_hidden: Tensor, attention_mask: Tensor, temperature: float = 2.0, alpha_ce: float = 5.0,
                    alpha_mlm: float = 2.0, alpha_cos: float = 1.0) -> Dict[str, Tensor]:
    """DistilBERT's triple loss on a masked-LM batch.

    Args:
        student_logits, teacher_logits: ``(batch, seq, vocab)`` MLM logits.
        labels: ``(batch, seq)`` MLM targets, -100 where nothing is predicted.
        student_hidden, teacher_hidden: ``(batch, seq, d)`` last hidden states.
        attention_mask: ``(batch, seq)`` 1 on real tokens.

    Returns:
        ``{"loss", "soft", "mlm", "cosine"}``; ``loss`` is the weighted sum.
    """
    predicted = labels != -100
    soft = soft_target_loss(student_logits, teacher_logits, temperature, mask=predicted)
    mlm = F.cross_entropy(student_logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
    cos = cosine_loss(student_hidden, teacher_hidden, mask=attention_mask.bool())
    return {"loss": alpha_ce * soft + alpha_mlm * mlm + alpha_cos * cos, "soft": soft, "mlm": mlm, "cosine": cos}


def every_other_layer(num_layers: int, keep: int) -> List[int]:
    """DistilBERT's choice of teacher layers: ``keep`` of ``num_layers``, evenly spaced from the
    first (6 of 12: 0, 2, ..., 10; 3 of 6: 0, 2, 4)."""
    if not 1 <= keep <= num_layers:
        raise UserError(f"a student keeps between 1 and {num_layers} layers, got {keep}")
    return [round(i * num_layers / keep) for i in range(keep)]


def student_from_teacher(teacher: nn.Module, layers: Sequence[int]) -> nn.Module:
    """A copy of a BERT-family encoder with only the teacher's ``layers`` (in that order).

    Embeddings, pooler and the chosen layers' weights are copied exactly; the config says
    the new depth.

    Raises:
        UserError: not a BERT-family encoder, or layer indices out of range.
    """
    stack = getattr(getattr(teacher, "encoder", None), "layers", None)
    if not isinstance(stack, nn.ModuleList) or not hasattr(getattr(teacher, "config", None), "num_layers"):
        raise UserError(f"distillation builds students of BERT-family encoders; got {type(teacher).__name__}")
    bad = [i for i in layers if not 0 <= i < len(stack)]
    if bad or not layers:
        raise UserError(f"teacher layers {list(layers)} are not in 0..{len(stack) - 1}")
    student = copy.deepcopy(teacher)
    student.encoder.layers = nn.ModuleList(copy.deepcopy(stack[i]) for i in layers)
    student.config = teacher.config.replace(num_layers=len(layers))
    return student


class DistillationObjective(nn.Module):
    """The student task model trained on ``alpha * soft + (1 - alpha) * hard``.

    ``forward(**batch)`` runs the student as the trainer would (its hard loss from the
    labels) and adds the soft-target loss against ``batch["teacher_logits"]``:

    * ``kind="sequence"``: logits ``(batch, classes)``; regression (one output): MSE to the
      teacher's prediction instead of KL; rows labelled :data:`UNLABELLED` (a transfer set
      of unlabelled text) have no hard loss;
    * ``kind="token"``: ``(batch, seq, classes)``, counted where ``labels != -100``;
    * ``kind="span"``: start and end logits ``(batch, seq)`` each against the teacher's
      ``teacher_logits[..., 0]`` / ``[..., 1]``, counted on real tokens, averaged.

    Args:
        student: the task model (an ``EncoderWithHead`` or ``SpanQAModel``).
        kind: ``"sequence"``, ``"token"`` or ``"span"``.
        temperature: ``T``.
        alpha: weight of the soft loss (0: plain fine-tuning of the same student).
        transfer: batches may hold transfer-set rows (label :data:`UNLABELLED`).
    """

    def __init__(self, student: nn.Module, kind: str, temperature: float = 2.0, alpha: float = 0.5, transfer: bool = False):
        super().__init__()
        if kind not in ("sequence", "token", "span"):
            raise UserError(f"kind must be sequence, token or span, got {kind!r}")
        if not 0 <= alpha <= 1:
            raise UserError(f"alpha must be in [0, 1], got {alpha}")
        if transfer and kind != "sequence":
            raise UserError("a transfer set of unlabelled text is for sentence and pair classification")
        self.student, self.kind, self.temperature, self.alpha, self.transfer = student, kind, temperature, alpha, transfer

    def forward(self, teacher_logits: Optional[Tensor] = None, **batch) -> Dict[str, Tensor]:
        labels = batch.get("labels")
        if self.transfer and labels is not None:
            # rows of a transfer set (label UNLABELLED) have the teacher's logits as their only
            # target; no host synchronisation here, so CUDA graphs can capture the step
            out = dict(self.student(**{k: v for k, v in batch.items() if k != "labels"}))
            known = (labels != UNLABELLED).sum().clamp(min=1)
            out["loss"] = F.cross_entropy(out["logits"].float(), labels, ignore_index=UNLABELLED, reduction="sum") / known
        else:
            out = self.student(**batch)
        if teacher_logits is None or self.alpha == 0 or "loss" not in out:
            return out
        soft = self.soft_loss(out, teacher_logits, batch)
        out = dict(out)
        out["hard_loss"], out["soft_loss"] = out["loss"], soft
        out["loss"] = self.alpha * soft + (1 - self.alpha) * out["loss"]
        return out

    def soft_loss(self, out: Dict[str, Tensor], teacher: Tensor, batch: Dict[str, Tensor]) -> Tensor:
        """The soft-target term of one batch (see the class docstring)."""
        T = self.temperature
        if self.kind == "span":
            mask = batch["attention_mask"].bool()
            start, end = out["start_logits"], out["end_logits"]
            seq = start.size(1)
            t_start, t_end = teacher[:, :seq, 0], teacher[:, :seq, 1]
            # padded positions carry -inf-like masked logits on both sides: compare real tokens only
            fill = torch.finfo(torch.float32).min / 4
            s = [x.float().masked_fill(~mask, fill) for x in (start, end)]
            t = [x.float().masked_fill(~mask, fill) for x in (t_start, t_end)]
            return 0.5 * (soft_target_loss(s[0], t[0], T) + soft_target_loss(s[1], t[1], T))
        logits = out["logits"]
        if self.kind == "token":
            teacher = teacher[:, : logits.size(1)]
            return soft_target_loss(logits, teacher, T, mask=batch["labels"] != -100)
        if logits.size(-1) == 1:  # regression: match the teacher's prediction
            return F.mse_loss(logits.float(), teacher.float())
        return soft_target_loss(logits, teacher, T)
