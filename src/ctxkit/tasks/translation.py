"""Machine translation: parallel text -> joint BPE -> Transformer encoder-decoder -> BLEU.

``train_translation`` trains :class:`~ctxkit.models.seq2seq.model.TransformerSeq2Seq` with the
shared :class:`~ctxkit.training.Trainer` (teacher forcing, label smoothing, the
inverse-square-root schedule by default) and scores the validation set with sacreBLEU
after every epoch; ``translate`` decodes with greedy or beam search.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..models.seq2seq.model import RNN_SEQ2SEQ_PRESETS, SEQ2SEQ_PRESETS
from ..models.seq2seq.model import RNNSeq2Seq, TransformerSeq2Seq, load_seq2seq, save_seq2seq
from ..tokenizers import ByteLevelBPETokenizer, read_lines
from ..training import TrainConfig, Trainer, resolve_device, set_seed
from ..training.callbacks import Callback
from ..core.deps import require, require_all
from ..core.errors import UnknownNameError, UserError
from ..decoding import GenerationConfig, generate

__all__ = ["read_parallel", "train_translation", "translate", "length_cap", "alignment", "load_translator", "bleu", "SPECIALS"]

logger = logging.getLogger("ctxkit")
SPECIALS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2: pad, begin, end


def read_parallel(src_path: os.PathLike, tgt_path: os.PathLike) -> List[Tuple[str, str]]:
    """Line-aligned sentence pairs (plain or ``.xz`` files).

    Raises:
        ValueError: the files have different line counts, or a line is empty on one side
            only (both named, with the line number).
    """
    src, tgt = list(read_lines(src_path)), list(read_lines(tgt_path))
    if len(src) != len(tgt):
        raise UserError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: not a parallel pair of files")
    pairs = []
    for lineno, (s, t) in enumerate(zip(src, tgt), 1):
        s, t = s.strip(), t.strip()
        if bool(s) != bool(t):
            raise UserError(f"{src_path if not s else tgt_path}:{lineno}: empty line where the other side has text")
        if s:
            pairs.append((s, t))
    return pairs


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU with sacreBLEU's default (13a) tokenisation, as reported for Multi30k."""
    sacrebleu = require("sacrebleu", "BLEU")
    return sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score


class _PairFeatures(list):
    """Feature dicts with the ``lengths`` the Trainer groups batches by."""

    def __init__(self, items: list):
        super().__init__(items)
        self.lengths = [max(len(f["input_ids"]), len(f["tgt_ids"])) for f in items]


def _features(pairs: Sequence[Tuple[str, str]], tok: ByteLevelBPETokenizer, max_length: int) -> _PairFeatures:
    pad, bos, eos = (tok.token_to_id(t) for t in SPECIALS)
    src = tok.encode_batch([s for s, _ in pairs])
    tgt = tok.encode_batch([t for _, t in pairs])
    cut = sum(len(s) + 1 > max_length or len(t) + 2 > max_length for s, t in zip(src, tgt))
    if cut:
        logger.warning("%d of %d pairs are longer than %d tokens and were truncated", cut, len(pairs), max_length)
    items = [{"input_ids": (s + [eos])[:max_length], "attention_mask": [1] * min(len(s) + 1, max_length),
              "tgt_ids": ([bos] + t + [eos])[:max_length]} for s, t in zip(src, tgt)]
    return _PairFeatures(items)


