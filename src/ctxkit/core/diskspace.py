"""Running out of disk space while writing: refused early where that is cheap, reported in one line.

A save that meets a full disk (or a full quota) must lose nothing: the durable writers
(:mod:`ctxkit.core.durable`) rename only complete files and folders into place and delete
their partial ones, so what was saved before stays as it was. What is left is to say so
plainly instead of a traceback:

    no space left on device writing RUN/checkpoint (needs ~N MB, M MB free); the last checkpoint (step S) is intact

* :func:`check_free_space` refuses a write before it starts when the bytes it needs (the
  tensors' sizes, known without writing anything) exceed the free space of the file system.
* :func:`write_output` does both for a command's output on stdout redirected to a file.
* :func:`reporting_disk_full` turns whatever a writer raises on a full disk into that one
  line, a :class:`DiskFullError`. The writers do not agree on how they say it: Python's own
  files raise ``OSError(ENOSPC)``, safetensors a ``SafetensorError`` whose text holds
  ``No space left on device (os error 28)``, and ``torch.save``'s zip writer a
  ``RuntimeError`` that drops the errno: ``unexpected pos 704 vs 598`` (a short write) or
  ``basic_ios::clear: iostream error`` (its stream failing at the end of the file).
  :func:`is_out_of_space` recognises each.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Callable, Iterator, Optional, TextIO, Tuple, Union

from .errors import UserError

__all__ = ["DiskFullError", "is_out_of_space", "free_bytes", "tensor_bytes", "check_free_space", "reporting_disk_full",
           "unchanged_note", "write_output"]

#: errnos of a full disk and of a full quota (the user's share of the disk)
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)
# How writers that hide the errno word it: strerror (Python, pip's stderr), Rust's io::Error
# (safetensors: "No space left on device (os error 28)").
_TEXTS = ("no space left on device", "disk quota exceeded", "os error 28", f"os error {errno.EDQUOT}")
# torch.save (PyTorchFileWriter): a short write, and its std::ofstream failing when the file ends.
_TORCH_WRITER_TEXTS = ("unexpected pos", "basic_ios::clear: iostream error")
# Headers and JSON beside the tensor bytes: safetensors' header, torch's zip records (a few
# hundred bytes each, data aligned to 64), trainer_state.json, config files.
_PER_TENSOR, _PER_SAVE = 512, 1 << 16

Intact = Union[str, Callable[[], str], None]


def _mb(n: int, up: bool) -> str:
    """Megabytes (10^6 bytes) for the message: tenths below 10 MB (a small model's checkpoint,
    the little space left), whole ones above; rounded up for what is needed, down for what is free."""
    tenths = math.ceil(n / 1e5) if up else math.floor(n / 1e5)
    return f"{tenths / 10:.1f}" if tenths < 100 else str(math.ceil(n / 1e6) if up else n // 10**6)


class DiskFullError(UserError, OSError):
    """A write ran out of disk space (or quota); the message says what is still intact.

    Also an ``OSError`` with ``errno`` ENOSPC, so ``except OSError`` keeps catching it.

    Attributes:
        target: the file or folder that was being written.
        needed: the bytes the write needs (an estimate), or None when not known.
        free: the bytes free on its file system (:func:`free_bytes`) when the error was
            raised, or None when not known (the message then leaves it out).
        intact: what the failed write left as it was, e.g. ``"the last checkpoint (step 40) is intact"``.
    """

    def __init__(self, target: Union[str, os.PathLike], needed: Optional[int] = None, free: Optional[int] = None,
                 intact: Optional[str] = None):
        self.target, self.needed, self.free, self.intact = str(target), needed, free, intact
        space = ([f"needs ~{_mb(needed, up=True)} MB"] if needed is not None else []) + (
            [f"{_mb(self.free, up=False)} MB free"] if self.free is not None else [])
        super().__init__(f"no space left on device writing {self.target}" + (f" ({', '.join(space)})" if space else "")
                         + (f"; {intact}" if intact else ""))
        self.errno = errno.ENOSPC

    def __str__(self) -> str:  # OSError would format "[Errno 28] ..." from its own fields
        return str(self.args[0])


def is_out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) says the disk or the quota is full."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFullError) or (isinstance(exc, OSError) and exc.errno in OUT_OF_SPACE):
            return True
        # A UserError's text is a message about the user's input, which may quote anything.
        if not isinstance(exc, UserError):
            text = str(exc).lower()
            if any(t in text for t in _TEXTS):
                return True
            if isinstance(exc, RuntimeError) and any(t in text for t in _TORCH_WRITER_TEXTS):
                # torch.save's writer reports a failed write without its errno; a write to a
                # local file fails for want of space in practice (the message shows the free space).
                return True
        exc = exc.__cause__ or exc.__context__
    return False


def free_bytes(path: Union[str, os.PathLike]) -> Optional[int]:
    """Bytes free for this user on the file system that holds ``path`` (or would: its nearest
    existing folder is measured); None when the file system does not say."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def tensor_bytes(*objs) -> int:
    """The bytes a save of ``objs`` (state dicts, optimiser states: tensors in nested dicts,
    lists and tuples) needs: the tensors' sizes, each tensor counted once, plus headers.
    No tensor is copied or moved, so this is cheap enough to call before every save."""
    import torch  # lazy: what reports a full disk must not make `import ctxkit.core` load torch

    seen, total, count = set(), 0, 0
    stack = list(objs)
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            key = (obj.device, obj.data_ptr(), obj.nbytes)
            if key not in seen:
                seen.add(key)
                total, count = total + obj.nbytes, count + 1
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return total + count * _PER_TENSOR + _PER_SAVE


