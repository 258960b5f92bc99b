"""Data-parallel training under ``torchrun`` (DDP; NCCL on GPUs, gloo on CPUs).

``torchrun --nproc_per_node N -m ctxkit.cli finetune ...`` (or ``pretrain``) runs the same
command in N processes; :func:`setup` joins them into one process group and
:class:`~ctxkit.training.Trainer` then gives each rank its share of every global batch,
averages gradients with DDP, and lets rank 0 alone write logs and checkpoints.
"""

from __future__ import annotations

import os
from typing import Tuple

import torch
import torch.distributed as dist

__all__ = ["setup", "rank_and_world", "is_main", "all_reduce_mean", "broadcast_parameters"]


def setup(device_type: str) -> Tuple[int, int]:
    """Join the process group when launched by torchrun; returns ``(rank, world_size)``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend)
    return rank_and_world()


def rank_and_world() -> Tuple[int, int]:
    """``(rank, world_size)``; ``(0, 1)`` outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    """Rank 0 (or a single process)."""
    return rank_and_world()[0] == 0


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """Mean of a tensor over ranks (identity in a single process)."""
    _, world = rank_and_world()
    if world == 1:
        return value
    value = value.clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / world


def broadcast_parameters(model: torch.nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank (what DDP does at start-up)."""
    if rank_and_world()[1] == 1:
        return
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor.data, src=0)
