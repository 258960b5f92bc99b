"""The training core every loop shares: RNG state, checkpoints, device and precision.

* :func:`capture_rng` / :func:`restore_rng`: every global generator (Python, NumPy, torch
  CPU, each CUDA device) plus any ``numpy.random.Generator`` a loop owns, in a form that
  ``torch.save`` writes and ``torch.load(weights_only=True)`` reads back. Restoring what
  was captured makes the following draws identical, which is what exact resume needs.
* :func:`save_checkpoint` / :func:`load_checkpoint`: a resumable checkpoint folder
  (``model.safetensors``, ``optimizer.pt``, ``trainer_state.json``) replaced as a unit with
  a manifest (:func:`ctxkit.core.durable.write_folder`), recovered after a crash and checked
  against its manifest before it is read; the optimiser file is read with
  ``weights_only=True`` (:func:`ctxkit.core.checkpoint.read_pickled_state`). A save that
  would not fit on the disk is refused before it starts, and one that fills the disk ends in
  one line saying which checkpoint is intact (:func:`intact_note`, :mod:`ctxkit.core.diskspace`).
* :class:`LossBuffer`: per-step losses kept on the device and read back in batches, so
  that a loop does not wait for the GPU at every step.
* :func:`resolve_device`, :func:`autocast`, :func:`set_seed` (from :mod:`ctxkit.core.device`)
  and :func:`resolve_precision`, which turns ``"auto"`` / None into what runs.

It sits in ``core`` so that loops below ``training`` (word2vec in ``models``) can use it.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional

import numpy as np
import torch

from .checkpoint import read_pickled_state, read_weights, save_weights
from .device import autocast, resolve_device, set_seed
from .diskspace import tensor_bytes
from .durable import atomic_write, recover_folder, remove_debris, verify_manifest, write_folder
from .errors import MissingFileError, UserError

__all__ = ["capture_rng", "restore_rng", "Checkpoint", "save_checkpoint", "load_checkpoint", "resume_checkpoint", "keep_last", "tidy_run_folder",
           "intact_note", "diverged", "save_final", "BackgroundSaver", "HostSnapshot",
           "LossBuffer", "resolve_precision",
           "resolve_device", "autocast", "set_seed", "MODEL_FILE", "OPTIMIZER_FILE", "STATE_FILE"]

MODEL_FILE, OPTIMIZER_FILE, STATE_FILE = "model.safetensors", "optimizer.pt", "trainer_state.json"


def capture_rng(generators: Optional[Mapping[str, np.random.Generator]] = None) -> dict:
    """The state of every global generator, and of the named NumPy ``generators``.

    Returns:
        ``{"python", "numpy", "torch"[, "cuda"][, "generators"]}``: lists, ints and tensors
        only (``weights_only`` loading accepts them).
    """
    np_state = np.random.get_state()
    state = {"python": random.getstate(), "numpy": [np_state[1].tolist()] + list(np_state[2:]), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if generators:
        state["generators"] = {name: json.dumps(g.bit_generator.state) for name, g in generators.items()}
    return state


def restore_rng(state: Mapping, generators: Optional[Mapping[str, np.random.Generator]] = None) -> None:
    """Put back what :func:`capture_rng` captured; generators missing from ``state`` (an
    older checkpoint that saved fewer) are left as they are.

    Raises:
        UserError: a named NumPy generator that ``state`` does not hold.
    """
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state(("MT19937", np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for name, g in (generators or {}).items():
        saved = state.get("generators", {})
        if name not in saved:
            raise UserError(f"the checkpoint holds no state for the random generator {name!r}")
        g.bit_generator.state = json.loads(saved[name])


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` read: the folder, the model's and optimiser's state
    dicts, the loop's JSON state, and the other entries of ``optimizer.pt`` (``rng``, a
    scheduler, a collator, ...)."""

    folder: Path
    model_state: Dict[str, torch.Tensor]
    optimizer_state: Optional[dict]
    trainer_state: dict
    extra: dict = field(default_factory=dict)

    @property
    def rng(self) -> Optional[dict]:
        return self.extra.get("rng")


