"""Pretraining the ELMo biLM on a whitespace-tokenised corpus (e.g. WikiText-2).

* Vocabulary: the training corpus's words by descending frequency after ``<S>``,
  ``</S>``, ``<UNK>`` (bilm-tf's order; the sampled softmax's log-uniform sampler
  assumes frequency-sorted ids).
* Data: every non-empty line becomes ``<S> w_1 ... w_n </S>``; the lines form one
  stream, cut into ``batch_size`` contiguous rows read ``unroll`` tokens at a time
  (truncated BPTT). LSTM states carry from one chunk to the next, detached, and reset
  at each epoch and, at random, now and then (``state_reset_prob``, see
  :class:`BiLMTrainConfig`). The backward LM reads the reversed stream the same way, as
  in bilm-tf.
* Targets that are trivially predictable, the ``<S>`` after a ``</S>`` (forward) and
  the ``</S>`` before a ``<S>`` (backward), are neither trained on nor scored, so the
  perplexities are over words plus one sentence end per line.
* Loss: the mean of the two LMs' mean NLLs; sampled (or adaptive) softmax for training,
  the exact softmax for evaluation. Perplexity is reported per direction and as
  ``exp`` of the average of the two log-perplexities.
* bf16 autocast on CUDA, fp32 on CPU; a tqdm bar shows tokens/s (stream tokens, each
  read by both LMs).
* ``checkpoint/`` (:func:`ctxkit.core.run_state.save_checkpoint`: replaced whole, manifest
  checked on resume) holds the model, optimiser, LSTM states, RNG states and data
  position, so a resumed run continues with exactly the losses of an uninterrupted one
  (a ``checkpoint.pt`` of earlier versions is still read).

Run: ``python -m ctxkit.pretraining.bilm --help``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..core.checkpoint import CheckpointError, atomic_write, load_state_dict_strict
from ..core.interrupts import StopSignals, resume_or_start
from ..core.run_folder import hold_run_folder, trim_log
from ..core.run_state import Checkpoint, LossBuffer, autocast, resolve_device, restore_rng, resume_checkpoint
from ..core.run_state import save_checkpoint as write_checkpoint
from ..models.elmo.model import ELMO_PRESETS, ElmoConfig, ElmoLanguageModel
from ..models.elmo.chars import BOS_TOKEN, EOS_TOKEN, word_to_char_ids
from ..models.elmo.io import config_to_options, load_elmo_lm, save_elmo_lm, write_bilm_tf
from ..data.errors import require_rereadable
from ..tokenizers import read_lines
from ..training.callbacks import Callback, CallbackList, JsonlWriter
from ..core.errors import UnknownNameError, UserError

__all__ = ["UNK_TOKEN", "BiLMTrainConfig", "build_vocab", "corpus_stream", "char_table", "batchify", "evaluate_bilm", "train_bilm"]

logger = logging.getLogger("ctxkit")

UNK_TOKEN = "<UNK>"
SPECIALS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
BOS_ID, EOS_ID, UNK_ID = 0, 1, 2
IGNORE = -100


def build_vocab(files: Sequence[os.PathLike], min_count: int = 1, max_size: Optional[int] = None) -> List[str]:
    """Words of whitespace-tokenised text files (plain or ``.xz``), specials first, then
    by descending count (ties alphabetically, so the order is reproducible)."""
    counts: Counter = Counter()
    for path in files:  # read again by the stream builder: a pipe would block the second time
        require_rereadable(path, "building the vocabulary and then the token stream")
    for path in files:
        for line in read_lines(path):
            counts.update(line.split())
    words = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS), key=lambda w: (-counts[w], w))
    if max_size is not None:
        words = words[: max(0, max_size - len(SPECIALS))]
    return list(SPECIALS) + words


def corpus_stream(files: Sequence[os.PathLike], vocab: Sequence[str]) -> Tensor:
    """``(n,)`` ids of ``<S> words </S>`` per non-empty line, unknown words as ``<UNK>``."""
    index = {w: i for i, w in enumerate(vocab)}
    ids: List[int] = []
    for path in files:
        for line in read_lines(path):
            words = line.split()
            if words:
                ids.append(BOS_ID)
                ids.extend(index.get(w, UNK_ID) for w in words)
                ids.append(EOS_ID)
    if not ids:
        raise UserError(f"no text in {', '.join(map(str, files))}")
    return torch.tensor(ids, dtype=torch.long)


def char_table(vocab: Sequence[str], max_chars: int = 50) -> Tensor:
    """``(vocab, max_chars)`` character ids of every word (``<S>``/``</S>`` as the markers)."""
    return torch.tensor([word_to_char_ids(w, max_chars) for w in vocab], dtype=torch.long)


def batchify(stream: Tensor, batch_size: int) -> Tensor:
    """``(batch_size, n // batch_size)``: row ``b`` is the ``b``-th contiguous slice of the stream."""
    cols = len(stream) // batch_size
    if cols < 2:
        raise UserError(f"a stream of {len(stream)} tokens is too short for {batch_size} rows")
    return stream[: cols * batch_size].view(batch_size, cols)


def _chunk(data: Tensor, start: int, unroll: int, skip_target: int):
    seq = min(unroll, data.shape[1] - 1 - start)
    inputs, targets = data[:, start : start + seq], data[:, start + 1 : start + 1 + seq]
    return inputs, targets.masked_fill(targets == skip_target, IGNORE)


@dataclass
class BiLMTrainConfig:
    """Hyper-parameters of :func:`train_bilm`.

    Attributes:
        batch_size: contiguous rows of the stream.
        unroll: truncated-BPTT length.
        epochs: passes over the training stream.
        max_steps: stop after this many updates in all (across resumes).
        max_time_s: stop this call after this many seconds of training (checked before
            each step; the final evaluation and export come after).
        lr: learning rate. optimizer: ``"adam"`` or ``"adagrad"`` (bilm-tf: Adagrad 0.2).
        clip_norm: gradient norm clip (bilm-tf: 10).
        warmup_steps: linear warmup, then a constant rate (a time budget has no known end).
        softmax: ``"sampled"``, ``"full"`` or ``"adaptive"`` (see :class:`ElmoLanguageModel`).
        num_samples: sampled-softmax negatives per batch (expected distinct ones).
        state_reset_prob: chance, per row, direction and chunk, that the carried LSTM
            state is zeroed. Without resets a model sees a zero state once per epoch and
            can come to rely on memory cells frozen since the start of training (its
            validation perplexity from a fresh state was orders of magnitude off in our
            H100 runs); sentence embeddings start from zero states too.
        eval_batch_size, eval_unroll: evaluation stream layout (few long rows, as is usual
            for LM evaluation, so little of the text is read from a cold state).
        save_every: checkpoint every this many steps (and at each epoch end and stop).
        log_every: write a ``log.jsonl`` record every this many steps.
        min_count, max_vocab: vocabulary filters.
        seed, device (``"auto"``: CUDA when available), precision (``"auto"``: bf16 on CUDA).
        compile: ``torch.compile`` the LSTM time step (:meth:`~ctxkit.models.elmo.model.ElmoBiLM.compile_steps`).
        progress: show the tqdm bar.
    """

    batch_size: int = 64
    unroll: int = 20
    epochs: int = 1
    max_steps: Optional[int] = None
    max_time_s: Optional[float] = None
    lr: float = 1e-3
    optimizer: str = "adam"
    clip_norm: float = 10.0
    warmup_steps: int = 0
    softmax: str = "sampled"
    num_samples: int = 8192
    state_reset_prob: float = 0.02
    eval_batch_size: int = 10
    eval_unroll: int = 50
    save_every: int = 500
    log_every: int = 50
    min_count: int = 1
    max_vocab: Optional[int] = None
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"
    compile: bool = False
    progress: bool = True


def evaluate_final(out_dir: os.PathLike, test: Sequence[os.PathLike], device: str = "auto", precision: str = "auto",
                   max_chars: int = 50) -> Dict[str, float]:
    """:func:`evaluate_bilm` of the language model a finished run saved (``out_dir/final``) on
    the ``test`` files (``ctxkit pretrain-elmo --test``)."""
    lm, vocab = load_elmo_lm(Path(out_dir) / "final")
    lm.to(resolve_device(device))
    return evaluate_bilm(lm, corpus_stream(test, vocab), char_table(vocab, max_chars), precision=precision)


@torch.no_grad()
def evaluate_bilm(lm: ElmoLanguageModel, stream: Tensor, table: Tensor, batch_size: int = 64, unroll: int = 50,
                  precision: str = "auto") -> Dict[str, float]:
    """Exact-softmax perplexity of both LMs over a stream (states carried, from zeros).

    Returns:
        ``forward_perplexity``, ``backward_perplexity``, ``perplexity`` (exp of the mean
        of the two NLLs), ``forward_nll``, ``backward_nll`` (nats per token), ``tokens``.
    """
    was_training = lm.training
    lm.eval()
    device = next(lm.parameters()).device
    batch_size = max(1, min(batch_size, len(stream) // 2))
    fwd, bwd = batchify(stream, batch_size).to(device), batchify(stream.flip(0), batch_size).to(device)
    table = table.to(device)
    totals = torch.zeros(4, dtype=torch.float64, device=device)
    state = None
    for start in range(0, fwd.shape[1] - 1, unroll):
        fi, ft = _chunk(fwd, start, unroll, BOS_ID)
        bi, bt = _chunk(bwd, start, unroll, EOS_ID)
        with autocast(device, precision):
            out, state = lm(fi, ft, bi, bt, table, state, exact=True)
        totals += torch.stack([out["forward_nll"], out["forward_tokens"], out["backward_nll"], out["backward_tokens"]]).double()
    lm.train(was_training)
    f_nll, f_n, b_nll, b_n = totals.tolist()
    f, b = f_nll / max(f_n, 1), b_nll / max(b_n, 1)
    return {"forward_perplexity": math.exp(f), "backward_perplexity": math.exp(b), "perplexity": math.exp((f + b) / 2),
            "forward_nll": f, "backward_nll": b, "tokens": int(f_n)}


def _resolve_model_config(model_config: Union[str, ElmoConfig]) -> ElmoConfig:
    if isinstance(model_config, ElmoConfig):
        return model_config
    if model_config not in ELMO_PRESETS:
        raise UnknownNameError(f"unknown ELMo preset {model_config!r}; known: {', '.join(ELMO_PRESETS)}")
    return ELMO_PRESETS[model_config]


def _read_checkpoint(out: Path) -> Checkpoint:
    """``out/checkpoint/``, or the single ``checkpoint.pt`` earlier versions wrote."""
    return resume_checkpoint(out, lambda blob: ({k: blob[k] for k in ("run", "train_config", "model_config")},
                                                {k: blob[k] for k in ("scheduler", "lstm_state", "rng")}))


# Fields that fix the data order or the model: a resume must not change them.
_RESUME_FIXED = ("batch_size", "unroll", "softmax", "num_samples", "optimizer", "seed", "min_count", "max_vocab")


def train_bilm(train_files: Sequence[os.PathLike], valid_files: Sequence[os.PathLike], out_dir: os.PathLike,
               model_config: Union[str, ElmoConfig] = "elmo_2x1024_128_2048cnn_1xhighway",
               config: Optional[BiLMTrainConfig] = None, resume: bool = False,
               callbacks: Optional[Sequence[Callback]] = None) -> dict:
    """Train forward and backward LMs; see the module docstring for the recipe.

    Args:
        train_files, valid_files: whitespace-tokenised text files (plain or ``.xz``);
            ``valid_files`` may be empty (no evaluation).
        out_dir: run folder: ``vocab.txt``, ``checkpoint/``, ``log.jsonl``,
            ``results.json`` and ``final/`` (:func:`~ctxkit.models.elmo.io.save_elmo_lm`
            plus ``weights.hdf5`` in the bilm-tf layout when h5py is installed).
        model_config: a preset name from :data:`~ctxkit.models.elmo.model.ELMO_PRESETS` or a config.
        config: hyper-parameters.
        resume: continue from ``out_dir/checkpoint/``; with no complete checkpoint there (a
            run that crashed before its first), start from the beginning with a one-line
            note; a finished run (``results.json``) whose checkpoint is gone is refused.
        callbacks: also receive the ``log.jsonl`` records (:mod:`ctxkit.training.callbacks`);
            closed when training returns or fails.

    Returns:
        summary dict: ``valid`` (last evaluation), ``history``, ``steps``, ``epoch``,
        ``losses`` (every step's training loss since the start), ``tokens_per_s`` (stream
        tokens per second of this call's wall time, evaluations included), ... SIGTERM or
        SIGUSR1 end the run after the current step with a checkpoint and no evaluation or
        ``final/`` (``summary["stopped"]["reason"] == "signal"``); a second signal stops at once.
    """
    # log.jsonl is the first writer, so a record reaches the file before any other writer.
    with hold_run_folder(out_dir), \
            CallbackList([JsonlWriter(Path(out_dir) / "log.jsonl", style="plain"), *(callbacks or ())]) as run_log, \
            StopSignals() as signals:
        return _train_bilm(train_files, valid_files, out_dir, model_config, config, resume, run_log, signals)


def _train_bilm(train_files: Sequence[os.PathLike], valid_files: Sequence[os.PathLike], out_dir: os.PathLike,
                model_config: Union[str, ElmoConfig], config: Optional[BiLMTrainConfig], resume: bool,
                run_log: CallbackList, signals: StopSignals) -> dict:
    cfg = config or BiLMTrainConfig()
    arch = _resolve_model_config(model_config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    ckpt_path = out / "checkpoint"
    ckpt = None
    if resume:  # a run that crashed before its first checkpoint starts again; a finished one is refused
        resume = resume_or_start(ckpt_path, finished=[out / "results.json"], legacy=out / "checkpoint.pt")
    if resume:
        ckpt = _read_checkpoint(out)
        ckpt_path = ckpt.folder
        changed = [k for k in _RESUME_FIXED if ckpt.trainer_state["train_config"].get(k) != getattr(cfg, k)]
        if json.dumps(ckpt.trainer_state["model_config"]) != json.dumps(config_to_options(arch)):
            changed.append("model_config")
        if changed:
            raise CheckpointError(f"{ckpt_path}: cannot resume with changed settings: {', '.join(changed)}")
        vocab = (out / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    else:
        vocab = build_vocab(train_files, cfg.min_count, cfg.max_vocab)
        text = "".join(w + "\n" for w in vocab)
        atomic_write(out / "vocab.txt", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    train_stream = corpus_stream(train_files, vocab)
    valid_stream = corpus_stream(valid_files, vocab) if valid_files else None
    table = char_table(vocab, arch.max_chars).to(device)
    fwd = batchify(train_stream, cfg.batch_size).to(device)
    bwd = batchify(train_stream.flip(0), cfg.batch_size).to(device)
    chunks_per_epoch = math.ceil((fwd.shape[1] - 1) / cfg.unroll)

    torch.manual_seed(cfg.seed)
    lm = ElmoLanguageModel(arch, len(vocab), softmax=cfg.softmax, num_samples=cfg.num_samples).to(device)
    if cfg.compile:
        lm.bilm.compile_steps()
    if cfg.optimizer == "adam":
        opt = torch.optim.Adam(lm.parameters(), lr=cfg.lr)
    elif cfg.optimizer == "adagrad":
        opt = torch.optim.Adagrad(lm.parameters(), lr=cfg.lr, initial_accumulator_value=1.0)
    else:
        raise UserError(f"optimizer must be 'adam' or 'adagrad', got {cfg.optimizer!r}")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0)
    run = {"step": 0, "epoch": 0, "chunk": 0, "losses": [], "history": [], "train_time_s": 0.0}
    lstm_state = None
    if ckpt is not None:
        load_state_dict_strict(lm, ckpt.model_state, source=str(ckpt_path))
        opt.load_state_dict(ckpt.optimizer_state)
        sched.load_state_dict(ckpt.extra["scheduler"])
        run = ckpt.trainer_state["run"]
        if ckpt.extra["lstm_state"] is not None:
            lstm_state = tuple(t.to(device) for t in ckpt.extra["lstm_state"])
        restore_rng(ckpt.rng)
        logger.info("resumed from %s at step %d (epoch %d, chunk %d)", ckpt_path, run["step"], run["epoch"], run["chunk"])
        trim_log(out / "log.jsonl", run["step"])  # the steps after the checkpoint are logged again
    params = sum(p.numel() for p in lm.parameters())
    logger.info("ELMo biLM: %d parameters, vocabulary %d, %d training tokens, %d chunks per epoch", params, len(vocab),
                len(train_stream), chunks_per_epoch)

    run_log.on_train_begin({"config": {**dataclasses.asdict(cfg), "model": config_to_options(arch)}, "parameters": params,
                            **({"resumed_at_step": run["step"]} if ckpt is not None else {})})
    pending = LossBuffer()

    def save_checkpoint() -> None:
        pending.flush_into(run["losses"])  # the checkpoint holds every step's loss
        write_checkpoint(out / "checkpoint", model_state=lm.state_dict(), optimizer_state=opt.state_dict(),
                         trainer_state={"run": run, "train_config": dataclasses.asdict(cfg), "model_config": config_to_options(arch)},
                         extra={"scheduler": sched.state_dict(),
                                "lstm_state": None if lstm_state is None else tuple(t.cpu() for t in lstm_state)})

    def evaluate() -> Optional[Dict[str, float]]:
        if valid_stream is None:
            return None
        result = evaluate_bilm(lm, valid_stream, table, cfg.eval_batch_size, cfg.eval_unroll, cfg.precision)
        record = {"step": run["step"], "epoch": run["epoch"], **result}
        run["history"].append(record)
        run_log.on_eval(run["step"], record)
        logger.info("step %d: valid perplexity forward %.2f, backward %.2f, average %.2f", run["step"],
                    result["forward_perplexity"], result["backward_perplexity"], result["perplexity"])
        return record

    start, last_saved = time.monotonic(), run["step"]
    steps_this_call, tokens_this_call = 0, 0
    total = cfg.epochs * chunks_per_epoch if cfg.max_steps is None else min(cfg.max_steps, cfg.epochs * chunks_per_epoch)
    bar = tqdm(total=total, initial=run["step"], desc="biLM", unit="step", disable=not cfg.progress, dynamic_ncols=True)
    stopped: Optional[str] = None  # why the loop ended early: "budget" (max_steps, max_time_s) or "signal"
    lm.train()
    while run["epoch"] < cfg.epochs and not stopped:
        if run["chunk"] == 0:
            lstm_state = None  # each epoch starts from zero states
        while run["chunk"] < chunks_per_epoch:
            if (cfg.max_steps is not None and run["step"] >= cfg.max_steps) or \
                    (cfg.max_time_s is not None and time.monotonic() - start >= cfg.max_time_s):
                stopped = "budget"
                break
            if signals.received:  # SIGTERM/SIGUSR1 came during the last step (or before the first)
                stopped = "signal"
                break
            begin = run["chunk"] * cfg.unroll
            fi, ft = _chunk(fwd, begin, cfg.unroll, BOS_ID)
            bi, bt = _chunk(bwd, begin, cfg.unroll, EOS_ID)
            with autocast(device, cfg.precision):
                result, new_state = lm(fi, ft, bi, bt, table, lstm_state)
            result["loss"].backward()
            if cfg.clip_norm:
                torch.nn.utils.clip_grad_norm_(lm.parameters(), cfg.clip_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            # Truncated BPTT: keep the values, cut the graph.
            lstm_state = tuple(t.detach().float() for t in new_state)
            if cfg.state_reset_prob > 0:
                keep = torch.rand(1, 2, fi.shape[0], 1, device=device) >= cfg.state_reset_prob
                lstm_state = tuple(t * keep for t in lstm_state)
            pending.append(result["loss"])
            run["step"] += 1
            run["chunk"] += 1
            steps_this_call += 1
            tokens_this_call += fi.numel()
            bar.update(1)
            if run["step"] % cfg.log_every == 0:
                pending.flush_into(run["losses"])
                elapsed = time.monotonic() - start
                tok_s = tokens_this_call / max(elapsed, 1e-9)
                bar.set_postfix(loss=f"{run['losses'][-1]:.3f}", tok_s=f"{tok_s:,.0f}")
                run_log.on_log(run["step"], {"step": run["step"], "epoch": run["epoch"], "loss": run["losses"][-1],
                                             "tokens_per_s": round(tok_s, 1), "lr": sched.get_last_lr()[0]})
            if run["step"] % cfg.save_every == 0:
                save_checkpoint()
                last_saved = run["step"]
        if not stopped and signals.received:  # the epoch's end (its evaluation) is left to the resumed run
            stopped = "signal"
        if not stopped:  # the epoch ran to its end
            run["epoch"] += 1
            run["chunk"] = 0
            lstm_state = None
            save_checkpoint()
            last_saved = run["step"]
            evaluate()
    bar.close()
    elapsed = time.monotonic() - start
    run["train_time_s"] = run.get("train_time_s", 0.0) + elapsed
    if run["step"] != last_saved or steps_this_call == 0:
        save_checkpoint()
    pending.flush_into(run["losses"])
    if stopped == "signal":  # the seconds before a kill go to the checkpoint: no evaluation, no final/
        logger.info("%s at step %d: checkpoint written", signals.received, run["step"])
        summary = {"steps": run["step"], "epoch": run["epoch"], "losses": run["losses"],
                   "stopped": {"reason": "signal", "step": run["step"]}}
        run_log.on_train_end({k: v for k, v in summary.items() if k != "losses"})
        return summary
    valid = run["history"][-1] if run["history"] and run["history"][-1]["step"] == run["step"] else evaluate()
    final = save_elmo_lm(lm, out / "final", vocab)
    try:
        write_bilm_tf(lm.bilm, final / "weights.hdf5")
    except ImportError as err:
        logger.warning("%s; skipped final/weights.hdf5", err)
    summary = {"model": config_to_options(arch), "parameters": params, "vocab_size": len(vocab),
               "train_tokens": len(train_stream), "steps": run["step"], "epoch": run["epoch"],
               "chunks_per_epoch": chunks_per_epoch, "valid": valid, "history": run["history"], "losses": run["losses"],
               "tokens_per_s": round(tokens_this_call / max(elapsed, 1e-9), 1), "train_time_s": round(run["train_time_s"], 1),
               "device": str(device), "train_config": dataclasses.asdict(cfg)}
    text = json.dumps({k: v for k, v in summary.items() if k != "losses"}, indent=2) + "\n"
    atomic_write(out / "results.json", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    run_log.on_train_end({k: v for k, v in summary.items() if k not in ("losses", "history")})
    return summary
