"""One trainer for every fine-tuning task.

AdamW with linear warmup/decay, gradient accumulation, clipping, bf16 autocast on GPU
(fp32 on CPU), length-grouped batches with dynamic padding, evaluation each epoch,
best-checkpoint saving, and exact resume: model, optimiser, scheduler, every RNG and the
position inside the epoch are checkpointed atomically, so a resumed run reproduces the
uninterrupted run's losses. Under torchrun a run resumes at any world size, with the same
data order (:mod:`ctxkit.training.world_resume`).

The model is any module whose ``forward(**batch)`` returns a dict with ``"loss"``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from ..core.capabilities import CarriesState, GraphCapturable, KeyedCollator, declares
from ..core.diskspace import tensor_bytes
from ..core.durable import write_folder
from ..core.interrupts import StopSignals, leave_stop_signals_to_parent, resume_or_start
from ..core.run_folder import hold_run_folder
from ..core.run_state import BackgroundSaver, HostSnapshot, autocast, diverged, intact_note, resolve_device, set_seed
from .callbacks import Callback, CallbackList, JsonlWriter
from .config import TrainConfig
from .curve import CurveDrawer
from .data import CollatedBatches, EpochItems
from .distributed import agree, all_reduce_mean, broadcast_parameters, cpu_copy, setup, shard_model
from .graphs import GraphedTrainStep, graphs_supported
from .master import MasterAdamW, build_master_adamw
from .optim import build_adamw, build_lamb, build_schedule
from .speed import compile_warm_up, graph_grad_sync, prepare_model
from .steps import make_step
from .world_resume import CheckpointIO, EpochOrder
from ..core.errors import UserError
from ..core.checkpoint import write_json
from ..fast import resolve

__all__ = ["TrainConfig", "Trainer", "TrainResult", "resolve_device", "autocast", "set_seed"]

logger = logging.getLogger("ctxkit")
#: seconds of training between two redraws of ``curve.png`` (it is always drawn after the last epoch)
CURVE_EVERY_S = 30.0
#: what the verbs write into a run folder once training has ended: with one of them there and
#: no checkpoint, ``--resume`` is refused rather than training over a finished run
FINISHED = ("results.json", "summary.json")


def _say(message: str, *args) -> None:
    """``logger.info`` on a line of its own while tqdm bars are drawn: the bars on the
    terminal are cleared first and redrawn after, as ``tqdm.write`` does (otherwise the
    line is glued to the end of the bar)."""

    with tqdm.external_write_mode(file=sys.stderr):
        logger.info(message, *args)


@dataclass
class TrainResult:
    """What :meth:`Trainer.train` returns."""

    best_metric: Optional[float]
    best_epoch: Optional[int]
    history: List[dict] = field(default_factory=list)
    losses: List[float] = field(default_factory=list)
    wall_time: float = 0.0
    steps: int = 0
    # Why training ended early, when it did: "max_steps" or "max_minutes" (a requested stop,
    # with a resumable checkpoint and a usable best/), None after the last epoch.
    stopped: Optional[str] = None


def _in_stream_order(lengths: Sequence[int], batch_size: int, seed: int, epoch: int) -> List[List[int]]:
    """The batches of a stateful model's epoch: examples in their order, ``batch_size`` at a
    time (example *i* of the data continues example *i - batch_size*'s rows)."""
    return [list(range(i, min(i + batch_size, len(lengths)))) for i in range(0, len(lengths), batch_size)]


def _compiled_graphs() -> int:
    """Graphs ``torch.compile`` has made in this process so far (Dynamo's own counter)."""
    from torch._dynamo.utils import counters  # lazy: torch._dynamo is heavy, and only compiling plans read it

    return int(counters["stats"]["unique_graphs"])


class Trainer(CheckpointIO):
    """Fine-tune ``model`` on ``train_features``.

    Args:
        model: module with ``forward(**batch) -> {"loss": ...}``.
        train_features: feature dicts (lists for sequences, scalars for labels).
        config: hyper-parameters.
        out_dir: run folder: ``log.jsonl``, ``curve.png``, ``checkpoint/`` (for resume) and
            whatever ``save_best`` writes into ``best/``.
        evaluate: ``evaluate(model) -> metrics dict``, called after every epoch.
        main_metric: key of the metrics dict that picks the best epoch.
        greater_is_better: direction of ``main_metric``.
        save_best: ``save_best(model, folder)`` writes a loadable model.
        collate_fn: turns a list of features into a batch of tensors (default: dynamic
            padding); if it has ``state_dict``/``load_state_dict`` (e.g. a masking
            collator's RNG), that state is checkpointed for exact resume.
        flops_per_token: training FLOPs per token, given the mean sequence length; with
            ``config.peak_tflops`` the log reports model FLOPs utilisation (MFU).
        callbacks: also receive every ``log.jsonl`` record (:mod:`ctxkit.training.callbacks`,
            e.g. a TensorBoard writer); on rank 0 only, closed when ``train`` returns or fails.
        use: the workload ``config.fast`` is resolved for: ``"train"`` (variable lengths,
            e.g. fine-tuning) or ``"pretrain"`` (long runs of fixed-length batches, where
            compiling pays); see :func:`ctxkit.fast.resolve`. The resolved plan is
            ``self.plan``, printed once and written to ``out_dir/fast.json``.

    Raises:
        ValueError: for inconsistent settings, e.g. FSDP on several ranks with ``evaluate``
            (rank 0 alone would evaluate a model whose weights are spread over all ranks).

    Examples may be any sequence with ``__len__``/``__getitem__`` (e.g. memory-mapped
    shards); a ``lengths`` attribute, when present, saves reading every example.
    """

    def __init__(
        self,
        model: nn.Module,
        train_features: Sequence[dict],
        config: TrainConfig,
        out_dir: os.PathLike,
        evaluate: Optional[Callable[[nn.Module], Dict[str, float]]] = None,
        main_metric: Optional[str] = None,
        greater_is_better: bool = True,
        save_best: Optional[Callable[[nn.Module, Path], None]] = None,
        collate_fn: Optional[Callable[[list], Dict[str, torch.Tensor]]] = None,
        flops_per_token: Optional[Callable[[float], float]] = None,
        callbacks: Optional[Sequence[Callback]] = None,
        use: str = "train",
    ):
        if not len(train_features):
            raise UserError("no training examples")
        if config.parallel not in ("ddp", "fsdp"):
            raise UserError(f"parallel must be 'ddp' or 'fsdp', got {config.parallel!r}")
        if config.warmup_steps is not None and config.warmup_steps < 0:
            raise UserError(f"warmup_steps must be >= 0, got {config.warmup_steps}")
        if config.eval_every < 0:
            raise UserError(f"eval_every must be >= 0 (0: evaluate at epoch ends only), got {config.eval_every}")
        if config.data_workers is not None and config.data_workers < 0:
            raise UserError(f"data_workers must be >= 0 (0: collate in this process), got {config.data_workers}")
        if config.batch_size % config.grad_accum:
            raise UserError(f"batch_size {config.batch_size} is not divisible by grad_accum {config.grad_accum}")
        self.config = config
        self.device = resolve_device(config.device)
        self.model = model.to(self.device)
        self.features = train_features if hasattr(train_features, "__getitem__") else list(train_features)
        lengths = getattr(self.features, "lengths", None)
        self.lengths = list(lengths) if lengths is not None else [len(f["input_ids"]) for f in self.features]
        self.collate_fn = collate_fn
        self.flops_per_token = flops_per_token
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.evaluate = evaluate
        self.main_metric = main_metric
        self.greater_is_better = greater_is_better
        self.save_best = save_best
        self._curve = CurveDrawer(self.out_dir, main_metric, lambda message: _say("%s", message))
        self.rank, self.world = setup(self.device.type)
        # log.jsonl is the first writer, so a record reaches the file before any other writer.
        self.callbacks = CallbackList([JsonlWriter(self.out_dir / "log.jsonl"), *(callbacks or ())] if self.rank == 0 else [])
        self.sharded = config.parallel == "fsdp" and self.world > 1
        if self.sharded and evaluate is not None:
            raise UserError("fsdp is supported for runs without per-epoch evaluation, e.g. pretrain; use --parallel ddp for fine-tuning")
        if self.device.type == "cuda" and self.world > 1:
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.model = self.model.to(self.device)
        self.micro_batch = config.batch_size // config.grad_accum
        if self.micro_batch % self.world:  # the global batch is held fixed at any world size; it must split evenly
            raise UserError(f"batch_size {config.batch_size} / grad_accum {config.grad_accum} is not divisible by {self.world} ranks: "
                            f"run on a number of ranks that divides {self.micro_batch}, or with a --grad-accum that leaves a "
                            f"multiple of {self.world} (the data order does not depend on it)")
        self.steps_per_epoch = math.ceil(len(self.features) / config.batch_size)
        total = math.ceil(self.steps_per_epoch * config.epochs)
        self.total_steps = min(total, config.max_steps) if config.max_steps else total
        # The schedule spans the full run even when max_steps stops it early, so a
        # stopped-then-resumed run follows the same learning-rate curve.
        self.graphed = None
        if config.optimizer not in ("adamw", "lamb"):
            raise UserError(f"optimizer must be 'adamw' or 'lamb', got {config.optimizer!r}")
        # Every speed option comes from the plan, resolved once for this device, world and
        # optimiser (auto: the fastest exact plan; an explicit one is refused here if it
        # cannot run, before any compute).
        plan = resolve(config.fast, use=use, device=self.device, world_size=self.world, precision=config.precision,
                       optimizer=config.optimizer, grad_accum=config.grad_accum, parallel=config.parallel)
        graph_safe = not any(isinstance(m, GraphCapturable) and not m.cuda_graph_safe for m in self.model.modules())
        if not graph_safe:  # ``cuda_graph_safe = False`` (GraphCapturable): e.g. packed RNN sequences, lengths on the host
            plan = plan.without("graphs", f"{type(self.model).__name__} syncs with the host")
        # Truncated BPTT (CarriesState): each step continues from the state the previous one left.
        self.stateful = declares(self.model, CarriesState)
        if self.stateful:
            if config.grad_accum > 1:
                raise UserError(f"{type(self.model).__name__} carries its state from batch to batch: train it with grad_accum 1")
            plan = plan.without("graphs", f"{type(self.model).__name__} carries state between steps")
        self.plan = plan
        use_graphs = plan.cuda_graphs and not self.sharded and graphs_supported(self.device, config.grad_accum)
        # Under FSDP rank 0 keeps an unsharded CPU twin to hand gathered weights to save_best.
        self._twin = cpu_copy(self.model) if self.sharded and save_best is not None and self.rank == 0 else None
        # Per-layer compilation under FSDP (before sharding, as FSDP2 expects); for an
        # overlapped all-reduce the model is compiled in segments (one whole-model graph
        # would deliver every gradient at the end).
        overlap = plan.overlap_grad_reduce and self.world > 1
        # Pretraining batches come from a fixed set of shapes (pretrain pads to length buckets):
        # a specialised graph each, never one with dynamic sizes.
        prepare_model(self.model, plan, whole_model=not self.sharded, segments=2 if overlap else 1, static_shapes=use == "pretrain")
        if self.sharded:
            shard_model(self.model, self.device)
        # Built after sharding: the optimiser must hold FSDP's DTensor shards.
        if plan.master_weights:
            self.optimizer = build_master_adamw(self.model, config.lr, config.weight_decay, capturable=use_graphs)
        else:
            self.optimizer = (build_lamb(self.model, config.lr, config.weight_decay) if config.optimizer == "lamb"
                              else build_adamw(self.model, config.lr, config.weight_decay, capturable=use_graphs))
        warmup = config.warmup_steps if config.warmup_steps is not None else int(config.warmup_ratio * total)
        self.scheduler = build_schedule(config, self.optimizer, warmup, total)
        self.forward = self.model  # fully_shard works in place: no wrapper
        if self.world > 1 and use_graphs:
            broadcast_parameters(self.model)  # DDP's start-up sync, done by hand
        elif self.world > 1 and not self.sharded:
            from torch.nn.parallel import DistributedDataParallel

            self.forward = DistributedDataParallel(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
            if plan.grad_reduce == "bfloat16":
                from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

                self.forward.register_comm_hook(None, bf16_compress_hook)
        self.pad_multiple = config.pad_multiple
        # One collated batch per shape the run will meet (pretrain sets them when it pads to
        # length buckets): compiled before step 1, so no compile stalls the measured steps.
        self.warm_batches: List[Dict[str, torch.Tensor]] = []
        # Forms each epoch's global batches instead of length grouping (pretrain sets
        # data.batching.balanced_batches when it packs sequences): (lengths, batch, seed, epoch) -> ids.
        # A stateful model (truncated BPTT) reads its batches in stream order, every epoch.
        self.batch_former: Optional[Callable] = _in_stream_order if self.stateful else None
        background = config.background_saves if config.background_saves is not None else self.device.type == "cuda"
        self._saver = BackgroundSaver() if background and config.save_checkpoints else None
        self._snapshot = HostSnapshot()
        if use_graphs:
            # Several ranks: the gradient average is captured in the graph too.
            self.graphed = GraphedTrainStep(self.model, self.optimizer, config.max_grad_norm, self._autocast,
                                            grad_sync=graph_grad_sync(self.model, plan) if self.world > 1 else None)
            self.pad_multiple = max(config.pad_multiple, 16)  # few shapes -> few graphs
        # One optimiser step, eager (micro-batches accumulated) or replayed from CUDA graphs.
        self.step = make_step(self.model, self.forward, self.optimizer, self.scheduler, device=self.device, precision=config.precision,
                              max_grad_norm=config.max_grad_norm, graphed=self.graphed, rows=self.micro_batch // self.world,
                              sharded=self.sharded)

    def _autocast(self):
        """The graphed step's autocast (its weight-cast cache off: a capture must not keep casts)."""
        return autocast(self.device, self.config.precision, cache_enabled=False if self.graphed is not None else True)

    def _full_precision(self):
        """While saving or evaluating: the fp32 masters in place of bf16 weights (MasterAdamW)."""
        optimizer = getattr(self, "optimizer", None)
        return optimizer.full_precision() if isinstance(optimizer, MasterAdamW) else contextlib.nullcontext()

    # -- checkpoints (the rest: CheckpointIO) --------------------------------------------------

    def _save_best(self, model: nn.Module) -> None:
        """``best/`` replaced as a unit, so its encoder and head always come from one epoch (a
        full disk, found before or while writing: one line saying what is intact)."""
        best = self.out_dir / "best"
        with self._full_precision():
            write_folder(best, lambda folder: self.save_best(model, folder), needed=tensor_bytes(model.state_dict()),
                         intact=lambda: intact_note(self.out_dir / "checkpoint", best))

    # -- logging ----------------------------------------------------------------------

    def _log(self, record: dict) -> None:
        if self.rank == 0:
            self.callbacks.emit(record)

    # -- the loop -----------------------------------------------------------------------

    def train(self, resume: bool = False) -> TrainResult:
        """Train; with ``resume`` continue from ``out_dir/checkpoint`` exactly. The callbacks
        are closed when this returns, also when training fails. SIGTERM or SIGUSR1 (what
        SLURM, Kubernetes and systemd send before a kill) ends the run after the current step
        with a checkpoint (``TrainResult.stopped == "signal"``); a second signal stops at once."""
        # One run per folder (under torchrun rank 0's lock covers it); the CLI took it already.
        with hold_run_folder(self.out_dir, enabled=self.rank == 0), self.callbacks, StopSignals() as self._signals:
            try:
                return self._train(resume)
            except BaseException:
                if self._saver is not None:
                    self._saver.wait_quietly()  # a checkpoint being written is finished before the error goes up
                raise

    def _train(self, resume: bool) -> TrainResult:
        cfg = self.config
        state = {"epoch": 0, "batch_in_epoch": 0, "step": 0, "best": None, "best_epoch": None, "history": [], "losses": []}
        self._tidy_run_folder()
        run_info = {"config": asdict(cfg), "fast": str(self.plan), "examples": len(self.features), "total_steps": self.total_steps}
        if self.rank == 0:
            _say("%s", self.plan.describe())
            # What evaluate / predict / serve reuse (ctxkit.tasks.load_run): the plan as asked,
            # re-resolved for inference there, and what it resolved to here.
            write_json({"asked": cfg.fast, "resolved": str(self.plan), "notes": list(self.plan.notes), "context": self.plan.context},
                       self.out_dir / "fast.json")
        if resume:  # a run that crashed before its first checkpoint starts again; a finished one is refused
            resume = resume_or_start(self.out_dir / "checkpoint", finished=[self.out_dir / name for name in FINISHED],
                                     say=_say if self.rank == 0 else lambda message: None)
        if resume:
            state = self.load_checkpoint()
            run_info["resumed_at_step"] = state["step"]  # the log goes on: no start record in log.jsonl
        else:
            set_seed(cfg.seed)
            if self.rank == 0:
                (self.out_dir / "log.jsonl").unlink(missing_ok=True)
        self.model.train()
        self._shapes, self._compiles = set(), 0
        self._graphs_at_start = _compiled_graphs() if self.plan.compile != "off" else 0
        bar = tqdm(total=self.total_steps, initial=state["step"], desc="train", disable=not cfg.progress, unit="step", dynamic_ncols=True)
        if self.warm_batches and self.plan.compile != "off" and self.world == 1:  # ranks would need the same shapes: not yet
            seconds = compile_warm_up(self.model, self.warm_batches, self._autocast, self.device, lambda b: self._note_shape(b, bar))
            self._count_compiles(0)
            run_info["warm_up"] = {"shapes": [list(b["input_ids"].shape) for b in self.warm_batches], "seconds": round(seconds, 2),
                                   "compiles": self._compiles}
        self._log({"event": "start", **run_info})
        start = time.time()
        losses: List[float] = state["losses"]
        n_epochs = math.ceil(cfg.epochs)
        step = state["step"]
        running: Dict[str, torch.Tensor] = {}
        running_n, seen, tokens, interval_start = 0, 0, 0, time.time()
        stopped: Optional[str] = None
        epoch = state["epoch"]
        # One stream of micro-batches over every epoch left; its loader workers start once and
        # collate the next epoch's first batches while this one ends (evaluation, checkpoint).
        begin = self._epoch_order(epoch, state)
        stream = self._stream(begin, n_epochs)
        for epoch in range(state["epoch"], n_epochs):
            # The same global batches at any world size; this rank collates only its rows of them.
            order, first = begin if epoch == begin[0].epoch else (self._fresh_order(epoch), 0)
            for s in range(first, len(order)):
                if s == 0 and self.stateful:  # an epoch starts with no state (a resumed one: the checkpoint's)
                    self.step.reset()
                group = [next(stream) for _ in range(order.bounds[s + 1] - order.bounds[s])]
                self._note_shape(group[0], bar)
                scalars, n_seq, n_tok = self.step(group, order.weights[order.bounds[s]:order.bounds[s + 1]])
                seen, tokens = seen + n_seq, tokens + n_tok
                step += 1
                self._count_compiles(step)
                for k, v in scalars.items():
                    running[k] = running[k] + v if k in running else v
                running_n += 1
                losses.append(scalars["loss"])  # kept on device: no sync per step
                bar.update(1)
                if step % cfg.log_every == 0 or step == self.total_steps:
                    means = {k: all_reduce_mean(v / running_n).item() for k, v in running.items()}
                    if not math.isfinite(means["loss"]):  # NaN weights train on at full speed: stop, keep the checkpoint
                        raise diverged(means["loss"], step, cfg.lr, self.out_dir / "checkpoint")
                    seen, tokens = seen * self.world, tokens * self.world
                    now = time.time()
                    record = {"event": "train", "step": step, "epoch": epoch, **means, "lr": float(self.scheduler.get_last_lr()[0]),
                              "elapsed": round(now - start, 2), "time": round(now, 3),
                              **self._throughput(seen, tokens, now - interval_start),
                              **({"compiles": self._compiles} if self.plan.compile != "off" else {})}
                    self._log(record)
                    bar.set_postfix(loss=f"{means['loss']:.4f}", lr=f"{record['lr']:.2e}", seq_s=f"{record['seq_per_s']:.0f}",
                                    **({"mfu": f"{record['mfu']:.2f}"} if "mfu" in record else {}))
                    running, running_n, seen, tokens, interval_start = {}, 0, 0, 0, now
                # Evaluation every eval_every steps, besides the epoch's (not where the epoch's own
                # or the last step's follows at once).
                if cfg.eval_every and step % cfg.eval_every == 0 and step < self.total_steps and \
                        not (cfg.eval_each_epoch and s + 1 == len(order)):
                    self._evaluate_at_step(state, epoch, step, start)
                # Several ranks: rank 0's clock decides, so all stop at the same step, and only at
                # log steps, which sync anyway (a broadcast per step would stall the GPU queue).
                due = cfg.max_minutes is not None and (self.world == 1 or step % cfg.log_every == 0)
                if due and agree(time.time() - start > 60 * cfg.max_minutes and step < self.total_steps, self.device):
                    _say("time budget of %g min reached at step %d", cfg.max_minutes, step)
                    self._checkpoint(state, epoch, s + 1, step, losses, order)
                    stopped = "max_minutes"
                    break
                if (self.world == 1 or step % cfg.log_every == 0) and agree(self._signals.received is not None, self.device):
                    self._checkpoint(state, epoch, s + 1, step, losses, order)
                    _say("%s at step %d: checkpoint written", self._signals.received, step)
                    stopped = "signal"
                    break
                if step >= self.total_steps:
                    if cfg.max_steps and step == cfg.max_steps and s + 1 < len(order):
                        # Interrupted by max_steps mid-epoch: checkpoint the exact position
                        # and skip the epoch-end evaluation. (Fractional epochs fall through.)
                        self._checkpoint(state, epoch, s + 1, step, losses, order)
                        stopped = "max_steps"
                    break
                if cfg.save_every and step % cfg.save_every == 0:
                    self._checkpoint(state, epoch, s + 1, step, losses, order)
            if stopped:
                break
            self._end_epoch(state, epoch, step, losses, start)
            if step >= self.total_steps:
                break
        bar.close()
        if stopped and stopped != "signal":  # a signal leaves seconds before the kill: the checkpoint only
            # A stop the user asked for is a success: besides the resumable checkpoint, leave a
            # usable best/ (evaluated now). The checkpoint was written first, so resuming
            # continues exactly as if there had been no stop.
            self._evaluate_at_stop(state, epoch, step, start, stopped)
        if self.rank == 0:
            self._curve.draw(state["history"], losses)
        if self._saver is not None:
            self._saver.wait()  # the last checkpoint written (or its error raised) before the run ends
        if self.world > 1:
            torch.distributed.barrier()  # rank 0's best/ and checkpoint/ are complete for everyone
        wall = time.time() - start
        result = TrainResult(state["best"], state["best_epoch"], state["history"], [float(v) for v in losses], wall, step,
                             stopped or None)
        self._log({"event": "end", "steps": step, "best": state["best"], "best_epoch": state["best_epoch"], "wall_time": round(wall, 2)})
        return result

    def _note_shape(self, cpu_batch: Dict[str, torch.Tensor], bar) -> None:
        """Before a step: say on the bar when a batch shape is new (it compiles and/or is
        captured now, which takes seconds, not milliseconds)."""
        shape = (tuple(cpu_batch["input_ids"].shape), "attention_mask" in cpu_batch)
        if shape in self._shapes:
            return
        self._shapes.add(shape)
        if self.plan.compile != "off" or self.plan.cuda_graphs:
            what = "compiling" if self.plan.compile != "off" else "capturing"
            bar.set_postfix_str(f"{what} for batches of {shape[0][0]} x {shape[0][1]}{' (padded)' if shape[1] else ''}", refresh=True)

    def _count_compiles(self, step: int) -> None:
        """Graphs compiled so far (torch.compile); one after the warm-up is logged once a step:
        a shape the run did not see early (fixed shapes avoid it: pretraining pads to buckets)."""
        if self.plan.compile == "off":
            return
        graphs = _compiled_graphs()
        if graphs > self._graphs_at_start + self._compiles:
            new = graphs - self._graphs_at_start - self._compiles
            self._compiles += new
            if step > self.config.log_every and self.rank == 0:
                _say("recompiled at step %d (%d graph%s): a batch shape the warm-up did not see", step, new, "s" * (new > 1))

    def _fresh_order(self, epoch: int) -> EpochOrder:
        """Epoch ``epoch``'s order from its first step, computed once for the loader (which
        reaches the epoch first) and the loop (an epoch of pretraining holds ~1e8 ids)."""
        cache = self.__dict__.setdefault("_orders", {})
        if epoch not in cache:
            cache[epoch] = self._epoch_order(epoch, {"epoch": -1})[0]
            for old in [e for e in cache if e < epoch - 1]:
                del cache[old]
        return cache[epoch]

    def _stream(self, start: tuple, n_epochs: int) -> Iterator[Dict[str, torch.Tensor]]:
        """This rank's collated micro-batches from ``start`` (the first epoch's order and step)
        to the end of epoch ``n_epochs - 1``, in training order, prepared ahead by
        ``data_workers`` processes (pinned for asynchronous copies to the GPU) or inline.

        One loader serves every epoch: its workers are forked once, and they collate the next
        epoch's first batches while this epoch's last steps, evaluation and checkpoint run (a
        loader per epoch forked its workers at every epoch's end: ~0.1 s of a BERT-base run on
        an H200, and the first steps after it ran slower). Each epoch's order is a pure
        function of (seed, epoch), so nothing here moves a random stream.
        """
        source = CollatedBatches(self.features, [], self.collate_fn, self.pad_multiple, 0, self.rank, self.world,
                                 global_batches=self.graphed is not None)
        items = EpochItems(start, self._fresh_order, n_epochs)
        workers = self.config.data_workers
        if workers is None:
            workers = 0 if self.device.type == "cpu" else min(4, max(1, (os.cpu_count() or 2) // self.world - 1))
        if hasattr(self.collate_fn, "state_dict") and not declares(self.collate_fn, KeyedCollator):
            workers = 0  # a collator with sequential state must run here, in order
        if workers == 0 or items.empty():
            return (source[item] for item in items)
        loader = torch.utils.data.DataLoader(source, batch_size=None, sampler=items, num_workers=workers, prefetch_factor=4,
                                             pin_memory=self.device.type == "cuda",
                                             # its own generator: worker seeding must not draw from the global
                                             # RNG, which drives dropout (and resume restores)
                                             generator=torch.Generator().manual_seed(0),
                                             # a scheduler's SIGTERM reaches the whole process group: the
                                             # workers leave it to this process, which stops after its step
                                             worker_init_fn=leave_stop_signals_to_parent)
        # The workers are forked: garbage of this process that holds CUDA tensors (an earlier
        # run's, in a notebook or a benchmark) must not be collected there, where freeing it
        # touches CUDA and aborts the worker. Frozen objects are never collected in the fork
        # (and here again as usual once unfrozen); freezing costs no traversal.
        gc.freeze()
        try:
            return iter(loader)  # forks the workers
        finally:
            gc.unfreeze()

    def _throughput(self, seqs: int, tokens: int, seconds: float) -> dict:
        """Sequences/s, tokens/s and (when FLOPs and peak are known) MFU over a log interval."""
        seconds = max(seconds, 1e-9)
        out = {"seq_per_s": round(seqs / seconds, 1), "tokens_per_s": round(tokens / seconds, 1)}
        if self.flops_per_token is not None and self.config.peak_tflops and seqs:
            achieved = self.flops_per_token(tokens / seqs) * tokens / seconds
            out["mfu"] = round(achieved / (self.config.peak_tflops * 1e12), 4)
        return out

    def _evaluate_at_step(self, state: dict, epoch: int, step: int, start: float) -> None:
        """``eval_every``: evaluate now (rank 0), log it, and keep the model as ``best/`` when it
        beats every evaluation so far (with ``eval_each_epoch``; without it ``best/`` stays the
        final model, and these evaluations are only logged)."""
        if self.evaluate is None or self.rank != 0:
            return
        value = self._evaluation(state, epoch, step, start, f"step {step}")
        if self.config.eval_each_epoch and self._better(state, value):
            state["best"], state["best_epoch"] = value, epoch
            if self.save_best is not None:
                self._save_best(self.model)

    def _evaluation(self, state: dict, epoch: int, step: int, start: float, said: str, **extra) -> Optional[float]:
        """Evaluate the model (its fp32 masters, if any), log the record, add it to the history
        and say it on one line; returns the main metric's value (None without one)."""
        with self._full_precision():
            metrics = self.evaluate(self.model)
        self.model.train()
        record = {"event": "eval", "epoch": epoch, "step": step, **extra, "elapsed": round(time.time() - start, 2), **metrics}
        self._log(record)
        state["history"].append(record)
        _say("%s: %s", said, ", ".join(f"{k}={v:.4f}" for k, v in metrics.items() if isinstance(v, float)))
        return metrics.get(self.main_metric) if self.main_metric else None

    def _better(self, state: dict, value: Optional[float]) -> bool:
        """Whether ``value`` beats the best evaluation so far (any value beats none)."""
        return value is not None and (state["best"] is None or (value > state["best"] if self.greater_is_better else value < state["best"]))

    def _evaluate_at_stop(self, state: dict, epoch: int, step: int, start: float, reason: str) -> None:
        """After a requested stop mid-epoch: evaluate (when the run evaluates) and keep best/.

        The model becomes ``best/`` when no epoch has finished yet or when it scores better
        than the best epoch so far. Only the returned state changes, not the checkpoint.
        """
        if self.save_best is None:
            return
        if self.sharded:  # a collective: every rank sends its shards
            full = self.full_state_dict()
            if full is not None:
                self._twin.load_state_dict(full)
        if self.rank != 0:
            return
        model = self._twin if self.sharded else self.model
        if not self.config.eval_each_epoch or self.evaluate is None:
            self._save_best(model)
            return
        value = self._evaluation(state, epoch, step, start, f"stopped ({reason}) at step {step}", stop=reason)
        has_best = (self.out_dir / "best").is_dir() and state["best_epoch"] is not None
        if not has_best or self._better(state, value):
            state["best"], state["best_epoch"] = value, epoch
            self._save_best(self.model)

    def _end_epoch(self, state: dict, epoch: int, step: int, losses: list, start: float) -> None:
        last = step >= self.total_steps or epoch + 1 >= math.ceil(self.config.epochs)
        best_model = self.model
        if self.sharded and self.save_best is not None and (last or self.config.eval_each_epoch):
            # Exactly when the branches below save without evaluating (FSDP has no evaluate):
            # every rank gathers before rank 0 goes its own way; rank 0's CPU twin takes the weights.
            full = self.full_state_dict()
            if full is not None:
                self._twin.load_state_dict(full)
            best_model = self._twin
        if self.rank != 0:  # evaluation, best model and plots belong to rank 0
            self._checkpoint(state, epoch + 1, 0, step, losses, None)
            return
        if not self.config.eval_each_epoch:
            if last and self.save_best is not None:
                self._save_best(best_model)
                state["best_epoch"] = epoch
        elif self.evaluate is not None:
            value = self._evaluation(state, epoch, step, start, f"epoch {epoch}")
            if self._better(state, value):
                state["best"], state["best_epoch"] = value, epoch
                if self.save_best is not None:
                    self._save_best(self.model)
        elif self.save_best is not None:
            self._save_best(best_model)
        self._checkpoint(state, epoch + 1, 0, step, losses, None)
        # Drawing takes 0.3-1 s: redraw at most every CURVE_EVERY_S seconds of training (the
        # end of training always draws), or a run of many short epochs spends its time here.
        if not last and time.time() - (self._curve.drawn_at or start) >= CURVE_EVERY_S:
            # With the device doing the work (background checkpoints), on a thread: a GPU
            # keeps stepping while matplotlib draws (0.3-1 s, once a second epoch boundary in
            # the 8-minute BERT run); on a CPU the draw would only take the training's cores.
            self._curve.draw(state["history"], losses, background=self._saver is not None)
