"""What every fine-tuning task shares: the task interface, run folders, and the
fine-tune / evaluate / load loop that ``ctxkit finetune|evaluate|predict`` drive.

A run folder holds::

    task.json        task name + options, model source, hyper-parameters
    best/            encoder in HF layout (+ tokenizer files) and head.safetensors
    checkpoint/      trainer state for --resume
    log.jsonl        one record per log step / evaluation
    curve.png        training loss and dev metric
    results.json     final metrics of the best model on every evaluation split
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..checkpoint import (
    CheckpointError,
    load_state_dict_strict,
    save_weights,
    write_json,
)
from ..models.encoders import load_encoder, save_encoder
from ..training import TrainConfig, Trainer, resolve_device

__all__ = ["Task", "finetune", "evaluate_run", "load_run", "save_run_model"]

logger = logging.getLogger("ctxkit")


class Task:
    """Interface of a fine-tuning task; subclasses fill it in for one task family.

    Attributes:
        name: registry name (``sst-2``, ``conll2003``, ``squad``...).
        main_metric: metric that picks the best epoch.
        train_split: split name used for training.
        eval_splits: split names evaluated after training (the first one each epoch).
        group_factor: default length grouping of training batches (see
            :class:`~ctxkit.training.TrainConfig`).
    """

    name: str = ""
    group_factor: int = 50
    main_metric: str = ""
    train_split: str = "train"
    eval_splits: Tuple[str, ...] = ("dev",)

    def options(self) -> dict:
        """JSON-serialisable options that rebuild this task via ``get_task(name, **options)``."""
        return {}

    def load(self, data: os.PathLike, split: str) -> list:
        """Read the examples of one split from the task's data folder or file."""
        raise NotImplementedError

    def prepare(self, train_examples: list) -> None:
        """Fix anything learned from the training data (e.g. the label set)."""

    def build_model(self, encoder: nn.Module) -> nn.Module:
        """The encoder plus this task's head; has ``.encoder`` and ``.head``."""
        raise NotImplementedError

    def featurize(self, tokenizer, examples: list, train: bool) -> List[dict]:
        """Feature dicts for the trainer and for :func:`ctxkit.training.predict`."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, tokenizer, examples: list, batch_size: int = 128, device: str = "auto") -> Tuple[Dict[str, float], object]:
        """Return ``(metrics, predictions)`` on labelled examples."""
        raise NotImplementedError

    def predict_lines(self, model: nn.Module, tokenizer, lines: Sequence[str], batch_size: int = 64, device: str = "auto") -> List[dict]:
        """Predictions for raw input lines (``ctxkit predict``), one JSON-able dict each."""
        raise NotImplementedError


def save_run_model(model: nn.Module, tokenizer, folder: Path) -> None:
    """Write the encoder (HF layout, with tokenizer) and the head weights."""
    save_encoder(model.encoder, folder, tokenizer)
    save_weights(model.head.state_dict(), folder / "head.safetensors")


def load_run(run_dir: os.PathLike, device: str = "auto"):
    """Load a fine-tuned run: ``(task, model, tokenizer, info)``.

    Raises:
        CheckpointError: the folder is not a finished run, or its weights do not match.
    """
    from ..tokenizers import WordPieceTokenizer
    from . import get_task

    run_dir = Path(run_dir)
    info_path = run_dir / "task.json"
    if not info_path.is_file():
        raise CheckpointError(f"{run_dir}: not a ctxkit run folder (no task.json)")
    info = json.loads(info_path.read_text(encoding="utf-8"))
    best = run_dir / "best"
    task = get_task(info["task"], **info.get("options", {}))
    tokenizer = WordPieceTokenizer.from_dir(best) if best.is_dir() else None
    if (best / "backend.json").is_file():  # an exported run (ctxkit quantize): ONNX Runtime instead of PyTorch
        from ..inference.ort_model import OrtTaskModel

        backend = json.loads((best / "backend.json").read_text(encoding="utf-8"))
        if not (best / backend["file"]).is_file():
            raise CheckpointError(f"{best / 'backend.json'} names {backend['file']}, which is missing")
        return task, OrtTaskModel(best / backend["file"]).eval(), tokenizer, {**info, "backend": backend}
    if not (best / "head.safetensors").is_file():
        raise CheckpointError(f"{run_dir}: no saved model in best/ (did training finish an epoch?)")
    model = task.build_model(load_encoder(best))
    load_state_dict_strict(model.head, read_weights_file(best / "head.safetensors"), source=str(best / "head.safetensors"))
    return task, model.to(resolve_device(device)).eval(), tokenizer, info


def read_weights_file(path: Path) -> Dict[str, torch.Tensor]:
    """One safetensors file (``read_weights`` reads a folder's model file)."""
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as err:
        raise CheckpointError(f"{path}: could not read weights ({type(err).__name__}: {err})") from None


def _limit(examples: list, n: Optional[int]) -> list:
    return examples if not n else examples[:n]


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
) -> dict:
    """Fine-tune ``model_name`` on ``task`` and evaluate the best epoch on every eval split.

    Args:
        task: the task.
        model_name: checkpoint name (``all_minilm_l6_v2``) or HF-format folder.
        data: the task's data folder (or file, for SQuAD).
        out_dir: run folder.
        config: hyper-parameters.
        resume: continue from ``out_dir/checkpoint``.
        limit_train, limit_eval: use only the first N examples (smoke tests).
        eval_data: evaluation data when it lives elsewhere (defaults to ``data``).

    Returns:
        ``{"results": {split: metrics}, "train_time": s, "best_epoch": int, ...}``.
    """
    from ..zoo import get_model

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if config.group_factor is None:
        config = replace(config, group_factor=task.group_factor)
    encoder, tokenizer = get_model(model_name)
    if tokenizer is None:
        raise ValueError(f"{model_name!r} has no tokenizer: fine-tune a checkpoint (name or folder), not a bare preset")
    t0 = time.time()
    train_examples = _limit(task.load(data, task.train_split), limit_train)
    task.prepare(train_examples)
    evals = {s: _limit(task.load(eval_data or data, s), limit_eval) for s in task.eval_splits}
    features = task.featurize(tokenizer, train_examples, train=True)
    prepare_s = time.time() - t0
    logger.info("%s: %d training examples -> %d features (%.1fs)", task.name, len(train_examples), len(features), prepare_s)
    model = task.build_model(encoder)
    info = {"task": task.name, "options": task.options(), "model": str(model_name), "config": asdict(config), "data": str(data)}
    write_json(info, out / "task.json")
    first = task.eval_splits[0]

    def evaluate(m: nn.Module) -> Dict[str, float]:
        metrics, _ = task.evaluate(m, tokenizer, evals[first], config.eval_batch_size, config.device)
        return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}

    trainer = Trainer(
        model, features, config, out, evaluate, task.main_metric,
        save_best=lambda m, folder: save_run_model(m, tokenizer, folder),
    )
    result = trainer.train(resume=resume)
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
        "results": results,
        "best_epoch": result.best_epoch,
        "train_time_s": round(result.wall_time, 1),
        "timings_s": {"prepare": round(prepare_s, 1), "train": round(result.wall_time, 1), "final_eval": round(time.time() - t1, 1)},
        "steps": result.steps,
        "train_examples": len(train_examples),
        "device": _device_name(config.device),
    }
    write_json(summary, out / "results.json")
    return summary


def evaluate_run(run_dir: os.PathLike, data: Optional[os.PathLike] = None, splits: Optional[Sequence[str]] = None, batch_size: int = 128, device: str = "auto") -> dict:
    """Evaluate a finished run on its evaluation splits (or ``splits``) of ``data``."""
    task, model, tokenizer, info = load_run(run_dir, device)
    data = data or info["data"]
    out = {}
    for split in splits or task.eval_splits:
        metrics, _ = task.evaluate(model, tokenizer, task.load(data, split), batch_size, device)
        out[split] = metrics
    return out


def _device_name(device: str) -> str:
    dev = resolve_device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