def save_checkpoint(folder: os.PathLike, *, model_state: Mapping[str, torch.Tensor], optimizer_state: Optional[dict],
                    trainer_state: dict, extra: Optional[dict] = None, rng: bool = True,
                    retire: Optional[Callable[[Path], None]] = None) -> Path:
    """Write a resumable checkpoint folder as a unit (at every instant one complete copy exists).

    Args:
        folder: e.g. ``RUN/checkpoint``.
        model_state: weights (``model.safetensors``; tied tensors must be dropped by the caller).
        optimizer_state: the optimiser's ``state_dict()``.
        trainer_state: the loop's position, losses, ... (``trainer_state.json``).
        extra: further tensors / plain values for ``optimizer.pt`` (scheduler, collator, ...).
        rng: also store :func:`capture_rng` (``extra["rng"]``, unless ``extra`` has one).
        retire: what to do with the previous copy (:func:`~ctxkit.core.durable.write_folder`).
    """
    folder = Path(folder)
    blob = {"optimizer": optimizer_state, **({"rng": capture_rng()} if rng else {}), **(extra or {})}
    text = json.dumps(trainer_state, indent=2)

    def write(new: Path) -> None:
        save_weights(model_state, new / MODEL_FILE)
        atomic_write(new / OPTIMIZER_FILE, lambda tmp: torch.save(blob, tmp))
        atomic_write(new / STATE_FILE, lambda tmp: Path(tmp).write_text(text))

    # The sizes are known before anything is written: a save that cannot fit is refused at once.
    return write_folder(folder, write, retire=retire, needed=tensor_bytes(model_state, blob) + len(text),
                        intact=lambda: intact_note(folder))


