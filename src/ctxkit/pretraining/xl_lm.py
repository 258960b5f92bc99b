"""Word-level language modelling with Transformer-XL (and a vanilla Transformer baseline).

* Data (as in the Transformer-XL code for WikiText): every line, empty ones included, is
  its whitespace-separated words plus ``<eos>``; the vocabulary is the training files'
  words (``<eos>`` counted as one) by descending count; unknown words map to ``<unk>``.
  WikiText-2 gives 33278 words and 2088628 / 217646 / 245569 train/valid/test tokens.
* The stream is cut into ``batch_size`` contiguous rows whose targets run one token past
  their end, read ``tgt_len`` tokens at a time; the XL carries its detached memory across
  segments (empty at each epoch start).
* :func:`evaluate_xl_lm` scores every token after the first (``<eos>`` included) with the
  memory length chosen at evaluation: ``mem_len=0`` is the no-recurrence number,
  ``2*tgt_len``/``4*tgt_len`` the longer attention length that recurrence buys.
* Baseline (``--model vanilla``, :class:`VanillaTransformerLM`): the same depth, width,
  heads, FFN, norm placement, adaptive input and adaptive softmax, but learned absolute
  positions and no memory, trained on the same segments. GPT-2 would differ in more than
  recurrence and positions (pre-norm, GELU, tied full softmax); an XL with ``mem_len=0``
  keeps relative positions, so it is reported as "XL evaluated without memory" instead.
* Adam, linear warmup then cosine over ``max_steps`` or, with only ``max_time_s``, over
  training *time* (not bit-reproducible), gradient clipping, bf16 autocast on CUDA.
  ``checkpoint/`` (:func:`ctxkit.core.run_state.save_checkpoint`: replaced whole, manifest
  checked on resume) holds model, optimiser, memory, RNG and data position: a resumed run
  repeats an uninterrupted one's losses (a ``checkpoint.pt`` of earlier versions is still
  read). ``final/``: :func:`load_xl_lm` (:func:`ctxkit.models.transformer_xl.io.load_transformer_xl_lm`; the
  baseline and the I/O live beside the model in :mod:`ctxkit.models`).
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
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from ..core.checkpoint import CheckpointError, atomic_write, load_state_dict_strict
from ..core.interrupts import StopSignals, resume_or_start
from ..core.run_folder import hold_run_folder, trim_log
from ..core.run_state import Checkpoint, LossBuffer, autocast, resolve_device, restore_rng, resume_checkpoint
from ..core.run_state import save_checkpoint as write_checkpoint
from ..models.transformer_xl.model import TransformerXLConfig, TransformerXLLMHeadModel, TransformerXLModel, VanillaTransformerLM
from ..models.transformer_xl.model import build_transformer_xl_lm as build_model
from ..models.transformer_xl.io import load_transformer_xl_lm as load_xl_lm
from ..models.transformer_xl.io import save_transformer_xl_lm as save_xl_lm
from ..data.errors import require_rereadable
from ..tokenizers import read_lines
from ..training.callbacks import Callback, CallbackList, JsonlWriter
from ..core.errors import UserError

__all__ = ["EOS", "UNK", "XLTrainConfig", "build_xl_vocab", "xl_stream", "make_rows", "VanillaTransformerLM", "build_model",
           "lm_forward", "evaluate_xl_lm", "train_xl_lm", "save_xl_lm", "load_xl_lm"]

logger = logging.getLogger("ctxkit")

EOS, UNK = "<eos>", "<unk>"


def build_xl_vocab(files: Sequence[os.PathLike], max_size: Optional[int] = None) -> List[str]:
    """Words of the files plus ``<eos>`` (one per line), by descending count, ties alphabetically;
    ``<unk>`` is appended when the text has none. ``max_size`` keeps the most frequent words
    (``<unk>`` included), the rest map to ``<unk>``."""
    counts: Counter = Counter()
    for path in files:  # read again by the stream builder: a pipe would block the second time
        require_rereadable(path, "building the vocabulary and then the token stream")
    for path in files:
        for line in read_lines(path):
            counts.update(line.split())
            counts[EOS] += 1
    if not counts:  # not even an empty line: the vocabulary would lack <eos>
        raise UserError(f"no text in {', '.join(map(str, files))}")
    vocab = sorted(counts, key=lambda w: (-counts[w], w))
    if max_size is not None:
        if max_size < 3:
            raise UserError(f"max_size must be at least 3 (<eos>, <unk> and a word), got {max_size}")
        kept = [w for w in vocab if w != UNK][: max_size - 1]
        return kept + [UNK] if EOS in kept else kept[:-1] + [EOS, UNK]
    return vocab if UNK in counts else vocab + [UNK]


def xl_stream(files: Sequence[os.PathLike], vocab: Sequence[str]) -> Tensor:
    """``(n,)`` ids: each line's words then ``<eos>`` (empty lines give a lone ``<eos>``)."""
    index = {w: i for i, w in enumerate(vocab)}
    if UNK not in index or EOS not in index:
        raise UserError(f"the vocabulary lacks {' and '.join(t for t in (UNK, EOS) if t not in index)}")
    unk, eos = index[UNK], index[EOS]
    ids: List[int] = []
    for path in files:
        for line in read_lines(path):
            ids.extend(index.get(w, unk) for w in line.split())
            ids.append(eos)
    if len(ids) < 2:
        raise UserError(f"too little text in {', '.join(map(str, files))}")
    return torch.tensor(ids, dtype=torch.long)