def unchanged_note(path: Union[str, os.PathLike], kind: str = "file") -> str:
    """What a failed write of ``path`` leaves once its partial copy is deleted, for the
    message: ``"the previous file is intact"``, or ``"no partial file is left"`` when there
    was none. Call it before writing."""
    return f"the previous {kind} is intact" if Path(path).exists() else f"no partial {kind} is left"


def _resolve(intact: Intact) -> Optional[str]:
    return intact() if callable(intact) else intact


def check_free_space(target: Union[str, os.PathLike], needed: int, intact: Intact = None) -> None:
    """Refuse a write of ``needed`` bytes to ``target`` before it starts when the file system
    has less free.

    Raises:
        DiskFullError: ``free < needed``; nothing was written.
    """
    free = free_bytes(target)
    if free is not None and free < needed:
        raise DiskFullError(target, needed, free, _resolve(intact))


@contextlib.contextmanager
def reporting_disk_full(target: Union[str, os.PathLike], needed: Optional[int] = None,
                        intact: Intact = None) -> Iterator[None]:
    """Around a write of ``target``: a full disk becomes one :class:`DiskFullError`.

    The free space is checked first when ``needed`` is given. Writes nest (a folder's files
    inside the folder's save): the outermost says what the user asked to write, so a
    ``DiskFullError`` from inside is raised again with this ``target`` and ``intact``.
    Cleaning up partial files is the writer's part (:func:`ctxkit.core.durable.atomic_write`
    and ``write_folder`` do it before the error reaches here), so the free space reported is
    what the user has once the failed write is gone.

    Args:
        target: the file or folder being written, as the message names it.
        needed: the bytes the write needs (:func:`tensor_bytes`), when known.
        intact: what a failure leaves as it was (a text, or a function that tells it, called
            only on failure), e.g. ``"the last checkpoint (step 40) is intact"``.

    Raises:
        DiskFullError: too little free space to start, or a writer ran out of it.
    """
    if needed is not None:
        check_free_space(target, needed, intact)
    try:
        yield
    except DiskFullError as err:
        raise DiskFullError(target, needed if needed is not None else err.needed, free_bytes(target),
                            _resolve(intact) or err.intact) from err
    except Exception as err:
        if not is_out_of_space(err):
            raise
        raise DiskFullError(target, needed, free_bytes(target), _resolve(intact)) from err


def _output_file(stream: TextIO) -> Optional[Tuple[int, str]]:
    """``(fd, name)`` when ``stream`` writes to a regular file (stdout redirected to one), else None."""
    try:
        fd = stream.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
    except (AttributeError, OSError, ValueError):  # a pipe, a terminal, pytest's capture (no fd)
        return None
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")  # the path the shell opened (Linux)
    except OSError:
        name = "standard output"
    return fd, name


def _fd_free(fd: int) -> Optional[int]:
    try:
        vfs = os.fstatvfs(fd)
    except (AttributeError, OSError):  # no fstatvfs on Windows
        return None
    return vfs.f_bavail * vfs.f_frsize


def write_output(text: str, stream: Optional[TextIO] = None) -> None:
    """Write a command's whole output (``predict``'s JSON lines) to ``stream`` (stdout) and flush it.

    When the stream is a file (``ctxkit predict ... > out.jsonl``) the file ends with all of
    ``text`` or none of it: too little free space is refused before writing, and a write
    that fails part-way is cut back to where it began.

    Raises:
        DiskFullError: the disk (or quota) holding the output is full.
    """
    stream = sys.stdout if stream is None else stream
    out = _output_file(stream)
    if out is None:  # a pipe, a terminal, a device: no file of ours to measure or to cut back
        try:
            stream.write(text)
            stream.flush()
        except Exception as err:
            if not is_out_of_space(err):
                raise
            raise DiskFullError("standard output", intact="the output is incomplete") from err
        return
    fd, name = out
    stream.flush()
    data = memoryview(text.encode(stream.encoding or "utf-8", errors=stream.errors or "strict"))
    size, start, free = len(data), os.fstat(fd).st_size, _fd_free(fd)  # start: the end, also under `>>`
    if free is not None and free < size:
        raise DiskFullError(name, size, free, intact="nothing was written to it")
    try:
        # Straight to the file: an unbuffered stream (PYTHONUNBUFFERED) drops the rest of a
        # short write without a word, and a buffered one would try again at exit.
        while data:
            data = data[os.write(fd, data):]
    except OSError as err:
        if not is_out_of_space(err):
            raise
        os.ftruncate(fd, start)
        raise DiskFullError(name, size, _fd_free(fd), intact="nothing was written to it") from err
