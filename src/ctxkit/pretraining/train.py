"""BERT pretraining: masked LM + next-sentence prediction on shards from ``pretrain-data``.

The MLM head projects to the vocabulary only at the masked positions (the collator
gathers them first), which saves most of the largest matrix product of the step. Training
itself is the shared :class:`~ctxkit.training.Trainer` (warmup + linear decay, bf16,
whole-step CUDA graphs, exact resume including the masking RNG, DDP or FSDP2 under
torchrun).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models.bert.model import BertForPreTraining, save_bert
from ..models.bert.model import BertConfig, get_preset
from ..core.device import autocast, resolve_device
from ..data.batching import balanced_batch_tokens, balanced_batches
from ..training import TrainConfig, Trainer, set_seed
from ..training.callbacks import Callback
from .masking import IGNORE_INDEX, MaskingConfig, MLMCollator, packed_mask_slots
from .shards import PretrainDataset, vocab_sha256
from ..core.errors import UserError
from ..core.run_state import save_final
from ..tokenizers import WordPieceTokenizer

__all__ = ["PretrainingModel", "bucket_batches", "default_pretrain_lr", "held_out_evaluation", "length_buckets", "training_flops_per_token", "pretrain"]

logger = logging.getLogger("ctxkit")


class PretrainingModel(nn.Module):
    """:class:`BertForPreTraining` plus the two losses and their accuracies.

    Args:
        config: the architecture.
    """

    def __init__(self, config: BertConfig, max_seq_len: int = 512):
        super().__init__()
        self.config = config
        self.bert = BertForPreTraining(config)
        # Bounds every sequence of a packed batch (the attention kernel is sized by it).
        self.max_seq_len = max_seq_len

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, masked_labels: Tensor, next_sentence_label: Tensor,
                masked_positions: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None, position_ids: Optional[Tensor] = None,
                cu_seqlens: Optional[Tensor] = None, seq_starts: Optional[Tensor] = None, query_positions: Optional[Tensor] = None,
                cu_seqlens_q: Optional[Tensor] = None, masked_rows: Optional[Tensor] = None, **_) -> dict:
        """Losses for one batch, padded or packed.

        Args:
            input_ids, token_type_ids: ``(batch, seq)``, masked inputs; packed: ``(1, width)``.
            attention_mask: ``(batch, seq)``, 1 for real tokens; None when nothing is padded.
            masked_positions: ``(batch, n_masked)`` positions to predict (padded with 0),
                within each sequence; None when packed.
            masked_labels: ``(batch, n_masked)`` original ids, -100 on padding; packed,
                ``(1, slots)``.
            next_sentence_label: ``(batch,)``, 0 = B follows A, 1 = random B.
            position_ids, cu_seqlens, seq_starts, query_positions, cu_seqlens_q, masked_rows: a
                packed batch's (:class:`~ctxkit.pretraining.masking.MLMCollator` with
                ``pack_width``; see :meth:`BertForPreTraining.forward_packed`).

        Returns:
            ``loss`` (MLM + NSP), ``mlm_loss``, ``nsp_loss``, ``mlm_acc``, ``nsp_acc``.
        """
        if cu_seqlens is not None:
            mlm_logits, nsp_logits = self.bert.forward_packed(input_ids, token_type_ids, position_ids, cu_seqlens, self.max_seq_len,
                                                              seq_starts, query_positions, cu_seqlens_q, masked_rows)
        else:
            mlm_logits, nsp_logits = self.bert(input_ids, attention_mask, token_type_ids=token_type_ids, masked_positions=masked_positions)
        # Losses in at least float32 (bf16 logits lose the softmax's small terms); a float64
        # model keeps float64.
        wide = torch.promote_types(mlm_logits.dtype, torch.float32)
        mlm_loss = F.cross_entropy(mlm_logits.to(wide).flatten(0, 1), masked_labels.flatten(), ignore_index=IGNORE_INDEX)
        nsp_loss = F.cross_entropy(nsp_logits.to(wide), next_sentence_label)
        valid = masked_labels != IGNORE_INDEX
        mlm_acc = ((mlm_logits.argmax(-1) == masked_labels) & valid).sum() / valid.sum().clamp(min=1)
        scored = next_sentence_label != IGNORE_INDEX  # rows a collator added to fill a batch have no targets
        nsp_acc = ((nsp_logits.argmax(-1) == next_sentence_label) & scored).sum() / scored.sum().clamp(min=1)
        return {"loss": mlm_loss + nsp_loss, "mlm_loss": mlm_loss.detach(), "nsp_loss": nsp_loss.detach(),
                "mlm_acc": mlm_acc.detach(), "nsp_acc": nsp_acc.detach()}


def length_buckets(max_len: int) -> tuple:
    """The sequence lengths pretraining batches are padded to when shapes must stay fixed:
    half and full length, multiples of 16 (tensor-core friendly)."""
    half = max(16, -(-(max_len // 2) // 16) * 16)
    return tuple(sorted({min(half, max_len), max_len}))


def bucket_batches(lengths: Sequence[int], data, collator: MLMCollator) -> List[Dict[str, Tensor]]:
    """One collated batch per length bucket the data will fill (what the run compiles).

    For each of ``collator.lengths``, the data's first sequence that only that bucket takes
    plus rows that fit it, collated with a key no training batch uses (the masks a
    keyed collator draws for the run stay as they are). A bucket no sequence needs (no
    short pair in the data) gets no batch, as it never gets a step.
    """
    lengths = np.asarray(lengths)
    batches, below = [], 0
    for k, size in enumerate(collator.lengths or ()):
        own = np.flatnonzero((lengths > below) & (lengths <= size))
        if len(own):
            fits = np.flatnonzero(lengths <= size)[: max(collator.rows or 1, 1)]
            rows = [int(own[0])] + [int(i) for i in fits if i != own[0]][: max(collator.rows or 1, 1) - 1]
            batches.append(collator([data[i] for i in rows], key=(2**32 - 1, k)))  # an epoch no run reaches
        below = size
    return batches


def default_pretrain_lr(preset: str) -> float:
    """``ctxkit pretrain``'s peak learning rate when none is given: BERT's 1e-4 (batch 256)
    for presets 768 wide and wider, 1e-3 for the small ones. 1e-3 diverges on BERT-base: on
    the Wikipedia extract the loss became NaN between steps 400 and 800 (H200, bf16)."""
    return 1e-4 if get_preset(preset).config.hidden_size >= 768 else 1e-3


def training_flops_per_token(config: BertConfig, seq_len: float, masked_fraction: float = 0.15) -> float:
    """Training FLOPs per token (forward + backward = 3x forward), the usual MFU count.

    ``6 * N`` for the Transformer weights (embeddings are lookups, not matmuls), ``12 * L
    * H * seq`` for the attention scores and their use, and ``6 * H * V`` for the MLM
    projection on the masked share of the tokens only.
    """
    h, layers, ffn = config.hidden_size, config.num_layers, config.ffn_size
    per_layer = 4 * h * h + 2 * h * ffn  # q, k, v, out + two FFN matrices
    dense = layers * per_layer + 2 * h * h  # + pooler-sized MLM transform
    return 6 * dense + 12 * layers * h * seq_len + 6 * h * config.vocab_size * masked_fraction


#: collated held-out batches kept between evaluations up to this many bytes (a larger held-out
#: set is collated again each time)
EVAL_CACHE_BYTES = 512 << 20


def held_out_evaluation(data: PretrainDataset, collator: MLMCollator, batch_size: int, device: torch.device, precision: str):
    """An ``evaluate(model)`` for the Trainer: MLM loss and accuracy and NSP accuracy on
    held-out shards, with the same masks at every evaluation (keyed batches), so the
    numbers of two epochs compare.

    The model runs eagerly (``torch.compiler.set_stance("force_eager")`` where torch has
    it): its compiled graphs are specialised for training, and an evaluation shape or eval
    mode would compile new ones, seconds each, in the middle of the run.
    """

    kept: List[Dict[str, torch.Tensor]] = []
    complete = [False]

    def batches() -> Iterator[Dict[str, torch.Tensor]]:
        # The masks are the same at every evaluation, so the collated batches are kept (up to
        # EVAL_CACHE_BYTES; pinned on a GPU, so the copies are asynchronous): an evaluation at
        # every epoch boundary then does not collate on the host while the GPU waits.
        if complete[0]:
            yield from kept
            return
        keep, total = True, 0
        kept.clear()
        for j, start in enumerate(range(0, len(data), batch_size)):
            batch = collator([data[i] for i in range(start, min(start + batch_size, len(data)))], key=(0, j))
            if device.type == "cuda":
                batch = {k: v.pin_memory() for k, v in batch.items()}
            if keep:
                total += sum(v.numel() * v.element_size() for v in batch.values())
                keep = total <= EVAL_CACHE_BYTES
                kept.append(batch) if keep else kept.clear()
            yield batch
        complete[0] = keep

    def evaluate(model: nn.Module) -> Dict[str, float]:
        stance = getattr(torch.compiler, "set_stance", None)
        eager = stance("force_eager") if stance is not None else contextlib.nullcontext()
        model.eval()
        sums = torch.zeros(5, dtype=torch.float64, device=device)  # mlm loss*n, mlm right, mlm n, nsp right, nsp n
        with torch.no_grad(), eager, autocast(device, precision):
            for batch in batches():
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                out = model(**batch)
                masked = (batch["masked_labels"] != IGNORE_INDEX).sum()
                scored = (batch["next_sentence_label"] != IGNORE_INDEX).sum()
                sums += torch.stack([out["mlm_loss"] * masked, out["mlm_acc"] * masked, masked, out["nsp_acc"] * scored,
                                     scored]).double()
        model.train()
        loss, right, n, nsp_right, nsp_n = sums.tolist()
        return {"mlm_loss": loss / max(n, 1), "mlm_acc": right / max(n, 1), "nsp_acc": nsp_right / max(nsp_n, 1),
                "sequences": len(data)}

    return evaluate


def pretrain(shards: os.PathLike, preset: str, out_dir: os.PathLike, config: TrainConfig, tokenizer_dir: Optional[os.PathLike] = None,
             masking: MaskingConfig = MaskingConfig(max_predictions=20), resume: bool = False,
             callbacks: Optional[Sequence[Callback]] = None, eval_data: Optional[os.PathLike] = None) -> dict:
    """Pretrain a BERT preset from scratch on pretraining shards.

    Args:
        shards: folder written by ``ctxkit pretrain-data``.
        preset: architecture (``bert_4_256_4``...); its vocabulary size comes from the shards.
        out_dir: run folder (``log.jsonl``, ``curve.png``, ``checkpoint/``, ``final/``).
        config: hyper-parameters (``max_steps`` bounds the run; epochs otherwise). Under
            ``torchrun`` with ``config.parallel="fsdp"`` the model is sharded over the
            ranks and gathered onto rank 0 to write ``final/``.
        tokenizer_dir: the tokenizer the shards were built with (default: the path recorded
            in their ``meta.json``); saved next to the final model so it can be fine-tuned.
        masking: dynamic masking settings.
        resume: continue from ``out_dir/checkpoint`` exactly.
        callbacks: also receive the training log (:mod:`ctxkit.training.callbacks`).
        eval_data: held-out shards (``pretrain-data`` with the same tokenizer): MLM loss and
            accuracy and NSP accuracy on them after every epoch and at a requested stop
            (``eval`` records in ``log.jsonl``), when ``config.eval_each_epoch``.

    Returns:
        A summary dict (steps, final losses and accuracies, wall time).
    """

    data = PretrainDataset(shards)
    tok_dir = Path(tokenizer_dir or data.meta["tokenizer"]["path"])
    tokenizer = WordPieceTokenizer.from_dir(tok_dir)
    recorded = data.meta["tokenizer"].get("vocab_sha256")
    if recorded and recorded != vocab_sha256(tokenizer):
        raise UserError(f"{tok_dir}: not the vocabulary the shards in {shards} were built with (SHA-256 differs)")
    arch = get_preset(preset).config.replace(vocab_size=tokenizer.vocab_size, max_position=max(512, data.meta["max_seq_len"]))
    set_seed(config.seed)  # the initial weights depend on the seed alone
    model = PretrainingModel(arch, max_seq_len=data.meta["max_seq_len"])
    collator = MLMCollator(tokenizer, masking, seed=config.seed, multiple_of=max(config.pad_multiple, 1))
    evaluate = None
    if eval_data is not None:
        held_out = PretrainDataset(eval_data)
        if held_out.meta["tokenizer"].get("vocab_sha256") != data.meta["tokenizer"].get("vocab_sha256"):
            raise UserError(f"{eval_data}: held-out shards built with another vocabulary than {shards}")
        evaluate = held_out_evaluation(held_out, MLMCollator(tokenizer, masking, seed=config.seed + 1, multiple_of=8),
                                       config.batch_size, resolve_device(config.device), config.precision)
    trainer = Trainer(model, data, config, out_dir, collate_fn=collator, evaluate=evaluate, main_metric="mlm_acc" if evaluate else None,
                      flops_per_token=lambda seq: training_flops_per_token(arch, seq, masking.mask_prob), callbacks=callbacks,
                      use="pretrain")
    if trainer.plan.pack_sequences:
        # Every batch one row of the same width (the most tokens a balanced batch holds,
        # rounded up): one shape, one compile, one CUDA graph, and no step spent on padding.
        rows, max_len = trainer.micro_batch, data.meta["max_seq_len"]
        most, fewest = balanced_batch_tokens(data.lengths, rows)
        collator.pack_width = -(-most // 64) * 64
        collator.pack_max_len, collator.rows = max_len, rows
        collator.pack_segments = -(-(collator.pack_width - fewest) // max_len) + 1
        # The MLM head's rows: what the batches can mask (short sequences mask fewer tokens
        # than the padded batch's rows * max_predictions), so no step computes unused ones.
        collator.pack_masked = packed_mask_slots(data.lengths, rows, masking)
        trainer.batch_former = balanced_batches
        first = balanced_batches(data.lengths, rows, config.seed, 0)[0]
        trainer.warm_batches = [collator([data[i] for i in first], key=(2**32 - 1, 0))]  # a key no training batch uses
    elif trainer.plan.compile != "off" or trainer.plan.cuda_graphs:
        # A fixed set of shapes whatever the length mix of the shards: each shape is a compile and
        # a CUDA graph, so half and full length (short pairs are BERT's 10 % of short targets) and
        # every batch at full rows (the epoch's last one filled with ignored copies).
        collator.lengths = length_buckets(data.meta["max_seq_len"])
        collator.rows = trainer.micro_batch // (trainer.world if trainer.graphed is None else 1)
        trainer.warm_batches = bucket_batches(data.lengths, data, collator)
    result = trainer.train(resume=resume)
    if result.stopped == "signal":  # stopped by SIGTERM/SIGUSR1: checkpoint/ holds the run; no final/ of a partial one
        return {"preset": preset, "steps": result.steps, "stopped": {
            "reason": "signal", "step": result.steps, "resume": "ctxkit pretrain ... --resume continues exactly from checkpoint/"}}
    final = Path(out_dir) / "final"
    if trainer.sharded:
        # Under FSDP each rank holds only shards of ``model``: gather the weights (every
        # rank takes part) into an unsharded copy on rank 0, which alone writes.
        state = trainer.full_state_dict()
        model = None
        if trainer.rank == 0:
            model = PretrainingModel(arch)
            model.load_state_dict(state)
    if model is not None:  # replaced as a unit; a full disk: one line naming the checkpoint that is intact
        save_final(out_dir, lambda folder: save_bert(model.bert, folder, tokenizer), model.bert.state_dict())
    log = [json.loads(line) for line in (Path(out_dir) / "log.jsonl").read_text().splitlines()]
    last = next((r for r in reversed(log) if r.get("event") == "train"), {})
    summary = {"preset": preset, "steps": result.steps, "wall_time_s": round(result.wall_time, 1), "final": str(final),
               **{k: last[k] for k in ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "seq_per_s", "tokens_per_s", "mfu") if k in last}}
    if model is not None:
        (Path(out_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if trainer.world > 1:
        torch.distributed.barrier()  # final/ (rank 0 writes it) is complete when any rank returns
    return summary
