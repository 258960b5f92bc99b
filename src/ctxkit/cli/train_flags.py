"""The training flags of every verb that trains with :class:`~ctxkit.training.TrainConfig`,
generated from the dataclass: one table of one-line helps, one table of the verbs' defaults.

A flag is a :class:`TrainConfig` field with a line in :data:`HELP`: its name is the field's
(``max_grad_norm`` -> ``--max-grad-norm``), its type the field's annotation (``Optional[int]``
-> ``int``; a ``str`` field takes no type, a ``bool`` field is a switch), its choices those of
:data:`CHOICES`, its default :class:`TrainConfig`'s unless the verb's row of :data:`VERBS`
says otherwise. :func:`add_train_flags` adds a verb's flags to its parser and
:func:`train_config_from_args` builds the :class:`TrainConfig` back from the parsed arguments.

Two styles of verb:

* ``finetune`` *defers*: every flag's argparse default is None (a switch: None too), and
  a flag left out leaves :class:`TrainConfig`'s own default; ``--no-progress`` stores False
  in ``progress``.
* every other verb states its defaults: the argparse default is the verb's (from
  :data:`VERBS`, else :class:`TrainConfig`'s), a switch defaults to False, and
  ``--no-progress`` stores True in ``no_progress``.

The verbs' defaults as they were written by hand on each verb (kept, so no command line
changes meaning; "-" = no such flag, the verb uses TrainConfig's value or fixes its own)::

    field             TrainConfig  finetune   translate-train  pretrain   lm-train  pretrain-xlnet
    epochs            3.0          (3.0)      10.0             1.0        1.0       1.0
    batch_size        32           (32)       128              256        64        32
    eval_batch_size   128          (128)      -                -          -         -
    lr                5e-5         (5e-5)     1e-3             None**     1e-3      1e-4
    weight_decay      0.01         (0.01)     0.0              0.01       0.01      0.01
    warmup_ratio      0.1          (0.1)      0.05             0.06       0.05      0.06
    grad_accum        1            (1)        -                1          -         1
    max_grad_norm     1.0          (1.0)      -                -          -         -
    schedule          linear       -          inverse_sqrt     linear     -         -
                                              (+cosine,        (linear, polynomial,
                                              inverse_sqrt)    cosine)
    group_factor      None         -          -                50         -         -
    eval_each_epoch   True         -          -                False*     -         False*
    seed 42, device auto, log_every 50, max_steps None, save_every 0, precision auto,
    max_minutes None, fast auto, progress True: the same wherever they are flags.
    pretrain alone: optimizer, schedule_power, min_lr_ratio, keep_last, peak_tflops, parallel
    (TrainConfig's defaults).

Speed is one flag, ``--fast PLAN`` (:class:`~ctxkit.fast.FastPlan`; every training verb).
The speed flags some verbs had before (``--compile``, ``--activation-checkpointing``,
``--bf16-residual``, ``--grad-reduce-dtype``, ``--overlap-grad-reduce``) still parse,
hidden from the help: each becomes its plan option (:data:`LEGACY_FLAGS`) with a one-line
note on stderr naming the new spelling.

    (x) = deferred to TrainConfig; * = fixed by the verb (``train_config_from_args(args,
    eval_each_epoch=False)``), not a flag; ** ``pretrain`` takes the preset's (:func:`ctxkit.pretraining.train.default_pretrain_lr`: 1e-4 from
    768 wide, 1e-3 below).

Every training verb, these and the ones with loops of their own (``pretrain-elmo``,
``train-transformer-xl``, ``word2vec-train``), takes ``--on-sigterm``
(:func:`add_on_sigterm_argument`): the exit status :func:`signal_status` gives, with one line,
after SIGTERM or SIGUSR1 stopped the run with its checkpoint written.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from ..core.device import check_device
from ..core.errors import UserError
from ..training import TrainConfig
from ..training.config import legacy_plan_edits

__all__ = ["device_option", "HELP", "CHOICES", "VERBS", "VerbFlags", "LEGACY_FLAGS", "FAST_HELP", "ON_SIGTERM", "add_fast_argument", "add_train_flags",
           "add_on_sigterm_argument", "add_allow_changes_argument", "fast_from_args", "train_config_from_args", "flag_specs", "signal_status"]


def device_option(text: str) -> str:
    """argparse type of every ``--device``: ``auto`` or a device this machine has, checked
    when the command line is read (one line, exit 2) rather than after data is loaded."""
    if text != "auto":
        try:
            check_device(text)
        except UserError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix(f"--device {text}: ")) from None
    return text

#: the ``--fast`` help shared by every verb that runs a model
FAST_HELP = ("how fast it runs: a plan, preset+option-option (auto = the fastest exact plan for this machine, printed at "
             "the start; reference = the lecture's plain modules; e.g. auto-compile, auto+ckpt, pretrain, graphs+qkv; "
             "options: python -m ctxkit.fast.plan)")

#: the speed flags verbs had before the plan (hidden; each is an option of --fast now)
LEGACY_FLAGS: Dict[str, str] = {"compile": "store_true", "activation_checkpointing": "store_true", "bf16_residual": "store_true",
                                "grad_reduce_dtype": "choice", "overlap_grad_reduce": "store_true"}

# One line per TrainConfig field that is a command-line flag (the field docs of TrainConfig
# say more). "(default: ...)" is added with the verb's own default.
HELP: Dict[str, str] = {
    "epochs": "passes over the training data",
    "max_steps": "stop after N optimiser steps (resume later with --resume)",
    "max_minutes": "wall-clock budget; stops with a resumable checkpoint",
    "batch_size": "examples per optimiser step",
    "eval_batch_size": "examples per evaluation batch",
    "grad_accum": "micro-batches per optimiser step",
    "lr": "peak learning rate",
    "warmup_ratio": "share of warmup steps",
    "warmup_steps": "warmup steps as a count (wins over --warmup-ratio)",
    "weight_decay": "AdamW weight decay",
    "max_grad_norm": "gradient clipping, 0 = off",
    "optimizer": "LAMB for very large batches",
    "schedule": "learning-rate decay after warmup",
    "schedule_power": "exponent of the polynomial decay",
    "min_lr_ratio": "where the cosine decay ends, as a share of the peak learning rate",
    "parallel": "under torchrun only: ddp replicates the model on every rank; fsdp shards weights, gradients and "
                "optimiser state over the ranks (FSDP2, less memory per GPU, no CUDA graphs)",
    "fast": FAST_HELP,
    "keep_last": "checkpoints to keep (the latest is checkpoint/)",
    "group_factor": "length grouping of batches (0 = plain shuffle)",
    "save_every": "checkpoint every N steps as well as each epoch",
    "eval_every": "evaluate every N steps as well as each epoch (each a candidate for best/; 0 = each epoch only)",
    "log_every": "log the mean training loss every N steps to log.jsonl",
    "peak_tflops": "device bf16 peak for MFU in the log (e.g. 811 measured on H100)",
    "seed": "random seed",
    "data_workers": "processes that collate (and mask) batches ahead of the model, 0 = in this process",
    "device": "auto, cpu, cuda, cuda:1 ...",
    "precision": "auto = bf16 on GPU, fp32 on CPU",
    "progress": "hide progress bars",
}

# The values a str field accepts (a verb may narrow them in its VerbFlags.choices).
CHOICES: Dict[str, Tuple[str, ...]] = {
    "precision": ("auto", "bf16", "fp32"),
    "optimizer": ("adamw", "lamb"),
    "schedule": ("cosine", "inverse_sqrt", "linear", "polynomial"),
    "parallel": ("ddp", "fsdp"),
}


@dataclass(frozen=True)
class VerbFlags:
    """One verb's training flags: which fields, in which order, and where it departs
    from :class:`TrainConfig` (``defaults``, ``choices``); ``defer``: see the module doc."""

    include: Tuple[str, ...]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    choices: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    defer: bool = False
    legacy: Tuple[str, ...] = ()  # old speed flags of this verb, still parsed (hidden): see LEGACY_FLAGS


# The one place the verbs' defaults live (the table in the module doc, as data).
VERBS: Dict[str, VerbFlags] = {
    "finetune": VerbFlags(
        include=("epochs", "lr", "batch_size", "eval_batch_size", "grad_accum", "warmup_ratio", "warmup_steps", "weight_decay", "max_grad_norm",
                 "seed", "precision", "device", "data_workers", "fast", "max_steps", "save_every", "eval_every", "log_every",
                 "progress"),
        defer=True, legacy=("compile",)),
    "distill": VerbFlags(  # a student run: the same flags and defaults as finetune
        include=("epochs", "lr", "batch_size", "eval_batch_size", "grad_accum", "warmup_ratio", "warmup_steps", "weight_decay", "max_grad_norm",
                 "seed", "precision", "device", "data_workers", "fast", "max_steps", "save_every", "eval_every", "log_every",
                 "progress"),
        defer=True, legacy=("compile",)),
    "translate-train": VerbFlags(
        include=("epochs", "max_steps", "max_minutes", "batch_size", "lr", "warmup_ratio", "warmup_steps", "weight_decay", "schedule",
                 "log_every", "seed", "device", "data_workers", "fast", "progress"),
        defaults={"epochs": 10.0, "batch_size": 128, "lr": 1e-3, "warmup_ratio": 0.05, "weight_decay": 0.0,
                  "schedule": "inverse_sqrt"}),
    "pretrain": VerbFlags(
        include=("epochs", "max_steps", "max_minutes", "batch_size", "grad_accum", "lr", "warmup_ratio", "warmup_steps", "weight_decay",
                 "optimizer", "schedule", "schedule_power", "min_lr_ratio", "fast", "parallel", "keep_last", "group_factor",
                 "save_every", "log_every", "peak_tflops", "seed", "device", "data_workers", "precision", "progress"),
        defaults={"epochs": 1.0, "batch_size": 256, "lr": None, "warmup_ratio": 0.06, "group_factor": 50},
        choices={"schedule": ("linear", "polynomial", "cosine")},
        legacy=("compile", "activation_checkpointing", "bf16_residual", "grad_reduce_dtype", "overlap_grad_reduce")),
    "lm-train": VerbFlags(
        include=("epochs", "max_steps", "max_minutes", "batch_size", "lr", "warmup_ratio", "warmup_steps", "weight_decay", "fast",
                 "log_every", "seed", "device", "data_workers", "progress"),
        defaults={"epochs": 1.0, "batch_size": 64, "lr": 1e-3, "warmup_ratio": 0.05}, legacy=("compile",)),
    "pretrain-xlnet": VerbFlags(
        include=("epochs", "max_steps", "batch_size", "grad_accum", "lr", "warmup_ratio", "warmup_steps", "weight_decay", "save_every",
                 "log_every", "seed", "device", "data_workers", "precision", "fast", "progress"),
        defaults={"epochs": 1.0, "lr": 1e-4, "warmup_ratio": 0.06}),
}

_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_HINTS = typing.get_type_hints(TrainConfig)


def _field_type(name: str):
    """The annotation without ``Optional``: ``int``, ``float``, ``str`` or ``bool``."""
    hint = _HINTS[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


# What a None default means where it is not "off".
_NONE_MEANS = {"data_workers": "0 on a CPU, up to 4 per GPU"}


def _default_text(value: Any, name: str = "") -> str:
    return _NONE_MEANS.get(name, "off") if value is None else str(value)


def flag_specs(verb: str, include: Optional[Sequence[str]] = None,
               overrides: Optional[Mapping[str, Any]] = None) -> list:
    """``(option strings, add_argument keywords)`` of a verb's training flags, in order."""
    table = VERBS[verb]
    defaults = {**table.defaults, **(overrides or {})}
    specs = []
    for name in include if include is not None else table.include:
        if name not in _FIELDS or name not in HELP:
            raise ValueError(f"{name!r} is not a TrainConfig field with a command-line flag")
        kind = _field_type(name)
        default = defaults.get(name, _FIELDS[name].default)
        flag = "--" + name.replace("_", "-")
        kw: Dict[str, Any] = {"dest": name}
        if kind is bool:
            if default:  # a switch that turns a default-on setting off: --no-progress
                flag = "--no-" + name.replace("_", "-")
                if table.defer:  # stores False in the field itself
                    kw.update(action="store_false", default=None)
                else:  # stores True in no_<field>
                    kw.update(action="store_true", dest="no_" + name, default=False)
                kw["help"] = HELP[name]
            else:
                kw.update(action="store_true", default=None if table.defer else False, help=HELP[name])
        else:
            if name == "device":
                kw["type"] = device_option
            elif kind is not str:
                kw["type"] = kind
            choices = table.choices.get(name, CHOICES.get(name))
            if choices:
                kw["choices"] = choices
            kw["default"] = None if table.defer else default
            kw["help"] = f"{HELP[name]} (default: {_default_text(default, name)})"
        specs.append(((flag,), kw))
    return specs


