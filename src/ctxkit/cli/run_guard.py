"""What :func:`ctxkit.cli.main` does around every training verb (issue 44 items 2 and 6).

* **One command per run folder.** The folder is locked (:func:`ctxkit.core.run_folder.hold_run_folder`)
  before the verb reads or writes anything, for as long as it runs; a second command into
  it ends at once in one line naming the first, exit 2, and leaves the folder as it was.
  Under torchrun, rank 0 alone holds the lock (``RANK``): it covers the whole run.
* **--resume keeps its promise.** A verb with ``--resume`` records its settings in
  ``RUN/settings.json`` (the options as parsed; the input files by name, size and, for small
  files, content). ``--resume`` from a checkpoint compares them with the new ones: a change
  that exact resume cannot follow (batch size, data, learning rate and schedule, seed,
  model, lengths, ...) is refused in one line listing each change, old -> new, unless
  ``--allow-changes`` is given; then a note says so and the change is added to the record's
  ``history``. What does not change the computation may differ: :data:`MAY_CHANGE`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Dict, Iterator, Optional

from ..core.durable import atomic_write
from ..core.errors import UserError
from ..core.run_folder import hold_run_folder
from ..training import TrainConfig

__all__ = ["RUN_FOLDER_OPTION", "MAY_CHANGE", "DATA_OPTIONS", "SETTINGS_FILE", "guard"]

#: every training verb and the option that names its run folder
RUN_FOLDER_OPTION: Dict[str, str] = {
    "finetune": "out", "distill": "out", "pretrain": "out", "distill-pretrain": "out", "lm-train": "out",
    "translate-train": "out", "pretrain-xlnet": "out", "pretrain-elmo": "out", "train-transformer-xl": "out",
    "word2vec-train": "checkpoint",  # --out is the vectors file; the folder that resumes is --checkpoint
}

#: settings a resumed run may change: when and how long it runs, where it runs, what it
#: logs, and what is scored after training; a loop may still refuse one it depends on
#: (train-transformer-xl's schedule spans --max-steps)
MAY_CHANGE = frozenset({
    "max_minutes", "max_steps", "max_time_s", "stop_step", "save_every", "eval_every", "keep_last",
    "log_every", "log_to", "log_dir", "progress", "no_progress", "peak_tflops", "on_sigterm",
    "device", "data_workers", "threads", "fast", "compile", "legacy_compile", "legacy_activation_checkpointing",
    "legacy_bf16_residual", "legacy_grad_reduce_dtype", "legacy_overlap_grad_reduce",
    "eval_batch_size", "test", "eval_mem_lens", "eval_clamp_len", "allow_unknown_tags",
})

#: options that name input files or folders: compared by what they hold, not by how they are spelled
DATA_OPTIONS = frozenset({"data", "eval_data", "train", "valid", "corpus", "train_src", "train_tgt", "valid_src", "valid_tgt",
                          "transfer_data", "tokenizer"})

SETTINGS_FILE = "settings.json"
NOT_SETTINGS = frozenset({"func", "verb", "command_line", "resume", "allow_changes"})
_SMALL = 1 << 20  # files up to 1 MiB count with their contents (meta.json, a task's CSV files) ...
_HASHED = 32 << 20  # ... up to 32 MiB in all; larger inputs by their files' names and sizes
_MAX_FILES = 10_000
_TRAIN_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def _rank() -> int:
    """This process's rank under torchrun (its ``RANK``), 0 otherwise."""
    try:
        return int(os.environ.get("RANK", "0") or 0)
    except ValueError:
        return 0


def _fingerprint(value) -> Optional[str]:
    """SHA-256 of the files an input option names (their names relative to it, sizes, and
    small regular files' contents); None when one is missing (then the spelling is compared).
    Pipes and devices count by name only: nothing is read from them."""
    digest = hashlib.sha256()
    budget, count = _HASHED, 0
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, str) or not os.path.exists(item):
            return None
        root = Path(item)
        files = [root] if not root.is_dir() else sorted(Path(d) / f for d, _, names in os.walk(root) for f in names)
        for path in files:
            count += 1
            if count > _MAX_FILES:
                break
            st = path.stat()
            name = path.name if path == root else path.relative_to(root).as_posix()
            size = st.st_size if stat.S_ISREG(st.st_mode) else -1
            digest.update(f"{name}\0{size}\0".encode("utf-8", "surrogateescape"))
            if 0 <= size <= min(_SMALL, budget):
                budget -= size
                digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _settings(args: argparse.Namespace, folder_dest: str) -> dict:
    """The parsed options that make the run what it is, as JSON values; a training flag left
    unset (finetune defers its defaults to TrainConfig) counts as its default."""
    values = {}
    for name, value in sorted(vars(args).items()):
        if name in NOT_SETTINGS or name == folder_dest or callable(value):
            continue
        if value is None and name in _TRAIN_FIELDS:
            value = _TRAIN_FIELDS[name].default
        values[name] = json.loads(json.dumps(value, default=str))
    return values


def _flags(parser: Optional[argparse.ArgumentParser], verb: str) -> Dict[str, str]:
    """``dest -> --option`` of the verb's parser (positionals by their metavar)."""
    names: Dict[str, str] = {}
    sub = next((a for a in (parser._actions if parser else ()) if isinstance(a, argparse._SubParsersAction)), None)
    for action in sub.choices[verb]._actions if sub is not None and verb in sub.choices else ():
        longs = [o for o in action.option_strings if o.startswith("--")]
        names[action.dest] = longs[0] if longs else (action.option_strings or [action.metavar or action.dest.upper()])[0]
    return names


