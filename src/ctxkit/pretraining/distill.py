"""Task-agnostic distillation (DistilBERT, Sanh et al. 2019) on pretraining shards.

``distill_pretrain(shards, teacher, out_dir, student_layers=3)``:

1. the teacher is a BERT-family checkpoint with its masked-LM head. A checkpoint released
   without one (sentence encoders such as all-MiniLM-L6-v2) first gets its head fitted with
   the body frozen (``head_steps`` steps of MLM on the same shards): the soft targets need a
   masked-LM distribution, and a random head would give noise;
2. the student keeps every other teacher layer (:func:`~ctxkit.training.distill.every_other_layer`)
   with the embeddings, pooler and heads;
3. the student trains on DistilBERT's triple loss over dynamically masked batches:
   ``alpha_ce * T^2 KL(teacher || student)`` on the masked positions, ``alpha_mlm *`` the MLM
   loss, ``alpha_cos *`` the cosine loss between last hidden states on real tokens. The
   teacher runs frozen, without gradients, in the same step (masks are drawn per step).
4. ``out_dir/final`` is an HF-layout BERT folder with the tokenizer: ``ctxkit finetune --model``
   takes it.

The same :class:`~ctxkit.training.Trainer` as ``ctxkit pretrain`` runs it (bf16, CUDA graphs,
exact resume, logs, curves).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.checkpoint import CheckpointMismatchError
from ..core.errors import UserError
from ..core.run_state import save_final
from ..models.bert.model import BertForPreTraining, load_bert, save_bert
from ..tokenizers import WordPieceTokenizer
from ..training import TrainConfig, Trainer, set_seed
from ..training.callbacks import Callback
from ..training.distill import distilbert_loss, every_other_layer, student_from_teacher
from ..zoo import checkpoint_folder
from .masking import MaskingConfig, MLMCollator
from .shards import PretrainDataset, vocab_sha256

__all__ = ["MLMDistillation", "HeadFitting", "distill_pretrain"]

logger = logging.getLogger("ctxkit")
IGNORE_INDEX = -100


def _mlm(model: BertForPreTraining, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Optional[Tensor],
         masked_positions: Tensor):
    """``(mlm logits (batch, n_masked, vocab), last hidden state (batch, seq, d))``."""
    out = model.bert(input_ids, attention_mask, token_type_ids=token_type_ids)
    hidden = out.last_hidden_state
    picked = hidden.gather(1, masked_positions[..., None].expand(-1, -1, hidden.size(-1)))
    return model.mlm(picked, model.bert.embeddings.word_embeddings.weight), hidden


class HeadFitting(nn.Module):
    """The teacher's masked-LM head trained alone (the body frozen): ``loss`` = MLM."""

    def __init__(self, model: BertForPreTraining):
        super().__init__()
        self.model = model
        model.bert.requires_grad_(False)

    def forward(self, input_ids, token_type_ids, masked_positions, masked_labels, attention_mask=None, **_) -> dict:
        with torch.no_grad():
            hidden = self.model.bert(input_ids, attention_mask, token_type_ids=token_type_ids).last_hidden_state
        picked = hidden.gather(1, masked_positions[..., None].expand(-1, -1, hidden.size(-1)))
        logits = self.model.mlm(picked, self.model.bert.embeddings.word_embeddings.weight)
        loss = F.cross_entropy(logits.float().flatten(0, 1), masked_labels.flatten(), ignore_index=IGNORE_INDEX)
        return {"loss": loss}


class MLMDistillation(nn.Module):
    """Student and frozen teacher on one masked batch: DistilBERT's triple loss.

    The teacher stays in eval mode (no dropout) whatever the trainer sets, and takes no
    gradient; its parameters are not trained (``requires_grad`` False).
    """

    def __init__(self, teacher: BertForPreTraining, student: BertForPreTraining, temperature: float = 2.0,
                 alpha_ce: float = 5.0, alpha_mlm: float = 2.0, alpha_cos: float = 1.0):
        super().__init__()
        self.teacher, self.student = teacher.requires_grad_(False), student
        self.temperature, self.alphas = temperature, (alpha_ce, alpha_mlm, alpha_cos)
        self.teacher.eval()

    def train(self, mode: bool = True) -> "MLMDistillation":
        super().train(mode)
        self.teacher.eval()
        return self

    def forward(self, input_ids, token_type_ids, masked_positions, masked_labels, attention_mask=None, **_) -> dict:
        with torch.no_grad():
            t_logits, t_hidden = _mlm(self.teacher, input_ids, token_type_ids, attention_mask, masked_positions)
        s_logits, s_hidden = _mlm(self.student, input_ids, token_type_ids, attention_mask, masked_positions)
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        a_ce, a_mlm, a_cos = self.alphas
        out = distilbert_loss(s_logits, t_logits, masked_labels, s_hidden, t_hidden, mask, self.temperature, a_ce, a_mlm, a_cos)
        return {"loss": out["loss"], "soft_loss": out["soft"].detach(), "mlm_loss": out["mlm"].detach(),
                "cos_loss": out["cosine"].detach()}


