"""Optimiser and learning-rate schedules used by every task."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

__all__ = ["build_adamw", "linear_warmup_decay", "polynomial_warmup_decay"]


def _param_groups(model: nn.Module, weight_decay: float) -> list:
    # BERT's recipe: no decay on biases and LayerNorm weights (decay pulls them to 0,
    # which is not a sensible prior for a scale or an offset).
    decay, no_decay = [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            if name == "bias" or isinstance(module, nn.LayerNorm):
                no_decay.append(param)
            else:
                decay.append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_adamw(model: nn.Module, lr: float, weight_decay: float = 0.01, betas=(0.9, 0.999), eps: float = 1e-8,
                capturable: bool = False) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay, fused on CUDA (one kernel for all parameters).

    With ``capturable=True`` (CUDA only) the step count and learning rate live on the GPU
    (the scheduler updates the rate in place), so the update can run inside a CUDA graph.
    """
    fused = all(p.is_cuda for p in model.parameters())
    groups = _param_groups(model, weight_decay)
    if capturable:
        if not fused:
            raise ValueError("capturable AdamW needs every parameter on a CUDA device")
        device = next(model.parameters()).device
        for group in groups:
            group["lr"] = torch.tensor(float(lr), device=device)
        return torch.optim.AdamW(groups, lr=torch.tensor(float(lr), device=device), betas=betas, eps=eps, fused=True, capturable=True)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)


def linear_warmup_decay(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int) -> LambdaLR:
    """LR rises linearly from 0 over ``warmup_steps`` then falls linearly to 0 at ``total_steps``."""
    return polynomial_warmup_decay(optimizer, warmup_steps, total_steps, power=1.0)


def polynomial_warmup_decay(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, power: float = 1.0, end_ratio: float = 0.0) -> LambdaLR:
    """Linear warmup, then ``(1 - progress) ** power`` decay down to ``end_ratio`` of the peak."""
    total_steps = max(total_steps, 1)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps  # the first update already moves a little
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return end_ratio + (1.0 - end_ratio) * math.pow(1.0 - progress, power)

    return LambdaLR(optimizer, factor)
