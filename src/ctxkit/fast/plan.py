"""FastPlan: the one description of how fast a model runs.

A plan says which fast variants of :mod:`ctxkit.fast` a run uses (fused q/k/v, the GELU
GEMM, dropout masks, a bf16 residual stream, master weights, ...), whether it is compiled
and how, and whether it replays CUDA graphs. Every entry that runs a model takes one: the
:class:`~ctxkit.training.Trainer` (``TrainConfig.fast``), the GPU encoder behind
``predict``/``serve``, ``embed``, ``generate`` and ``distill``; every command line takes it
as ``--fast``.

Plans are written as strings: a preset, then options added with ``+`` or removed with
``-``::

    reference                the lecture's plain modules, nothing else
    auto                     the fastest exact plan for this machine and use (the default)
    auto-compile             ... without compiling
    pretrain+ckpt            the pretraining preset with activation checkpointing
    graphs+qkv+gelugemm      options alone (added to reference)

:func:`FastPlan.parse` reads them, ``str(plan)`` writes the canonical form back,
:func:`resolve` turns ``auto`` into options for a device, a use (``train``, ``pretrain``,
``infer``, ``decode``), a world size and a precision, :meth:`FastPlan.validate` refuses a
plan that cannot run there (every interaction rule lives there), and
:meth:`FastPlan.describe` gives the one line that commands print. ``python -m ctxkit.fast.plan``
lists the options.

Each option says how it relates to the reference (:data:`KINDS`): ``auto`` takes only
``exact``, ``rounding`` and ``stream`` options; ``declared`` ones (fp8, tanh GELU, bf16
gradients) run only when asked.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..core.errors import UserError
from .kernels import DeviceInfo, device_info, supported

__all__ = ["FastPlan", "KINDS", "OPTIONS", "Option", "PRESETS", "USES", "as_plan", "resolve"]

#: How an option's results relate to the reference plan's.
KINDS: Dict[str, str] = {
    "exact": "the same function; float sums may run in another order",
    "rounding": "the same function within the compute dtype's rounding",
    "stream": "the same function with another random stream (dropout masks)",
    "memory": "the same function, recomputed to save memory (slower)",
    "declared": "a declared precision change: used only when asked",
}

#: What a plan runs: variable-length training (fine-tuning), fixed-length training
#: (pretraining, language models), encoder inference, token-by-token decoding.
USES: Tuple[str, ...] = ("train", "pretrain", "infer", "decode")
_TRAIN = ("train", "pretrain")
_ALL = USES


@dataclass(frozen=True)
class Option:
    """One token of the plan vocabulary.

    Attributes:
        token: how it is written (``gelugemm``; ``seg`` and ``normsplit`` take a number).
        field: the :class:`FastPlan` field it sets.
        value: the value it sets (for numbered tokens: taken from the token).
        kind: a key of :data:`KINDS`.
        uses: where it has an effect (elsewhere it is left out of the plan).
        help: one line.
        needs: options it works only with (``seg2`` needs ``compile``).
    """

    token: str
    field: str
    value: Any
    kind: str
    uses: Tuple[str, ...]
    help: str
    needs: Tuple[str, ...] = ()


#: The vocabulary, in canonical order.
OPTIONS: Tuple[Option, ...] = (
    Option("graphs", "cuda_graphs", True, "exact", _ALL,
           "replay each shape's step (training step, forward pass, decoding step) from a CUDA graph"),
    Option("compile", "compile", "model", "exact", _ALL,
           "torch.compile the whole model (decoding: the step); the first calls per shape compile"),
    Option("layercompile", "compile", "layers", "exact", _TRAIN,
           "torch.compile each Transformer layer instead (quicker to compile; what FSDP uses)"),
    Option("autotune", "compile_mode", "max-autotune-no-cudagraphs", "exact", _ALL,
           "compile with Inductor's GEMM autotuning (minutes the first time)", needs=("compile",)),
    Option("seg", "segments", 2, "exact", _TRAIN,
           "segN: split the compiled encoder into N graphs (gradients of upper layers arrive early)", needs=("compile",)),
    Option("normsplit", "norm_split", 64, "exact", _TRAIN,
           "normsplitN: rows per partial sum of Inductor's fused norm backward (a process-wide setting)", needs=("compile",)),
    Option("qkv", "fused_qkv", True, "exact", _ALL, "q, k, v of a shared input as one GEMM"),
    Option("qkvpack", "packed_qkv_grad", True, "exact", _TRAIN,
           "pack the q/k/v gradients and sum the bias gradient in one Triton pass (implies qkv)"),
    Option("gelugemm", "gelu", "gemm", "exact", ("train", "pretrain", "infer"),
           "the exact GELU (and its derivative) inside Triton GEMM epilogues (Hopper)"),
    Option("gelutanh", "gelu", "tanh", "declared", ("infer", "decode"),
           "fc1 + bias + tanh GELU as one cuBLASLt GEMM (exact for GPT-2, an approximation for BERT)"),
    Option("maskdrop", "dropout_masks", True, "stream", _TRAIN,
           "dropout masks drawn as packed bits outside compiled graphs"),
    Option("bf16res", "residual", "bfloat16", "rounding", _TRAIN,
           "keep the residual stream in bf16 under bf16 autocast"),
    Option("master", "master_weights", True, "exact", _TRAIN,
           "Linear weights in bf16 with fp32 masters in one flat AdamW update (one process)"),
    Option("pack", "pack_sequences", True, "stream", ("pretrain",),
           "pretraining: each batch's sequences one after another in one row (no padding), batches of equal token counts"),
    Option("fp8", "fp8", "all", "declared", ("infer",), "every Transformer-layer product as a float8 GEMM"),
    Option("fp8norm", "fp8", "norm_inputs", "declared", ("infer",),
           "q/k/v and fc1 as float8 GEMMs with scales, bias and GELU in the epilogue (Hopper)"),
    Option("fp8train", "fp8", "rowwise", "declared", _TRAIN, "torchao's row-wise float8 training Linears"),
    Option("ckpt", "recompute", True, "memory", _TRAIN, "recompute each layer in the backward pass (activation checkpointing)"),
    Option("decodelayers", "decode_layers", True, "exact", ("decode",),
           "each pre-norm layer's batch-1 decoding step as five Triton kernels"),
    Option("rows", "one_row", True, "exact", ("decode",),
           "one-row products as fused reductions in compiled batch-1 decoding", needs=("compile",)),
    Option("overlap", "overlap_grad_reduce", True, "exact", _TRAIN,
           "several GPUs: all-reduce gradient buckets during the backward pass"),
    Option("bf16grad", "grad_reduce", "bfloat16", "declared", _TRAIN, "several GPUs: all-reduce gradients in bf16"),
)
_BY_TOKEN: Dict[str, Option] = {o.token: o for o in OPTIONS}
_NUMBERED = re.compile(r"^(seg|normsplit)(\d+)$")

#: Named plans (data). ``auto`` resolves to the entry of its use, less what cannot run
#: here; each use's entry is the fastest exact plan measured for it (docs/performance.md).
PRESETS: Dict[str, str] = {
    "reference": "",
    "train": "graphs+qkv",
    "pretrain": "graphs+compile+normsplit64+qkv+qkvpack+gelugemm+maskdrop+bf16res+master+pack",
    "infer": "graphs+compile+qkv+gelugemm",
    "decode": "graphs+compile+qkv+decodelayers+rows",
}
#: what ``auto`` starts from per use
AUTO: Dict[str, str] = {use: PRESETS[use] for use in USES}


@dataclass(frozen=True)
class FastPlan:
    """How fast a model runs (a frozen description; nothing here touches a model).

    The defaults are the ``reference`` plan. Build one with :meth:`parse`; apply it with
    :func:`ctxkit.fast.apply` and the runners (Trainer, GPUEncoder, generate).

    Attributes:
        cuda_graphs: replay each shape from a CUDA graph.
        compile: ``"off"``, ``"model"`` (the whole model, or decoding's step) or ``"layers"``.
        compile_mode: a ``torch.compile`` mode (None: the runner's default).
        segments: compiled encoder graphs (0: the runner's choice).
        norm_split: rows per partial sum of Inductor's norm backward (None: Inductor's).
        fused_qkv: q/k/v of a shared input as one GEMM.
        packed_qkv_grad: the packed q/k/v gradient kernel (training).
        gelu: ``"plain"``, ``"gemm"`` (exact, Triton epilogue) or ``"tanh"`` (cuBLASLt, declared).
        dropout_masks: packed-bit dropout masks outside compiled graphs (training).
        residual: dtype of the residual stream under autocast: ``"float32"`` or ``"bfloat16"``.
        master_weights: bf16 weights with fp32 masters (training, one process).
        pack_sequences: pretraining batches packed into one row each (no padding), formed
            by :func:`~ctxkit.data.batching.balanced_batches` (one process).
        fp8: ``"off"``, ``"all"`` / ``"norm_inputs"`` (inference) or ``"rowwise"`` (training).
        recompute: activation checkpointing (training).
        decode_layers: Triton decoding layers (batch-1 decoding).
        one_row: one-row products as reductions in compiled batch-1 decoding.
        overlap_grad_reduce: overlap the gradient all-reduce with backward (several GPUs).
        grad_reduce: dtype of the gradient all-reduce (several GPUs).
        auto: not resolved yet: :func:`resolve` fills the options in for a machine.
        edits: for ``auto``: options added (True) or removed (False) after resolving.
        lenient: the options are a ceiling, not a demand: :func:`resolve` leaves out what
            cannot run here (with a note) instead of refusing the plan. A run folder's
            recorded plan is reused this way (a run trained on a GPU predicts on a CPU).
        notes: after :func:`resolve`: why options are off, one short clause each.
        context: after :func:`resolve`: the use and device it was resolved for.
    """

    cuda_graphs: bool = False
    compile: str = "off"
    compile_mode: Optional[str] = None
    segments: int = 0
    norm_split: Optional[int] = None
    fused_qkv: bool = False
    packed_qkv_grad: bool = False
    gelu: str = "plain"
    dropout_masks: bool = False
    residual: str = "float32"
    master_weights: bool = False
    pack_sequences: bool = False
    fp8: str = "off"
    recompute: bool = False
    decode_layers: bool = False
    one_row: bool = False
    overlap_grad_reduce: bool = False
    grad_reduce: str = "float32"
    auto: bool = False
    edits: Tuple[Tuple[str, bool], ...] = ()
    lenient: bool = field(default=False, compare=False)
    notes: Tuple[str, ...] = field(default=(), compare=False)
    context: str = field(default="", compare=False)

    # ------------------------------------------------------------------ reading and writing

    @classmethod
    def parse(cls, text: Union[str, "FastPlan", None]) -> "FastPlan":
        """The plan a string names (``"auto"``, ``"pretrain+ckpt"``, ``"graphs+qkv"``...).

        Raises:
            UserError: an unknown preset or option (with the closest known names).
        """
        if isinstance(text, FastPlan):
            return text
        if text is None:
            return cls(auto=True)
        raw = str(text).strip().lower().replace(" ", "")
        if not raw:
            raise UserError("empty fast plan: give a preset (auto, reference, train, pretrain, infer, decode) or options")
        parts = re.findall(r"([+-]?)([^+-]+)", raw)
        if "".join(s + t for s, t in parts) != raw:
            raise UserError(f"fast plan {text!r}: write it as preset+option-option (e.g. auto-compile, pretrain+ckpt)")
        head_sign, head = parts[0]
        if head_sign == "-":
            raise UserError(f"fast plan {text!r} starts by removing {head!r}: start with a preset (e.g. auto-{head})")
        rest = parts[1:]
        if head == "auto":
            plan = cls(auto=True)
        elif head in PRESETS:
            plan = cls()._edited([(t, True) for t in _tokens(PRESETS[head])])
        else:
            plan, rest = cls(), parts  # options alone: added to reference
        edits = [(_check_token(token, text), sign != "-") for sign, token in rest]
        if plan.auto:
            return dataclasses.replace(plan, edits=tuple(edits))
        return plan._edited(edits)

    def __str__(self) -> str:
        if self.auto:
            return "auto" + "".join(("+" if on else "-") + t for t, on in self.edits)
        tokens = self.tokens()
        return "+".join(tokens) if tokens else "reference"

    def tokens(self) -> List[str]:
        """The options this (resolved) plan has on, in canonical order."""
        out = []
        for option in OPTIONS:
            value = getattr(self, option.field)
            if option.token in ("seg", "normsplit"):
                if value:
                    out.append(f"{option.token}{value}")
            elif value == option.value:
                out.append(option.token)
        return out

    def _edited(self, edits: Sequence[Tuple[str, bool]]) -> "FastPlan":
        """This plan with options added (True) or removed (False), in order. Removing an
        option also removes the options that need it (``-compile`` drops ``seg2``)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        reference = FastPlan()
        for token, on in edits:
            option, number = _option(token)
            if on:
                values[option.field] = number if number is not None else option.value
                if option.token == "qkvpack":
                    values["fused_qkv"] = True
                continue
            if number is not None or option.token in ("seg", "normsplit") or values[option.field] == option.value:
                values[option.field] = getattr(reference, option.field)
            if option.token == "qkv":
                values["packed_qkv_grad"] = False
            if values["compile"] == "off":  # what only runs compiled goes with it
                for dependent in OPTIONS:
                    if "compile" in dependent.needs:
                        values[dependent.field] = getattr(reference, dependent.field)
        return FastPlan(**values)

    # ------------------------------------------------------------------ uses and rules

    def for_use(self, use: str) -> "FastPlan":
        """The options that have an effect in ``use`` (others back to the reference)."""
        _check_use(use)
        if self.auto:
            return self
        keep = {o.field for o in OPTIONS if use in o.uses and getattr(self, o.field) != getattr(FastPlan(), o.field)
                and (o.token in ("seg", "normsplit") or getattr(self, o.field) == o.value)}
        values = {f.name: (getattr(self, f.name) if f.name in keep else getattr(FastPlan(), f.name))
                  for f in dataclasses.fields(self) if f.name not in ("notes", "context", "auto", "edits", "lenient")}
        return FastPlan(**values, notes=self.notes, context=self.context)

    def problems(self, device: Union[str, torch.device, DeviceInfo, None] = None, world_size: int = 1, *,
                 use: Optional[str] = None, precision: str = "auto", optimizer: str = "adamw", grad_accum: int = 1,
                 parallel: str = "ddp") -> List[str]:
        """Every reason this plan cannot run as asked (empty when it can); see :meth:`validate`."""
        if self.auto:
            return []
        info = device_info(device)
        dtype = _compute_dtype(precision, info)
        out = []
        on = set(self.tokens())
        for token in sorted(on):
            match = _NUMBERED.match(token)
            if "compile" in _BY_TOKEN[match.group(1) if match else token].needs and self.compile == "off":
                out.append(f"{token} needs compile")
        if self.norm_split is not None and (self.norm_split < 1 or self.norm_split & (self.norm_split - 1)):
            out.append(f"normsplit{self.norm_split}: the rows per partial sum must be a power of two")
        if self.segments < 0:
            out.append("seg: the number of segments must be >= 1")
        if self.fp8 == "rowwise":
            out += [f"fp8train keeps three float8 q/k/v GEMMs and its own weights: drop {t}" for t in ("qkv", "qkvpack", "master")
                    if t in on]
        training = use in _TRAIN
        if use is not None and training and self.fp8 in ("all", "norm_inputs"):
            out.append(f"{'fp8' if self.fp8 == 'all' else 'fp8norm'} is an inference precision; for training use fp8train")
        if self.cuda_graphs and info.type != "cuda":
            out.append(f"graphs need a CUDA GPU (the device is {info.type})")
        if training and self.cuda_graphs:
            if optimizer != "adamw":
                out.append(f"graphs need AdamW (the optimizer is {optimizer})")
            if grad_accum != 1:
                out.append(f"graphs need grad_accum 1 (it is {grad_accum})")
            if parallel == "fsdp" and world_size > 1:
                out.append("graphs do not run under FSDP (parallel fsdp on several ranks)")
        if training and self.master_weights:
            why = ("precision is fp32 (master weights are for bf16 training)" if dtype != torch.bfloat16
                   else f"the optimizer is {optimizer} (master weights come with AdamW)" if optimizer != "adamw"
                   else f"{world_size} ranks (master weights run in one process)" if world_size > 1 else None)
            if why:
                out.append(f"master: {why}")
        if use in (None, "pretrain") and self.pack_sequences:
            if world_size > 1:
                out.append(f"pack: runs in one process ({world_size} ranks)")
            if grad_accum != 1:
                out.append(f"pack needs grad_accum 1 (it is {grad_accum})")
        kernel_of = {"gelugemm": ("gelu_gemm", dtype), "qkvpack": ("qkv_grad", dtype), "decodelayers": ("decode_layers", None),
                     "fp8norm": ("scaled_mm", None), "fp8": ("scaled_mm", None), "fp8train": ("fp8_training", None)}
        for token, (kernel, kdtype) in kernel_of.items():
            if token in on and (use is None or use in _BY_TOKEN[token].uses):
                why = supported(kernel, info, kdtype)
                if why:
                    out.append(f"{token}: {why}")
        return out

    def validate(self, device: Union[str, torch.device, DeviceInfo, None] = None, world_size: int = 1, **context) -> "FastPlan":
        """This plan, or a :class:`UserError` listing every reason it cannot run.

        Args:
            device: where it runs (None: CUDA when available, else CPU).
            world_size: ranks under torchrun.
            **context: ``use``, ``precision`` ("auto", "bf16", "fp32"), ``optimizer``,
                ``grad_accum``, ``parallel`` (what training rules depend on).
        """
        problems = self.problems(device, world_size, **context)
        if problems:
            raise UserError(f"fast plan {self} cannot run here: " + "; ".join(problems))
        return self

    def describe(self) -> str:
        """One line: the options on, what it was resolved for, and why anything is off."""
        line = f"fast plan: {self}"
        if self.context:
            line += f" ({self.context})"
        if self.notes:
            line += "; off: " + "; ".join(self.notes)
        return line

    def without(self, token: str, why: str) -> "FastPlan":
        """This plan with option ``token`` off and ``why`` added to its notes (a runner
        that finds an option cannot serve its model, e.g. graphs for a host-synchronising one)."""
        if token not in self.tokens():
            return self
        return dataclasses.replace(self._edited([(token, False)]), notes=self.notes + (f"{token}: {why}",))

    def with_options(self, text: str) -> "FastPlan":
        """This plan with ``+option`` / ``-option`` edits applied (e.g. ``"+ckpt-compile"``)."""
        raw = text if text[:1] in "+-" else "+" + text
        edits = [(_check_token(t, text), s != "-") for s, t in re.findall(r"([+-])([^+-]+)", raw.replace(" ", "").lower())]
        if self.auto:
            return dataclasses.replace(self, edits=self.edits + tuple(edits))
        return self._edited(edits)


# ---------------------------------------------------------------------- resolution


def resolve(plan: Union[str, FastPlan, None] = "auto", *, use: str, device: Union[str, torch.device, DeviceInfo, None] = None,
            world_size: int = 1, precision: str = "auto", optimizer: str = "adamw", grad_accum: int = 1,
            parallel: str = "ddp") -> FastPlan:
    """The concrete plan to run: ``auto`` filled in for this machine, an explicit plan
    narrowed to ``use`` and validated.

    ``auto`` starts from :data:`AUTO`'s entry for ``use`` (the fastest exact plan measured
    for it) and leaves out each option that cannot run or does not pay here, saying why
    in ``notes``; its edits then apply and must be able to run.

    Args:
        plan: a plan or its string (None: ``auto``).
        use: one of :data:`USES`.
        device, world_size, precision, optimizer, grad_accum, parallel: what the run is.

    Raises:
        UserError: an explicit plan (or an option added to ``auto``) that cannot run here.
    """
    _check_use(use)
    plan = FastPlan.parse(plan)
    info = device_info(device)
    context = dict(use=use, precision=precision, optimizer=optimizer, grad_accum=grad_accum, parallel=parallel)
    how = "auto" if plan.auto else "recorded plan, what runs here" if plan.lenient else "as asked"
    where = f"{how} for {use} on {info.label}" + (f", {world_size} ranks" if world_size > 1 else "")
    if not plan.auto and not plan.lenient:
        narrowed = plan.for_use(use).validate(info, world_size, **context)
        return dataclasses.replace(narrowed, context=where)
    on, notes = [], {}
    # What the user took out is not a candidate, so what pays only with it goes too
    # (auto-compile: no maskdrop, whose gain is inside compiled graphs).
    removed = {t for t, on_ in plan.edits if not on_}
    candidates = [t for t in (_tokens(AUTO[use]) if plan.auto else plan.for_use(use).tokens())
                  if t not in removed and _base(t) not in removed]
    for token in candidates:
        why = _auto_off(token, use, info, world_size, precision, optimizer, grad_accum, parallel, on)
        if why is None and not plan.auto:  # a recorded option: also whatever the rules say here
            why = next((p.split(": ", 1)[-1] for p in FastPlan()._edited([(t, True) for t in on + [token]])
                        .problems(info, world_size, **context) if token in p), None)
        if why is None:
            on.append(token)
        else:
            notes.setdefault(why, []).append(token)
    resolved = FastPlan()._edited([(t, True) for t in on])._edited(plan.edits).for_use(use)
    # auto's own choices can run (checked above): a problem comes from an option the user added.
    problems = resolved.problems(info, world_size, **context)
    if problems:
        raise UserError(f"fast plan {plan} cannot run here: " + "; ".join(problems))
    text = tuple(f"{', '.join(tokens)}: {why}" for why, tokens in notes.items())
    return dataclasses.replace(resolved, notes=text, context=where)


def _auto_off(token: str, use: str, info: DeviceInfo, world: int, precision: str, optimizer: str, grad_accum: int,
              parallel: str, on: List[str]) -> Optional[str]:
    """Why ``auto`` leaves ``token`` off here (None: on). ``on``: the tokens taken so far."""
    cuda = info.type == "cuda"
    dtype = _compute_dtype(precision, info)
    name = _base(token)
    if name == "compile" and not cuda:
        return "compiling takes minutes on a CPU (ask for it with +compile)"
    if name in ("graphs", "normsplit", "maskdrop", "rows", "decodelayers", "qkvpack", "gelugemm", "master") and not cuda:
        return "needs a CUDA GPU"
    if name == "graphs":
        if use in _TRAIN and optimizer != "adamw":
            return f"CUDA graphs need AdamW (optimizer {optimizer})"
        if use in _TRAIN and grad_accum != 1:
            return "CUDA graphs need grad_accum 1"
        if use in _TRAIN and parallel == "fsdp" and world > 1:
            return "no CUDA graphs under FSDP"
    if name in ("normsplit", "maskdrop", "rows") and "compile" not in on:
        return "pays only in compiled graphs"
    if name == "normsplit" and not hasattr(torch._inductor.config.triton, "mix_order_reduction_split_size"):
        return f"torch {torch.__version__.split('+')[0]} has no mix-order split (torch >= 2.10)"
    if name == "pack":
        if not cuda or dtype not in (torch.bfloat16, torch.float16):
            return "needs a CUDA GPU in bf16 (flash attention's variable-length kernel)"
        if world > 1:
            return "runs in one process"
        if grad_accum != 1:
            return "needs grad_accum 1"
    if name in ("bf16res", "master") and dtype != torch.bfloat16:
        return "for bf16 training"
    if name == "master":
        if optimizer != "adamw":
            return f"comes with AdamW (optimizer {optimizer})"
        if world > 1:
            return "runs in one process"
    kernel = {"gelugemm": "gelu_gemm", "qkvpack": "qkv_grad", "maskdrop": "dropout_bits", "decodelayers": "decode_layers"}.get(name)
    if kernel is not None:
        return supported(kernel, info, dtype if kernel in ("gelu_gemm", "qkv_grad") else None)
    return None


def _compute_dtype(precision: str, info: DeviceInfo) -> torch.dtype:
    if precision in ("bf16", "bfloat16"):
        return torch.bfloat16
    if precision in ("fp16", "float16"):
        return torch.float16
    if precision in ("auto", None):
        return torch.bfloat16 if info.type == "cuda" else torch.float32
    return torch.float32


def as_plan(plan: Union[str, FastPlan, None], **resolve_args) -> FastPlan:
    """A resolved plan from a string, a plan or None (``auto``); see :func:`resolve`."""
    plan = FastPlan.parse(plan)
    if plan.auto or "use" in resolve_args:
        return resolve(plan, **resolve_args)
    return plan


# ---------------------------------------------------------------------- tokens


def _base(token: str) -> str:
    """``seg2`` -> ``seg``; other tokens as they are."""
    match = _NUMBERED.match(token)
    return match.group(1) if match else token


def _tokens(text: str) -> List[str]:
    return [t for t in text.split("+") if t]


def _option(token: str) -> Tuple[Option, Optional[int]]:
    match = _NUMBERED.match(token)
    if match:
        return _BY_TOKEN[match.group(1)], int(match.group(2))
    return _BY_TOKEN[token], None


def _check_token(token: str, text: Any) -> str:
    if token in _BY_TOKEN and token not in ("seg", "normsplit"):
        return token
    if _NUMBERED.match(token):
        return token
    if token in ("seg", "normsplit"):
        raise UserError(f"fast plan {text!r}: {token} takes a number ({token}2, {token}64)")
    known = [o.token for o in OPTIONS if o.token not in ("seg", "normsplit")] + ["segN", "normsplitN"]
    close = difflib.get_close_matches(token, known + list(PRESETS) + ["auto"], n=2)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    where = " (presets go first)" if token in PRESETS or token == "auto" else ""
    raise UserError(f"fast plan {text!r}: unknown option {token!r}{hint}{where}; options: {', '.join(known)}")


def _check_use(use: str) -> None:
    if use not in USES:
        raise UserError(f"use must be one of {', '.join(USES)}, got {use!r}")


def options_table() -> str:
    """The vocabulary as text (``python -m ctxkit.fast.plan``)."""
    lines = ["presets: " + ", ".join(["auto"] + list(PRESETS)), ""]
    lines += [f"  {name:<10} {text or '(nothing: the plain modules)'}" for name, text in PRESETS.items()]
    lines += ["", "options:"]
    for o in OPTIONS:
        token = f"{o.token}N" if o.token in ("seg", "normsplit") else o.token
        lines.append(f"  {token:<13} {o.kind:<9} {'/'.join(o.uses):<27} {o.help}")
    lines += ["", "kinds:"] + [f"  {k:<9} {v}" for k, v in KINDS.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(options_table())
