"""Checkpoints published as plain files (AllenNLP's ELMo): fetched by URL with ``pooch``,
each file SHA-256 checked, into ctxkit's cache.

``pooch`` downloads to a temporary name and moves the file into place only after its hash
matched, so an interrupted or corrupted download never leaves a file that looks complete;
files already present with the right hash are not fetched again.

A file whose publisher gives no checksum (sha256 None) is hashed at its first download and
the digest kept in ``SHA256SUMS`` beside it: every later use checks the file against that
record (trust on first use, said in the log).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

from .deps import require
from .diskspace import DiskFullError, free_bytes, is_out_of_space
from .errors import UserError, capped_list, clip

__all__ = ["fetch_files", "files_present", "RECORD"]

logger = logging.getLogger("ctxkit")
RECORD = "SHA256SUMS"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _recorded(folder: Path) -> Dict[str, str]:
    path = folder / RECORD
    if not path.is_file():
        return {}
    return {name: digest for digest, name in (line.split(None, 1) for line in path.read_text(encoding="utf-8").splitlines()
                                              if line.strip())}


def _record(folder: Path, name: str, digest: str) -> None:
    rows = {**_recorded(folder), name: digest}
    tmp = folder / (RECORD + ".tmp")
    tmp.write_text("".join(f"{d}  {n}\n" for n, d in sorted(rows.items())), encoding="utf-8")
    os.replace(tmp, folder / RECORD)


def files_present(folder: Path, files: Mapping[str, Tuple[str, Optional[str]]]) -> bool:
    """Whether every file of ``files`` (name -> (url, sha256)) is in ``folder`` (not hashed)."""
    return all((Path(folder) / name).is_file() for name in files)


def fetch_files(files: Mapping[str, Tuple[str, Optional[str]]], folder: os.PathLike, progress: bool = True) -> Path:
    """Download ``files`` (local name -> ``(url, sha256)``) into ``folder``.

    Raises:
        UserError: offline (``HF_HUB_OFFLINE`` / ``CTXKIT_OFFLINE``) with files missing, a
            failed download, or a file whose SHA-256 differs (nothing is left in its place).
    """
    folder = Path(folder)
    offline = any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in ("HF_HUB_OFFLINE", "CTXKIT_OFFLINE"))
    if offline and not files_present(folder, files):
        missing = [n for n in files if not (folder / n).is_file()]
        # One line, then each missing file with its URL: the list is capped (urls are long).
        raise UserError(f"{folder}: {len(missing)} file(s) missing and offline mode is set: fetch them where the network is "
                        "reachable, into this folder:" + capped_list(f"{n}: {files[n][0]}" for n in missing))
    pooch = require("pooch", "fetching checkpoints published by URL (the released ELMo)")
    folder.mkdir(parents=True, exist_ok=True)
    recorded = _recorded(folder)
    for name, (url, sha256) in files.items():
        expected = sha256 or recorded.get(name)
        try:
            pooch.retrieve(url, known_hash=f"sha256:{expected}" if expected else None, fname=name, path=folder,
                           progressbar=progress)
        except ValueError as err:  # pooch: hash mismatch (the download is discarded)
            raise UserError(f"{url}: {clip(err, 400)}") from None
        except Exception as err:  # network errors of requests / urllib3, or a full disk
            if is_out_of_space(err):  # pooch deletes its temporary file; the files fetched before stay
                raise DiskFullError(folder / name, free=free_bytes(folder), intact="no partial file is left") from err
            raise UserError(f"downloading {url} failed ({type(err).__name__}: {str(err)[:300]}); run again") from None
        if expected is None:
            digest = _sha256(folder / name)
            _record(folder, name, digest)
            logger.warning("%s: no published checksum; recorded sha256 %s in %s (later loads are checked against it)",
                           url, digest, folder / RECORD)
    return folder
