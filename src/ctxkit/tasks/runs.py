"""Run folders and the fine-tune / evaluate / load loop that ``ctxkit finetune|evaluate|predict``
drive, for any registered task.

A run folder holds::

    task.json        task name + options, model source, hyper-parameters
    best/            encoder in HF layout (+ tokenizer files) and head.safetensors
    checkpoint/      trainer state for --resume
    log.jsonl        one record per log step / evaluation
    curve.png        training loss and dev metric
    results.json     final metrics of the best model on every evaluation split
    README.md        the model card (ctxkit.tasks.model_card): scores, data, command, plan
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import torch
from safetensors.torch import load_file
from torch import nn

from ..core.checkpoint import (
    CheckpointError,
    load_state_dict_strict,
    save_weights,
    write_json,
)
from ..models.common import check_vocab_fits
from ..zoo.encoders import load_encoder, save_encoder
from ..training import TrainConfig, Trainer, resolve_device, set_seed
from ..training.callbacks import Callback
from ..fast import FastPlan, apply, resolve
from ..core.deps import require_all
from ..core.durable import recover_folder, verify_manifest
from ..core.errors import UserError
from ..tokenizers import WordPieceTokenizer
from ..core.hub import hub_snapshot, is_hub_id, push_folder
from .base import Task
from .hub_tasks import hf_task, hf_task_kind, load_hf_task_model
from .model_card import write_model_card
from .ort_model import OrtTaskModel
from .registry import get_task
from ..zoo import get_model
from ..training.progress import progress_bar

__all__ = ["finetune", "evaluate_run", "load_run", "load_task", "save_run_model", "read_weights_file"]

logger = logging.getLogger("ctxkit")


def save_run_model(model: nn.Module, tokenizer, folder: Path) -> None:
    """Write the encoder (HF layout, with tokenizer) and the head weights."""
    save_encoder(model.encoder, folder, tokenizer)
    save_weights(model.head.state_dict(), folder / "head.safetensors")


def run_folder(run_dir: os.PathLike) -> Path:
    """The folder of a run: the path itself, or for a Hub id (of a transformers task model,
    e.g. ``distilbert/distilbert-base-uncased-finetuned-sst-2-english``) its snapshot in the
    Hugging Face cache, downloaded first if needed."""
    path = Path(run_dir)
    if not path.exists() and is_hub_id(str(run_dir)):
        return hub_snapshot(str(run_dir))
    return path


def load_task(run_dir: os.PathLike) -> Tuple[Task, dict]:
    """The task of a run folder and its ``task.json``, without loading any weights; for a
    transformers task checkpoint (:mod:`ctxkit.tasks.hub_tasks`), the task its
    ``config.json`` describes (``info["hf_task"]`` says which head).

    Raises:
        CheckpointError: the folder is not a run folder, or its task.json is unreadable.
    """
    run_dir = run_folder(run_dir)
    info_path = run_dir / "task.json"
    if not info_path.is_file():
        kind = hf_task_kind(run_dir)
        if kind is not None:
            task = hf_task(run_dir, kind)
            return task, {"task": task.name, "options": task.options(), "model": str(run_dir), "hf_task": kind}
        raise CheckpointError(f"{run_dir}: not a ctxkit run folder (no task.json) nor a transformers task checkpoint "
                              "(a config.json whose architectures name a *ForSequenceClassification, "
                              "*ForTokenClassification or *ForQuestionAnswering model)")
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
        return get_task(info["task"], **info.get("options", {})), info
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise CheckpointError(f"{info_path}: not a readable run description ({type(err).__name__}: {err})") from None


def recorded_plan(run_dir: os.PathLike) -> Optional[str]:
    """The fast plan a run was trained with, as asked (``RUN/fast.json``; None when absent
    or unreadable: the run predates plans, or was not written by the Trainer)."""
    path = Path(run_dir) / "fast.json"
    try:
        asked = json.loads(path.read_text(encoding="utf-8")).get("asked")
    except (OSError, ValueError, AttributeError):
        return None
    return asked if isinstance(asked, str) and asked else None


def load_run(run_dir: os.PathLike, device: str = "auto", fast: Optional[str] = None):
    """Load a fine-tuned run: ``(task, model, tokenizer, info)``.

    The model gets the module swaps of a fast plan for inference: ``fast``, else the plan the
    run was trained with (``RUN/fast.json``: what of it can run here, for inference), else
    ``auto``; ``info["fast"]`` holds that :class:`~ctxkit.fast.FastPlan` (unresolved) for the
    backends, which resolve it again for their dtype (the GPU encoder).

    Raises:
        CheckpointError: the folder is not a finished run, or its weights do not match.
        UserError: a plan that cannot run here.
    """
    run_dir = run_folder(run_dir)
    task, info = load_task(run_dir)
    if info.get("hf_task"):  # a transformers task checkpoint: the folder is the model
        asked = FastPlan.parse(fast if fast is not None else "auto")
        dev = resolve_device(device)
        plan = resolve(asked, use="infer", device=dev)
        model, arch = load_hf_task_model(run_dir, info["hf_task"], task)
        apply(model, plan)
        tokenizer = WordPieceTokenizer.from_dir(run_dir)
        check_vocab_fits(model, tokenizer, run_dir)
        return task, model.to(dev).eval(), tokenizer, {**info, "architecture": arch, "fast": asked, "fast_plan": str(plan)}
    best = run_dir / "best"
    if not best.is_dir() and (run_dir / "head.safetensors").is_file():
        best = run_dir  # a run pushed to the Hub (push_run): best/'s files at the top, beside task.json
    elif not best.is_dir():  # a crash between the two renames of a save: the previous best/ stands aside
        try:
            recover_folder(best)
        except OSError:
            pass
    if best.is_dir():
        verify_manifest(best)  # best/ is swapped in whole; a copy that differs from its manifest is refused
    tokenizer = WordPieceTokenizer.from_dir(best) if best.is_dir() else None
    if (best / "backend.json").is_file():  # an exported run (ctxkit quantize): ONNX Runtime instead of PyTorch

        backend = json.loads((best / "backend.json").read_text(encoding="utf-8"))
        if not (best / backend["file"]).is_file():
            raise CheckpointError(f"{best / 'backend.json'} names {backend['file']}, which is missing")
        # An exported graph runs as exported: no fast plan applies to it.
        return task, OrtTaskModel(best / backend["file"]).eval(), tokenizer, {**info, "backend": backend, "fast": None}
    if not (best / "head.safetensors").is_file():
        raise CheckpointError(f"{run_dir}: no saved model in best/ (did training finish an epoch?)")
    # Asked now: it must run here. Recorded at training: a ceiling, what can run here of it.
    recorded = recorded_plan(run_dir) if fast is None else None
    asked = FastPlan.parse(fast) if fast is not None else replace(FastPlan.parse(recorded), lenient=True) if recorded else FastPlan.parse("auto")
    dev = resolve_device(device)
    plan = resolve(asked, use="infer", device=dev)  # refused here, before the weights load, if it cannot run
    model = task.build_model(load_encoder(best))
    check_vocab_fits(model, tokenizer, best)
    load_state_dict_strict(model.head, read_weights_file(best / "head.safetensors"), source=str(best / "head.safetensors"))
    apply(model, plan)  # a loaded run only runs inference: e.g. one q/k/v GEMM instead of three (ctxkit.fast)
    return task, model.to(dev).eval(), tokenizer, {**info, "fast": asked, "fast_plan": str(plan)}


def push_run(run_dir: os.PathLike, repo_id: str, *, private: Optional[bool] = None, commit_message: Optional[str] = None,
             token: Optional[str] = None) -> str:
    """Upload a fine-tuned run to the Hub repository ``repo_id`` in one commit: ``best/``'s files
    (the encoder in the HF layout, the tokenizer, ``head.safetensors``) at the top, with
    ``task.json``, ``fast.json``, ``results.json`` and the model card ``README.md``;
    ``ctxkit predict|evaluate|serve ORG/NAME`` then load it as they load the folder. Returns
    the commit's URL.

    Raises:
        CheckpointError: not a finished run (no ``best/``).
    """
    run_dir = Path(run_dir)
    task, info = load_task(run_dir)
    best = run_dir / "best"
    if info.get("hf_task") or not (best / "head.safetensors").is_file():
        raise CheckpointError(f"{run_dir}: no finished run to push (no best/head.safetensors)")
    with tempfile.TemporaryDirectory(prefix="ctxkit-push-") as tmp:
        for item in best.iterdir():
            if item.is_file() and item.name != "MANIFEST.json":  # the Hub checks each file's SHA-256 itself
                shutil.copy2(item, Path(tmp) / item.name)
        for name in ("task.json", "fast.json", "results.json", "README.md"):
            if (run_dir / name).is_file():
                shutil.copy2(run_dir / name, Path(tmp) / name)
        return push_folder(Path(tmp), repo_id, private=private, commit_message=commit_message or f"Upload {task.name} run", token=token)


def read_weights_file(path: Path) -> Dict[str, torch.Tensor]:
    """One safetensors file (``read_weights`` reads a folder's model file)."""
    try:
        return load_file(str(path))
    except Exception as err:
        raise CheckpointError(f"{path}: could not read weights ({type(err).__name__}: {err})") from None


def _limit(examples: list, n: Optional[int]) -> list:
    return examples if not n else examples[:n]


def _source(task: Task, data: os.PathLike, split: str, examples) -> str:
    """Where a split was read from, for messages: the file when the reader knows it."""
    path = getattr(examples, "path", None)
    return str(path) if path else task.describe_split(data, split)


def _read_splits(task: Task, data: Path, eval_data: Optional[Path], limit_train: Optional[int], limit_eval: Optional[int]):
    """Read and check every split before any model is loaded or step is taken.

    Raises:
        UserError: a split with no examples (named by file), or labels the task refuses.
    """
    train_split, eval_split = task.train_split, None
    if eval_data is not None and task.splits_one_file:
        train_split = eval_split = "all"  # a separate evaluation file: every question of each file
    train_raw = task.load(data, train_split)
    if not train_raw:
        raise UserError(f"{_source(task, data, train_split, train_raw)}: no training examples")
    train = _limit(train_raw, limit_train)
    task.prepare(train)
    task.check(train, _source(task, data, train_split, train_raw), training=True)
    evals = {}
    for split in task.eval_splits:
        raw = task.load(eval_data or data, eval_split or split)
        where = _source(task, eval_data or data, eval_split or split, raw)
        if not raw:
            raise UserError(f"{where}: no {split} examples to evaluate on (checked before training)")
        evals[split] = _limit(raw, limit_eval)
        task.check(evals[split], where, training=False)
    return train, evals


def finetune(
    task: Task,
    model_name: str,
    data: os.PathLike,
    out_dir: os.PathLike,
    config: TrainConfig,
    resume: bool = False,
    limit_train: Optional[int] = None,
    limit_eval: Optional[int] = None,
    eval_data: Optional[os.PathLike] = None,
    callbacks: Optional[Sequence[Callback]] = None,
    command: Optional[str] = None,
) -> dict:
    """Fine-tune ``model_name`` on ``task`` and evaluate the best epoch on every eval split.

    Every split is read and checked first (an empty split, or evaluation labels the model
    cannot predict, is a :class:`UserError` before any training time is spent). The seed is
    set before the task head is built, so the same seed on the same machine gives the same
    weights. A stop the config asks for (``max_steps`` mid-epoch, ``max_minutes``) is a
    success: a resumable checkpoint, and ``best/`` evaluated at the stop.

    Args:
        task: the task.
        model_name: checkpoint name (``all_minilm_l6_v2``) or HF-format folder.
        data: the task's data folder (or file, for SQuAD).
        out_dir: run folder.
        config: hyper-parameters.
        resume: continue from ``out_dir/checkpoint``.
        limit_train, limit_eval: use only the first N examples (smoke tests); recorded in
            the run folder, and ``evaluate`` applies the same ``limit_eval`` by default.
        eval_data: evaluation data when it lives elsewhere (defaults to ``data``); for
            SQuAD-style tasks, a separate file whose every question is evaluated (and then
            every question of ``data`` trains).
        callbacks: also receive the training log (:mod:`ctxkit.training.callbacks`), e.g.
            a TensorBoard writer.
        command: the command line that started the run, for the model card (``RUN/README.md``,
            :mod:`ctxkit.tasks.model_card`), which is written with ``results.json``.

    Returns:
        ``{"results": {split: metrics}, "train_time": s, "best_epoch": int, ...}``.
    """

    out = Path(out_dir)
    data = Path(data).resolve()  # the run folder must work from any directory
    eval_path = Path(eval_data).resolve() if eval_data is not None else None
    if config.group_factor is None:
        config = replace(config, group_factor=task.group_factor)
    t0 = time.time()
    require_all(task.requires(), f"scoring {task.name}")  # a missing package must not cost the run
    train_examples, evals = _read_splits(task, data, eval_path, limit_train, limit_eval)
    encoder, tokenizer = get_model(model_name)
    if tokenizer is None:
        raise UserError(f"{model_name!r} has no tokenizer: fine-tune a checkpoint (name or folder), not a bare preset")
    features = task.featurize(tokenizer, train_examples, train=True)
    prepare_s = time.time() - t0
    logger.info("%s: %d training examples -> %d features (%.1fs)", task.name, len(train_examples), len(features), prepare_s)
    # The head's random initialisation is part of the run: seed it like everything else.
    set_seed(config.seed)
    model = task.build_model(encoder)
    limits = {"limit_train": limit_train or None, "limit_eval": limit_eval or None}
    info = {"task": task.name, "options": task.options(), "model": str(model_name), "config": asdict(config), "data": str(data),
            "eval_data": None if eval_path is None else str(eval_path), **limits}
    out.mkdir(parents=True, exist_ok=True)
    write_json(info, out / "task.json")
    first = task.eval_splits[0]

    def evaluate(m: nn.Module) -> Dict[str, float]:
        metrics, _ = task.evaluate(m, tokenizer, evals[first], config.eval_batch_size, config.device)
        return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}

    trainer = Trainer(
        model, features, config, out, evaluate, task.main_metric,
        save_best=lambda m, folder: save_run_model(m, tokenizer, folder), callbacks=callbacks,
    )
    result = trainer.train(resume=resume)
    if result.stopped == "signal":  # stopped by SIGTERM/SIGUSR1: the checkpoint is what counts, no evaluation
        summary = {"task": task.name, "model": str(model_name), "steps": result.steps, "fast": str(trainer.plan),
                   "stopped": {"reason": "signal", "step": result.steps,
                               "resume": "ctxkit finetune ... --resume continues exactly from checkpoint/"}}
        write_json(summary, out / "results.json")
        return summary
    t1 = time.time()
    # Score the best epoch's weights (not the last epoch's) on every split.
    _, best_model, _, _ = load_run(out, config.device)
    results = {}
    for split, examples in evals.items():
        metrics, _ = task.evaluate(best_model, tokenizer, examples, config.eval_batch_size, config.device)
        results[split] = metrics
    summary = {
        "task": task.name,
        "model": str(model_name),
        "results": rounded(results),
        "best_epoch": result.best_epoch,
        "train_time_s": round(result.wall_time, 1),
        "timings_s": {"prepare": round(prepare_s, 1), "train": round(result.wall_time, 1), "final_eval": round(time.time() - t1, 1)},
        "steps": result.steps,
        "fast": str(trainer.plan),
        "train_examples": len(train_examples),
        "eval_examples": {split: len(examples) for split, examples in evals.items()},
        **limits,
        "device": _device_name(config.device),
    }
    if result.stopped:
        summary["stopped"] = {"reason": result.stopped, "step": result.steps,
                              "resume": "ctxkit finetune ... --resume continues exactly from checkpoint/"}
    write_json(summary, out / "results.json")
    write_model_card(out, info, summary, command)
    return summary


