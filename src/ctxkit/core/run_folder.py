"""A run folder belongs to one training command at a time, and its log goes on after a resume.

* :func:`hold_run_folder`: an exclusive lock on a run folder (``RUN/.lock``) for as long as a
  training command runs. It is an ``flock`` on an open file, so the operating system releases
  it when the process ends, however it ends (``kill -9`` included); a lock file left by a
  killed run is simply taken over. The file says who holds it (pid, host, command, start
  time), so that a second command into the same folder is refused in one line naming the
  first (:class:`RunFolderBusyError`) before it reads or writes anything. A process may take
  the same lock again while it holds it (the command line and the trainer under it both do).
  Without ``fcntl`` (Windows) ``msvcrt`` locks a byte of the file instead; where neither
  works (a file system without locks) the run goes on unlocked, with a warning.
* :func:`trim_log`: on resume, the records of ``log.jsonl`` after the checkpoint's step are
  dropped (the resumed run logs those steps again), so that each step appears once.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from .durable import atomic_write
from .errors import UserError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
try:
    import msvcrt
except ImportError:  # everything but Windows
    msvcrt = None

__all__ = ["LOCK_NAME", "RunFolderBusyError", "hold_run_folder", "lock_file", "trim_log"]

logger = logging.getLogger("ctxkit")

LOCK_NAME = ".lock"
# msvcrt locks byte ranges and a locked range cannot be read by others: the lock is on a byte
# far past the holder's description, which stays readable.
_WINDOWS_BYTE = 1 << 30


class RunFolderBusyError(UserError):
    """Another process holds the run folder's lock."""


class _Held:
    """A lock this process holds: its file descriptor and how many holders share it."""

    def __init__(self, fd: Optional[int], path: Path, made: Optional[Path]):
        self.fd, self.path, self.made, self.count = fd, path, made, 1


# Locks held by this process, by lock file and pid: a forked child does not hold its parent's.
_held: Dict[tuple, _Held] = {}


def lock_file(folder: os.PathLike, beside: bool = False) -> Path:
    """The lock file of ``folder``: ``FOLDER/.lock``, or ``.FOLDER.lock`` beside it for a folder
    that is replaced whole (a checkpoint folder given as the run folder, as ``word2vec-train
    --checkpoint DIR`` does), where a file inside would be swapped away with the old copy."""
    folder = Path(folder)
    return folder.parent / f".{folder.name}.lock" if beside else folder / LOCK_NAME


def _make_dirs(folder: Path) -> Optional[Path]:
    """``mkdir -p folder``; returns the topmost folder it created (None: it existed)."""
    top = None
    for parent in [folder, *folder.parents]:
        if parent.exists():
            break
        top = parent
    folder.mkdir(parents=True, exist_ok=True)
    return top


def _remove_made(folder: Path, top: Optional[Path]) -> None:
    """Remove the folders :func:`_make_dirs` created, up to ``top``, where they stayed empty."""
    if top is None:
        return
    for path in [folder, *folder.parents]:
        try:
            path.rmdir()
        except OSError:  # not empty: something was written there
            return
        if path == top:
            return


def _try_lock(fd: int) -> bool:
    """Lock ``fd`` without waiting; False when another process holds it.

    Raises:
        OSError: the platform or the file system has no locks.
    """
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True
    if msvcrt is not None:
        os.lseek(fd, _WINDOWS_BYTE, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    raise OSError(errno.ENOTSUP, "no file locks on this platform")


def _holder(path: Path) -> dict:
    """What the holder wrote into the lock file; it writes just after locking, so an empty
    file is read again a few times."""
    for _ in range(10):
        try:
            text = path.read_text(encoding="utf-8", errors="replace").strip("\0 \n")
            if text:
                return json.loads(text)
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return {}


def _clock(started: float) -> str:
    when = datetime.datetime.fromtimestamp(started)
    return when.strftime("%H:%M:%S" if when.date() == datetime.date.today() else "%Y-%m-%d %H:%M:%S")


def _busy(folder: Path, info: dict, option: str) -> RunFolderBusyError:
    who = f"pid {info['pid']}" if info.get("pid") else "another process"
    if info.get("host") and info["host"] != socket.gethostname():
        who += f" on {info['host']}"
    about = []
    if info.get("command"):
        command = " ".join(str(info["command"]).split())
        about.append(command if len(command) <= 60 else command[:57] + "...")
    if isinstance(info.get("started"), (int, float)):
        about.append("started " + _clock(info["started"]))
    return RunFolderBusyError(f"run folder {folder} is in use by {who}" + (f" ({', '.join(about)})" if about else "")
                              + f"; wait for it or pick another {option}")


def _acquire(path: Path, folder: Path, command: Optional[str], option: str) -> Optional[int]:
    """Open and lock ``path``, then write who holds it; None where locks do not work."""
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            locked = _try_lock(fd)
        except OSError as err:
            os.close(fd)
            logger.warning("%s cannot be locked here (%s): a second command into it would not be refused",
                           folder, err.strerror or err)
            return None
        if not locked:
            os.close(fd)
            raise _busy(folder, _holder(path), option)
        try:  # the holder before us may have removed the file as we opened it: lock the one that is there
            same = fcntl is None or os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "started": time.time()}
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(info) + "\n").encode("utf-8"))
            return fd
        os.close(fd)
    raise _busy(folder, _holder(path), option)


