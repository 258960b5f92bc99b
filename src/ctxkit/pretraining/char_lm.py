"""Training character-level language models, with Al-Rfou et al.'s auxiliary losses, and
bits per character.

Al-Rfou et al. (2018) train a 64-layer causal Transformer on 512-character segments; it
converges only with three auxiliary losses, each a switch of :class:`CharLMObjective`:

* **multiple positions** (``aux_positions``): predict the next character at every position
  of the segment, not only after the last one;
* **intermediate layers** (``aux_layers``): every layer predicts the next character too
  (through the shared classifier); layer ``l`` of ``L`` (1-based) stops contributing once
  ``l / (2L)`` of the training steps are done, so all are gone half-way and the last layer
  trains alone;
* **multiple targets** (the config's ``second_target``): a second classifier predicts the
  character after next, its loss weighted 0.5.

The layers' weights live in a device buffer compared with a step counter that the forward
pass advances in place, so the schedule needs no host synchronisation and survives CUDA
graph capture; the counter is saved with the model, so a resumed run continues the schedule.

Bits per character (bpc) is the mean negative log2-likelihood of each character: for the
Transformer by sliding windows of ``context`` characters advancing by ``stride`` (each
character scored once, with at least ``context - stride`` characters before it); for the
LSTM statefully, the state carried over the whole stream.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Dict, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..core.errors import UnknownNameError, UserError
from ..data.errors import check_input
from ..models.char_lm.model import CHAR_PRESETS, CharLSTMConfig, CharLSTMLM, CharTransformerConfig, CharTransformerLM, build_char_lm, load_char_lm, save_char_lm
from ..tokenizers.char import CharTokenizer
from ..training import TrainConfig, Trainer, resolve_device, set_seed
from ..training.callbacks import Callback
from .lm import LMBlocks, perplexity

__all__ = ["CharLMObjective", "bits_per_character", "read_char_stream", "train_char_lm"]

logger = logging.getLogger("ctxkit")

#: weight of the character-after-next loss (the paper's "multiple targets")
SECOND_TARGET_WEIGHT = 0.5


def _ce(logits: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy over ``(..., vocab)`` logits in at least float32 (bf16 logits from
    autocast would round the loss; float64 ones stay float64)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), reduction=reduction)


class CharLMObjective(nn.Module):
    """A character LM plus its training loss (what the :class:`~ctxkit.training.Trainer` calls).

    Args:
        model: a :class:`~ctxkit.models.char_lm.model.CharTransformerLM` or
            :class:`~ctxkit.models.char_lm.model.CharLSTMLM`.
        aux_positions: score every position (False: only the segment's last prediction).
        aux_layers: intermediate-layer losses with the phase-out schedule (Transformer only).

    The batch's ``input_ids`` are ``(batch, context + 1)`` characters: the model reads the
    first ``context`` and predicts characters 1..context (and 2..context with the second
    target).
    """

    def __init__(self, model: nn.Module, aux_positions: bool = True, aux_layers: bool = True):
        super().__init__()
        self.model = model
        self.aux_positions = aux_positions
        self.aux_layers = aux_layers and isinstance(model, CharTransformerLM)
        layers = model.config.num_layers if isinstance(model, CharTransformerLM) else 1
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        # Steps after which each layer's loss stops; "never" for the last layer.
        self.register_buffer("cutoffs", torch.full((layers,), torch.iinfo(torch.long).max, dtype=torch.long))

    def set_schedule(self, total_steps: int) -> None:
        """Layer ``l`` (1-based) of ``L`` contributes for the first ``l / (2L)`` of ``total_steps``."""
        layers = len(self.cutoffs)
        for i in range(layers - 1):
            self.cutoffs[i] = int((i + 1) / (2 * layers) * total_steps)

    def layer_weights(self) -> Tensor:
        """``(layers,)`` 1.0 where a layer's loss is active at the current step."""
        active = (self.step < self.cutoffs).float()
        if not self.aux_layers:
            # Built on the device: writing a Python scalar into a CUDA tensor copies from the
            # host, which CUDA-graph capture forbids.
            layers = torch.arange(len(active), device=active.device)
            active = (layers == len(active) - 1).float()
        return active

    def forward(self, input_ids: Tensor, **_) -> Dict[str, Tensor]:
        """``loss`` (and ``loss_next``: the last layer's next-character loss, in nats)."""
        # Blocks are context + 1 characters; a trainer that pads lengths to a multiple (the
        # CUDA-graph path pads to 16) appends columns that are not text: cut them off.
        input_ids = input_ids[:, : self.model.config.context + 1]
        inputs, targets = input_ids[:, :-1], input_ids[:, 1:]
        positions = slice(None) if self.aux_positions else slice(-1, None)
        if isinstance(self.model, CharLSTMLM):
            logits = self.model(inputs)
            loss = _ce(logits[:, positions], targets[:, positions])
            return {"loss": loss, "loss_next": loss.detach()}
        model: CharTransformerLM = self.model
        last = model.config.num_layers - 1
        layers = list(range(model.config.num_layers)) if self.aux_layers else [last]
        hidden = model.hidden_states(inputs, layers)
        weights = self.layer_weights()
        total = weights.new_zeros(())
        loss_next = None
        for i in layers:
            logits = model.head(hidden[i][:, positions])
            ce = _ce(logits, targets[:, positions])
            total = total + weights[i].to(ce.dtype) * ce
            if i == last:
                loss_next = ce
        loss = total / weights.sum().to(total.dtype)
        if model.second_head is not None:
            # The character after next: predicted at positions 0..n-2 (targets 2..n).
            h = hidden[last][:, :-1]
            h = h if self.aux_positions else h[:, -1:]
            after = input_ids[:, 2:] if self.aux_positions else input_ids[:, -1:]
            second = _ce(model.second_head(h), after)
            loss = loss + SECOND_TARGET_WEIGHT * second
        if self.training:
            self.step.add_(1)  # in place, on the device: the schedule never syncs the host
        return {"loss": loss, "loss_next": loss_next.detach()}


@torch.inference_mode()
def bits_per_character(model: nn.Module, ids: Tensor, stride: Optional[int] = None, device: str = "auto",
                       batch_size: int = 16, show_progress: bool = False, leave: bool = True) -> Dict[str, float]:
    """Bits per character of a character stream (see the module docstring).

    Args:
        model: a character Transformer or LSTM.
        ids: ``(n,)`` character ids.
        stride: Transformer window step (default: a quarter of the context).
        batch_size: Transformer windows per forward pass; LSTM: parallel streams the text
            is cut into (each starts with an empty state, so ``batch_size - 1``
            characters are scored without context).

    Returns:
        ``bpc``, ``nll`` (nats per character) and ``characters`` scored.
    """
    ids = ids.long()
    if isinstance(model, CharTransformerLM):
        context = model.config.context
        out = perplexity(model, ids, context, stride or max(1, context // 4), device=device, batch_size=batch_size,
                         show_progress=show_progress, desc="bpc", leave=leave)
        return {"bpc": out["nll"] / math.log(2), "nll": out["nll"], "characters": out["tokens"]}
    dev = resolve_device(device)
    was_training = model.training
    model.eval().to(dev)
    streams = max(1, min(batch_size, (len(ids) - 1) // 2))
    per = (len(ids) - 1) // streams
    inputs = ids[: streams * per].view(streams, per).to(dev)
    targets = ids[1 : streams * per + 1].view(streams, per).to(dev)
    state, total = None, torch.zeros((), dtype=torch.float64, device=dev)
    context = model.config.context
    for start in tqdm(range(0, per, context), desc="bpc", disable=not show_progress, leave=leave, unit="segment"):
        logits, state = model(inputs[:, start : start + context], state, return_state=True)
        total += _ce(logits, targets[:, start : start + context], reduction="sum").double()
    model.train(was_training)
    nll = float(total) / (streams * per)
    return {"bpc": nll / math.log(2), "nll": nll, "characters": streams * per}


def read_char_stream(paths: Union[os.PathLike, Sequence[os.PathLike]], tokenizer: CharTokenizer,
                     limit: Optional[int] = None) -> Tensor:
    """``(n,)`` uint8 ids of text files, one after the other (at most ``limit`` characters).

    Raises:
        UserError: a missing or unreadable file, a character outside the alphabet (with the
            file and offset), or fewer than two characters in all.
    """
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    parts = []
    for path in paths:
        check_input(path)
        text = Path(path).read_text(encoding="utf-8")
        try:
            parts.append(tokenizer.encode_tensor(text[:limit] if limit else text))
        except UserError as e:
            raise UserError(f"{path}: {e}") from None
    ids = torch.cat(parts)[:limit] if limit else torch.cat(parts)
    if len(ids) < 2:
        raise UserError(f"{', '.join(map(str, paths))}: needs at least two characters")
    return ids


def _param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def train_char_lm(train_file: Union[os.PathLike, Sequence[os.PathLike]], valid_file: Union[os.PathLike, Sequence[os.PathLike]], preset: Union[str, CharTransformerConfig, CharLSTMConfig],
                  out_dir: os.PathLike, config: TrainConfig, test_file: Union[None, os.PathLike, Sequence[os.PathLike]] = None,
                  alphabet: str = "text8", aux_positions: bool = True, aux_layers: bool = True,
                  eval_stride: Optional[int] = None, max_eval_chars: Optional[int] = None,
                  callbacks: Optional[Sequence[Callback]] = None, **overrides) -> dict:
    """Train a character LM from scratch; bits per character on valid (and test).

    Args:
        train_file, valid_file, test_file: text files of one corpus (e.g. from
            :func:`~ctxkit.pretraining.char_corpus.build_char_corpus`).
        preset: a name from :data:`~ctxkit.models.char_lm.model.CHAR_PRESETS` or a config.
        out_dir: run folder: ``log.jsonl``, ``curve.png``, ``best/`` (model + ``vocab.json``),
            ``results.json``.
        config: hyper-parameters (``max_minutes`` gives runs of equal wall-clock time).
        alphabet: ``"text8"`` (27 symbols) or ``"bytes"``.
        aux_positions, aux_layers: the auxiliary losses (module docstring); the third,
            multiple targets, is the config's ``second_target``.
        eval_stride: Transformer bpc window step (default: context / 4).
        max_eval_chars: score only the first characters of valid/test (faster per epoch).
        **overrides: config fields to change, e.g. ``context=256``.

    Returns:
        The summary written to ``results.json``: ``valid`` / ``test`` bpc, parameters,
        steps, wall time, and the settings.
    """
    if isinstance(preset, str):
        if preset not in CHAR_PRESETS:
            raise UnknownNameError(f"unknown character LM preset {preset!r}; known: {', '.join(CHAR_PRESETS)}")
        arch = CHAR_PRESETS[preset]
    else:
        arch = preset
    if alphabet not in ("text8", "bytes"):
        raise UserError(f"alphabet must be 'text8' or 'bytes', got {alphabet!r}")
    tokenizer = CharTokenizer() if alphabet == "text8" else CharTokenizer(None)
    arch = arch.replace(vocab_size=tokenizer.vocab_size, **overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_ids = read_char_stream(train_file, tokenizer)
    valid_ids = read_char_stream(valid_file, tokenizer, max_eval_chars)
    set_seed(config.seed)
    model = build_char_lm(arch)
    objective = CharLMObjective(model, aux_positions=aux_positions, aux_layers=aux_layers)

    def evaluate(m: CharLMObjective) -> Dict[str, float]:
        return bits_per_character(m.model, valid_ids, eval_stride, device=config.device, batch_size=config.eval_batch_size,
                                  show_progress=config.progress, leave=False)

    def save_best(m: CharLMObjective, folder: Path) -> None:
        save_char_lm(m.model, folder)
        tokenizer.save(folder)

    blocks = LMBlocks(train_ids, arch.context + 1)
    trainer = Trainer(objective, blocks, config, out, evaluate=evaluate, main_metric="bpc", greater_is_better=False,
                      save_best=save_best, callbacks=callbacks)
    objective.set_schedule(trainer.total_steps)
    result = trainer.train()
    if result.stopped == "signal":  # stopped by SIGTERM/SIGUSR1 (checkpoint written): no evaluation in the seconds left
        return {"model": type(model).__name__, "steps": result.steps, "stopped": {"reason": "signal", "step": result.steps}}
    history, best = result.history, result.best_metric
    if not history:  # per-epoch evaluation was off: score and keep the final model
        history = [evaluate(objective)]
        best = history[0]["bpc"]
        save_best(objective, out / "best")
    summary = {"model": type(model).__name__, "config": {k: getattr(arch, k) for k in arch.__dataclass_fields__},
               "parameters": _param_count(model), "train_characters": len(train_ids), "valid": history[-1],
               "best_bpc": best, "best_epoch": result.best_epoch, "steps": result.steps,
               "wall_time_s": round(result.wall_time, 1), "aux_positions": aux_positions,
               "aux_layers": objective.aux_layers}
    if test_file is not None:  # scored by the model that was best on valid
        summary["test"] = bits_per_character(load_char_lm(out / "best"), read_char_stream(test_file, tokenizer, max_eval_chars),
                                             eval_stride, device=config.device, batch_size=config.eval_batch_size)
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
