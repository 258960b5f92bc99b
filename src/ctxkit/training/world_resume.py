"""Resume at any world size: one global data order, and checkpoints written by every rank.

A run started with ``torchrun --nproc_per_node N`` (or in one process) resumes with
``--resume`` on M ranks, with the optimiser state it saved and the data from the next unseen
sample on.

**What is held fixed across world sizes**: the global batch (``TrainConfig.batch_size``
sequences per optimiser step), the seed and the data, and with them the order of the
samples. Each epoch's order is :func:`~ctxkit.data.batching.length_grouped_batches` over
every example with the *global* batch size, a function of ``(seed, epoch)`` alone; global
batch ``s`` is optimiser step ``s`` of the epoch. Rank ``r`` of ``W`` takes rows ``r::W`` of
it and cuts them into ``grad_accum`` micro-batches, each weighted by its share of the global
batch, so that every step averages the gradient over the same global batch at any world size
and any accumulation. The checkpoint records its place as the epoch and the number of global
batches (and samples) of it consumed, in which no world size enters. ``grad_accum`` may
change on resume (e.g. 4 GPUs at 1 -> 1 GPU at 4: the same memory per device, the same
batches; the CLI wants ``--allow-changes`` for it, as for any recorded setting). What cannot
be honoured is refused in one line: a ``batch_size / grad_accum`` that does not split evenly
over the ranks.

**Not held fixed**: bitwise equality. An all-reduce sums in another order at another world
size, so weights agree to float rounding. Dropout and MLM masks are drawn per rank (a keyed
collator gets ``(epoch, micro-batch, rank)``), so at another world size a sequence meets
other masks; the sequences and their order are the same.

**Checkpoints.** One process writes the single-file layout of :mod:`ctxkit.core.run_state`
(``model.safetensors``, ``optimizer.pt``). Several ranks write through
:mod:`torch.distributed.checkpoint` (DCP) instead of gathering onto rank 0: each rank writes
its own shards (FSDP2) or its share of the replicated tensors (DDP) into ``checkpoint/shards/``,
and rank 0 writes ``extra.pt`` (scheduler, RNG streams, collator) and ``trainer_state.json``.
All of it goes into a new ``.checkpoint.new-*`` folder that rank 0 names, closes with its
manifest and renames into place (:func:`~ctxkit.core.durable.write_folder`): a crash at any
instant, on any rank, leaves the last complete checkpoint. Loading reshards: FSDP ranks read
only their own shards (DCP plans the reads); one process or DDP ranks read the whole state,
which each of them holds. Either layout resumes at any world size. ``best/`` and ``final/``
stay gathered safetensors, what evaluate, predict and serve read.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ..core.checkpoint import read_pickled_state
from ..core.durable import atomic_write, recover_folder, verify_manifest, write_folder
from ..core.errors import MissingFileError, UserError
from ..core.run_folder import trim_log
from ..core.run_state import (STATE_FILE, Checkpoint, capture_rng, diverged, intact_note, keep_last, restore_rng, save_checkpoint,
                              tidy_run_folder)
from ..core.run_state import load_checkpoint as load_single_process
from ..data.batching import length_grouped_batches
from .distributed import (full_model_state, load_full_state, optimizer_state_by_index, param_names, rank_and_world)
from .master import MasterAdamW, per_parameter_state

__all__ = ["EpochOrder", "CheckpointIO", "DATA_ORDER", "SHARDS", "EXTRA", "is_sharded", "save_sharded", "load_sharded",
           "read_checkpoint", "read_shards"]

logger = logging.getLogger("ctxkit")

#: the data order a checkpoint's position refers to: global batches (this module), or the
#: micro-batches of earlier versions (their order depended on ``grad_accum``)
DATA_ORDER, LEGACY_ORDER = "global-batches/1", "micro-batches/0"
SHARDS, EXTRA = "shards", "extra.pt"


# -- the data order ---------------------------------------------------------------------


def _split(rows: List[int], k: int) -> List[List[int]]:
    """``rows`` cut into ``k`` contiguous pieces whose sizes differ by at most one (as
    ``numpy.array_split``): neighbours in a length-sorted batch pad alike."""
    q, r = divmod(len(rows), k)
    pieces, start = [], 0
    for i in range(k):
        size = q + (i < r)
        pieces.append(rows[start:start + size])
        start += size
    return pieces


class EpochOrder:
    """One epoch's optimiser steps, and this rank's micro-batches of each.

    Args:
        lengths: every example's length (length grouping; no example is read for it).
        batch_size: the global batch, sequences per optimiser step.
        grad_accum: micro-batches per step on each rank.
        seed, epoch, group_factor: as for :func:`~ctxkit.data.batching.length_grouped_batches`.
        rank, world: this process and the number of processes.
        whole: each micro-batch is the whole global batch (the CUDA-graph path collates it
            and keeps this rank's rows: ``grad_accum`` is 1 there).
        legacy: the order of earlier versions (global micro-batches of ``batch_size /
            grad_accum``, ``grad_accum`` of them a step), for an epoch that a checkpoint of
            theirs stopped in the middle of.

    Attributes:
        global_steps: the example ids of each step's global batch, in order.
        micro: this rank's example ids per micro-batch, every step's in turn. A rank whose
            share of a step is empty (a global batch shorter than the ranks) gets one row of
            it with weight 0: under DDP and FSDP every rank takes part in every step.
        weights: each micro-batch's weight in its step's loss: its rows times ``world`` over
            the global batch's rows, so that the mean over ranks is the global batch's mean.
        keys: each micro-batch's key for a keyed collator (``step * grad_accum + k``, the
            micro-batch index of earlier versions).
        bounds: step ``s``'s micro-batches are ``micro[bounds[s]:bounds[s + 1]]``.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, grad_accum: int, seed: int, epoch: int, group_factor: int,
                 rank: int = 0, world: int = 1, whole: bool = False, legacy: bool = False, former: Optional[Callable] = None):
        self.name = LEGACY_ORDER if legacy else DATA_ORDER
        self.epoch, self.grad_accum = epoch, grad_accum
        if legacy:
            micro = length_grouped_batches(lengths, batch_size // grad_accum, seed, epoch, group_factor=group_factor)
            usable = len(micro) - len(micro) % grad_accum if len(micro) >= grad_accum else len(micro)
            steps = [micro[b:b + grad_accum] for b in range(0, usable, grad_accum)]
        elif former is not None:
            steps = [[b] for b in former(lengths, batch_size, seed, epoch)]
        else:
            steps = [[b] for b in length_grouped_batches(lengths, batch_size, seed, epoch, group_factor=group_factor)]
        # (one global batch a step shares its list: an epoch of pretraining holds ~1e8 ids)
        self.global_steps: List[List[int]] = [parts[0] if len(parts) == 1 else [i for part in parts for i in part] for parts in steps]
        self.micro: List[List[int]] = []
        self.weights: List[float] = []
        self.keys: List[int] = []
        self.bounds = [0]
        for s, parts in enumerate(steps):
            n = sum(map(len, parts))
            if whole:
                pieces = parts
            elif legacy:
                pieces = [part[rank::world] for part in parts]
            else:  # the same number of micro-batches on every rank: an FSDP forward is a collective
                pieces = _split(parts[0][rank::world], min(grad_accum, -(-n // world)))
            for k, piece in enumerate(pieces):
                self.micro.append(piece or parts[0][:1])
                self.weights.append(1.0 if whole else len(piece) * world / n)
                self.keys.append(s * grad_accum + k)
            self.bounds.append(len(self.micro))
        self._cumulative = [0]
        for batch in self.global_steps:
            self._cumulative.append(self._cumulative[-1] + len(batch))

    def __len__(self) -> int:
        return len(self.global_steps)

    def samples_before(self, step: int) -> int:
        """Samples of the epoch the first ``step`` steps consume (over every rank)."""
        return self._cumulative[step]

    def start(self, state: dict, batch_size: int) -> int:
        """The step to resume from in this epoch, for a checkpoint's ``state``.

        A checkpoint of this version names its step and the samples consumed before it; one
        of earlier versions, its micro-batch (``batch_in_epoch``). When the global batch has
        changed since (``--allow-changes``), the order is another one: the epoch goes on from
        the first step past the samples consumed, and a line says that this is not exact.
        """
        if "step_in_epoch" not in state:  # an earlier version's: its steps began every grad_accum micro-batches
            return state["batch_in_epoch"] // self.grad_accum
        step, consumed = state["step_in_epoch"], state.get("samples_in_epoch")
        if consumed is None or (state.get("batch_size", batch_size) == batch_size and step <= len(self)
                                and self.samples_before(step) == consumed):
            return step
        after = next((s for s in range(len(self) + 1) if self.samples_before(s) >= consumed), len(self))
        logger.warning("the checkpoint had consumed %d samples of epoch %d in %d global batches of up to %s; this run's order "
                       "(batches of %d, %d examples) differs, as the data or the batch size changed: the epoch goes on from "
                       "step %d, not exactly where it stopped", consumed, state["epoch"], step, state.get("batch_size", "?"),
                       batch_size, self._cumulative[-1], after)
        return after


def position(order: Optional[EpochOrder], epoch: int, step_in_epoch: int, batch_size: int, grad_accum: int, world: int) -> dict:
    """A checkpoint's place in the data, in terms no world size enters (``batch_in_epoch``,
    the micro-batch index of earlier versions, is kept for them and their readers)."""
    mid = order is not None and step_in_epoch > 0
    accum = order.grad_accum if mid else grad_accum  # an earlier version's order needs its own to be rebuilt
    return {"epoch": epoch, "step_in_epoch": step_in_epoch, "samples_in_epoch": order.samples_before(step_in_epoch) if mid else 0,
            "batch_in_epoch": step_in_epoch * accum, "data_order": order.name if mid else DATA_ORDER,
            "batch_size": batch_size, "grad_accum": accum, "world_size": world}


# -- sharded checkpoints ----------------------------------------------------------------


def is_sharded(folder: Path) -> bool:
    """Whether the checkpoint ``folder`` was written by several ranks (DCP shards)."""
    return (Path(folder) / SHARDS / ".metadata").is_file()


def _state_bytes(tree) -> int:
    """The bytes of a (nested) state's tensors at their global sizes (a DTensor's ``numel``
    is the whole tensor's): what the checkpoint will take on a shared disk."""
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(_state_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_state_bytes(v) for v in tree)
    return 0


def _broadcast(payload=None):
    """Rank 0's ``payload`` on every rank."""
    box = [payload]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _save(state: dict, path: Path) -> None:
    """Collective: ``torch.distributed.checkpoint.save`` into ``path``, with an error of the
    disk (a full one) raised as itself: DCP wraps every rank's errors into one exception,
    which :func:`~ctxkit.core.diskspace.reporting_disk_full` would not recognise."""
    from torch.distributed.checkpoint import FileSystemWriter, save

    try:
        save(state, storage_writer=FileSystemWriter(str(path)))
    except BaseException as err:  # noqa: BLE001 - re-raised, unwrapped when a rank's disk said why
        cause = next((e for e, _ in getattr(err, "failures", {}).values() if isinstance(e, OSError)), None)
        if cause is not None:
            raise cause from None
        raise


def save_sharded(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict, extra: dict,
                 retire=None) -> None:
    """Collective: write the checkpoint ``folder`` from every rank (see the module doc).

    Rank 0 names the new folder (and, when it cannot start one, e.g. too little disk
    space, says why on every rank); every rank writes its shards there; rank 0 adds the
    trainer state and ``extra``, closes the folder with its manifest and swaps it in.

    Raises:
        UserError: on every rank when rank 0 could not start the folder (its own error on rank 0).
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    if dist.get_rank() != 0:
        new, why = _broadcast()
        if new is None:
            raise UserError(f"the checkpoint was not written: rank 0 could not start it ({why})")
        _save(state, Path(new) / SHARDS)
        return
    text = json.dumps(trainer_state, indent=2)
    announced = False

    def write(new: Path) -> None:
        nonlocal announced
        _broadcast((str(new), None))
        announced = True
        _save(state, new / SHARDS)  # every rank's shards, then rank 0's .metadata
        atomic_write(new / EXTRA, lambda tmp: torch.save(extra, tmp))
        atomic_write(new / STATE_FILE, lambda tmp: Path(tmp).write_text(text))

    try:
        write_folder(folder, write, retire=retire, needed=_state_bytes(state) + len(text), intact=lambda: intact_note(folder))
    except BaseException as err:
        if not announced:  # the other ranks wait for a folder name: give them the reason instead
            _broadcast((None, str(err).splitlines()[0] if str(err) else type(err).__name__))
        raise


def _verified(folder: Path, collective: bool = True) -> Path:
    """The checkpoint folder after rank 0 put back a copy a crash left aside and checked the
    manifest (hashing every file once, not once per rank); its error is raised on every rank.
    Not ``collective``: this process alone, as rank 0."""
    rank, world = rank_and_world() if collective else (0, 1)
    error = None
    if rank == 0:
        try:
            found = recover_folder(folder)
            if found is None or not (found / STATE_FILE).is_file():
                raise MissingFileError(f"{folder.parent}: no checkpoint to resume from")
            verify_manifest(found)
        except Exception as err:  # noqa: BLE001 - raised on every rank below (the others wait for it)
            error = err
    if world > 1:
        error = _broadcast(error)
    if error is not None:
        raise error
    return folder


def read_shards(path: Path) -> dict:
    """Every tensor and value of a DCP checkpoint folder, whole, in this process alone
    (``{"model": {name: tensor}, "optimizer": {"state": {name: {...}}, "param_groups": [...]}}``)."""
    # What torch.distributed.checkpoint.format_utils.dcp_to_torch_save does (torch >= 2.3),
    # without writing the copy: a planner that builds the state dict from the metadata.
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict = {}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore")
        _load_state_dict(state, storage_reader=FileSystemReader(str(path)), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return state


def _load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict, by_name: bool) -> None:
    """Load a whole optimiser state (by parameter name, or by integer id) into an unsharded
    optimiser, converting between :class:`MasterAdamW`'s flat layout (one process) and the
    per-parameter AdamW layout (several ranks) when the checkpoint and this run differ."""
    names = param_names(model, optimizer)
    if saved.get("format") == "ctxkit.MasterAdamW/1":
        if isinstance(optimizer, MasterAdamW):
            optimizer.load_state_dict(saved)
            return
        saved, by_name = per_parameter_state(saved, model, optimizer), False
    state = optimizer_state_by_index(saved, names) if by_name else saved
    if isinstance(optimizer, MasterAdamW):
        optimizer.load_per_parameter_state(state)
    else:
        optimizer.load_state_dict(state)


def load_sharded(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sharded: bool, full_precision) -> Tuple[dict, dict]:
    """Collective under torchrun: load the DCP checkpoint ``folder`` into ``model`` and
    ``optimizer`` at this world size.

    Args:
        sharded: the model is FSDP2-sharded: each rank reads only the pieces of its shards
            (DCP reshards from the saved layout). Otherwise (one process, DDP) each rank
            reads the whole state.
        full_precision: a context in which the model's weights are the ones to load
            (:meth:`MasterAdamW.full_precision`, else a null context).

    Returns:
        ``(trainer_state, extra)``.
    """
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_state_dict

    _verified(folder)
    if sharded:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        load(state, storage_reader=FileSystemReader(str(folder / SHARDS)))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    else:
        whole = read_shards(folder / SHARDS)
        with full_precision:
            set_model_state_dict(model, whole["model"])
        _load_optimizer(model, optimizer, whole["optimizer"], by_name=True)
    extra = dict(read_pickled_state(folder / EXTRA, what="the trainer's state"))
    return json.loads((folder / STATE_FILE).read_text()), extra


def read_checkpoint(folder: Path) -> Checkpoint:
    """A checkpoint folder of either layout as whole state dicts, in one process (for tools
    and tests; a resumed run loads with :meth:`CheckpointIO.load_checkpoint`).

    ``model_state`` is keyed by parameter name. ``optimizer_state`` is the single-file
    layout's ``optimizer.state_dict()`` (integer ids) or, for a sharded checkpoint, the same
    keyed by parameter name (:func:`~ctxkit.training.distributed.optimizer_state_by_index`
    turns it into ids for a given optimiser).
    """
    folder = Path(folder)
    if not is_sharded(recover_folder(folder) or folder):
        return load_single_process(folder)
    _verified(folder, collective=False)
    whole = read_shards(folder / SHARDS)
    extra = dict(read_pickled_state(folder / EXTRA, what="the trainer's state"))
    return Checkpoint(folder, whole["model"], whole["optimizer"], json.loads((folder / STATE_FILE).read_text()), extra)


# -- the trainer's side -----------------------------------------------------------------


class CheckpointIO:
    """The checkpoints of :class:`~ctxkit.training.Trainer` (a mixin: it uses the trainer's
    model, optimiser, scheduler, collator, run folder, rank and world)."""

    def full_state_dict(self) -> Optional[Dict[str, torch.Tensor]]:
        """The model's full (unsharded) weights as CPU tensors (sharing memory with a CPU model).

        Under FSDP a collective that every rank must call: rank 0 gets the dict, others None.
        """
        if self.sharded:
            state = full_model_state(self.model)
            return state if self.rank == 0 else None
        with self._full_precision():
            return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def _extra(self) -> dict:
        extra = {"scheduler": self.scheduler.state_dict()}
        if hasattr(self.collate_fn, "state_dict"):
            extra["collator"] = self.collate_fn.state_dict()
        if getattr(self, "stateful", False):  # truncated BPTT: the state the next step continues from
            extra["step_state"] = self.step.state_dict()
        return extra

    def _checkpoint(self, state: dict, epoch: int, step_in_epoch: int, step: int, losses: list, order: Optional[EpochOrder]) -> None:
        """Checkpoint the run after ``step``, to go on at step ``step_in_epoch`` of ``epoch``
        (every rank calls it; with several ranks it is a collective)."""
        cfg = self.config
        state.update(position(order, epoch, step_in_epoch, cfg.batch_size, cfg.grad_accum, self.world), step=step,
                     losses=[float(v) for v in losses])
        if state["losses"] and not math.isfinite(state["losses"][-1]):  # never replace a good checkpoint with NaN weights
            raise diverged(state["losses"][-1], step, cfg.lr, self.out_dir / "checkpoint")
        if not cfg.save_checkpoints:
            return
        folder, retire = self.out_dir / "checkpoint", keep_last(self.out_dir, cfg.keep_last)
        if self.world > 1:  # every rank writes its shards (no gathering onto rank 0)
            save_sharded(folder, self.model, self.optimizer, state, {**self._extra(), "rng": capture_rng()}, retire=retire)
        elif self.rank == 0:
            with self._full_precision():  # the masters' tensors, saved before the next update
                weights = self.model.state_dict()
            self._save_checkpoint(folder, retire, state, weights, self.optimizer.state_dict())

    def _save_checkpoint(self, folder: Path, retire, state: dict, weights: Dict[str, torch.Tensor], optimizer_state: dict) -> None:
        """The single-process layout, written here or (``background_saves``) on a thread."""
        extra = self._extra()
        # Swapped in whole: at every instant one complete checkpoint exists (core/run_state.py).
        if self._saver is None:
            save_checkpoint(folder, model_state=weights, optimizer_state=optimizer_state, trainer_state=state, extra=extra, retire=retire)
            return
        # On a thread: copies of this step's tensors, RNG streams and position are written
        # while training goes on (the next save, or the end of the run, waits for it).
        self._saver.wait()
        extra["rng"] = capture_rng()
        weights, optimizer_state, extra = self._snapshot.take((weights, optimizer_state, extra))
        state = json.loads(json.dumps(state))
        self._saver.submit(lambda: save_checkpoint(folder, model_state=weights, optimizer_state=optimizer_state, trainer_state=state,
                                                   extra=extra, rng=False, retire=retire))

    def _tidy_run_folder(self) -> None:
        """At (re)start: a complete checkpoint and best/ back in place after a crash, then
        the debris of crashed writes removed (rank 0; the others wait for it)."""
        if self.rank == 0 and self.out_dir.is_dir():
            for path in tidy_run_folder(self.out_dir):
                logger.info("removed %s, left by an interrupted save", path)
        if self.world > 1:
            dist.barrier()

    def load_checkpoint(self) -> dict:
        """Load ``out_dir/checkpoint`` (either layout, written at any world size) into the
        model, optimiser, scheduler, RNG streams and collator; returns the trainer state.

        Every rank calls it under torchrun. ``train(resume=True)`` calls it.
        """
        folder = self.out_dir / "checkpoint"
        if self.rank == 0:
            recover_folder(folder)
        if self.world > 1:
            dist.barrier()  # rank 0 put the folder back before any rank looks at it
        if is_sharded(folder):
            state, extra = load_sharded(folder, self.model, self.optimizer, self.sharded, self._full_precision())
        else:
            ckpt = load_single_process(folder)
            state, extra = ckpt.trainer_state, ckpt.extra
            if self.sharded:  # every rank read the whole checkpoint and keeps its shard
                saved = ckpt.optimizer_state
                if saved.get("format") == "ctxkit.MasterAdamW/1":
                    saved = per_parameter_state(saved, self.model, self.optimizer)
                load_full_state(self.model, self.optimizer, ckpt.model_state, saved)
            else:
                with self._full_precision():
                    self.model.load_state_dict(ckpt.model_state)
                _load_optimizer(self.model, self.optimizer, ckpt.optimizer_state, by_name=False)
        self.scheduler.load_state_dict(extra["scheduler"])
        restore_rng(extra["rng"])
        if "collator" in extra and hasattr(self.collate_fn, "load_state_dict"):
            self.collate_fn.load_state_dict(extra["collator"])
        if getattr(self, "stateful", False):
            self.step.load_state_dict(extra.get("step_state", {"state": None}))
        at = state.get("world_size", 1)
        logger.info("resumed from %s at epoch %d, step %d of it (step %d)%s", folder, state["epoch"],
                    state.get("step_in_epoch", state["batch_in_epoch"]), state["step"],
                    f", written by {at} ranks, on {self.world}" if at != self.world else "")
        if self.rank == 0:  # the steps after the checkpoint are logged again: each once in log.jsonl
            trim_log(self.out_dir / "log.jsonl", state["step"])
        return state

    def _epoch_order(self, epoch: int, state: dict) -> Tuple[EpochOrder, int]:
        """Epoch ``epoch``'s order for this rank and the step it starts from (``state``: the
        run's, a resumed checkpoint's until the epoch it stopped in is done)."""
        cfg = self.config
        resuming = epoch == state["epoch"] and state.get("step_in_epoch", state["batch_in_epoch"]) > 0
        # A checkpoint of an earlier version stopped mid-epoch: that epoch in its micro-batch
        # order (it depended on grad_accum; the same as this one's at grad_accum 1).
        accum = state.get("grad_accum", cfg.grad_accum)
        legacy = resuming and state.get("data_order", LEGACY_ORDER) == LEGACY_ORDER and accum > 1
        order = EpochOrder(self.lengths, cfg.batch_size, accum if legacy else cfg.grad_accum, cfg.seed, epoch,
                           50 if cfg.group_factor is None else cfg.group_factor, self.rank, self.world,
                           whole=self.graphed is not None, legacy=legacy, former=self.batch_former)
        return order, order.start(state, cfg.batch_size) if resuming else 0