def make_rows(stream: Tensor, batch_size: int, pad: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """``(inputs, targets, weights)``, each ``(batch_size, cols)``: row ``b`` is the ``b``-th
    slice of the stream, ``targets`` the tokens one place later. Without ``pad`` the
    remainder is dropped; with it the last row is padded and ``weights`` (1 = scored) hide
    the padding, so every token after the first is predicted exactly once."""
    n = len(stream) - 1  # predictions
    cols = math.ceil(n / batch_size) if pad else n // batch_size
    if cols < 1:
        raise UserError(f"a stream of {len(stream)} tokens is too short for {batch_size} rows")
    padded = torch.cat([stream, stream.new_zeros(max(0, batch_size * cols + 1 - len(stream)))])
    inputs = padded[: batch_size * cols].view(batch_size, cols)
    targets = padded[1 : batch_size * cols + 1].view(batch_size, cols)
    weights = (torch.arange(batch_size * cols) < n).view(batch_size, cols).float()
    return inputs, targets, weights


def lm_forward(model: TransformerXLLMHeadModel, inputs: Tensor, targets: Tensor, mems, device: torch.device,
               precision: str) -> Tuple[Tensor, List[Tensor]]:
    """``(nll (batch, len) fp32, new mems)``: the body under bf16 autocast (CUDA), the softmax in
    fp32 outside it (``AdaptiveLogSoftmaxWithLoss`` fails on mixed dtypes under autocast)."""
    with autocast(device, precision):
        hidden, new_mems = model.transformer(inputs, mems)
    flat, target = hidden.float().flatten(0, 1), targets.flatten()
    with torch.autocast(device.type, enabled=False):
        nll = -model.crit(flat, target).output if model.crit is not None else \
            F.cross_entropy(model.out(flat), target, reduction="none")
    return nll.view_as(targets), new_mems


@torch.inference_mode()
def evaluate_xl_lm(model: TransformerXLLMHeadModel, stream: Tensor, tgt_len: int, mem_len: Optional[int] = None,
                   clamp_len: Optional[int] = None, batch_size: int = 10, device: str = "auto",
                   precision: str = "auto") -> Dict[str, float]:
    """Perplexity of every token of ``stream`` (``(n,)`` ids) after the first, ``tgt_len`` at a time.

    ``mem_len``/``clamp_len`` (None: the model's own) hold for this call only and are ignored
    by the vanilla model; each of the ``batch_size`` contiguous rows starts with no memory.
    Returns ``perplexity``, ``nll`` (nats/token), ``tokens``, ``tokens_per_s``, ``mem_len``, ``tgt_len``.
    """
    dev, body = resolve_device(device), model.transformer
    saved = (body.mem_len, body.clamp_len, model.training)
    if isinstance(body, TransformerXLModel):
        body.mem_len = saved[0] if mem_len is None else mem_len
        body.clamp_len = saved[1] if clamp_len is None else clamp_len
    used_mem_len, mems = body.mem_len, None
    model.eval().to(dev)
    inputs, targets, weights = (t.to(dev) for t in make_rows(stream, batch_size, pad=True))
    total = torch.zeros((), dtype=torch.float64, device=dev)
    start = time.perf_counter()
    try:
        for s in range(0, inputs.size(1), tgt_len):
            nll, mems = lm_forward(model, inputs[:, s : s + tgt_len], targets[:, s : s + tgt_len], mems, dev, precision)
            total += (nll.double() * weights[:, s : s + tgt_len]).sum()
        nll_sum = total.item()
    finally:
        body.mem_len, body.clamp_len = saved[0], saved[1]
        model.train(saved[2])
    elapsed, n = time.perf_counter() - start, int(weights.sum().item())
    return {"perplexity": math.exp(nll_sum / n), "nll": nll_sum / n, "tokens": n, "mem_len": used_mem_len,
            "tgt_len": tgt_len, "tokens_per_s": round(n / max(elapsed, 1e-9), 1)}


@dataclass
class XLTrainConfig:
    """Hyper-parameters of :func:`train_xl_lm`.

    ``model``: ``"xl"`` or ``"vanilla"``. ``max_steps`` / ``max_time_s`` (training time,
    evaluations excluded) count across resumes and stop the run; the first given is the
    schedule's length. ``stop_step`` pauses this call only (resume later, same schedule).
    ``eval_every`` 0: validation only at the end. ``clip_norm`` 0: no clipping.
    """

    model: str = "xl"
    batch_size: int = 32
    tgt_len: int = 128  # segment length
    mem_len: int = 128  # training memory length
    max_steps: Optional[int] = None
    max_time_s: Optional[float] = None
    lr: float = 5e-4
    warmup_steps: int = 200
    min_lr_ratio: float = 0.0
    clip_norm: float = 0.25
    eval_every: int = 0
    eval_batch_size: int = 10
    save_every: int = 500
    stop_step: Optional[int] = None
    log_every: int = 50
    seed: int = 1111
    max_vocab: Optional[int] = None  # most frequent words kept (None: all); the rest are <unk>
    device: str = "auto"
    precision: str = "auto"
    progress: bool = True


_RESUME_FIXED = ("model", "batch_size", "tgt_len", "mem_len", "max_steps", "lr", "warmup_steps", "min_lr_ratio", "seed",
                 "max_vocab")


def _lr_factor(cfg: XLTrainConfig, step: int, train_time: float) -> float:
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps) if cfg.max_steps else \
        train_time / cfg.max_time_s
    progress = min(max(progress, 0.0), 1.0)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def train_xl_lm(train_files: Sequence[os.PathLike], valid_files: Sequence[os.PathLike], out_dir: os.PathLike,
                config: TransformerXLConfig, train_cfg: Optional[XLTrainConfig] = None, resume: bool = False,
                callbacks: Optional[Sequence[Callback]] = None) -> dict:
    """Train an XL (or vanilla) word-level LM; see the module docstring for the recipe.

    ``out_dir`` gets ``vocab.txt``, ``checkpoint/``, ``log.jsonl``, ``final/``, ``results.json``;
    ``config``'s ``vocab_size``/``tgt_len``/``mem_len`` are set from the data and ``train_cfg``
    (cutoffs that do not fit the vocabulary are dropped). ``callbacks`` also receive the
    ``log.jsonl`` records (:mod:`ctxkit.training.callbacks`) and are closed when training
    returns or fails. Returns the summary: ``steps``, ``losses`` (every step's, since the
    start), ``train_tokens_per_s`` (this call), ``valid``, ...

    ``resume`` with no complete checkpoint (a run that crashed before its first) starts from
    the beginning with a one-line note; a finished run (``results.json``) whose checkpoint is
    gone is refused. SIGTERM or SIGUSR1 end the run after the current step with a checkpoint
    and no evaluation or ``final/`` (``summary["stopped"]["reason"] == "signal"``); a second
    signal stops at once.
    """
    # log.jsonl is the first writer, so a record reaches the file before any other writer.
    with hold_run_folder(out_dir), \
            CallbackList([JsonlWriter(Path(out_dir) / "log.jsonl", style="plain"), *(callbacks or ())]) as run_log, \
            StopSignals() as signals:
        return _train_xl_lm(train_files, valid_files, out_dir, config, train_cfg, resume, run_log, signals)


