"""Every setting of a training run (:class:`TrainConfig`), read by :class:`~ctxkit.training.Trainer`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["TrainConfig"]


@dataclass
class TrainConfig:
    """Hyper-parameters and run settings.

    Attributes:
        epochs: passes over the training set.
        batch_size: examples per optimiser step (split over ``grad_accum`` micro-batches).
        eval_batch_size: examples per evaluation batch.
        lr: peak learning rate.
        weight_decay: AdamW decoupled decay (not on biases/LayerNorm).
        warmup_ratio: share of steps with rising learning rate.
        grad_accum: micro-batches per optimiser step.
        max_grad_norm: clip threshold (0 disables).
        seed: seeds Python, NumPy and torch, and the batch order.
        precision: "auto" (bf16 on CUDA, fp32 on CPU), "bf16" or "fp32".
        device: "auto", "cpu", "cuda", ...
        log_every: optimiser steps between log records.
        max_steps: stop after this many optimiser steps (None: run all epochs).
        save_every: also checkpoint every N optimiser steps (0: only at epoch ends).
        pad_multiple: pad sequence lengths up to a multiple of this.
        group_factor: batches are formed inside shuffled groups of ``batch_size *
            group_factor`` examples sorted by length (less padding); 0 = plain shuffling;
            None = the task's choice (:func:`ctxkit.tasks.finetune`), else 50.
        compile: ``torch.compile`` the model (each Transformer layer under FSDP): fused
            elementwise kernels, still inside the CUDA graphs.
        compile_segments: with ``compile``, split the encoder into this many compiled
            graphs (:func:`~ctxkit.training.speed.compile_model`); 0 = automatic (1, or 2
            with ``overlap_grad_reduce`` on several ranks, so gradients arrive early).
        compile_norm_split: with ``compile``, rows per partial sum of the norm-parameter
            gradients in Inductor's fused norm backward
            (:func:`~ctxkit.training.speed.set_norm_grad_split`; a process-wide Inductor
            setting); None = Inductor's choice. 64 is fastest for BERT-base on an H100.
        activation_checkpointing: recompute each encoder layer in the backward pass
            (less memory, about a third more compute).
        schedule: ``"linear"`` warmup + linear decay, ``"polynomial"`` warmup +
            ``(1 - progress) ** schedule_power`` decay, or ``"inverse_sqrt"`` (the
            Transformer paper's warmup then ``1/sqrt(step)``).
        schedule_power: exponent of the polynomial decay.
        progress: show tqdm progress bars.
        eval_each_epoch: evaluate (and keep the best epoch) after every epoch; when False
            only the final model is saved as ``best/`` (the caller evaluates it).
        save_checkpoints: write the resumable ``checkpoint/`` at epoch ends (and every
            ``save_every`` steps); when False a run cannot be resumed.
        cuda_graphs: on CUDA without gradient accumulation, replay each
            training step as a CUDA graph (see :mod:`ctxkit.training.graphs`); sequence
            lengths are then padded to a multiple of ``max(pad_multiple, 16)``.
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
            Checkpoints hold the same unsharded files either way. Ignored in one process.
        bf16_residual: under bf16 autocast keep the residual stream in bf16 instead of
            float32 (:func:`ctxkit.training.speed.set_stream_dtype`; ~4 % faster BERT-base
            pretraining, one bf16 rounding of the stream per sub-layer).
        grad_reduce_dtype: ``"bfloat16"`` halves the bytes of the data-parallel gradient
            all-reduce (DDP's ``bf16_compress_hook`` or the graph-captured all-reduce);
            the average is then rounded to bf16. ``"float32"`` (default) is exact.
        data_workers: processes that collate (and mask) batches ahead of the GPU; None =
            0 on CPU, else up to 4 per rank. A collate function with sequential RNG state
            and no ``keyed`` support always runs inline.
        overlap_grad_reduce: on CUDA with several ranks, all-reduce gradient buckets while
            the backward pass runs (:class:`~ctxkit.training.reducer.OverlappedGradReducer`;
            ``compile`` then compiles the model in segments) instead of one flat
            all-reduce after it.
        gelu_gemm: compute erf-GELU feed-forward blocks with the GELU and its derivative
            inside Triton GEMM epilogues (:func:`ctxkit.fast.fuse_gelu_gemm`; exact; Hopper
            GPUs with the ``gpu`` extra, the plain blocks elsewhere).
        packed_qkv_grad: in the backward, pack self-attention's q/k/v gradients and sum the
            projection's bias gradient in one Triton pass (:func:`ctxkit.fast.pack_qkv_grad`;
            the same products; needs the ``gpu`` extra, the fused projection elsewhere).
        fp8_training: the Transformer layers' Linears as float8 GEMMs with row-wise scales
            (:func:`ctxkit.training.fp8.enable_fp8_training`, torchao; a declared
            precision; needs the ``gpu`` extra and compute capability >= 8.9). Raises
            before training where it cannot run.
        fast_dropout: draw dropout masks with PyTorch's Bernoulli kernel outside the
            compiled graph (:func:`ctxkit.fast.fast_dropout`): the same function, a
            memory-bound mask kernel instead of Philox inside the fused norm kernels
            (faster compiled GPU training); a different random stream than without it.
        master_weights: keep ``nn.Linear`` weights and biases in bf16 with fp32 master copies
            in the optimiser (:class:`ctxkit.training.master.MasterAdamW`): the numbers of
            bf16 autocast without its per-step weight casts and fp32 gradient passes; one
            flat update kernel with the clipping inside. Needs bf16 precision, AdamW and
            one process; checkpoints and ``best/`` hold the fp32 masters.
    """

    epochs: float = 3.0
    batch_size: int = 32
    eval_batch_size: int = 128
    lr: float = 5e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
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
    compile: bool = False
    compile_segments: int = 0
    compile_norm_split: Optional[int] = None
    progress: bool = True
    eval_each_epoch: bool = True
    save_checkpoints: bool = True
    cuda_graphs: bool = True
    peak_tflops: Optional[float] = None
    keep_last: int = 1
    optimizer: str = "adamw"
    max_minutes: Optional[float] = None
    activation_checkpointing: bool = False
    schedule: str = "linear"
    schedule_power: float = 2.0
    parallel: str = "ddp"
    bf16_residual: bool = False
    grad_reduce_dtype: str = "float32"
    overlap_grad_reduce: bool = False
    data_workers: Optional[int] = None
    gelu_gemm: bool = False
    packed_qkv_grad: bool = False
    fp8_training: bool = False
    fast_dropout: bool = False
    master_weights: bool = False