def add_train_flags(parser: argparse.ArgumentParser, verb: str, include: Optional[Sequence[str]] = None,
                    overrides: Optional[Mapping[str, Any]] = None) -> None:
    """Add ``verb``'s training flags (its row of :data:`VERBS`) to its parser.

    Args:
        include: the fields to add, in order (default: the verb's row).
        overrides: defaults that replace the row's (and TrainConfig's), by field name.
    """
    for flags, kw in flag_specs(verb, include, overrides):
        parser.add_argument(*flags, **kw)
    fields = include if include is not None else VERBS[verb].include
    if "fast" in fields:
        for name in VERBS[verb].legacy:  # the verb's old spellings: still accepted, not shown
            kind = LEGACY_FLAGS[name]
            flag = "--" + name.replace("_", "-")
            if kind == "choice":
                parser.add_argument(flag, dest="legacy_" + name, choices=("float32", "bfloat16"), default=None, help=argparse.SUPPRESS)
            else:
                parser.add_argument(flag, dest="legacy_" + name, action="store_true", default=None, help=argparse.SUPPRESS)


def train_config_from_args(args: argparse.Namespace, **fixed: Any) -> TrainConfig:
    """The :class:`TrainConfig` of parsed arguments: every field the namespace holds (a
    None leaves TrainConfig's default; ``no_<field>`` sets ``<field>`` to its negation),
    then ``fixed`` (settings the verb does not offer as flags, e.g. ``eval_each_epoch``)."""
    values = {}
    for name in _FIELDS:
        value = getattr(args, name, None)
        if value is None and isinstance(getattr(args, "no_" + name, None), bool):
            value = not getattr(args, "no_" + name)
        if value is not None:
            values[name] = value
    legacy = {name: getattr(args, "legacy_" + name) for name in LEGACY_FLAGS if getattr(args, "legacy_" + name, None)}
    if legacy:
        plan = str(values.get("fast", _FIELDS["fast"].default)) + legacy_plan_edits(legacy)
        old = " ".join("--" + n.replace("_", "-") + ("" if v is True else f" {v}") for n, v in legacy.items())
        print(f"ctxkit: note: {old} is now part of the fast plan: --fast {plan}", file=sys.stderr)
        values["fast"] = plan
    values.update(fixed)
    return TrainConfig(**values)