def _train_xl_lm(train_files: Sequence[os.PathLike], valid_files: Sequence[os.PathLike], out_dir: os.PathLike,
                 config: TransformerXLConfig, train_cfg: Optional[XLTrainConfig], resume: bool, run_log: CallbackList,
                 signals: StopSignals) -> dict:
    cfg = train_cfg or XLTrainConfig()
    if not cfg.max_steps and not cfg.max_time_s:
        raise UserError("give max_steps or max_time_s (the schedule's length)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device, ckpt_path, ckpt = resolve_device(cfg.device), out / "checkpoint", None
    if resume:  # a run that crashed before its first checkpoint starts again; a finished one is refused
        resume = resume_or_start(ckpt_path, finished=[out / "results.json"], legacy=out / "checkpoint.pt")
    if resume:
        ckpt = _read_checkpoint(out)
        ckpt_path = ckpt.folder
        changed = [k for k in _RESUME_FIXED if ckpt.trainer_state["train_config"].get(k) != getattr(cfg, k)]
        if changed:
            raise CheckpointError(f"{ckpt_path}: cannot resume with changed settings: {', '.join(changed)}")
        vocab = (out / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    else:
        vocab = build_xl_vocab(train_files, cfg.max_vocab)
        _write_text(out / "vocab.txt", "".join(w + "\n" for w in vocab))
    cutoffs = tuple(c for c in config.cutoffs if c < len(vocab))  # those that fit the vocabulary
    arch = config.replace(vocab_size=len(vocab), cutoffs=cutoffs, tgt_len=cfg.tgt_len,
                          mem_len=cfg.mem_len if cfg.model == "xl" else 0)
    train_stream = xl_stream(train_files, vocab)
    valid_stream = xl_stream(valid_files, vocab) if valid_files else None
    inputs, targets, _ = (t.to(device) for t in make_rows(train_stream, cfg.batch_size))
    segments = math.ceil(inputs.size(1) / cfg.tgt_len)

    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, arch, cfg.tgt_len).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    run = {"step": 0, "epoch": 0, "segment": 0, "losses": [], "history": [], "train_time_s": 0.0}
    mems = None
    if ckpt is not None:
        load_state_dict_strict(model, ckpt.model_state, source=str(ckpt_path))
        opt.load_state_dict(ckpt.optimizer_state)
        run = ckpt.trainer_state["run"]
        mems = None if ckpt.extra["mems"] is None else [m.to(device) for m in ckpt.extra["mems"]]
        restore_rng(ckpt.rng)
        logger.info("resumed from %s at step %d", ckpt_path, run["step"])
        trim_log(out / "log.jsonl", run["step"])  # the steps after the checkpoint are logged again
    params = sum(p.numel() for p in model.parameters())
    logger.info("%s LM: %d parameters, vocabulary %d, %d training tokens, %d segments per epoch", cfg.model, params,
                len(vocab), len(train_stream), segments)
    run_log.on_train_begin({"config": {**dataclasses.asdict(cfg), "architecture": dataclasses.asdict(arch)}, "parameters": params,
                            **({"resumed_at_step": run["step"]} if ckpt is not None else {})})
    pending = LossBuffer()

    def save_checkpoint() -> None:
        pending.flush_into(run["losses"])  # the checkpoint holds every step's loss
        write_checkpoint(out / "checkpoint", model_state=model.state_dict(), optimizer_state=opt.state_dict(),
                         trainer_state={"run": run, "train_config": dataclasses.asdict(cfg)},
                         extra={"mems": None if mems is None else [m.cpu() for m in mems]})

    def evaluate() -> Optional[dict]:
        if valid_stream is None:
            return None
        result = evaluate_xl_lm(model, valid_stream, cfg.tgt_len, batch_size=cfg.eval_batch_size, device=cfg.device,
                                precision=cfg.precision)
        run["history"].append({"step": run["step"], "epoch": run["epoch"], **result})
        run_log.on_eval(run["step"], run["history"][-1])
        logger.info("step %d: valid perplexity %.2f", run["step"], result["perplexity"])
        return run["history"][-1]

    def out_of_budget() -> bool:
        return bool((cfg.max_steps and run["step"] >= cfg.max_steps) or (cfg.stop_step and run["step"] >= cfg.stop_step)
                    or (cfg.max_time_s and run["train_time_s"] >= cfg.max_time_s))

    base_time, t0 = run["train_time_s"], time.monotonic()
    tokens_now, eval_time = 0, 0.0
    bar = tqdm(total=cfg.max_steps, initial=run["step"], desc=f"{cfg.model} LM", unit="step", disable=not cfg.progress)
    model.train()
    while not out_of_budget() and not signals.received:  # a signal: stop after this step
        if run["segment"] >= segments:  # epoch done: memory starts empty again
            run["epoch"], run["segment"], mems = run["epoch"] + 1, 0, None
        s = run["segment"] * cfg.tgt_len
        lr = cfg.lr * _lr_factor(cfg, run["step"], base_time + time.monotonic() - t0 - eval_time)
        for group in opt.param_groups:
            group["lr"] = lr
        seg = slice(s, s + cfg.tgt_len)
        nll, mems = lm_forward(model, inputs[:, seg], targets[:, seg], mems, device, cfg.precision)
        loss = nll.mean()
        loss.backward()
        if cfg.clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        pending.append(loss)
        run["step"], run["segment"] = run["step"] + 1, run["segment"] + 1
        tokens_now += inputs.size(0) * min(cfg.tgt_len, inputs.size(1) - s)
        run["train_time_s"] = base_time + time.monotonic() - t0 - eval_time
        bar.update(1)
        if run["step"] % cfg.log_every == 0:
            pending.flush_into(run["losses"])
            tok_s = tokens_now / max(time.monotonic() - t0 - eval_time, 1e-9)
            bar.set_postfix(loss=f"{run['losses'][-1]:.3f}", tok_s=f"{tok_s:,.0f}")
            run_log.on_log(run["step"], {"step": run["step"], "epoch": run["epoch"], "loss": run["losses"][-1], "lr": lr,
                                         "tokens_per_s": round(tok_s, 1)})
        if cfg.eval_every and run["step"] % cfg.eval_every == 0:
            e0 = time.monotonic()
            evaluate()
            eval_time += time.monotonic() - e0
        if run["step"] % cfg.save_every == 0:
            save_checkpoint()
    bar.close()
    pending.flush_into(run["losses"])  # waits for the device
    train_elapsed = time.monotonic() - t0 - eval_time
    run["train_time_s"] = base_time + train_elapsed
    save_checkpoint()
    if signals.received:  # the seconds before a kill go to the checkpoint: no evaluation, no final/
        logger.info("%s at step %d: checkpoint written", signals.received, run["step"])
        summary = {"model": cfg.model, "steps": run["step"], "epoch": run["epoch"], "losses": run["losses"],
                   "stopped": {"reason": "signal", "step": run["step"]}}
        run_log.on_train_end({k: v for k, v in summary.items() if k != "losses"})
        return summary
    valid = run["history"][-1] if run["history"] and run["history"][-1]["step"] == run["step"] else evaluate()
    save_xl_lm(model, out / "final", vocab)
    summary = {"model": cfg.model, "architecture": dataclasses.asdict(arch), "parameters": params, "vocab_size": len(vocab),
               "train_tokens": len(train_stream), "steps": run["step"], "epoch": run["epoch"], "segments_per_epoch": segments,
               "tokens_seen": run["step"] * cfg.batch_size * cfg.tgt_len, "valid": valid, "history": run["history"],
               "losses": run["losses"], "train_tokens_per_s": round(tokens_now / max(train_elapsed, 1e-9), 1),
               "train_time_s": round(run["train_time_s"], 1), "device": str(device),
               "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
               "train_config": dataclasses.asdict(cfg)}
    _write_text(out / "results.json", json.dumps({k: v for k, v in summary.items() if k != "losses"}, indent=2) + "\n")
    run_log.on_train_end({k: v for k, v in summary.items() if k not in ("losses", "history")})
    return summary


def _read_checkpoint(out: Path) -> Checkpoint:
    """``out/checkpoint/``, or the single ``checkpoint.pt`` earlier versions wrote."""
    return resume_checkpoint(out, lambda blob: ({"run": blob["run"], "train_config": blob["train_config"]},
                                                {"mems": blob["mems"], "rng": blob["rng"]}))


def _write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