@torch.inference_mode()
def length_cap(source_tokens: int, limit: int) -> int:
    """New tokens a translation may take: 2 x the source length rounded up to 8, + 10, within
    the model's ``limit`` positions. A sentence's own property, so its translation does not
    depend on which sentences share its batch (rounding lets sentences of similar length
    share a beam-search batch)."""
    return max(1, min(limit - 1, 2 * (-(-source_tokens // 8) * 8) + 10))


def translate(model: torch.nn.Module, tok: ByteLevelBPETokenizer, sentences: Sequence[str], num_beams: int = 1,
              batch_size: int = 64, max_new_tokens: Optional[int] = None, device: str = "auto") -> List[str]:
    """Translate sentences (greedy with ``num_beams=1``, else beam search) with a
    :class:`~ctxkit.models.seq2seq.model.TransformerSeq2Seq` or ``RNNSeq2Seq``.

    Each sentence gets at most ``max_new_tokens`` new tokens, by default :func:`length_cap`
    of its own length: the same translation whichever sentences share its batch.
    """

    dev = resolve_device(device)
    model = model.to(dev).eval()
    pad, bos, eos = (tok.token_to_id(t) for t in SPECIALS)
    limit = model.config.max_position
    out: List[str] = [""] * len(sentences)
    ids = [(tok.encode(s) + [eos])[:limit] for s in sentences]
    caps = [max_new_tokens or length_cap(len(i), limit) for i in ids]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths share a batch
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    if num_beams > 1:
        # Beam search keeps or drops hypotheses by the length budget: one budget per batch.
        batches = [[i for i in rows if caps[i] == cap] for rows in batches for cap in sorted({caps[i] for i in rows})]
    for rows in batches:
        width = max(len(ids[i]) for i in rows)
        src = torch.tensor([ids[i] + [pad] * (width - len(ids[i])) for i in rows], device=dev)
        config = GenerationConfig(max_new_tokens=max(caps[i] for i in rows), num_beams=num_beams, eos_token_id=eos, pad_token_id=pad)
        result = generate(model.bind(src), torch.full((len(rows), 1), bos, device=dev), config=config)
        for row, i in enumerate(rows):
            # Greedy rows are independent: a row cut at its own cap is what decoding it alone gives.
            tokens = result[row, 1 : 1 + caps[i]].tolist()
            tokens = tokens[: tokens.index(eos)] if eos in tokens else tokens
            out[i] = tok.decode(tokens, skip_special_tokens=True).strip()
    return out


@torch.inference_mode()
def alignment(model: torch.nn.Module, tok: ByteLevelBPETokenizer, sentence: str, translation: Optional[str] = None,
              layer: int = -1, device: str = "auto") -> Tuple[torch.Tensor, List[str], List[str]]:
    """Encoder-decoder attention of one sentence pair, averaged over heads.

    Args:
        sentence: the source.
        translation: the target to force-decode (default: the model's greedy translation).
        layer: decoder layer whose cross-attention is returned (default: the last).

    Returns:
        ``(weights (target_len, source_len), source tokens, target tokens)``; the target
        rows are the translation's tokens followed by the end marker, each row being the
        attention used to predict that token.
    """
    dev = resolve_device(device)
    model = model.to(dev).eval()
    pad, bos, eos = (tok.token_to_id(t) for t in SPECIALS)
    if translation is None:
        translation = translate(model, tok, [sentence], device=device)[0]
    src = tok.encode(sentence) + [eos]
    tgt = tok.encode(translation) + [eos]
    src_t = torch.tensor([src], device=dev)
    memory = model.encode(src_t, torch.ones_like(src_t))
    _, cross = model.decode(torch.tensor([[bos] + tgt[:-1]], device=dev), memory, torch.ones_like(src_t), need_weights=True)
    weights = cross[layer][0]
    weights = (weights.mean(0) if weights.dim() == 3 else weights).float().cpu()  # heads averaged -> (target, source)
    labels = [tok.decode([i]) if i != eos else "</s>" for i in src], [tok.decode([i]) if i != eos else "</s>" for i in tgt]
    return weights, labels[0], labels[1]


def load_translator(run_or_model_dir: os.PathLike) -> Tuple[torch.nn.Module, ByteLevelBPETokenizer]:
    """The model and tokenizer of a run folder (its ``best/``) or of a saved model folder."""
    folder = Path(run_or_model_dir)
    if (folder / "best" / "config.json").is_file():
        folder = folder / "best"
    return load_seq2seq(folder), ByteLevelBPETokenizer.from_dir(folder)


def train_translation(train: Tuple[os.PathLike, os.PathLike], valid: Tuple[os.PathLike, os.PathLike], out_dir: os.PathLike,
                      config: TrainConfig, preset: str = "transformer_3_256_8", vocab_size: int = 8000, max_length: int = 128,
                      label_smoothing: float = 0.1, eval_beams: int = 1, callbacks: Optional[Sequence[Callback]] = None,
                      quaternion: bool = False, **overrides) -> dict:
    """Train on parallel files and keep the epoch with the best validation BLEU.

    Args:
        train, valid: ``(source file, target file)`` pairs.
        out_dir: run folder: ``log.jsonl``, ``curve.png``, ``best/`` (model + tokenizer),
            ``results.json``.
        config: hyper-parameters (``schedule="inverse_sqrt"`` is the paper's choice).
        preset: a Transformer (:data:`~ctxkit.zoo.presets.SEQ2SEQ_PRESETS`) or RNN +
            attention (:data:`~ctxkit.zoo.presets.RNN_SEQ2SEQ_PRESETS`) name;
            ``overrides`` change its fields (e.g. ``dropout=0.3``).
        vocab_size: joint BPE vocabulary trained on both sides of ``train``.
        max_length: longest source/target in tokens (longer pairs are truncated, with a warning).
        label_smoothing: passed to the loss.
        eval_beams: beams for the per-epoch validation BLEU.
        callbacks: also receive the training log (:mod:`ctxkit.training.callbacks`).
        quaternion: quaternion projections in the Transformer's stacks
            (:attr:`Seq2SeqConfig.quaternion`; the ``quaternion_*`` presets have it already).

    Returns:
        ``{"valid_bleu", "best_epoch", "steps", "parameters", ...}``.
    """
    presets = {**SEQ2SEQ_PRESETS, **RNN_SEQ2SEQ_PRESETS}
    if preset not in presets:
        raise UnknownNameError(f"unknown translation preset {preset!r}; known: {', '.join(presets)}")
    if quaternion and preset not in SEQ2SEQ_PRESETS:
        raise UserError(f"quaternion layers are for the Transformer presets, not the RNN preset {preset!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    require_all(["sacrebleu"], "validation BLEU")  # before the data and the model
    train_pairs, valid_pairs = read_parallel(*train), read_parallel(*valid)
    text = [s for pair in train_pairs for s in pair]
    tok = ByteLevelBPETokenizer.train(iter(text), vocab_size=vocab_size, show_progress=config.progress, special_tokens=SPECIALS)
    # Positions for twice the longest source: translations may come out longer.
    arch = presets[preset].replace(vocab_size=tok.vocab_size, max_position=2 * max_length, **overrides)
    if quaternion:
        arch = arch.replace(quaternion=True)
    set_seed(config.seed)
    model = TransformerSeq2Seq(arch) if preset in SEQ2SEQ_PRESETS else RNNSeq2Seq(arch)
    refs = [t for _, t in valid_pairs]

    class _WithSmoothing(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, **batch):
            return self.inner(**batch, label_smoothing=label_smoothing)

    wrapped = _WithSmoothing(model)

    def evaluate(m) -> Dict[str, float]:
        hyps = translate(m.inner, tok, [s for s, _ in valid_pairs], num_beams=eval_beams, device=config.device)
        return {"bleu": bleu(hyps, refs)}

    def save_best(m, folder: Path) -> None:
        save_seq2seq(m.inner, folder)
        tok.save(folder)

    trainer = Trainer(wrapped, _features(train_pairs, tok, max_length), config, out, evaluate=evaluate, main_metric="bleu",
                      save_best=save_best, callbacks=callbacks)
    result = trainer.train()
    if result.stopped == "signal":  # stopped by SIGTERM/SIGUSR1 (checkpoint written): best/ holds the best epoch so far
        return {"preset": preset, "steps": result.steps, "stopped": {"reason": "signal", "step": result.steps}}
    summary = {"preset": preset, "quaternion": bool(getattr(arch, "quaternion", False)),
               "parameters": sum(p.numel() for p in model.parameters()),
               "train_pairs": len(train_pairs), "valid_pairs": len(valid_pairs), "vocab_size": tok.vocab_size,
               "valid_bleu": result.best_metric, "best_epoch": result.best_epoch, "steps": result.steps,
               "wall_time_s": round(result.wall_time, 1), "history": result.history}
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
