"""AdamW over bf16 weights with fp32 master copies, kept in flat buffers.

Under bf16 autocast an ``nn.Linear`` with fp32 parameters costs four passes over its
weights per step besides the optimiser's own: autocast casts the weight and bias to bf16 in
the forward, autograd converts their bf16 gradients back to fp32, gradient clipping
multiplies every fp32 gradient, and AdamW then reads them. For BERT-base that is ~0.9 ms of
a 45 ms step on an H100 (issue 24). :class:`MasterAdamW` keeps those parameters in bf16 and
their fp32 masters in the optimiser:

* the forward uses the bf16 weights as they are (autocast's cast becomes a no-op);
* their gradients stay bf16;
* one kernel per segment (:mod:`ctxkit.fast.adamw_kernels` on CUDA; on CPU tensors only in
  the tests, through Triton's interpreter: :func:`ctxkit.fast.kernels.interpret_on_cpu`) reads the gradients,
  applies the clipping factor, updates the fp32 masters and moments as torch's fused AdamW
  does, and writes the rounded bf16 weights for the next forward.

The numbers are those of bf16 autocast: autocast rounds the fp32 weight to bf16 exactly as
the master's copy is rounded, and the gradient it hands back is the bf16 GEMM's output
converted to fp32 (the same value, here kept in bf16). Parameters outside ``nn.Linear``
modules (embeddings, which a lookup reads in fp32, and LayerNorms, which autocast runs in
fp32) stay fp32 and are their own masters. The global gradient norm is the 2-norm over all
of them, accumulated in fp32.

Every parameter becomes a view into one flat buffer per dtype, so each update is one launch
over a contiguous segment; gradients are gathered into a flat buffer first (one copy). The
saved model weights are the fp32 masters (:meth:`MasterAdamW.full_precision`).
"""

from __future__ import annotations

import contextlib
import warnings
from types import SimpleNamespace
from typing import Dict, Iterable, Iterator, List, Optional

import torch
from torch import Tensor, nn

from ..core.errors import UserError
from ..fast.kernels import supported
from .optim import _param_groups

__all__ = ["MasterAdamW", "build_master_adamw", "low_precision_parameters", "per_parameter_state"]

ALIGN = 16


def low_precision_parameters(model: nn.Module) -> List[nn.Parameter]:
    """The parameters that bf16 autocast only ever uses in bf16: those of ``nn.Linear``
    modules (fast-path subclasses included) that no other kind of module shares (a tied
    output layer's weight is also an embedding table, which a lookup reads in fp32)."""
    linear, other = {}, set()
    for module in model.modules():
        for param in module.parameters(recurse=False):
            if isinstance(module, nn.Linear):
                linear[id(param)] = param
            else:
                other.add(id(param))
    return [p for k, p in linear.items() if k not in other and p.requires_grad]