class HostSnapshot:
    """Copies of a (nested) state's tensors in host memory, reused from one save to the next.

    A checkpoint written on a thread must not read the live tensors, which the next
    optimiser steps change: :meth:`take` copies every tensor of a ``dict``/``list`` tree
    into a host buffer of the same shape (pinned for a GPU's asynchronous copies, kept for
    the next save, as pinning ~1 GB costs more than the copy), waits for the copies, and
    returns the same tree over the copies. Two snapshots from one instance share buffers:
    take the next one only after the previous was written.
    """

    def __init__(self):
        self._buffers: Dict[tuple, torch.Tensor] = {}

    def take(self, tree):
        copied = self._copy(tree, ())
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return copied

    def _copy(self, value, path: tuple):
        if isinstance(value, torch.Tensor):
            value = value.detach()
            buffer = self._buffers.get(path)
            if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
                buffer = torch.empty(value.shape, dtype=value.dtype, pin_memory=value.is_cuda)
                self._buffers[path] = buffer
            return buffer.copy_(value, non_blocking=value.is_cuda)
        if isinstance(value, dict):
            return {k: self._copy(v, path + (k,)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._copy(v, path + (i,)) for i, v in enumerate(value))
        return copy.deepcopy(value)


class BackgroundSaver:
    """One checkpoint write at a time on a thread, its error raised in the training thread.

    :meth:`submit` waits for the previous write first (so at most one is in flight and the
    snapshot buffers are free again); :meth:`wait` joins it and raises what it raised (e.g.
    the one-line full-disk :class:`UserError`). The write itself is the durable
    :func:`save_checkpoint`: a crash mid-write leaves the previous checkpoint, as before.
    """

    def __init__(self):
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def submit(self, write: Callable[[], object]) -> None:
        self.wait()

        def run():
            try:
                write()
            except BaseException as err:  # noqa: BLE001 - handed to the training thread by wait()
                self._error = err

        self._thread = threading.Thread(target=run, name="ctxkit-checkpoint", daemon=True)
        self._thread.start()

    def wait_quietly(self) -> None:
        """:meth:`wait`, its error logged instead of raised (an error is already on its way up)."""
        try:
            self.wait()
        except BaseException as err:  # noqa: BLE001 - the first error is the one to report
            logging.getLogger("ctxkit").warning("a checkpoint written in the background failed too: %s", err)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def save_final(out_dir: os.PathLike, write: Callable[[Path], object], weights: Mapping[str, torch.Tensor]) -> Path:
    """``RUN/final`` (a pretraining run's model) filled by ``write(folder)`` and replaced as a
    unit, like ``best/``: refused before it starts when ``weights`` cannot fit on the disk, and
    a disk that fills up leaves no partial folder and one line naming the checkpoint to resume
    from (:func:`intact_note`)."""
    final = Path(out_dir) / "final"
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return final  # under torchrun rank 0 alone writes: two ranks swapping the same folder in would collide
    return write_folder(final, write, needed=tensor_bytes(weights), intact=lambda: intact_note(Path(out_dir) / "checkpoint", final))


def diverged(loss: float, step: int, lr: float, checkpoint: os.PathLike) -> UserError:
    """The one-line error for a training loss that is no longer finite (raise it before a
    checkpoint would keep the broken weights): which step, what survives, what to change."""
    return UserError(f"the training loss is {loss} at step {step}: training diverged; {intact_note(checkpoint)}. "
                     f"Start again with a lower --lr (the peak was {lr:g}) or a longer --warmup-ratio "
                     f"(or --resume --allow-changes --lr ...)")


def intact_note(checkpoint: os.PathLike, writing: Optional[os.PathLike] = None) -> str:
    """What a save that failed (a full disk) left as it was, for the one-line error.

    Args:
        checkpoint: the run's checkpoint folder (``RUN/checkpoint``).
        writing: the folder that failed when it was not the checkpoint (``RUN/best``,
            ``RUN/final``): its previous copy is named too.

    Returns:
        e.g. ``"the last checkpoint (step 40) is intact"``, ``"the previous best/ and the last
        checkpoint (step 40) are intact"``, or ``"no earlier checkpoint exists"``.
    """
    kept = [f"the previous {Path(writing).name}/"] if writing is not None and Path(writing).is_dir() else []
    state = Path(checkpoint) / STATE_FILE
    if state.is_file():
        try:
            step = f" (step {int(json.loads(state.read_text())['step'])})"
        except (OSError, ValueError, KeyError, TypeError):  # a loop whose state has no step (word2vec)
            step = ""
        kept.append(f"the last checkpoint{step}")
    if not kept:
        return "no earlier checkpoint exists"
    return " and ".join(kept) + (" are intact" if len(kept) > 1 else " is intact")


def has_checkpoint(folder: os.PathLike) -> bool:
    """Whether ``folder`` (a run's ``checkpoint/``) holds a complete checkpoint, after putting
    back a copy a crash left aside."""
    found = recover_folder(Path(folder))
    return found is not None and (found / STATE_FILE).is_file()


def load_checkpoint(folder: os.PathLike) -> Checkpoint:
    """Read what :func:`save_checkpoint` wrote, after putting back a copy a crash left aside.

    Raises:
        MissingFileError: no checkpoint (``"RUN: no checkpoint to resume from"``).
        IncompleteFolderError: files that differ from the folder's manifest.
        CheckpointError: an optimiser file refused for safety, or damaged.
    """
    folder = Path(folder)
    found = recover_folder(folder)
    if found is None or not (found / STATE_FILE).is_file():
        raise MissingFileError(f"{folder.parent}: no checkpoint to resume from")
    verify_manifest(found)
    trainer_state = json.loads((found / STATE_FILE).read_text())
    model_state = read_weights(found)
    extra = dict(read_pickled_state(found / OPTIMIZER_FILE))
    optimizer_state = extra.pop("optimizer", None)
    return Checkpoint(found, model_state, optimizer_state, trainer_state, extra)


def resume_checkpoint(out: os.PathLike, legacy: Callable[[dict], tuple]) -> Checkpoint:
    """The checkpoint of run folder ``out`` for ``--resume``: ``out/checkpoint/``, or the
    single ``checkpoint.pt`` earlier versions of a loop wrote (``legacy(blob)`` splits it into
    ``(trainer_state, extra)``); then removes what a crashed save left beside it."""
    out = Path(out)
    old = out / "checkpoint.pt"
    if not (out / "checkpoint").exists() and old.is_file():
        blob = read_pickled_state(old, what="a training checkpoint")
        return Checkpoint(old, blob["model"], blob["optimizer"], *legacy(blob))
    ckpt = load_checkpoint(out / "checkpoint")  # no checkpoint: "OUT: no checkpoint to resume from"
    remove_debris(out, names=("checkpoint",))
    return ckpt


def keep_last(run_dir: os.PathLike, n: int) -> Callable[[Path], None]:
    """A ``retire`` for :func:`save_checkpoint`: with ``n`` > 1 the previous checkpoint becomes
    ``checkpoint-step{N}`` and the oldest beyond ``n - 1`` of those are deleted; else it is deleted."""
    run_dir = Path(run_dir)

    def retire(old: Path) -> None:
        if n > 1 and (old / STATE_FILE).is_file():
            archived = run_dir / f"checkpoint-step{json.loads((old / STATE_FILE).read_text())['step']}"
            shutil.rmtree(archived, ignore_errors=True)
            os.replace(old, archived)
            kept = sorted(run_dir.glob("checkpoint-step*"), key=lambda p: int(p.name[len("checkpoint-step"):]))
            for stale in kept[: max(0, len(kept) - (n - 1))]:
                shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)

    return retire