def _teacher(name: str) -> Tuple[BertForPreTraining, bool]:
    """The teacher with its masked-LM head; a checkpoint without one gets fresh heads (to fit)."""
    folder = checkpoint_folder(name, verify=False)
    try:
        return load_bert(folder, with_heads=True), True
    except CheckpointMismatchError as err:
        if err.missing and all(not k.startswith("bert.") for k in err.missing) and not err.misshaped:  # the heads only
            encoder = load_bert(folder)
            model = BertForPreTraining(encoder.config)
            model.bert.load_state_dict(encoder.state_dict())
            logger.info("%s has no masked-LM head: it is fitted first, with the body frozen", name)
            return model, False
        raise


def _stopped_by_signal(step: int, phase: str) -> dict:
    """The summary of a run a signal stopped (its checkpoint written), for ``signal_status``."""
    return {"steps": step, "stopped": {"reason": "signal", "step": step, "at": f"step {step} of {phase}",
                                       "resume": "ctxkit distill-pretrain ... --resume continues exactly"}}


def distill_pretrain(shards: os.PathLike, teacher: str, out_dir: os.PathLike, config: TrainConfig, student_layers: int = 3,
                     temperature: float = 2.0, alpha_ce: float = 5.0, alpha_mlm: float = 2.0, alpha_cos: float = 1.0,
                     head_steps: int = 500, masking: MaskingConfig = MaskingConfig(max_predictions=20), resume: bool = False,
                     callbacks: Optional[Sequence[Callback]] = None) -> dict:
    """Distil ``teacher`` into a ``student_layers``-layer student on pretraining shards (see the
    module docstring). ``config.max_steps`` bounds the student's training.

    Returns:
        A summary: steps, the last losses, ``final`` (the student's folder), the teacher layers kept.
    """
    data = PretrainDataset(shards)
    tok_dir = checkpoint_folder(teacher, verify=False)
    tokenizer = WordPieceTokenizer.from_dir(tok_dir)
    recorded = data.meta["tokenizer"].get("vocab_sha256")
    if recorded and recorded != vocab_sha256(tokenizer):
        raise UserError(f"{shards} were built with another vocabulary than {teacher}'s (SHA-256 differs)")
    out = Path(out_dir)
    set_seed(config.seed)
    model, has_head = _teacher(teacher)
    collator = MLMCollator(tokenizer, masking, seed=config.seed, multiple_of=max(config.pad_multiple, 1))
    if not has_head:
        head_dir = out / "teacher_head"
        if (head_dir / "final" / "model.safetensors").is_file():
            model = load_bert(head_dir / "final", with_heads=True)
        else:
            head_cfg = dataclasses.replace(config, max_steps=head_steps)
            fitted = Trainer(HeadFitting(model), data, head_cfg, head_dir, collate_fn=collator, callbacks=callbacks).train(resume=resume)
            if fitted.stopped == "signal":  # SIGTERM/SIGUSR1: teacher_head/checkpoint holds the fit; --resume goes on from it
                return _stopped_by_signal(fitted.steps, "fitting the teacher's head")
            model.bert.requires_grad_(True)
            save_bert(model, head_dir / "final", tokenizer)
    layers = every_other_layer(model.config.num_layers, student_layers)
    student = BertForPreTraining(model.config.replace(num_layers=student_layers))
    student.bert = student_from_teacher(model.bert, layers)
    student.mlm.load_state_dict(model.mlm.state_dict())
    student.nsp.load_state_dict(model.nsp.state_dict())
    objective = MLMDistillation(model, student, temperature, alpha_ce, alpha_mlm, alpha_cos)
    collator = MLMCollator(tokenizer, masking, seed=config.seed + 1, multiple_of=max(config.pad_multiple, 1))
    result = Trainer(objective, data, config, out, collate_fn=collator, callbacks=callbacks).train(resume=resume)
    if result.stopped == "signal":  # SIGTERM/SIGUSR1: checkpoint/ holds the run; no final/ of a partial student
        return _stopped_by_signal(result.steps, "training the student")
    # Replaced as a unit; a full disk: one line naming the checkpoint that is intact.
    final = save_final(out, lambda folder: save_bert(student.bert, folder, tokenizer), student.bert.state_dict())
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    last = next((r for r in reversed(log) if r.get("event") == "train"), {})
    summary = {"teacher": teacher, "teacher_layers_kept": layers, "head_fitted": not has_head, "steps": result.steps,
               "wall_time_s": round(result.wall_time, 1), "final": str(final),
               **{k: last[k] for k in ("loss", "soft_loss", "mlm_loss", "cos_loss", "seq_per_s") if k in last}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