def add_fast_argument(parser: argparse.ArgumentParser, default: Optional[str] = "auto", what: str = "") -> None:
    """``--fast PLAN`` for a verb that runs a model without training it (``generate``,
    ``predict``, ``serve``, ``embed``, ``evaluate``); ``--compile`` stays as a hidden old
    spelling of ``+compile``. ``default`` None means "the run folder's recorded plan"."""
    shown = "the plan the run was trained with, re-resolved here (else auto)" if default is None else default
    parser.add_argument("--fast", default=default, metavar="PLAN", help=FAST_HELP[:-1] + f"{what}; default: {shown})")
    parser.add_argument("--compile", dest="legacy_compile", action="store_true", default=None, help=argparse.SUPPRESS)


def fast_from_args(args: argparse.Namespace) -> Optional[str]:
    """The plan string a verb's ``--fast`` (and an old ``--compile``) ask for."""
    plan = getattr(args, "fast", None)
    if getattr(args, "legacy_compile", None):
        plan = (plan or "auto") + "+compile"
        print(f"ctxkit: note: --compile is now part of the fast plan: --fast {plan}", file=sys.stderr)
    return plan


#: ``--on-sigterm``: the exit status after a signal stopped a run gracefully
ON_SIGTERM = {"exit143": 143, "exit0": 0}