def _release(held: _Held) -> None:
    if held.fd is not None:
        if fcntl is not None:
            # Removed while still locked: a process that opens the path from now on makes a new
            # file and locks that one; one that opened the old file sees it gone and retries.
            with contextlib.suppress(OSError):
                if os.fstat(held.fd).st_ino == os.stat(held.path).st_ino:
                    held.path.unlink()
            os.close(held.fd)
        else:  # Windows removes no open file
            with contextlib.suppress(OSError):
                os.lseek(held.fd, _WINDOWS_BYTE, os.SEEK_SET)
                msvcrt.locking(held.fd, msvcrt.LK_UNLCK, 1)
            os.close(held.fd)
            with contextlib.suppress(OSError):
                held.path.unlink()
    _remove_made(held.path.parent, held.made)


@contextlib.contextmanager
def hold_run_folder(folder: os.PathLike, command: Optional[str] = None, option: str = "--out", beside: bool = False,
                    enabled: bool = True) -> Iterator[Optional[Path]]:
    """Hold the lock of run folder ``folder`` while the ``with`` block runs.

    The folder is created if needed (and removed again at the end if nothing was written
    into it); the lock file goes at the end too, and the lock with the process in any case.

    Args:
        folder: the run folder.
        command: the command line, for the message a second command gets (default: this
            process's ``sys.argv``).
        option: the option that named the folder, for that message (``--out``).
        beside: the lock file goes beside the folder (:func:`lock_file`).
        enabled: False: no lock (under torchrun every rank but rank 0, whose lock covers the run).

    Yields:
        The lock file, or None when nothing is locked.

    Raises:
        RunFolderBusyError: another process holds the folder: ``run folder R is in use by pid
            N (COMMAND, started HH:MM:SS); wait for it or pick another --out``.
    """
    if not enabled:
        yield None
        return
    folder = Path(folder)
    path = lock_file(folder, beside)
    key = (os.path.realpath(path), os.getpid())
    held = _held.get(key)
    if held is not None:  # this process holds it already (the CLI, then the trainer under it)
        held.count += 1
    else:
        made = _make_dirs(path.parent)
        try:
            fd = _acquire(path, folder, command if command is not None else _argv(), option)
        except BaseException:
            _remove_made(path.parent, made)
            raise
        held = _held[key] = _Held(fd, path, made)
    try:
        yield path if held.fd is not None else None
    finally:
        held.count -= 1
        if held.count == 0:
            del _held[key]
            _release(held)


def _argv() -> str:
    """This process's command line, as a person would type it."""
    return " ".join(["ctxkit" if sys.argv[0].endswith(("ctxkit", "__main__.py")) else os.path.basename(sys.argv[0]),
                     *sys.argv[1:]])


def _step_of(record) -> Optional[int]:
    """The step a log record belongs to: ``step`` (training and evaluation records), ``steps``
    (the Trainer's end record) or the ``step`` of a plain log's ``{"eval": {...}}``."""
    if not isinstance(record, dict):
        return None
    inner = record.get("eval")
    for value in (record.get("step"), record.get("steps"), inner.get("step") if isinstance(inner, dict) else None):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def trim_log(path: os.PathLike, step: int) -> int:
    """Before a resumed run from a checkpoint at ``step`` appends to its ``log.jsonl``: drop
    the records of later steps (the interrupted run logged them after its last checkpoint and
    the resumed run logs them again) and a last line cut short by a kill. The file is
    rewritten whole (:func:`~ctxkit.core.durable.atomic_write`), and only when something goes.

    Returns:
        The number of lines dropped.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, UnicodeDecodeError):  # nothing logged yet, or not a log this can read
        return 0
    kept: List[str] = []
    dropped = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            later = (_step_of(json.loads(line)) or 0) > step
        except ValueError:  # half a record: the process was killed while writing it
            later = True
        if later:
            dropped += 1
        else:
            kept.append(line + "\n")
    if dropped or (text and not text.endswith("\n")):
        atomic_write(path, lambda tmp: Path(tmp).write_text("".join(kept), encoding="utf-8"))
    return dropped
