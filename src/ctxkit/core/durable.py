"""Writing files and folders so that a crash at any instant leaves one complete copy.

A kill (or a power cut) can come between any two system calls. The rules here make every
such instant safe:

* **A file** is written to a temporary name beside it, flushed to disk (``fsync``), renamed
  over the old one (atomic on POSIX and Windows), and the folder's entry is flushed too.
* **A folder** (a training checkpoint, ``best/``) is written whole into a sibling
  ``.NAME.new-XXXX``, closed by a ``MANIFEST.json`` (size and SHA-256 of every file) written
  last, then swapped in. The previous copy is moved aside to ``.NAME.old`` first and deleted
  only once the new one is in place; when there is no ``NAME`` (a crash came between the two
  renames), ``.NAME.old`` is the only complete copy and is kept until a new one stands.
* **On (re)start** :func:`recover_folder` puts a complete copy back under ``NAME`` if a crash
  left none there, and :func:`remove_debris` deletes what crashed writes left behind.

Tests kill a writer at each boundary of these sequences (:data:`fault_hook`) and check that
a complete copy survives every one of them (``tests/test_durable.py``).

A full disk is one more such instant: the partial file or folder is deleted and the error is
a one-line :class:`~ctxkit.core.diskspace.DiskFullError` saying what is intact
(``tests/test_disk_full.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Dict, Optional

from .diskspace import Intact, is_out_of_space, reporting_disk_full, unchanged_note
from .errors import UserError

__all__ = ["atomic_write", "write_folder", "recover_folder", "remove_debris", "verify_manifest", "fault_hook",
           "MANIFEST", "IncompleteFolderError"]

MANIFEST = "MANIFEST.json"
_OLD, _NEW = ".{}.old", ".{}.new-"

# Tests set this to a function called with a name at every write boundary (before and after
# each write, flush, rename and delete); raising or exiting there simulates a crash.
fault_hook: Optional[Callable[[str], None]] = None


class IncompleteFolderError(UserError):
    """A folder's files do not match its manifest (a copy made by hand, a disk error)."""


def _boundary(name: str) -> None:
    if fault_hook is not None:
        fault_hook(name)


