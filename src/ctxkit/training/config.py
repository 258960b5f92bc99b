"""Every setting of a training run (:class:`TrainConfig`), read by :class:`~ctxkit.training.Trainer`.

How fast a run goes is one field, ``fast`` (a :class:`~ctxkit.fast.FastPlan` string). The
speed switches this class held before (``compile``, ``cuda_graphs``, ``bf16_residual``,
``gelu_gemm``, ``master_weights``, ...) are still accepted as keywords for old scripts:
each becomes the plan option it was (:data:`LEGACY_SPEED_FIELDS`), with a
``DeprecationWarning`` that names the new spelling.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Dict, Optional

__all__ = ["LEGACY_SPEED_FIELDS", "TrainConfig"]

#: old TrainConfig speed field -> plan option it set when true ("-option" when false)
LEGACY_SPEED_FIELDS: Dict[str, str] = {
    "compile": "compile",
    "cuda_graphs": "graphs",
    "activation_checkpointing": "ckpt",
    "bf16_residual": "bf16res",
    "overlap_grad_reduce": "overlap",
    "gelu_gemm": "gelugemm",
    "packed_qkv_grad": "qkvpack",
    "fp8_training": "fp8train",
    "fast_dropout": "maskdrop",
    "master_weights": "master",
    "compile_segments": "seg",
    "compile_norm_split": "normsplit",
    "grad_reduce_dtype": "bf16grad",
}


def legacy_plan_edits(values: Dict[str, Any]) -> str:
    """The plan edits (``"+compile-graphs"``) that old speed keywords ask for."""
    edits = ""
    for name, value in values.items():
        token = LEGACY_SPEED_FIELDS[name]
        if token in ("seg", "normsplit"):
            edits += f"+{token}{int(value)}" if value else ""
        elif token == "bf16grad":
            edits += "+bf16grad" if value == "bfloat16" else "-bf16grad"
        elif token == "graphs" and value:
            continue  # "where they can run", as before: auto decides
        elif token == "fp8train":
            edits += "+fp8train-qkv-master" if value else "-fp8train"
        else:
            edits += ("+" if value else "-") + token
    return edits


@dataclass(init=False)
class TrainConfig:
    """Hyper-parameters and run settings.

    Attributes:
        epochs: passes over the training set.
        batch_size: examples per optimiser step, over all ranks (each rank takes its share,
            split over ``grad_accum`` micro-batches); with the seed it fixes the data order,
            whatever the number of ranks (:mod:`ctxkit.training.world_resume`).
        eval_batch_size: examples per evaluation batch.
        lr: peak learning rate.
        weight_decay: AdamW decoupled decay (not on biases/LayerNorm).
        warmup_ratio: share of steps with rising learning rate.
        warmup_steps: steps with rising learning rate, counted, not as a share; when given it
            wins over ``warmup_ratio`` (a recipe that names its warm-up in steps: BERT's 10,000,
            Transformer-XL's).
        grad_accum: micro-batches per optimiser step on each rank; the batches themselves
            do not depend on it, so a resumed run may change it (e.g. on fewer GPUs).
        max_grad_norm: clip threshold (0 disables).
        seed: seeds Python, NumPy and torch, and the batch order.
        precision: "auto" (bf16 on CUDA, fp32 on CPU), "bf16" or "fp32".
        device: "auto", "cpu", "cuda", ...
        log_every: optimiser steps between log records.
        max_steps: stop after this many optimiser steps (None: run all epochs).
        save_every: also checkpoint every N optimiser steps (0: only at epoch ends).
        pad_multiple: pad sequence lengths up to a multiple of this (with CUDA graphs: of
            ``max(pad_multiple, 16)``, so few shapes occur).
        group_factor: batches are formed inside shuffled groups of ``batch_size *
            group_factor`` examples sorted by length (less padding); 0 = plain shuffling;
            None = the task's choice (:func:`ctxkit.tasks.finetune`), else 50.
        schedule: ``"linear"`` warmup + linear decay, ``"polynomial"`` warmup +
            ``(1 - progress) ** schedule_power`` decay, ``"cosine"`` warmup + half a cosine
            down to ``min_lr_ratio`` of the peak (Transformer-XL, GPT-style pretraining), or
            ``"inverse_sqrt"`` (the Transformer paper's warmup then ``1/sqrt(step)``).
        schedule_power: exponent of the polynomial decay.
        min_lr_ratio: where the cosine decay ends, as a share of the peak learning rate.
        progress: show tqdm progress bars.
        eval_every: also evaluate every N optimiser steps (0: only at epoch ends), each
            evaluation a candidate for ``best/`` like an epoch's (transformers'
            ``eval_strategy="steps"``): for long epochs, or runs stopped by a time budget.
        eval_each_epoch: evaluate (and keep the best epoch) after every epoch; when False
            only the final model is saved as ``best/`` (the caller evaluates it).
        save_checkpoints: write the resumable ``checkpoint/`` at epoch ends (and every
            ``save_every`` steps); when False a run cannot be resumed.
        background_saves: write checkpoints on a thread while training goes on (the state
            is copied to host memory first, so what is written is the step's state); None =
            on a GPU, where a BERT-base save took ~5.5 s of training time per checkpoint.
            A write's error (a full disk) is raised at the next checkpoint or at the end.
            One process only: several ranks write their shards in parallel, in the step.
        peak_tflops: the device's peak bf16 matmul TFLOP/s, for the MFU in the log.
        keep_last: checkpoints to keep: ``checkpoint/`` (the latest, used by resume) plus
            ``checkpoint-step{N}/`` folders for the previous ``keep_last - 1``.
        optimizer: ``"adamw"`` or ``"lamb"`` (layer-wise trust ratio, for large batches).
        max_minutes: wall-clock budget; training stops (with a resumable checkpoint) at the
            first step past it (first log step with several ranks). The schedule still
            spans the full run.
        parallel: several ranks under ``torchrun``: ``"ddp"`` replicates the model;
            ``"fsdp"`` shards weights, gradients and optimiser state (FSDP2 ``fully_shard``
            per Transformer layer, then the whole model; no CUDA graphs, no ``evaluate``).
            Either way every rank writes its shards of the checkpoint
            (``torch.distributed.checkpoint``), which resumes at any world size; ``best/``
            and ``final/`` hold the gathered model. Ignored in one process.
        data_workers: processes that collate (and mask) batches ahead of the GPU; None =
            0 on CPU, else up to 4 per rank. A collate function with sequential RNG state
            and no ``keyed`` support always runs inline.
        fast: how fast the run goes: a :class:`~ctxkit.fast.FastPlan` string. ``"auto"``
            (default): the fastest exact plan for this machine and workload, resolved by
            the trainer, printed in one line and written to ``fast.json`` in the run
            folder; ``"reference"``: the lecture's plain modules, no CUDA graphs;
            ``"auto+ckpt"``, ``"pretrain-compile"``, ``"graphs+qkv"``, ... (options:
            ``python -m ctxkit.fast.plan``). CUDA graphs, ``torch.compile``, the fused
            kernels, master weights, activation checkpointing and the multi-GPU gradient
            options are all options of the plan.
    """

    epochs: float = 3.0
    batch_size: int = 32
    eval_batch_size: int = 128
    lr: float = 5e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    warmup_steps: Optional[int] = None
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    seed: int = 42
    precision: str = "auto"
    device: str = "auto"
    log_every: int = 50
    max_steps: Optional[int] = None
    save_every: int = 0
    pad_multiple: int = 1
    group_factor: Optional[int] = None
    progress: bool = True
    eval_each_epoch: bool = True
    eval_every: int = 0
    save_checkpoints: bool = True
    background_saves: Optional[bool] = None
    peak_tflops: Optional[float] = None
    keep_last: int = 1
    optimizer: str = "adamw"
    max_minutes: Optional[float] = None
    schedule: str = "linear"
    schedule_power: float = 2.0
    min_lr_ratio: float = 0.0
    parallel: str = "ddp"
    data_workers: Optional[int] = None
    fast: str = "auto"

    def __init__(self, **values: Any):
        legacy = {k: values.pop(k) for k in list(values) if k in LEGACY_SPEED_FIELDS}
        fields = self.__dataclass_fields__
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise TypeError(f"TrainConfig has no setting {', '.join(unknown)}")
        for name, f in fields.items():
            setattr(self, name, values.get(name, f.default))
        self.fast = str(self.fast)
        if legacy:
            edits = legacy_plan_edits(legacy)
            new = self.fast + edits if edits else self.fast
            warnings.warn(f"TrainConfig({', '.join(f'{k}={v!r}' for k, v in legacy.items())}) is now TrainConfig(fast={new!r}) "
                          "(the fast plan holds every speed option)", DeprecationWarning, stacklevel=2)
            self.fast = new