def _show(value) -> str:
    if value is None:
        return "unset"
    if isinstance(value, list):
        return " ".join(map(str, value)) or "none"
    return str(value)


def _changes(old: dict, settings: dict, data: dict, verb: str) -> Dict[str, list]:
    """``{option: [old, new]}`` for each recorded setting that differs and may not."""
    changes: Dict[str, list] = {}
    if old.get("verb") not in (None, verb):
        changes["verb"] = [old["verb"], verb]
    before, before_data = old.get("settings") or {}, old.get("data") or {}
    for name, value in settings.items():
        if name in MAY_CHANGE or name not in before:  # a setting the record does not know: an older version's
            continue
        if before_data.get(name) and data.get(name):  # the same files under another path are the same data
            if before_data[name] != data[name]:
                changes[name] = [before[name], value] if before[name] != value else [before[name], "(its files changed)"]
        elif before[name] != value:
            changes[name] = [before[name], value]
    return changes


def _describe(changes: Dict[str, list], flags: Dict[str, str]) -> str:
    parts = []
    for name, (old, new) in changes.items():
        flag = flags.get(name, "--" + name.replace("_", "-"))
        parts.append(f"{flag} {_show(old)} {new}" if new == "(its files changed)" else f"{flag} {_show(old)} -> {_show(new)}")
    return ", ".join(parts)


def _has_checkpoint(folder: Path) -> bool:
    """Whether ``--resume`` has a checkpoint to continue from (or one a crash left aside):
    only then do the recorded settings bind the new command."""
    return ((folder / "checkpoint").is_dir() or (folder / ".checkpoint.old").is_dir() or (folder / "checkpoint.pt").is_file()
            or any(folder.glob(".checkpoint.new-*")))


def _checkpoint_stamp(folder: Path) -> tuple:
    """Changes whenever a checkpoint is written (each is swapped in whole: a new file)."""
    stamps = []
    for path in (folder / "checkpoint" / "trainer_state.json", folder / "checkpoint.pt"):
        try:
            st = path.stat()
            stamps.append((st.st_ino, st.st_mtime_ns))
        except OSError:
            stamps.append(None)
    return tuple(stamps)


def _legacy_record(folder: Path) -> Optional[dict]:
    """The training settings a run folder of an earlier version recorded: TrainConfig in
    ``task.json`` (finetune, distill) or in the first record of ``log.jsonl`` (the Trainer's
    start record); None when neither holds them."""
    try:
        config = json.loads((folder / "task.json").read_text(encoding="utf-8")).get("config")
    except (OSError, ValueError, AttributeError):
        config = None
    if not isinstance(config, dict):
        try:
            with open(folder / "log.jsonl", encoding="utf-8") as f:
                config = json.loads(f.readline()).get("config")
        except (OSError, ValueError, AttributeError):
            config = None
    if not isinstance(config, dict):
        return None
    return {"settings": {k: v for k, v in config.items() if k in _TRAIN_FIELDS}}


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _write(path: Path, text: Optional[str]) -> None:
    if text is None:
        path.unlink(missing_ok=True)
    else:
        atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


@contextlib.contextmanager
def guard(args: argparse.Namespace, parser: Optional[argparse.ArgumentParser] = None) -> Iterator[None]:
    """Run a verb inside: a training verb's run folder locked and, for a verb with
    ``--resume``, its settings checked against the record and recorded (see the module doc).

    Raises:
        RunFolderBusyError: another command holds the run folder.
        UserError: ``--resume`` with settings that differ from the recorded ones, without
            ``--allow-changes``; nothing in the folder was touched.
    """
    verb = getattr(args, "verb", None)
    dest = RUN_FOLDER_OPTION.get(verb)
    if dest is None or getattr(args, dest, None) is None:
        yield
        return
    folder = Path(getattr(args, dest))
    rank0 = _rank() == 0
    command = getattr(args, "command_line", None)
    with hold_run_folder(folder, command, option="--" + dest.replace("_", "-"), beside=dest == "checkpoint", enabled=rank0):
        if not hasattr(args, "allow_changes"):  # no --resume: nothing to keep
            yield
            return
        path = folder / SETTINGS_FILE
        previous = _read(path)
        try:
            old = json.loads(previous) if previous else None
        except ValueError:
            old = None
        settings = _settings(args, dest)
        data = {name: _fingerprint(settings[name]) for name in sorted(DATA_OPTIONS & settings.keys())}
        history = []
        if args.resume and _has_checkpoint(folder):
            recorded = old if isinstance(old, dict) else _legacy_record(folder)
            changes = _changes(recorded, settings, data, verb) if recorded else {}
            said = _describe(changes, _flags(parser, verb))
            if changes and not args.allow_changes:
                raise UserError(f"--resume would change what the checkpoint in {folder} was trained with: {said}; resume with "
                                f"the recorded settings ({path}), or add --allow-changes to resume with these anyway")
            history = list((old or {}).get("history") or []) if isinstance(old, dict) else []
            if changes:
                history.append({"time": datetime.datetime.now().isoformat(timespec="seconds"), "command": command,
                                "changes": changes})
                if rank0:
                    print(f"ctxkit: note: resuming with changed settings (--allow-changes): {said}; recorded in {path}",
                          file=sys.stderr)
        record = {"verb": verb, "command": command, "settings": settings, "data": data, "history": history}
        stamp = _checkpoint_stamp(folder)
        if rank0:
            _write(path, json.dumps(record, indent=2) + "\n")
        try:
            yield
        except BaseException:
            # Failed before a new checkpoint: the checkpoint there is still the recorded one's.
            if rank0 and _checkpoint_stamp(folder) == stamp:
                _write(path, previous)
            raise
