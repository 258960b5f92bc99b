"""Data-parallel training under ``torchrun`` (DDP or FSDP2; NCCL on GPUs, gloo on CPUs).

``torchrun --nproc_per_node N -m ctxkit.cli finetune ...`` (or ``pretrain``) runs the same
command in N processes; :func:`setup` joins them into one process group and
:class:`~ctxkit.training.Trainer` then gives each rank its share of every global batch,
averages gradients with DDP (or, with ``TrainConfig.parallel="fsdp"``, shards parameters,
gradients and optimiser state with FSDP2's ``fully_shard``), and lets rank 0 alone write
logs and checkpoints.

The FSDP helpers below (:func:`shard_model`, :func:`full_model_state`,
:func:`full_optimizer_state`, :func:`load_full_state`) are collectives: every rank must
call them, in the same order, or the run hangs.
"""

from __future__ import annotations

import copy
import os
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist
from torch import nn

from ..layers.transformer import TransformerDecoderLayer, TransformerEncoderLayer

__all__ = ["setup", "rank_and_world", "is_main", "all_reduce_mean", "broadcast_parameters", "agree",
           "shard_model", "full_model_state", "full_optimizer_state", "load_full_state", "cpu_copy", "param_names",
           "optimizer_state_by_name", "optimizer_state_by_index"]


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


def agree(flag: bool, device: torch.device) -> bool:
    """Rank 0's ``flag`` on every rank (``flag`` itself in a single process).

    For decisions taken from local clocks (the time budget): ranks that stop at different
    steps would wait forever in each other's collectives.
    """
    if rank_and_world()[1] == 1:
        return flag
    value = torch.tensor([int(flag)], device=device)
    dist.broadcast(value, src=0)
    return bool(value.item())


# -- FSDP2 ------------------------------------------------------------------------------


def _fully_shard():
    # Public in torch >= 2.6; torch 2.4/2.5 ship the same function under _composable.
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def shard_model(model: nn.Module, device: torch.device) -> int:
    """Apply FSDP2 ``fully_shard`` to every Transformer layer of ``model``, then to the
    model itself (embeddings, heads and whatever else is left); returns the layer count.

    Rank 0's values are broadcast first (as DDP does). Each layer becomes one all-gather /
    reduce-scatter unit, so only one layer's full weights live on a rank at a time (plus
    the root's). The parameters are replaced by DTensor shards in place: build the
    optimiser afterwards.
    """
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard = _fully_shard()
    broadcast_parameters(model)  # fully_shard keeps each rank's own values: start from rank 0's
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    blocks = [m for m in model.modules() if isinstance(m, (TransformerEncoderLayer, TransformerDecoderLayer))]
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return len(blocks)


def _full_options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> List[str]:
    """Parameter names in the optimiser's order, the order of ``optimizer.state_dict()`` ids."""
    # torch.distributed.checkpoint drops torch.compile's wrapper from its names.
    names = {p: n.replace("_orig_mod.", "") for n, p in model.named_parameters()}
    return [names[p] for group in optimizer.param_groups for p in group["params"]]


def optimizer_state_by_name(state: dict, names: List[str]) -> dict:
    """An ``optimizer.state_dict()`` (integer parameter ids) keyed by parameter name instead,
    the layout of ``torch.distributed.checkpoint.state_dict`` (``names``: :func:`param_names`)."""
    return {"state": {names[i]: v for i, v in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}


def optimizer_state_by_index(state: dict, names: List[str]) -> dict:
    """The reverse of :func:`optimizer_state_by_name`: integer ids, as ``optimizer.load_state_dict`` takes."""
    index = {name: i for i, name in enumerate(names)}
    return {"state": {index[k]: v for k, v in state["state"].items()},
            "param_groups": [{**g, "params": [index[k] for k in g["params"]]} for g in state["param_groups"]]}


def full_model_state(model: nn.Module) -> Dict[str, torch.Tensor]:
    """Collective: gather a sharded model's full weights as CPU tensors on rank 0.

    Returns:
        The state dict (same keys as the unsharded model's) on rank 0, ``{}`` elsewhere.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options(cpu_offload=True))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Collective: gather a sharded optimiser's full state on rank 0, in the layout of an
    unsharded ``optimizer.state_dict()`` (integer parameter ids), so DDP and FSDP
    checkpoints are interchangeable.

    Returns:
        The state dict on rank 0, ``{}`` elsewhere.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    full = get_optimizer_state_dict(model, optimizer, options=_full_options(cpu_offload=True))
    return optimizer_state_by_index(full, param_names(model, optimizer)) if full else {}


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: Dict[str, torch.Tensor], optimizer_state: dict) -> None:
    """Collective: load full (unsharded) weights and optimiser state into a sharded model.

    Every rank passes the whole state (each read the checkpoint) and keeps its own shard.
    ``optimizer_state`` is in ``optimizer.state_dict()`` layout, as
    :func:`full_optimizer_state` returns.
    """
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(model, weights, options=_full_options())
    by_name = optimizer_state_by_name(optimizer_state, param_names(model, optimizer))
    set_optimizer_state_dict(model, optimizer, by_name, options=_full_options())


def cpu_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every parameter and buffer on the CPU.

    Serves as the unsharded twin into which gathered FSDP weights are loaded for saving;
    copying straight to the CPU avoids a second copy of the model on the accelerator.
    """
    memo: dict = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(p.detach().to("cpu", copy=True), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = b.detach().to("cpu", copy=True)
    return copy.deepcopy(model, memo)
