"""Plain text lines from a file (optionally ``.xz`` / ``.gz``): UTF-8 decoded one line at a
time, so a bad byte is reported with its file and line."""

from __future__ import annotations

import os
from typing import Iterable, Iterator, Union

from .errors import DataError, raw_lines as _file_lines

PathLike = Union[str, os.PathLike]

__all__ = ["read_lines", "decode_lines"]


def read_lines(path: PathLike) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file, optionally ``.xz`` or ``.gz`` compressed.

    Lines are decoded one at a time from bytes so a bad byte is reported with its
    file and line, not as a bare ``UnicodeDecodeError``. A leading UTF-8 BOM (some
    GLUE files have one) and the line terminators are dropped. The file is read once,
    so a FIFO or a ``<(...)`` process substitution works too.

    Args:
        path: File to read; a name ending in ``.xz`` / ``.gz`` is decompressed on the fly.

    Yields:
        Each line without ``\\n`` / ``\\r\\n``.

    Raises:
        DataError: (a ``ValueError``) ``"{path}:{line_no}: invalid UTF-8 ..."`` or
            ``"{path}:{line_no}: corrupt xz data ..."``, when that line is reached.
        MissingFileError: (a ``FileNotFoundError``) ``"{path}: no such file"``.
        UserError: ``path`` is a directory or cannot be read.
    """
    yield from decode_lines(_file_lines(path), str(path))


def decode_lines(raw_lines: Iterable[bytes], name: str) -> Iterator[str]:
    """Decode byte lines as UTF-8 (BOM and line ends dropped), naming ``name:LINE`` on bad bytes.

    Raises:
        DataError: (a ``ValueError``) ``"{name}:{line_no}: invalid UTF-8 ..."``, when that line is reached.
    """
    for line_no, raw in enumerate(raw_lines, start=1):
        if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
            if not raw:  # a file holding only a BOM is empty, not one empty line
                return
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(name, line_no, f"invalid UTF-8 at byte {exc.start} of the line "
                                           f"({raw[exc.start:exc.start + 4]!r})", exc.reason) from None
        yield line.rstrip("\n").rstrip("\r")
