"""Causal language modelling with GPT-2: corpus -> token blocks -> training, and
perplexity with a sliding window.

Perplexity follows the usual fixed-context recipe: the text is one token stream, scored
by windows of ``max_length`` tokens that advance by ``stride``; each window scores only
the tokens the previous one did not, so every token after the first is predicted once,
with at least ``max_length - stride`` tokens of context. With ``stride == max_length``
the windows do not overlap and the first token of each has no context: it is skipped,
as in the Hugging Face recipe.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..models.gpt2.model import GPT2LMHeadModel, save_gpt2
from ..models.gpt2.model import GPT2_PRESETS
from ..tokenizers import ByteLevelBPETokenizer, read_lines
from ..training import TrainConfig, Trainer, resolve_device, set_seed
from ..training.callbacks import Callback
from ..core.errors import UnknownNameError, UserError
from ..data.errors import check_input

__all__ = ["corpus_ids", "LMBlocks", "CausalLMModel", "perplexity", "train_lm"]

logger = logging.getLogger("ctxkit")


def corpus_ids(files: Sequence[os.PathLike], tokenizer: ByteLevelBPETokenizer, show_progress: bool = True) -> Tensor:
    """Token ids of text files (plain or ``.xz``) as one stream, line breaks kept."""
    ids: List[int] = []
    for path in files:
        lines = [line + "\n" for line in read_lines(path)]
        for start in tqdm(range(0, len(lines), 2000), desc=f"tokenize {Path(path).name}", disable=not show_progress, unit="chunk"):
            for row in tokenizer.encode_batch(lines[start : start + 2000]):
                ids.extend(row)
    if not ids:
        raise UserError(f"no text in {', '.join(map(str, files))}")
    return torch.tensor(ids, dtype=torch.long)


class LMBlocks(torch.utils.data.Dataset):
    """Consecutive, non-overlapping blocks of ``block_size`` tokens (the remainder is dropped).

    Items are feature dicts (``input_ids`` lists) for :class:`~ctxkit.training.Trainer`.
    """

    def __init__(self, ids: Tensor, block_size: int):
        if len(ids) < block_size:
            raise UserError(f"the corpus has {len(ids)} tokens, fewer than one block of {block_size}")
        self.blocks = ids[: len(ids) // block_size * block_size].view(-1, block_size)
        self.lengths = [block_size] * len(self.blocks)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> Dict[str, list]:
        return {"input_ids": self.blocks[i].tolist()}


class CausalLMModel(nn.Module):
    """GPT-2 plus the next-token loss, for the Trainer."""

    def __init__(self, lm: GPT2LMHeadModel):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, **_) -> dict:
        """``loss``: mean cross-entropy of predicting token t+1 from tokens <= t."""
        logits = self.lm(input_ids, attention_mask=attention_mask)
        targets = input_ids[:, 1:]
        if attention_mask is not None:
            targets = targets.masked_fill(attention_mask[:, 1:] == 0, -100)
        loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), targets.flatten(), ignore_index=-100)
        return {"loss": loss}


@torch.inference_mode()
def perplexity(model: GPT2LMHeadModel, ids: Tensor, max_length: Optional[int] = None, stride: Optional[int] = None,
               device: str = "auto", batch_size: int = 16, show_progress: bool = False, desc: str = "perplexity",
               leave: bool = True) -> Dict[str, float]:
    """Sliding-window perplexity of a token stream (see the module docstring).

    Args:
        model: the language model (put in eval mode here).
        ids: ``(n,)`` token ids.
        max_length: window length (default: the model's context length).
        stride: window step, ``1 <= stride <= max_length`` (default: ``max_length // 2``).
        batch_size: windows per forward pass.
        show_progress, desc, leave: a tqdm bar (stderr) named ``desc``; ``leave=False``
            erases it when done (a validation pass inside training).

    Returns:
        ``perplexity``, ``nll`` (mean negative log-likelihood per token, nats) and
        ``tokens`` (how many were scored).
    """
    max_length = max_length or model.config.max_position
    stride = stride or max(1, max_length // 2)
    if not 1 <= stride <= max_length or max_length > model.config.max_position:
        raise UserError(f"need 1 <= stride ({stride}) <= max_length ({max_length}) <= context ({model.config.max_position})")
    if len(ids) < 2:
        raise UserError("need at least two tokens to score")
    dev = resolve_device(device)
    was_training = model.training
    model.eval().to(dev)
    windows, prev_end = [], 0  # (begin, end, how many of its last predictions are new)
    for begin in range(0, len(ids) - 1, stride):
        end = min(begin + max_length, len(ids))
        windows.append((begin, end, end - max(prev_end, begin + 1)))
        prev_end = end
        if end == len(ids):
            break
    total_nll, scored = 0.0, 0
    # position=0: inside training it takes the train bar's line for a while instead of
    # drawing a second line (which a log file would show as a stray line per update).
    for i in tqdm(range(0, len(windows), batch_size), desc=desc, disable=not show_progress, unit="batch", leave=leave,
                  position=0, dynamic_ncols=True):
        group = windows[i : i + batch_size]
        # Full-length windows share a shape and run as one batch; the short last one alone.
        for same in ([w for w in group if w[1] - w[0] == max_length], [w for w in group if w[1] - w[0] != max_length]):
            if not same:
                continue
            batch = torch.stack([ids[b:e] for b, e, _ in same]).to(dev)
            logp = model(batch)[:, :-1].float().log_softmax(-1)
            nll = -logp.gather(2, batch[:, 1:, None])[..., 0]
            for row, (_, _, new) in enumerate(same):
                total_nll += nll[row, -new:].sum().item()
                scored += new
    model.train(was_training)
    mean = total_nll / scored
    return {"perplexity": math.exp(mean), "nll": mean, "tokens": scored}


def _train_tokenizer(files: Sequence[os.PathLike], vocab_size: int, show_progress: bool) -> ByteLevelBPETokenizer:
    """A byte-level BPE of ``vocab_size`` learned on ``files``, with a tqdm bar on stderr
    (lines read, then the merges). The tokenizers library's own bars stay off: they end
    each phase with a blank line on stdout."""

    for path in files:
        check_input(path)
    bar = tqdm(desc="vocabulary", unit=" lines", unit_scale=True, disable=not show_progress, dynamic_ncols=True)

    def lines():
        n = 0
        for path in files:
            for line in read_lines(path):
                yield line
                n += 1
                if n == 2000:
                    bar.update(n)
                    n = 0
        bar.update(n)
        bar.set_postfix_str("computing merges")  # the longest silent part on a big corpus

    try:
        tokenizer = ByteLevelBPETokenizer.train(lines(), vocab_size=vocab_size, show_progress=False)
        bar.set_postfix_str(f"{tokenizer.vocab_size} tokens", refresh=False)
    finally:
        bar.close()
    return tokenizer


def train_lm(train_files: Sequence[os.PathLike], valid_files: Sequence[os.PathLike], preset: str, out_dir: os.PathLike,
             config: TrainConfig, tokenizer_dir: Optional[os.PathLike] = None, vocab_size: int = 8000, block_size: int = 128,
             eval_stride: Optional[int] = None, callbacks: Optional[Sequence[Callback]] = None) -> dict:
    """Train a GPT-2 preset from scratch on text files and report validation perplexity.

    Args:
        train_files, valid_files: text files (plain or ``.xz``).
        preset: a name from :data:`~ctxkit.zoo.presets.GPT2_PRESETS`.
        out_dir: run folder: ``log.jsonl``, ``curve.png``, ``best/`` (the model with the
            lowest validation perplexity, with its tokenizer), ``results.json``.
        config: hyper-parameters.
        tokenizer_dir: a byte-level BPE folder; by default one of ``vocab_size`` is
            trained on ``train_files`` and saved with the model.
        block_size: training sequence length (and the model's context length).
        eval_stride: perplexity window step (default: ``block_size // 2``).
        callbacks: also receive the training log (:mod:`ctxkit.training.callbacks`).

    Returns:
        ``{"valid": {"perplexity", "nll", "tokens"}, "best_epoch", "steps", ...}``.
    """
    if preset not in GPT2_PRESETS:
        raise UnknownNameError(f"unknown GPT-2 preset {preset!r}; known: {', '.join(GPT2_PRESETS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is not None:
        tokenizer = ByteLevelBPETokenizer.from_dir(tokenizer_dir)
    else:
        tokenizer = _train_tokenizer(train_files, vocab_size, config.progress)
    train_ids = corpus_ids(train_files, tokenizer, config.progress)
    valid_ids = corpus_ids(valid_files, tokenizer, config.progress)
    arch = GPT2_PRESETS[preset].replace(vocab_size=tokenizer.vocab_size, max_position=block_size)
    set_seed(config.seed)
    model = CausalLMModel(GPT2LMHeadModel(arch))
    stride = eval_stride or max(1, block_size // 2)

    def evaluate(m: CausalLMModel) -> Dict[str, float]:
        return perplexity(m.lm, valid_ids, block_size, stride, device=config.device, show_progress=config.progress,
                          desc="validation", leave=False)

    def save_best(m: CausalLMModel, folder: Path) -> None:
        save_gpt2(m.lm, folder)
        tokenizer.save(folder)

    trainer = Trainer(model, LMBlocks(train_ids, block_size), config, out, evaluate=evaluate, main_metric="perplexity",
                      greater_is_better=False, save_best=save_best, callbacks=callbacks)
    result = trainer.train()
    if result.stopped == "signal":  # stopped by SIGTERM/SIGUSR1 (checkpoint written): no evaluation in the seconds left
        return {"preset": preset, "steps": result.steps, "stopped": {"reason": "signal", "step": result.steps}}
    history, best = result.history, result.best_metric
    if not history:  # per-epoch evaluation was off: score and keep the final model
        history = [evaluate(model)]
        best = history[0]["perplexity"]
        save_best(model, out / "best")
    summary = {"preset": preset, "train_tokens": len(train_ids), "valid": history[-1],
               "best_perplexity": best, "best_epoch": result.best_epoch, "steps": result.steps,
               "wall_time_s": round(result.wall_time, 1), "block_size": block_size, "eval_stride": stride}
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