_AS_TRAINED = object()


def evaluate_run(run_dir: os.PathLike, data: Optional[os.PathLike] = None, splits: Optional[Sequence[str]] = None, batch_size: int = 128,
                 device: str = "auto", limit_eval=_AS_TRAINED, progress: bool = False, unknown_tags: Optional[str] = None,
                 fast: Optional[str] = None) -> dict:
    """Evaluate a finished run on its evaluation splits (or ``splits``) of ``data``.

    Args:
        run_dir: the run folder.
        data: data folder/file (default: the one the run was trained with, or its ``eval_data``).
        splits: split names (default: the task's evaluation splits).
        limit_eval: score only the first N examples of each split; by default the same
            ``limit_eval`` the run was trained with (recorded in ``task.json``), so the
            number matches ``results.json``; 0 or None scores every example.
        progress: show a progress bar per split.
        unknown_tags: NER: "score" evaluates gold tags outside the model's label set as
            missed entities instead of refusing them (see :class:`~ctxkit.tasks.ner.ConllNerTask`).
        fast: the fast plan's module swaps (default: the run's recorded plan; see :func:`load_run`).
    """
    task, info = load_task(run_dir)  # data problems surface before the weights load
    require_all(task.requires(), f"scoring {task.name}")
    if unknown_tags is not None:
        if not hasattr(task, "unknown_tags"):
            raise UserError(f"unknown_tags is for NER runs; {run_dir} is a {task.name} run")
        task.unknown_tags = unknown_tags
    if limit_eval is _AS_TRAINED:
        limit_eval = info.get("limit_eval")
        if limit_eval:
            logger.info("scoring the first %d examples of each split, as in training (--limit-eval); "
                        "pass --limit-eval 0 to score them all", limit_eval)
    separate = data is None and info.get("eval_data")
    data = data or info.get("eval_data") or info.get("data")
    if not data:  # a transformers checkpoint records no data
        raise UserError(f"{run_dir} records no evaluation data; pass --data PATH")
    if not Path(data).exists():
        raise UserError(f"{run_dir} was trained on {data}, which does not exist here; pass --data PATH")
    chosen = {}
    for split in splits or task.eval_splits:
        raw = task.load(data, "all" if separate and task.splits_one_file else split)
        examples = _limit(raw, limit_eval)
        if not examples:
            raise UserError(f"{_source(task, data, split, raw)}: no {split} examples to evaluate on")
        task.check(examples, _source(task, data, split, raw), training=False)
        chosen[split] = examples
    _, model, tokenizer, _ = load_run(run_dir, device, fast=fast)
    out = {}
    for split, examples in chosen.items():
        with _progress(progress, f"evaluate {split}", len(examples)):
            metrics, _ = task.evaluate(model, tokenizer, examples, batch_size, device)
        out[split] = metrics
    return rounded(out)


def rounded(metrics, digits: int = 4):
    """Metrics as a reader wants them in results.json and on the terminal: floats to ``digits``
    decimals (percentages keep 0.0001 points), everything else as it is."""
    if isinstance(metrics, dict):
        return {k: rounded(v, digits) for k, v in metrics.items()}
    if isinstance(metrics, (list, tuple)):
        return type(metrics)(rounded(v, digits) for v in metrics)
    return round(metrics, digits) if isinstance(metrics, float) else metrics


def _progress(enabled: bool, desc: str, n: int):
    """A progress indication for a long evaluation (the prediction loop reports batches)."""

    return progress_bar(desc, n) if enabled else contextlib.nullcontext()


def _device_name(device: str) -> str:
    dev = resolve_device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)

    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
