"""Task-specific distillation: a fine-tuned run (the teacher) gives a smaller student run.

``distill(teacher_run, data, out_dir, student_layers=3)``:

1. loads the teacher run (task, model, tokenizer) and reads the task's splits as
   :func:`~ctxkit.tasks.finetune` does (checked before any compute);
2. builds the student from the teacher's encoder, keeping every other layer (DistilBERT's
   initialisation, :func:`~ctxkit.training.distill.every_other_layer`) and the teacher's
   head, unless ``student_init`` names a checkpoint to start from instead;
3. runs the teacher once over the training features without gradients and keeps its logits
   in ``OUT/teacher_logits.safetensors`` (reused by every epoch, by ``--resume`` and by a
   second run with the same teacher: the file records the teacher's weights digest);
4. trains the student with the :class:`~ctxkit.training.Trainer` (same fast paths, logs,
   curves, exact resume) on ``alpha * T^2 KL(teacher || student) + (1 - alpha) * hard loss``
   (regression: MSE to the teacher's prediction; NER: labelled tokens; QA: start and end);
5. writes an ordinary run folder, so ``ctxkit evaluate | predict | export | serve`` take it.

``alpha=0`` trains the same student on the hard labels only: the baseline distillation is
measured against.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from safetensors.numpy import load_file as load_numpy, save_file as save_numpy
from torch import nn

from ..core.checkpoint import write_json
from ..core.errors import UserError
from ..training import TrainConfig, Trainer, predict, set_seed
from ..training.callbacks import Callback
from ..data.errors import check_input
from ..data.glue import TextExample
from ..data.lines import read_lines
from ..training.distill import UNLABELLED, DistillationObjective, every_other_layer, student_from_teacher
from ..zoo import get_model
from .runs import _device_name, _read_splits, load_run, save_run_model

__all__ = ["distill", "teacher_logits"]

logger = logging.getLogger("ctxkit")
CACHE = "teacher_logits.safetensors"


def _kind(task) -> str:
    name = type(task).__name__
    return "span" if "Squad" in name else "token" if "Ner" in name else "sequence"


def _fingerprint(model: nn.Module) -> str:
    """A digest of the teacher's weights: a cache made by another teacher is never reused."""
    digest = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(value.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def teacher_logits(teacher: nn.Module, features: Sequence[dict], kind: str, cache: Path, batch_size: int = 128,
                   device: str = "auto") -> List[np.ndarray]:
    """The teacher's logits for every training feature, from ``cache`` when it holds this
    teacher's logits for these features, else computed (inference mode, bf16 on CUDA) and saved.

    Returns:
        One float32 array per feature: ``(classes,)``, or ``(seq, classes)`` for tokens, or
        ``(seq, 2)`` (start, end) for spans.
    """
    stamp = {"teacher": _fingerprint(teacher), "features": len(features),
             "lengths": hashlib.sha256(np.asarray([len(f["input_ids"]) for f in features]).tobytes()).hexdigest()[:16]}
    if cache.is_file():
        try:
            stored = load_numpy(str(cache))
            meta = json.loads(bytes(stored["meta"]).decode())
            if meta == stamp:
                offsets = stored["offsets"]
                flat = stored["logits"]
                logger.info("teacher logits from %s", cache)
                return [flat[offsets[i]:offsets[i + 1]].reshape(stored["shapes"][i][stored["shapes"][i] > 0])
                        for i in range(len(features))]
        except Exception as err:  # an unreadable cache is recomputed, never trusted
            logger.warning("%s: not a usable teacher cache (%s); computing again", cache, err)
    t0 = time.time()
    with torch.inference_mode():
        outs = predict(teacher, features, batch_size=batch_size, device=device)
    if kind == "span":
        outs = [np.stack(o, axis=-1) for o in outs]
    outs = [np.asarray(o, dtype=np.float32) for o in outs]
    shapes = np.zeros((len(outs), 2), dtype=np.int64)
    for i, o in enumerate(outs):
        shapes[i, : o.ndim] = o.shape
    sizes = np.array([o.size for o in outs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    tmp = cache.with_name(cache.name + ".tmp")
    save_numpy({"logits": np.concatenate([o.reshape(-1) for o in outs]), "offsets": offsets, "shapes": shapes,
                "meta": np.frombuffer(json.dumps(stamp).encode(), dtype=np.uint8)}, str(tmp))
    os.replace(tmp, cache)
    logger.info("teacher logits for %d features in %.1fs -> %s", len(features), time.time() - t0, cache)
    return outs


def _transfer_examples(task, kind: str, path: Optional[os.PathLike]) -> list:
    """The unlabelled examples of a transfer-set file (checked like ``ctxkit predict`` input)."""
    if path is None:
        return []
    if kind != "sequence" or getattr(task, "is_regression", False):
        raise UserError(f"--transfer-data is for sentence and pair classification; {task.name} is not")
    check_input(path)
    lines = [(n, text) for n, text in enumerate(read_lines(path), 1) if text.strip()]
    if not lines:
        raise UserError(f"{path}: no text to label (one text per line)")
    texts = task.clean_input(lines, str(path))
    examples = []
    for text in texts:
        first, _, pair = text.partition("\t")
        examples.append(TextExample(first, pair or None, UNLABELLED, ""))
    return examples


def distill(teacher_run: os.PathLike, data: os.PathLike, out_dir: os.PathLike, config: Optional[TrainConfig] = None,
            student_layers: int = 3, layers: Optional[Sequence[int]] = None, student_init: Optional[str] = None,
            temperature: float = 2.0, alpha: float = 0.5, transfer_data: Optional[os.PathLike] = None,
            eval_data: Optional[os.PathLike] = None,
            limit_train: Optional[int] = None, limit_eval: Optional[int] = None, resume: bool = False,
            callbacks: Optional[Sequence[Callback]] = None) -> dict:
    """Distil a fine-tuned run into a smaller student run (see the module docstring).

    Args:
        teacher_run: a ``ctxkit finetune`` run folder.
        data: the task's data (the teacher's own by default through the CLI).
        out_dir: the student's run folder.
        config: training hyper-parameters (the student's).
        student_layers: how many teacher layers the student keeps (every other one).
        layers: the exact teacher layers to keep instead (0-based).
        student_init: a checkpoint name or folder to start the student from instead of the
            teacher's layers (its head starts fresh).
        temperature, alpha: the soft-target temperature and weight (0: no distillation).
        transfer_data: sentence and pair classification: a file of unlabelled texts (one per
            line; ``text<TAB>pair`` for pair tasks) that the teacher labels: the student learns
            them from the soft targets alone (Hinton et al.'s transfer set).

    Returns:
        The run summary (as :func:`~ctxkit.tasks.finetune`'s) with ``distillation`` details.
    """
    config = config or TrainConfig()
    out = Path(out_dir)
    data = Path(data).resolve()
    task, teacher, tokenizer, info = load_run(teacher_run, config.device)
    if not hasattr(teacher, "encoder"):
        raise UserError(f"{teacher_run}: an exported run (ONNX) cannot teach; distil from a PyTorch run")
    if config.group_factor is None:
        config = replace(config, group_factor=task.group_factor)
    t0 = time.time()
    train_examples, evals = _read_splits(task, data, Path(eval_data).resolve() if eval_data else None, limit_train, limit_eval)
    kind = _kind(task)
    features = task.featurize(tokenizer, train_examples, train=True)
    transfer = _transfer_examples(task, kind, transfer_data)
    if transfer:
        features += task.featurize(tokenizer, transfer, train=True)
        for f in features[len(features) - len(transfer):]:
            f["labels"] = UNLABELLED
    out.mkdir(parents=True, exist_ok=True)
    logits = teacher_logits(teacher, features, kind, out / CACHE, config.eval_batch_size, config.device)
    for f, t in zip(features, logits):
        f["teacher_logits"] = t
    set_seed(config.seed)
    if student_init is not None:
        encoder, student_tok = get_model(student_init)
        if student_tok is None or student_tok.get_vocab() != tokenizer.get_vocab():
            raise UserError(f"{student_init}: the student must share the teacher's vocabulary")
        student = task.build_model(encoder)
        chosen = None
    else:
        chosen = list(layers) if layers is not None else every_other_layer(teacher.encoder.config.num_layers, student_layers)
        student = task.build_model(student_from_teacher(teacher.encoder, chosen))
        student.head.load_state_dict(teacher.head.state_dict())
    del teacher
    objective = DistillationObjective(student, kind, temperature=temperature, alpha=alpha, transfer=bool(transfer))
    first = task.eval_splits[0]
    prepare_s = time.time() - t0
    details = {"teacher_run": str(Path(teacher_run).resolve()), "teacher_layers_kept": chosen, "student_init": student_init,
               "temperature": temperature, "alpha": alpha, "kind": kind,
               "transfer_data": None if transfer_data is None else str(transfer_data), "transfer_examples": len(transfer)}
    run_info = {"task": task.name, "options": task.options(), "model": f"distilled from {teacher_run}",
                "config": asdict(config), "data": str(data), "eval_data": None if eval_data is None else str(eval_data),
                "limit_train": limit_train, "limit_eval": limit_eval, "distillation": details}
    write_json(run_info, out / "task.json")

    def evaluate(m: nn.Module) -> Dict[str, float]:
        metrics, _ = task.evaluate(m.student, tokenizer, evals[first], config.eval_batch_size, config.device)
        return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}

    trainer = Trainer(objective, features, config, out, evaluate, task.main_metric,
                      save_best=lambda m, folder: save_run_model(m.student, tokenizer, folder), callbacks=callbacks)
    result = trainer.train(resume=resume)
    if result.stopped == "signal":  # stopped by SIGTERM/SIGUSR1: the checkpoint is what counts, no evaluation
        summary = {"task": task.name, "steps": result.steps, "stopped": {
            "reason": "signal", "step": result.steps, "resume": "ctxkit distill ... --resume continues exactly from checkpoint/"}}
        write_json(summary, out / "results.json")
        return summary
    t1 = time.time()
    _, best, _, _ = load_run(out, config.device)
    results = {split: task.evaluate(best, tokenizer, examples, config.eval_batch_size, config.device)[0]
               for split, examples in evals.items()}
    summary = {"task": task.name, "model": run_info["model"], "results": results, "best_epoch": result.best_epoch,
               "train_time_s": round(result.wall_time, 1),
               "timings_s": {"prepare": round(prepare_s, 1), "train": round(result.wall_time, 1),
                             "final_eval": round(time.time() - t1, 1)},
               "steps": result.steps, "train_examples": len(train_examples),
               "eval_examples": {s: len(e) for s, e in evals.items()}, "device": _device_name(config.device),
               "parameters": {"student": sum(p.numel() for p in best.parameters())}, "distillation": details}
    if result.stopped:
        summary["stopped"] = {"reason": result.stopped, "step": result.steps,
                              "resume": "ctxkit distill ... --resume continues exactly from checkpoint/"}
    write_json(summary, out / "results.json")
    return summary