def _fsync(path: os.PathLike) -> None:
    """Flush a file's data, or a folder's entries, to the disk."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if Path(path).is_dir() else os.O_RDONLY
    try:
        fd = os.open(path, flags)
    except OSError:  # folders cannot be opened on Windows; their entries are durable there
        return
    try:
        os.fsync(fd)
    except OSError as err:
        # File systems without fsync on folders say so; a full disk is said here too (data
        # held in the page cache may find no blocks), and then the file is not on the disk.
        if is_out_of_space(err):
            raise
    finally:
        os.close(fd)


def atomic_write(path: os.PathLike, write: Callable[[str], object], size: Optional[int] = None) -> Path:
    """Write a file via ``write(tmp_path)``, flush it, then rename it over ``path``.

    Readers see the old file or the new one, never half of one, and after a power cut the
    new one is on the disk once this returns.

    Args:
        path: the file to (re)place.
        write: writes the whole file to the temporary path it is given.
        size: the bytes it will take, when known: too little free space is refused before
            anything is written.

    Raises:
        DiskFullError: the disk (or quota) is full; the temporary file is deleted and
            ``path`` is as it was.
    """
    path = Path(path)
    with reporting_disk_full(path, size, intact=unchanged_note(path)):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
        os.close(fd)
        try:
            _boundary(f"write {path.name}")
            write(tmp)
            _fsync(tmp)
            _boundary(f"rename {path.name}")
            os.replace(tmp, path)
            _fsync(path.parent)
            _boundary(f"wrote {path.name}")
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    return path


def _sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def _manifest(folder: Path) -> Dict[str, dict]:
    return {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}


def verify_manifest(folder: os.PathLike) -> bool:
    """Check a folder against its ``MANIFEST.json``.

    Returns:
        True when the manifest lists exactly the folder's files with their sizes and hashes,
        False when the folder has no manifest (written before manifests, or by hand).

    Raises:
        IncompleteFolderError: naming each missing, extra or changed file.
    """
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        return False
    try:
        want = json.loads(path.read_text(encoding="utf-8"))["files"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise IncompleteFolderError(f"{path}: unreadable manifest ({type(err).__name__}); the folder is not a complete copy") from None
    have = _manifest(folder)
    problems = [f"{name}: missing" for name in want if name not in have]
    problems += [f"{name}: not in the manifest" for name in have if name not in want]
    problems += [f"{name}: {'size' if have[name]['size'] != w['size'] else 'SHA-256'} differs from the manifest"
                 for name, w in want.items() if name in have and have[name] != w]
    if problems:
        raise IncompleteFolderError(f"{folder} is not the complete copy its manifest describes: " + "; ".join(problems))
    return True


def _write_new(final: Path, write: Callable[[Path], object]) -> Path:
    """``write`` into a new sibling folder of ``final``, closed by its manifest and flushed;
    on any failure the new folder is deleted."""
    new = Path(tempfile.mkdtemp(prefix=_NEW.format(final.name), dir=final.parent))
    try:
        write(new)
        manifest = {"files": _manifest(new)}
        _boundary(f"manifest {final.name}")
        (new / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        for p in new.rglob("*"):
            if p.is_file():
                _fsync(p)
        _fsync(new)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    return new


def write_folder(final: os.PathLike, write: Callable[[Path], object],
                 retire: Optional[Callable[[Path], None]] = None, needed: Optional[int] = None,
                 intact: Intact = None) -> Path:
    """Replace the folder ``final`` as a unit with what ``write(folder)`` puts in a new one.

    Args:
        final: the folder to (re)place, e.g. ``RUN/checkpoint`` or ``RUN/best``.
        write: fills the empty folder it is given.
        retire: what to do with the previous copy once the new one stands (default: delete
            it; the trainer archives it as ``checkpoint-stepN`` under ``keep_last``).
        needed: the bytes the new folder will take, when known (:func:`~ctxkit.core.diskspace.tensor_bytes`):
            too little free space is refused before anything is written.
        intact: what a full disk leaves as it was, for the error's message (default: the
            previous folder, or nothing); e.g. ``"the last checkpoint (step 40) is intact"``.

    Returns:
        ``final``.

    Raises:
        DiskFullError: the disk (or quota) filled up while the new folder was written; it
            is deleted and ``final`` is as it was.
    """
    final = Path(final)
    parent = final.parent
    old = parent / _OLD.format(final.name)
    # The previous copy stays in place until the new one is whole: it needs room for both.
    with reporting_disk_full(final, needed, intact if intact is not None else unchanged_note(final, "folder")):
        parent.mkdir(parents=True, exist_ok=True)
        new = _write_new(final, write)
    if final.exists():
        # final is complete (it was renamed into place whole): an older .old can go, then
        # final steps aside. Without final, .old may be the only complete copy: keep it.
        if old.exists():
            _boundary(f"delete stale .{final.name}.old")
            shutil.rmtree(old)
        _boundary(f"move {final.name} aside")
        os.replace(final, old)
        _fsync(parent)
    _boundary(f"rename new {final.name} into place")
    os.replace(new, final)
    _fsync(parent)
    _boundary(f"retire .{final.name}.old")
    if old.exists():
        (retire or shutil.rmtree)(old)
        _fsync(parent)
    _boundary(f"done {final.name}")
    return final


def _complete(folder: Path) -> bool:
    try:
        return verify_manifest(folder)
    except IncompleteFolderError:
        return False


def recover_folder(final: os.PathLike) -> Optional[Path]:
    """After a crash: make sure ``final`` holds the newest complete copy, if any exists.

    ``final`` present: it is complete (only whole folders are renamed there). Absent: the
    newest of a finished ``.NAME.new-*`` (manifest verified) and ``.NAME.old`` is renamed to
    ``final``. Returns ``final``, or None when there is no complete copy at all.
    """
    final = Path(final)
    if final.exists():
        return final
    parent, old = final.parent, final.parent / _OLD.format(final.name)
    finished = sorted((p for p in parent.glob(_NEW.format(final.name) + "*") if p.is_dir() and _complete(p)),
                      key=lambda p: p.stat().st_mtime)
    candidates = finished[-1:] or ([old] if old.is_dir() and (_complete(old) or not (old / MANIFEST).exists()) else [])
    if not candidates:
        return None
    os.replace(candidates[0], final)
    _fsync(parent)
    return final


def remove_debris(folder: os.PathLike, names=("checkpoint", "best")) -> list:
    """Delete what crashed writes left in a run folder; returns the paths removed.

    Removes unfinished ``.NAME.new-*`` folders, ``.NAME.old`` once ``NAME`` stands, the
    ``.checkpoint.XXXXXXXX`` folders of earlier versions, and ``.*.tmp`` files of
    :func:`atomic_write` in the folder and in each ``NAME/``. Call :func:`recover_folder`
    first, so that no complete copy is taken for debris.
    """
    folder = Path(folder)
    removed = []
    for name in names:
        final = folder / name
        stale = list(folder.glob(_NEW.format(name) + "*"))
        if final.exists():
            stale += [folder / _OLD.format(name)]
        if name == "checkpoint":  # earlier versions' temporary folders: .checkpoint.<random>
            stale += [p for p in folder.glob(".checkpoint.*") if p.name != ".checkpoint.old" and not p.name.startswith(".checkpoint.new-")]
        for p in stale:
            if p.exists():
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
                removed.append(p)
        if final.is_dir():
            for tmp in final.glob(".*.tmp"):
                tmp.unlink()
                removed.append(tmp)
    for tmp in folder.glob(".*.tmp"):
        tmp.unlink()
        removed.append(tmp)
    return removed
