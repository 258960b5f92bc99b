"""Fine-tuning: trainer, optimiser and schedules."""

from .callbacks import Callback, CallbackList, make_callbacks
from .optim import build_adamw, linear_warmup_decay, polynomial_warmup_decay
from .predict import featurized_ahead, predict
from .steps import EagerStep, GraphedStep, Step, make_step
from .trainer import (
    TrainConfig,
    Trainer,
    TrainResult,
    autocast,
    resolve_device,
    set_seed,
)

__all__ = [
    "Callback",
    "CallbackList",
    "make_callbacks",
    "TrainConfig",
    "Trainer",
    "TrainResult",
    "autocast",
    "build_adamw",
    "linear_warmup_decay",
    "polynomial_warmup_decay",
    "featurized_ahead",
    "EagerStep",
    "GraphedStep",
    "Step",
    "make_step",
    "predict",
    "resolve_device",
    "set_seed",
]
