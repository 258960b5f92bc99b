"""XLNet pretraining: permutation language modelling with partial prediction (Yang et al. 2019).

Data comes from the BERT pretraining shards (``ctxkit pretrain-data``,
:class:`~ctxkit.pretraining.shards.PretrainDataset`) or from plain token-id sequences.
:class:`XLNetCollator` turns each instance into XLNet's layout, with the special tokens
at the end::

    shard instance  [CLS] A [SEP] B [SEP]   ->   A <sep> B <sep> <cls>
    token types                                  0  0     1  1     2
    plain sequence  x                       ->   x <sep> <cls>       (types 0 0 2)

The shards are WordPiece-tokenised, so the WordPiece ids stand in for XLNet's
SentencePiece specials: ``<sep>`` = ``[SEP]`` (``sep_id``), ``<cls>`` = ``[CLS]``
(``cls_id``), ``<pad>`` = ``[PAD]`` (``pad_id``), taken from the shards' ``meta.json`` (or
given). Sequences are padded on the right; padding is masked out as keys.

Per sequence, :func:`~ctxkit.models.xlnet.model.sample_permutation_masks` draws a factorisation
order over the *content* tokens (padding and ``<sep>``/``<cls>`` are never targets: they
are context visible to every token) and the last ``num_predict = max(1, round(n / K))``
tokens of it are predicted, ``n`` being the number of content tokens of that sequence
(``K = 6`` as in the paper). Rows with fewer targets than the batch's maximum get zero
``target_mapping`` rows labelled ``-100`` (ignored by the loss).

The loss is the cross-entropy of the query-stream logits at the target positions.
Training runs in the shared :class:`~ctxkit.training.Trainer` (checkpoints, exact resume
with the collator's RNG, logging); the final model is written in the Hugging Face layout
by :func:`~ctxkit.models.xlnet.model.save_xlnet`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models.xlnet.model import XLNetConfig
from ..models.xlnet.model import XLNetLMHeadModel, sample_permutation_masks, save_xlnet
from ..training import TrainConfig, Trainer, set_seed
from ..training.callbacks import Callback
from ..core.diskspace import is_out_of_space
from ..core.errors import UserError
from ..core.run_state import save_final
from .shards import PretrainDataset
from ..tokenizers import WordPieceTokenizer

__all__ = ["IGNORE_INDEX", "XLNetCollator", "XLNetPretrainingModel", "permutation_lm_loss", "to_xlnet_layout",
           "pretrain_xlnet"]

logger = logging.getLogger("ctxkit")
IGNORE_INDEX = -100


def to_xlnet_layout(feature: Union[Mapping, Sequence[int]], cls_id: int, sep_id: int):
    """``(ids, token_types, is_content)`` lists of one instance in XLNet's layout (see the
    module doc). A mapping with ``token_type_ids`` is a shard instance ``[CLS] A [SEP] B
    [SEP]``; a plain sequence (or a mapping with ``input_ids`` only) is one segment."""
    if isinstance(feature, Mapping):
        ids = [int(t) for t in feature["input_ids"]]
        types = feature.get("token_type_ids")
    else:
        ids, types = [int(t) for t in feature], None
    if types is not None and ids and ids[0] == cls_id:
        len_a = sum(1 for t in types if int(t) == 0)  # [CLS] A [SEP]
        a, b = ids[1:len_a - 1], ids[len_a:-1]  # without [CLS], the first and the last [SEP]
        out = a + [sep_id] + (b + [sep_id] if b else []) + [cls_id]
        tt = [0] * (len(a) + 1) + ([1] * (len(b) + 1) if b else []) + [2]
        content = [True] * len(a) + [False] + ([True] * len(b) + [False] if b else []) + [False]
        return out, tt, content
    return ids + [sep_id, cls_id], [0] * (len(ids) + 1) + [2], [True] * len(ids) + [False, False]


class XLNetCollator:
    """Pad a list of instances and draw permutation masks, for the Trainer's ``collate_fn``.

    Args:
        pad_id, cls_id, sep_id: the ids used as ``<pad>``, ``<cls>``, ``<sep>``.
        K: predict about ``1/K`` of the content tokens of every sequence.
        seed: with a ``key`` (the Trainer passes ``(epoch, batch[, rank])``) a batch's
            masks depend only on ``(seed, key)``; without one successive calls draw from
            one generator (saved by :meth:`state_dict` for exact resume).
        multiple_of: pad the sequence length up to a multiple of this.

    Returns (on call):
        ``input_ids``, ``token_type_ids``, ``attention_mask`` ``(batch, seq)``;
        ``perm_mask`` ``(batch, seq, seq)`` (1 = may not attend); ``target_mapping``
        ``(batch, P, seq)`` one-hot (zero rows for padding targets); ``labels`` ``(batch,
        P)`` the ids at the target positions, ``-100`` on padding targets; ``num_predict``
        ``(batch,)``. ``P`` is the largest ``num_predict`` of the batch.
    """

    keyed = True

    def __init__(self, pad_id: int, cls_id: int, sep_id: int, K: float = 6, seed: int = 0, multiple_of: int = 1):
        if K < 1:
            raise UserError(f"K must be >= 1, got {K}")
        self.pad_id, self.cls_id, self.sep_id, self.K = pad_id, cls_id, sep_id, K
        self.seed, self.multiple_of = seed, max(1, multiple_of)
        self.generator = torch.Generator().manual_seed(seed)

    def num_predict(self, n_content: int) -> int:
        """Targets of a sequence with ``n_content`` content tokens: ``max(1, round(n / K))``."""
        return min(n_content, max(1, round(n_content / self.K)))

    def __call__(self, features: Sequence, key: Optional[Sequence[int]] = None) -> Dict[str, Tensor]:
        rows = [to_xlnet_layout(f, self.cls_id, self.sep_id) for f in features]
        if any(sum(c) == 0 for _, _, c in rows):
            raise UserError("an instance has no content tokens to predict")
        seq = max(len(ids) for ids, _, _ in rows)
        seq = -(-seq // self.multiple_of) * self.multiple_of
        batch = len(rows)
        input_ids = torch.full((batch, seq), self.pad_id, dtype=torch.long)
        token_type = torch.zeros(batch, seq, dtype=torch.long)
        attention = torch.zeros(batch, seq, dtype=torch.long)
        content = torch.zeros(batch, seq, dtype=torch.long)
        for i, (ids, tt, c) in enumerate(rows):
            input_ids[i, :len(ids)] = torch.tensor(ids)
            token_type[i, :len(ids)] = torch.tensor(tt)
            token_type[i, len(ids):] = tt[-1]
            attention[i, :len(ids)] = 1
            content[i, :len(ids)] = torch.tensor(c, dtype=torch.long)
        generator = self.generator
        if key is not None:
            generator = torch.Generator().manual_seed(int(np.random.SeedSequence([self.seed, *map(int, key)]).generate_state(1)[0]))
        n_pred = [self.num_predict(int(c.sum())) for c in content]
        width = max(n_pred)
        perm_mask = torch.zeros(batch, seq, seq)
        target_mapping = torch.zeros(batch, width, seq)
        labels = torch.full((batch, width), IGNORE_INDEX, dtype=torch.long)
        for i, n in enumerate(n_pred):
            m = sample_permutation_masks(input_ids[i:i + 1], n, attention_mask=content[i:i + 1], generator=generator)
            perm_mask[i] = m.perm_mask[0]
            target_mapping[i, :n] = m.target_mapping[0]
            labels[i, :n] = input_ids[i, m.target_positions[0]]
        return {"input_ids": input_ids, "token_type_ids": token_type, "attention_mask": attention, "perm_mask": perm_mask,
                "target_mapping": target_mapping, "labels": labels, "num_predict": torch.tensor(n_pred)}

    def state_dict(self) -> Dict[str, Tensor]:
        """The generator state, for exact resume."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Restore :meth:`state_dict`."""
        self.generator.set_state(state["generator"])