def add_on_sigterm_argument(parser: argparse.ArgumentParser) -> None:
    """``--on-sigterm``, on every training verb: the exit status after SIGTERM or SIGUSR1
    stopped the run with its checkpoint written (:func:`signal_status`)."""
    parser.add_argument("--on-sigterm", choices=tuple(ON_SIGTERM), default="exit143",
                        help="exit status after SIGTERM/SIGUSR1 stopped the run with its checkpoint written: 143, what schedulers "
                             "expect of a terminated job, or 0 for a scheduler that needs success (default: exit143)")


def add_allow_changes_argument(parser: argparse.ArgumentParser) -> None:
    """``--allow-changes``, beside every ``--resume`` that keeps a run folder's settings
    (:mod:`ctxkit.cli.run_guard`): resume even though settings differ from the recorded ones."""
    parser.add_argument("--allow-changes", dest="allow_changes", action="store_true",
                        help="with --resume: accept settings that differ from those the run was started with (another "
                             "--batch-size, --lr, --data, ...; refused otherwise, as the run would not continue exactly); "
                             "the change is recorded in RUN_DIR/settings.json")


def signal_status(summary: dict, out, on_sigterm: str = "exit143", checkpoint=None, resumable: bool = True) -> int:
    """A training verb's exit status: 0, or, when a signal stopped the run (the graceful stop
    of every training loop), one line and 143 (what schedulers expect after SIGTERM; 0 with
    ``--on-sigterm exit0``).

    Args:
        summary: what the training function returned; ``summary["stopped"]`` says why and
            where it stopped (``step``, or ``at`` in the loop's own words).
        out: the run folder, whose ``checkpoint/`` holds the stop (unless ``checkpoint``).
        on_sigterm: the verb's ``--on-sigterm``.
        checkpoint: where the checkpoint is, when not ``out/checkpoint``.
        resumable: the verb has ``--resume`` (the line says to add it).
    """
    stop = summary.get("stopped") or {}
    if stop.get("reason") != "signal":
        return 0
    at = stop.get("at") or f"step {stop['step']}"
    where = checkpoint if checkpoint is not None else f"{out}/checkpoint"
    print(f"ctxkit: stopped by a signal at {at}; {where} holds it" + ("; add --resume to continue" if resumable else ""),
          file=sys.stderr)
    return ON_SIGTERM[on_sigterm]