def tidy_run_folder(run_dir: os.PathLike, names=("checkpoint", "best")) -> list:
    """At (re)start: a complete copy of each folder back in place after a crash, then the
    debris of crashed writes removed (returned)."""
    for name in names:
        recover_folder(Path(run_dir) / name)
    return remove_debris(run_dir, names)


class LossBuffer:
    """Per-step loss tensors held on the device until the loop needs them as numbers.

    Reading a loss with ``.item()`` makes the host wait for the device, and doing that at
    every step stalls the pipeline of queued kernels. A loop appends each step's loss here
    and calls :meth:`flush_into` only where it needs the numbers (a log line, before a
    checkpoint), which waits once for all of them.

    Example::

        pending = LossBuffer()
        for step, batch in enumerate(batches, 1):
            pending.append(train_step(batch))
            if step % log_every == 0:
                pending.flush_into(run["losses"])
    """

    def __init__(self) -> None:
        self._pending: List[torch.Tensor] = []

    def append(self, loss: torch.Tensor) -> None:
        """Keep one step's scalar loss (detached, so that its graph can be freed)."""
        self._pending.append(loss.detach())

    def flush_into(self, losses: List[float]) -> None:
        """Move the losses held so far, in order, to the end of ``losses`` as Python floats
        (through float32, whatever the loss dtype); nothing happens when none are held.

        Args:
            losses: the run's list of recorded losses (a checkpoint saves it).
        """
        if self._pending:
            losses.extend(torch.stack(self._pending).float().tolist())
            self._pending.clear()


def resolve_precision(precision: Optional[str], device: torch.device) -> str:
    """``"bf16"`` or ``"fp32"``: what runs for ``precision`` on ``device`` (``"auto"`` or
    None: bf16 on CUDA, fp32 elsewhere).

    Raises:
        UserError: anything but ``"auto"``, None, ``"bf16"`` or ``"fp32"``.
    """
    if precision in (None, "auto"):
        return "bf16" if device.type == "cuda" else "fp32"
    if precision not in ("bf16", "fp32"):
        raise UserError(f"precision must be 'fp32', 'bf16' or 'auto', got {precision!r}")
    return precision