def permutation_lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy of query-stream ``logits`` ``(batch, P, vocab)`` against
    ``labels`` ``(batch, P)``; ``-100`` (padding targets) is ignored."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


class XLNetPretrainingModel(nn.Module):
    """:class:`XLNetLMHeadModel` plus the permutation-LM loss, for the Trainer
    (``forward(**batch) -> {"loss", "acc"}``)."""

    def __init__(self, config: XLNetConfig):
        super().__init__()
        self.config = config
        self.xlnet = XLNetLMHeadModel(config)

    def forward(self, input_ids: Tensor, perm_mask: Tensor, target_mapping: Tensor, labels: Tensor,
                token_type_ids: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None, **_) -> dict:
        logits = self.xlnet(input_ids, attention_mask, token_type_ids=token_type_ids, perm_mask=perm_mask, target_mapping=target_mapping)
        loss = permutation_lm_loss(logits, labels)
        valid = labels != IGNORE_INDEX
        acc = ((logits.argmax(-1) == labels) & valid).sum() / valid.sum().clamp(min=1)
        return {"loss": loss, "acc": acc.detach()}


def pretrain_xlnet(data: Union[os.PathLike, str, Sequence], arch: XLNetConfig, out_dir: os.PathLike, config: TrainConfig,
                   K: float = 6, resume: bool = False, special_ids: Optional[Mapping[str, int]] = None,
                   tokenizer_dir: Optional[os.PathLike] = None, callbacks: Optional[Sequence[Callback]] = None) -> dict:
    """Pretrain an XLNet from scratch with permutation LM.

    Args:
        data: a shard folder (``ctxkit pretrain-data``) or a sequence of features (dicts
            with ``input_ids`` and optionally ``token_type_ids``).
        arch: the architecture; with shards its ``vocab_size`` is set from them.
        out_dir: run folder (``log.jsonl``, ``checkpoint/``, ``final/`` in HF layout,
            ``summary.json``).
        config: Trainer hyper-parameters.
        K: predict about ``1/K`` of the tokens.
        resume: continue from ``out_dir/checkpoint`` exactly.
        special_ids: ``pad_id``, ``cls_id``, ``sep_id`` (default: from the shards' meta).
        tokenizer_dir: tokenizer saved next to the final model (default: the shards'
            tokenizer, when its folder still exists).
        callbacks: also receive the training log (:mod:`ctxkit.training.callbacks`).

    Returns:
        A summary dict (steps, final loss and accuracy, wall time, ``final`` folder).
    """
    if isinstance(data, (str, os.PathLike)):
        features = PretrainDataset(data)
        ids = {"pad_id": features.pad_id, "cls_id": features.cls_id, "sep_id": features.sep_id, **(special_ids or {})}
        arch = arch.replace(vocab_size=features.vocab_size)
        tokenizer_dir = tokenizer_dir or features.meta["tokenizer"].get("path")
    else:
        features = [f if isinstance(f, Mapping) else {"input_ids": [int(t) for t in f]} for f in data]
        if special_ids is None:
            raise UserError("special_ids (pad_id, cls_id, sep_id) are needed for plain sequences")
        ids = dict(special_ids)
    set_seed(config.seed)  # the initial weights depend on the seed alone
    model = XLNetPretrainingModel(arch)
    collator = XLNetCollator(ids["pad_id"], ids["cls_id"], ids["sep_id"], K=K, seed=config.seed,
                             multiple_of=max(config.pad_multiple, 1))
    trainer = Trainer(model, features, config, out_dir, collate_fn=collator, callbacks=callbacks)
    result = trainer.train(resume=resume)
    if result.stopped == "signal":  # stopped by SIGTERM/SIGUSR1: checkpoint/ holds the run; no final/ of a partial one
        return {"steps": result.steps, "stopped": {"reason": "signal", "step": result.steps,
                                                   "resume": "ctxkit pretrain-xlnet ... --resume continues exactly"}}

    def write(folder: Path) -> None:
        save_xlnet(model.xlnet, folder)
        if tokenizer_dir and Path(tokenizer_dir).is_dir():
            try:
                WordPieceTokenizer.from_dir(tokenizer_dir).save(folder)
            except Exception as exc:  # the model is still usable without it, but not on a full disk
                if is_out_of_space(exc):
                    raise
                logger.warning("tokenizer %s not saved with the model: %s", tokenizer_dir, exc)

    # Replaced as a unit; a full disk: one line naming the checkpoint that is intact.
    final = save_final(out_dir, write, model.xlnet.state_dict())
    log = [json.loads(line) for line in (Path(out_dir) / "log.jsonl").read_text().splitlines()]
    last = next((r for r in reversed(log) if r.get("event") == "train"), {})
    summary = {"steps": result.steps, "wall_time_s": round(result.wall_time, 1), "final": str(final), "K": K,
               **{k: last[k] for k in ("loss", "acc", "seq_per_s", "tokens_per_s") if k in last}}
    (Path(out_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
