"""FP8 training: the Transformer layers' Linears as float8 GEMMs (torchao, row-wise scales).

A declared precision, not the same maths: each Linear's input, weight and output gradient
are cast to float8 e4m3 with one scale per row (per column for the operand whose rows are
the reduction), the products accumulate in float32 and come out in the autocast dtype;
master weights, optimiser state and everything outside those Linears stay as they were.
torchao's ``convert_to_float8_training`` with the ``"rowwise"`` recipe does the swapping
(:class:`torchao.float8.Float8Linear`: same parameters and ``state_dict`` keys, so
checkpoints are interchangeable with bf16 runs).

Which Linears: those inside the Transformer layers (``.layers.`` in their name) whose both
sizes are multiples of 16 (float8 GEMMs need them); embeddings, the MLM decoder (a 30,522-row
vocabulary), pooler and task heads stay in bf16, as in torchao's own recipes. q/k/v stay
three GEMMs (ctxkit's fused q/k/v concatenates plain weights, which would bypass the float8
modules).

`benchmarks/fp8_training.py` checks convergence (plan option ``fp8train``): the MLM loss after N steps against the same
run in bf16. Needs ``torchao`` (the ``gpu`` extra) and a GPU with float8 tensor cores
(compute capability >= 8.9: Ada, Hopper, Blackwell).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..core.errors import UserError
from .kernels import supported

__all__ = ["enable_fp8_training", "fp8_training_unavailable"]


def fp8_training_unavailable(device: torch.device) -> "str | None":
    """Why FP8 training cannot run on ``device`` (None when it can; :func:`ctxkit.fast.kernels.supported`)."""
    why = supported("fp8_training", device)
    return f"fp8train {why}" if why else None


def _fp8_eligible(module: nn.Module, fqn: str) -> bool:
    return (isinstance(module, nn.Linear) and ".layers." in f".{fqn}."
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def enable_fp8_training(model: nn.Module) -> int:
    """Swap the Transformer layers' Linears of ``model`` (already on its GPU) to torchao's
    row-wise float8 training Linears, in place. Returns how many were swapped.

    Raises:
        UserError: torchao missing, the model not on a GPU with float8 tensor cores, or no
            eligible Linear (a model without ``.layers.``): before any compute is spent.
    """
    param = next(model.parameters(), None)
    why = fp8_training_unavailable(param.device if param is not None else torch.device("cpu"))
    if why:
        raise UserError(why)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # lazy: torchao (the gpu extra)

    eligible = [name for name, m in model.named_modules() if _fp8_eligible(m, name)]
    if not eligible:
        raise UserError("fp8_training: no Linear inside the Transformer layers ('.layers.' in its name) "
                        "with sizes that are multiples of 16")
    config = Float8LinearConfig.from_recipe_name("rowwise")
    # Token counts are the reduction of the weight gradients' GEMMs and float8 GEMMs need
    # multiples of 16: pad them (a short last batch, or the last layer run only at the masked
    # positions, gives any count).
    config = dataclasses.replace(config, pad_inner_dim=True)
    convert_to_float8_training(model, config=config, module_filter_fn=_fp8_eligible)
    return len(eligible)