class _Kind:
    """One flat buffer of parameters of one dtype: their storage, masters, moments and gradients."""

    def __init__(self, params: List[nn.Parameter], groups: List[int], dtype: torch.dtype, device: torch.device):
        self.params = params
        self.low = dtype != torch.float32
        # Every parameter starts at a multiple of ALIGN elements, so the kernels' loads vectorise.
        n = sum(-(-p.numel() // ALIGN) * ALIGN for p in params)
        self.master = torch.zeros(n, dtype=torch.float32, device=device)
        self.flat = torch.empty(n, dtype=dtype, device=device) if self.low else self.master
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        self.grad = torch.zeros(n, dtype=dtype, device=device)  # (the gaps stay 0)
        self.segments: Dict[int, tuple] = {}  # group index -> (start, end)
        self.sizes = [p.numel() for p in params]
        self.offsets = []
        self.groups = list(groups)  # each parameter's group index
        self.tables: Optional[dict] = None  # the kernels' block tables (built on first use)
        offset = 0
        with torch.no_grad():
            for param, group in zip(params, groups):
                size = param.numel()
                self.offsets.append(offset)
                self.master[offset:offset + size].copy_(param.detach().reshape(-1))
                start, end = self.segments.get(group, (offset, offset))
                self.segments[group] = (start, offset + size)
                param.data = self.flat[offset:offset + size].view(param.shape)
                offset += -(-size // ALIGN) * ALIGN
            if self.low:
                self.flat.copy_(self.master)

    def views(self, buffer: Tensor) -> Iterator[Tensor]:
        for param, offset in zip(self.params, self.offsets):
            yield buffer[offset:offset + param.numel()].view(param.shape)

    def gather(self, grads: List[Tensor]) -> None:
        """The gradients into the flat gradient buffer (the PyTorch path)."""
        torch._foreach_copy_(list(self.views(self.grad)), grads)


class MasterAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, torch's fused formula) whose ``low_precision``
    parameters compute in ``dtype`` and are updated through fp32 masters; see the module
    docstring.

    Args:
        params: parameters or param groups (each group may set ``lr`` and ``weight_decay``).
            They must all be on one device and are re-laid out in place as views into flat
            buffers (the ``low_precision`` ones converted to ``dtype``).
        low_precision: the parameters to keep in ``dtype`` (default: none).
        lr, betas, eps, weight_decay: as for ``torch.optim.AdamW``.
        dtype: the compute dtype of the ``low_precision`` parameters.
        capturable: keep the learning rates as device tensors (the schedulers update them in
            place), so the step can run inside a CUDA graph.

    Call :meth:`step` with ``max_grad_norm`` to clip: the factor is applied inside the update.
    """

    def __init__(self, params, low_precision: Iterable[nn.Parameter] = (), lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, dtype: torch.dtype = torch.bfloat16, capturable: bool = False):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        members = [(p, i) for i, g in enumerate(self.param_groups) for p in g["params"]]
        devices = {p.device for p, _ in members}
        if len(devices) > 1:
            raise UserError(f"MasterAdamW: parameters on several devices {sorted(map(str, devices))}")
        if any(p.dtype != torch.float32 for p, _ in members):
            raise UserError("MasterAdamW: give it fp32 parameters (it makes the low-precision copies itself)")
        self.device = devices.pop() if devices else torch.device("cpu")
        low = {id(p) for p in low_precision}
        self.kinds = []
        for is_low in (True, False):
            chosen = [(p, i) for p, i in members if (id(p) in low) == is_low]
            if chosen:
                self.kinds.append(_Kind([p for p, _ in chosen], [i for _, i in chosen], dtype if is_low else torch.float32, self.device))
        self.step_count = torch.zeros((), dtype=torch.float32, device=self.device)
        if capturable:
            for group in self.param_groups:
                group["lr"] = torch.tensor(float(group["lr"]), device=self.device)
        self._kernels = None
        self._warned = False
        self.last_grad_norm: Optional[Tensor] = None

    # -- the update --------------------------------------------------------------------

    def _use_kernels(self) -> bool:
        if self._kernels is None:
            self._kernels = False
            # CUDA with triton installed (CPU tensors: only in the tests, through Triton's interpreter)
            if supported("master_adamw", self.device) is None:
                try:
                    from ..fast.adamw_kernels import (  # lazy: triton (the gpu extra) only where the kernels run
                        adamw_update, build_tables, set_grad_addresses, sum_of_squares)

                    self._kernels = SimpleNamespace(adamw_update=adamw_update, build_tables=build_tables,
                                                    set_grad_addresses=set_grad_addresses, sum_of_squares=sum_of_squares)
                except ImportError:  # no triton: the same arithmetic in PyTorch
                    self._kernels = False
        return bool(self._kernels)

    def _scalars(self, group: dict, clip: Tensor) -> Tensor:
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        lr = lr.to(torch.float32) if torch.is_tensor(lr) else torch.tensor(float(lr), device=self.device)
        bias1 = 1 - torch.pow(beta1, self.step_count)
        bias2 = 1 - torch.pow(beta2, self.step_count)
        return torch.stack([lr, lr / bias1, torch.rsqrt(bias2), clip]).to(torch.float32)

    @torch.no_grad()
    def clip_and_step(self, max_grad_norm: float) -> None:
        """:func:`~ctxkit.training.optim.clipped_step`'s way in: the clipping rides in the update."""
        self.step(max_grad_norm=max_grad_norm)

    def step(self, closure=None, max_grad_norm: float = 0.0):
        """One update; with ``max_grad_norm > 0`` the gradients' global 2-norm is clipped to it
        (``torch.nn.utils.clip_grad_norm_``'s factor ``min(1, max / (norm + 1e-6))``, applied
        inside the update). The norm is kept in ``last_grad_norm``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        missing = [p for kind in self.kinds for p in kind.params if p.grad is None]
        if missing:
            return self._step_skipping(missing, max_grad_norm) if len(missing) < sum(len(k.params) for k in self.kinds) else loss
        direct = self._use_kernels() and all(p.grad.dtype == k.grad.dtype and p.grad.is_contiguous()
                                             for k in self.kinds for p in k.params)
        if direct:  # the kernels read each gradient where it is
            for kind in self.kinds:
                self._prepare_tables(kind)
        else:  # gathered into the flat gradient buffer first
            for kind in self.kinds:
                kind.gather([p.grad for p in kind.params])
        clip = torch.ones((), dtype=torch.float32, device=self.device)
        if max_grad_norm > 0:
            if direct:
                squares = torch.cat([self._kernels.sum_of_squares(k.tables, k.grad.dtype, k.partials) for k in self.kinds])
                total = squares.sum().sqrt()
            else:
                total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(k.grad, dtype=torch.float32)
                                                              for k in self.kinds]))
            self.last_grad_norm = total
            clip = torch.clamp(max_grad_norm / (total + 1e-6), max=1.0)
        self.step_count += 1
        if direct:  # one launch per kind, every group's scalars in one small tensor
            hyper = self._hyper()
            lr = torch.stack([g["lr"].to(torch.float32) if torch.is_tensor(g["lr"]) else
                              torch.tensor(float(g["lr"]), dtype=torch.float32, device=self.device) for g in self.param_groups])
            bias1 = 1 - torch.pow(hyper[:, 1], self.step_count)
            bias2 = 1 - torch.pow(hyper[:, 3], self.step_count)
            scalars = torch.stack([lr, lr / bias1, torch.rsqrt(bias2), clip.expand_as(lr)], dim=1).contiguous()
            for kind in self.kinds:
                self._kernels.adamw_update(kind.tables, kind.grad.dtype, kind.master, kind.exp_avg, kind.exp_avg_sq,
                                           kind.flat if kind.low else None, scalars, hyper)
            return loss
        for i, group in enumerate(self.param_groups):
            scalars = self._scalars(group, clip)
            for kind in self.kinds:
                if i in kind.segments:
                    self._update(kind, *kind.segments[i], group, scalars)
        return loss

    def _hyper(self) -> Tensor:
        """``(groups, 6)`` fp32 ``[weight_decay, beta1, 1 - beta1, beta2, 1 - beta2, eps]`` on the
        device, rebuilt when a group's values change (not possible inside a CUDA graph)."""
        values = tuple((float(g["weight_decay"]), *g["betas"], float(g["eps"])) for g in self.param_groups)
        if getattr(self, "_hyper_key", None) != values:
            if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise UserError("MasterAdamW: weight_decay, betas or eps changed while a CUDA graph is being captured")
            rows = [[wd, b1, 1.0 - b1, b2, 1.0 - b2, eps] for wd, b1, b2, eps in values]
            self._hyper_tensor = torch.tensor(rows, dtype=torch.float32, device=self.device)
            self._hyper_key = values
        return self._hyper_tensor

    def _prepare_tables(self, kind: _Kind) -> None:
        """The kernels' block tables (once) and this step's gradient addresses."""
        if kind.tables is None:
            grad_addr = torch.zeros(-(-len(kind.params) // 16) * 16, dtype=torch.int64, device=self.device)
            kind.tables = {**self._kernels.build_tables(kind.sizes, kind.offsets, kind.groups, self.device), "grad_addr": grad_addr}
            kind.partials = torch.empty(kind.tables["block_param"].numel(), dtype=torch.float32, device=self.device)
        self._kernels.set_grad_addresses(kind.tables["grad_addr"], [p.grad for p in kind.params])

    def _update(self, kind: _Kind, start: int, end: int, group: dict, scalars: Tensor) -> None:
        beta1, beta2 = group["betas"]
        master, grad = kind.master[start:end], kind.grad[start:end]
        m, v = kind.exp_avg[start:end], kind.exp_avg_sq[start:end]
        low = kind.flat[start:end] if kind.low else None
        lr, step_size, inv_bias2_sqrt, clip = scalars.unbind()
        g = grad.to(torch.float32) * clip
        master.sub_(lr * group["weight_decay"] * master)
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        master.sub_(step_size * m / (v.sqrt() * inv_bias2_sqrt + group["eps"]))
        if low is not None:
            low.copy_(master)

    def _step_skipping(self, missing: List[nn.Parameter], max_grad_norm: float):
        """Parameters without a gradient are left alone (as torch's AdamW does), at the cost of
        an update per parameter; a zero gradient would still move them through weight decay."""
        if not self._warned:
            warnings.warn(f"MasterAdamW: {len(missing)} parameters have no gradient; they are skipped and this step "
                          "updates parameter by parameter (slower)", stacklevel=3)
            self._warned = True
        skip = {id(p) for p in missing}
        clip = torch.ones((), dtype=torch.float32, device=self.device)
        present = [p.grad for kind in self.kinds for p in kind.params if id(p) not in skip]
        if max_grad_norm > 0:
            total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in present]))
            self.last_grad_norm = total
            clip = torch.clamp(max_grad_norm / (total + 1e-6), max=1.0)
        self.step_count += 1
        for kind in self.kinds:
            kind.gather([p.grad if p.grad is not None else torch.zeros_like(p) for p in kind.params])
        index = {id(p): i for i, g in enumerate(self.param_groups) for p in g["params"]}
        for kind in self.kinds:
            for p, offset in zip(kind.params, kind.offsets):
                if id(p) not in skip:
                    group = self.param_groups[index[id(p)]]
                    self._update(kind, offset, offset + p.numel(), group, self._scalars(group, clip))

    # -- weights at full precision, state ----------------------------------------------

    @contextlib.contextmanager
    def full_precision(self):
        """Within the block the low-precision parameters are their fp32 masters (for saving:
        ``model.state_dict()`` then holds the weights the optimiser updates, not their bf16
        rounding). Do not run the model inside the block."""
        swapped = [(p, p.data) for kind in self.kinds if kind.low for p in kind.params]
        try:
            for kind in self.kinds:
                if kind.low:
                    for p, master in zip(kind.params, kind.views(kind.master)):
                        p.data = master
            yield self
        finally:
            for p, data in swapped:
                p.data = data

    @torch.no_grad()
    def load_per_parameter_state(self, state: dict) -> None:
        """Load a ``torch.optim.AdamW.state_dict()`` (integer ids in param-group order), as
        a run on several ranks saves it, into the flat moments; call it after loading the
        fp32 weights inside :meth:`full_precision` (they are the masters), as this copies
        the masters to the low-precision weights. A parameter without state gets zero moments."""
        members = [p for g in self.param_groups for p in g["params"]]
        index = {id(p): i for i, p in enumerate(members)}
        steps = {float(s["step"]) for s in state["state"].values()}
        for kind in self.kinds:
            for p, m, v in zip(kind.params, kind.views(kind.exp_avg), kind.views(kind.exp_avg_sq)):
                saved = state["state"].get(index[id(p)])
                if saved is None:
                    m.zero_(), v.zero_()
                else:
                    m.copy_(saved["exp_avg"]), v.copy_(saved["exp_avg_sq"])
            if kind.low:
                kind.flat.copy_(kind.master)
        self.step_count.fill_(max(steps) if steps else 0.0)  # one step count for all: AdamW's agree unless a parameter sat out
        for group, saved in zip(self.param_groups, state["param_groups"]):
            for key, value in saved.items():
                if key == "params" or key not in group:
                    continue
                if torch.is_tensor(group[key]):
                    group[key].fill_(float(value))
                else:
                    group[key] = tuple(value) if key == "betas" else value

    def state_dict(self) -> dict:
        groups = [{k: (float(v) if torch.is_tensor(v) else v) for k, v in g.items() if k != "params"} for g in self.param_groups]
        kinds = [{"low": k.low, "size": k.master.numel(), "master": k.master.detach().clone(), "exp_avg": k.exp_avg.clone(),
                  "exp_avg_sq": k.exp_avg_sq.clone()} for k in self.kinds]
        return {"format": "ctxkit.MasterAdamW/1", "step": float(self.step_count), "param_groups": groups, "kinds": kinds}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        if state.get("format") != "ctxkit.MasterAdamW/1":
            raise UserError("MasterAdamW.load_state_dict: not a MasterAdamW state (was the run saved with another optimiser? "
                            "resume with the same fast plan: master on or off as before)")
        mine = [(k.low, k.master.numel()) for k in self.kinds]
        theirs = [(k["low"], k["size"]) for k in state["kinds"]]
        if mine != theirs or len(state["param_groups"]) != len(self.param_groups):
            raise UserError(f"MasterAdamW.load_state_dict: saved layout {theirs} with {len(state['param_groups'])} groups, "
                            f"this optimiser has {mine} with {len(self.param_groups)}")
        for kind, saved in zip(self.kinds, state["kinds"]):
            kind.master.copy_(saved["master"])
            kind.exp_avg.copy_(saved["exp_avg"])
            kind.exp_avg_sq.copy_(saved["exp_avg_sq"])
            if kind.low:
                kind.flat.copy_(kind.master)
        self.step_count.fill_(state["step"])
        for group, saved in zip(self.param_groups, state["param_groups"]):
            for key, value in saved.items():
                if torch.is_tensor(group.get(key)):
                    group[key].fill_(value)
                else:
                    group[key] = tuple(value) if key == "betas" else value


def per_parameter_state(saved: dict, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """A :meth:`MasterAdamW.state_dict` as ``torch.optim.AdamW.state_dict()`` for ``optimizer``
    (integer ids in its parameter order): what a run on several ranks, where master weights
    do not run, resumes from a one-process checkpoint with.

    The flat buffers are cut where :class:`MasterAdamW` laid them out: its low-precision
    parameters (:func:`low_precision_parameters` of ``model``) first, then the rest, each in
    the param-group order that ``optimizer`` shares with it (both come from the same groups),
    at multiples of ``ALIGN``.
    """
    members = [p for g in optimizer.param_groups for p in g["params"]]
    low = {id(p) for p in low_precision_parameters(model)}
    kinds = [[p for p in members if (id(p) in low) == is_low] for is_low in (True, False)]
    kinds = [k for k in kinds if k]
    if [sum(-(-p.numel() // ALIGN) * ALIGN for p in k) for k in kinds] != [k["size"] for k in saved["kinds"]]:
        raise UserError("the checkpoint's master-weight optimiser state does not fit this model's parameters")
    index = {id(p): i for i, p in enumerate(members)}
    step = torch.tensor(float(saved["step"]), dtype=torch.float32)
    state = {}
    for params, kind in zip(kinds, saved["kinds"]):
        offset = 0
        for p in params:
            size = p.numel()
            state[index[id(p)]] = {"step": step.clone(), "exp_avg": kind["exp_avg"][offset:offset + size].view(p.shape).clone(),
                                   "exp_avg_sq": kind["exp_avg_sq"][offset:offset + size].view(p.shape).clone()}
            offset += -(-size // ALIGN) * ALIGN
    groups = [{**g, "params": [index[id(p)] for p in og["params"]]} for g, og in zip(saved["param_groups"], optimizer.param_groups)]
    return {"state": state, "param_groups": groups}


def build_master_adamw(model: nn.Module, lr: float, weight_decay: float = 0.01, betas=(0.9, 0.999), eps: float = 1e-8,
                       dtype: torch.dtype = torch.bfloat16, capturable: bool = False) -> MasterAdamW:
    """:class:`MasterAdamW` over ``model`` with BERT's no-decay groups (biases and norms), its
    ``nn.Linear`` parameters in ``dtype`` (:func:`low_precision_parameters`)."""
    low = low_precision_parameters(model)
    return MasterAdamW(_param_groups(model, weight_decay), low_precision=low, lr=lr, betas=betas, eps=eps,
                       weight_decay=weight_decay, dtype=dtype, capturable=capturable)
