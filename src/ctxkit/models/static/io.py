"""File formats for context-free word vectors: GloVe text, word2vec text / binary, fastText ``.vec``.

Also :func:`read_corpus`, the tokenised-text reader used for training.

These functions work on plain ``(words, matrix)`` pairs so they stay independent of
:class:`ctxkit.models.static.vectors.WordVectors`, which wraps them as ``WordVectors.load`` / ``save``.

* ``glove``: one ``word v1 ... vd`` line per word, no header.
* ``word2vec``: the same lines after a ``"count dim"`` header line. fastText's ``.vec``
  files are this format (``fasttext`` is accepted as an alias).
* ``word2vec-binary``: the Google ``.bin`` layout: a ``"count dim\\n"`` header, then per word
  its UTF-8 bytes, a space, ``dim`` little-endian float32 values and (usually) ``\\n``.
* ``npz``: ctxkit's own lossless container; unlike the others it also keeps fastText
  sub-word bucket vectors, so out-of-vocabulary words still get vectors after a reload.

Text files may be ``.gz`` or ``.xz`` compressed. Every problem in a file raises
:class:`ctxkit.data.errors.DataError` (a ``ValueError``) whose message starts with
``"{path}:{line}: "`` (for the binary format, the 1-based record number and byte offset; for
``npz``, ``archive`` or the array's name). Files are read in one pass, so a FIFO or ``<(...)``
works too (an ``npz`` from a pipe is read into memory first, since ``np.load`` seeks).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import lzma
import math
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
from tqdm.auto import tqdm

from ctxkit.data.errors import DataError, is_rereadable, open_input, raw_lines, require_rereadable
from ctxkit.data.lines import decode_lines

from ...core.errors import UserError, quote
from ..common import Replaceable

__all__ = ["StaticVectorsConfig", "STATIC_PRESETS", "FORMATS", "guess_format", "open_file", "read_corpus", "read_vectors", "write_vectors"]

PathLike = Union[str, os.PathLike]
FORMATS = ("glove", "word2vec", "fasttext", "word2vec-binary", "npz")
_SUFFIX_FORMATS = {".txt": "glove", ".vec": "word2vec", ".bin": "word2vec-binary", ".npz": "npz"}
# What a corrupt or truncated .xz / .gz stream raises while it is read.
_DECOMPRESSION_ERRORS = (lzma.LZMAError, EOFError, zlib.error, gzip.BadGzipFile)


def open_file(path: PathLike, mode: str = "rb"):
    """Opens ``path``, decompressing ``.xz`` and ``.gz`` on the fly."""
    name = str(path)
    if name.endswith(".xz"):
        return lzma.open(path, mode)
    if name.endswith(".gz"):
        return gzip.open(path, mode)
    return open(path, mode)


def read_corpus(paths: Union[PathLike, Sequence[PathLike]], lowercase: bool = False) -> Iterator[List[str]]:
    """Yields the whitespace tokens of each non-empty line of UTF-8 text files (``.xz`` / ``.gz`` transparently).

    A line is a "sentence": training windows never cross line ends.

    Raises:
        DataError: ``PATH:LINE: invalid UTF-8 ...`` or corrupt compressed data.
        UserError: a missing path (``MissingFileError``), a directory, or a pipe (FIFO,
            ``<(...)``): training reads the corpus more than once, which a pipe cannot give.
    """
    for path in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        require_rereadable(path, "word-vector training")
        for line in decode_lines(raw_lines(path), str(path)):
            tokens = (line.lower() if lowercase else line).split()
            if tokens:
                yield tokens


def _base_suffix(path: PathLike) -> str:
    p = Path(path)
    if p.suffix in (".gz", ".xz"):
        p = p.with_suffix("")
    return p.suffix.lower()


def guess_format(path: PathLike, for_writing: bool = False) -> str:
    """Picks a format from the suffix and, when reading text, the first line.

    ``.bin`` is word2vec binary, ``.npz`` ctxkit's container and ``.vec`` word2vec text. Any
    other text file is word2vec text if its first line is exactly two integers (the
    header), else GloVe; when writing, anything not named above is written as GloVe.

    Sniffing reads the first line, so the file is opened twice; :func:`read_vectors`
    sniffs as it reads instead, which also works for a FIFO or ``<(...)``.

    Raises:
        DataError: Reading an empty file of an unknown suffix (nothing to sniff).
    """
    suffix = _base_suffix(path)
    if suffix in (".bin", ".npz", ".vec") or for_writing:
        return _SUFFIX_FORMATS.get(suffix, "glove")
    with contextlib.closing(raw_lines(path)) as lines:
        first = next(lines, b"")
    if not first:
        raise DataError(path, 1, "empty file")
    return "word2vec" if _is_header(first.decode("utf-8", "replace")) else "glove"


def _is_header(line: str) -> bool:
    """Whether a first line is word2vec's ``"COUNT DIM"`` (ASCII digits only: ``int()`` takes no ``"²"``)."""
    fields = line.split()
    return len(fields) == 2 and all(f.isascii() and f.isdigit() and len(f) <= 18 for f in fields)


def _parse_header(line: str, path: PathLike) -> Tuple[int, int]:
    if not _is_header(line):
        raise DataError(path, 1, "bad header", f"expected 'COUNT DIM', found {line[:80]!r}")
    fields = line.split()
    count, dim = int(fields[0]), int(fields[1])
    if dim <= 0:
        raise DataError(path, 1, "bad header", f"dimension must be positive, found {dim}")
    return count, dim


def _parse_values(fields: Sequence[str], path: PathLike, line_no: int) -> List[float]:
    try:
        values = [float(f) for f in fields]
    except ValueError:
        bad = next(f for f in fields if not _is_float(f))
        raise DataError(path, line_no, "non-numeric value", repr(bad)[:40]) from None
    if not all(map(math.isfinite, values)):
        raise DataError(path, line_no, "non-finite value", "NaN or infinity in the vector")
    return values


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


class _Collector:
    """Gathers parsed rows into one float32 matrix, and rejects duplicate words."""

    def __init__(self, path: PathLike):
        self.path, self.words, self.seen = path, [], {}
        self.rows: List[List[float]] = []

    def add(self, word: str, values, where: Union[int, str]) -> None:
        if word in self.seen:
            raise DataError(self.path, where, "duplicate word", f"{quote(word, 100)} first seen at {self.seen[word]}")
        self.seen[word] = where
        self.words.append(word)
        self.rows.append(values)

    def result(self, dim: int) -> Tuple[List[str], np.ndarray]:
        with np.errstate(over="ignore"):
            matrix = np.asarray(self.rows, dtype=np.float32) if self.rows else np.zeros((0, dim), np.float32)
        finite = np.isfinite(matrix).all(axis=1) if matrix.ndim == 2 else np.ones(len(self.words), bool)
        if not finite.all():  # finite as float64 text, but beyond float32: it would silently be inf
            word = self.words[int(np.flatnonzero(~finite)[0])]
            raise DataError(self.path, self.seen[word], "value out of range",
                            f"beyond float32's ±{float(np.finfo(np.float32).max):.4g}")
        return self.words, matrix.reshape(len(self.words), dim)


def _text_lines(path: PathLike, progress: bool) -> Iterator[Tuple[int, str]]:
    plain = _base_suffix(path) == Path(path).suffix.lower() and is_rereadable(path)
    total = os.path.getsize(path) if plain and os.path.exists(path) else None
    with contextlib.closing(raw_lines(path)) as lines, \
            tqdm(total=total, unit="B", unit_scale=True, desc=f"reading {Path(path).name}",
                 disable=not progress, leave=False) as bar:
        def counted():
            pending = 0
            for raw in lines:
                pending += len(raw)
                if pending > 1 << 20:  # tqdm per line would cost more than parsing
                    bar.update(pending)
                    pending = 0
                yield raw
        yield from enumerate(decode_lines(counted(), str(path)), start=1)


def _read_text(path: PathLike, header: Optional[bool], progress: bool, max_words: Optional[int]):
    """``header=None`` sniffs the first line (one pass, so pipes work)."""
    count = dim = None
    out = _Collector(path)
    last = 0
    for line_no, line in _text_lines(path, progress):
        last = line_no
        if header is None:
            header = _is_header(line)
        if header and line_no == 1:
            count, dim = _parse_header(line, path)
            continue
        # Only trailing whitespace is dropped: words may contain non-breaking spaces, and
        # word2vec's C tool ends each line with "value \n".
        fields = line.rstrip().split(" ")
        if not line.strip():
            raise DataError(path, line_no, "empty line")
        if not fields[0]:
            raise DataError(path, line_no, "empty word", "the line starts with a space")
        if dim is None:
            dim = len(fields) - 1
            if dim == 0:
                raise DataError(path, line_no, "no values", "a word with no vector")
        if len(fields) - 1 != dim:
            raise DataError(path, line_no, "wrong number of values",
                            f"expected {dim} after the word, found {len(fields) - 1}")
        if count is not None and len(out.words) == count:
            raise DataError(path, line_no, "more vectors than the header's count", f"header says {count}")
        out.add(fields[0], _parse_values(fields[1:], path, line_no), line_no)
        if max_words is not None and len(out.words) >= max_words:
            return out.result(dim)
    if count is not None and len(out.words) != count:
        raise DataError(path, 1, "header count mismatch",
                        f"header says {count} vectors, the file has {len(out.words)} (ends at line {last})")
    if dim is None:
        raise DataError(path, 1, "empty file")
    return out.result(dim)


def _read_exactly(fh, n: int) -> bytes:
    """Up to ``n`` bytes, read in bounded chunks: a corrupt header's huge size must not
    allocate gigabytes before the short read is noticed."""
    chunks, left = [], n
    while left > 0:
        chunk = fh.read(min(left, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_binary(path: PathLike, progress: bool, max_words: Optional[int]):
    name = str(path)
    opener = lzma.open if name.endswith(".xz") else gzip.open if name.endswith(".gz") else None
    where = "record 1 (byte 0)"
    with open_input(path) as raw_fh, (opener(raw_fh, "rb") if opener else contextlib.nullcontext(raw_fh)) as fh:
        try:
            return _read_binary_records(fh, path, progress, max_words)
        except _DECOMPRESSION_ERRORS as exc:
            raise DataError(path, where, "corrupt compressed data", str(exc) or type(exc).__name__) from None


def _read_binary_records(fh, path: PathLike, progress: bool, max_words: Optional[int]):
    header = fh.readline(1 << 16)
    count, dim = _parse_header(header.decode("utf-8", "replace"), path)
    want = count if max_words is None else min(count, max_words)
    words: List[str] = []
    seen: Dict[str, int] = {}
    # Grown as records arrive (not sized by the header, which may lie), trimmed at the end.
    matrix = np.empty((0, dim), dtype=np.float32)
    offset = len(header)  # counted by hand: a pipe cannot tell()
    for record in tqdm(range(1, want + 1), desc=f"reading {Path(path).name}", unit="word",
                       disable=not progress, leave=False, mininterval=1.0):
        where = f"record {record} (byte {offset})"
        raw = bytearray()
        while True:
            ch = fh.read(1)
            if not ch:
                raise DataError(path, where, "truncated file", f"header says {count} vectors")
            offset += 1
            if ch == b" ":
                break
            if ch != b"\n" or raw:  # the newline closing the previous vector is optional
                raw += ch
            if len(raw) > 10_000:
                raise DataError(path, where, "no space after the word", "is this really word2vec binary?")
        try:
            word = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(path, where, "invalid UTF-8 in the word", exc.reason) from None
        if not word:
            raise DataError(path, where, "empty word")
        data = _read_exactly(fh, 4 * dim)
        offset += len(data)
        if len(data) != 4 * dim:
            raise DataError(path, where, "truncated vector", f"{len(data)} of {4 * dim} bytes")
        row = np.frombuffer(data, dtype="<f4")
        if not np.isfinite(row).all():
            raise DataError(path, where, "non-finite value", "NaN or infinity in the vector")
        if word in seen:
            raise DataError(path, where, "duplicate word", f"{quote(word, 100)} first seen at record {seen[word]}")
        seen[word] = record
        words.append(word)
        if len(matrix) < record:  # double, starting at ~16 MB
            grown = np.empty((min(want, max(2 * len(matrix), (1 << 24) // (4 * dim), 1)), dim), dtype=np.float32)
            grown[: record - 1] = matrix[: record - 1]
            matrix = grown
        matrix[record - 1] = row
    if max_words is None:
        rest = fh.read(2)
        if rest not in (b"", b"\n"):
            raise DataError(path, f"record {count + 1} (byte {offset})", "more vectors than the header's count",
                            f"header says {count}")
    return words, matrix[: len(words)]


def _read_npz(path: PathLike, max_words: Optional[int]) -> Tuple[List[str], np.ndarray, Dict[str, np.ndarray]]:
    with open_input(path) as fh:
        source = fh if is_rereadable(path) else io.BytesIO(fh.read())  # np.load seeks; a pipe cannot
        try:
            loaded = np.load(source, allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                raise DataError(path, "archive", "not an .npz archive", "a single .npy array")
            with loaded as data:
                missing = [k for k in ("words", "vectors") if k not in data.files]
                if missing:
                    raise DataError(path, "archive", "not a word-vector archive", f"no {' or '.join(missing)} array")
                extras = {k: data[k] for k in data.files if k not in ("words", "vectors")}
                words_arr, vectors = data["words"], data["vectors"]
        except DataError:
            raise
        except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error, MemoryError,
                NotImplementedError) as exc:  # not a zip, pickled objects, truncated or corrupt members
            detail = "not a NumPy archive" if "pickled" in str(exc) else (str(exc)[:200] or type(exc).__name__)
            raise DataError(path, "archive", "unreadable .npz file", detail) from None
    if words_arr.ndim != 1 or words_arr.dtype.kind not in "US":
        raise DataError(path, "array 'words'", "bad array", f"expected a 1-D string array, got {words_arr.dtype} "
                                                            f"of shape {words_arr.shape}")
    if vectors.ndim != 2 or vectors.shape[0] != len(words_arr) or vectors.dtype.kind not in "fiu":
        raise DataError(path, "array 'vectors'", "bad array", f"expected ({len(words_arr)}, dim) numbers, got "
                                                              f"{vectors.dtype} of shape {vectors.shape}")
    words = [str(w) for w in words_arr]
    matrix = np.asarray(vectors, dtype=np.float32)
    if not np.isfinite(matrix).all():
        row = int(np.flatnonzero(~np.isfinite(matrix).all(axis=1))[0])
        raise DataError(path, "array 'vectors'", "non-finite value", f"NaN or infinity in row {row} ({quote(words[row], 100)})")
    if max_words is not None:
        words, matrix = words[:max_words], matrix[:max_words]
    return words, matrix, extras


def read_vectors(path: PathLike, format: Optional[str] = None, progress: bool = True,
                 max_words: Optional[int] = None) -> Tuple[List[str], np.ndarray, Dict[str, np.ndarray]]:
    """Reads a word-vector file.

    Args:
        path: The file; text formats may be ``.gz`` / ``.xz`` compressed.
        format: One of :data:`FORMATS`, or None to guess (:func:`guess_format`).
        progress: Show a tqdm bar (it only draws on a terminal for files that take a while).
        max_words: Stop after this many vectors (files are usually sorted by frequency).

    Returns:
        ``(words, matrix, extras)``: the words in file order, a float32 ``(V, dim)``
        matrix, and for ``npz`` the other arrays it holds (e.g. ``ngram_vectors``).

    Raises:
        DataError: (a ``ValueError``) naming the file and line or record of the first problem:
            wrong number of values, non-numeric or non-finite value, header count or
            dimension mismatch, duplicate word, invalid UTF-8, truncated binary data.
        FileNotFoundError: ``path`` does not exist.
    """
    if format is None and _base_suffix(path) not in (".bin", ".npz", ".vec"):
        format = "sniff"  # decided by the first line while reading: one pass, so pipes work
    format = format or guess_format(path)
    if format not in FORMATS + ("sniff",):
        raise UserError(f"unknown vector format {format!r}; choose from {', '.join(FORMATS)}")
    if format == "npz":
        return _read_npz(path, max_words)
    if format == "word2vec-binary":
        words, matrix = _read_binary(path, progress, max_words)
    else:
        header = None if format == "sniff" else format in ("word2vec", "fasttext")
        words, matrix = _read_text(path, header=header, progress=progress, max_words=max_words)
    return words, matrix, {}


def _check_word(word: str) -> None:
    # ASCII whitespace only: readers split lines on it, but fastText vocabularies hold
    # words with non-breaking spaces, which survive a round trip here.
    if not word or any(ch in " \t\n\r\x0b\x0c" for ch in word):
        raise UserError(f"cannot write {word!r}: word-vector text formats split on whitespace")


def write_vectors(path: PathLike, words: Sequence[str], matrix: np.ndarray, format: Optional[str] = None,
                  decimals: Optional[int] = None, progress: bool = True,
                  extras: Optional[Dict[str, np.ndarray]] = None) -> Path:
    """Writes word vectors in one of :data:`FORMATS`.

    Args:
        path: Output file (``.gz`` / ``.xz`` compress text formats).
        words: ``V`` words, one per matrix row.
        matrix: ``(V, dim)`` vectors; stored as float32.
        format: None picks by suffix (``.txt`` GloVe, ``.vec`` word2vec text, ``.bin``
            word2vec binary, ``.npz``).
        decimals: Text formats: None writes ``%.9g``, which reads back bit-identical
            float32 values; an int writes fixed decimals (``6`` is what word2vec's C tool
            writes) for smaller, lossy files.
        progress: Show a tqdm bar.
        extras: ``npz`` only: more arrays to store (sub-word buckets and settings).

    Returns:
        ``path`` as a :class:`Path`.
    """
    format = format or guess_format(path, for_writing=True)
    if format not in FORMATS:
        raise UserError(f"unknown vector format {format!r}; choose from {', '.join(FORMATS)}")
    matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    if matrix.ndim != 2 or matrix.shape[0] != len(words):
        raise UserError(f"matrix of shape {matrix.shape} does not match {len(words)} words")
    path = Path(path)
    if format == "npz":
        np.savez(path, words=np.asarray(list(words), dtype=str), vectors=matrix, **(extras or {}))
        # np.savez appends .npz to names without it; report where the file really is.
        return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")
    for word in words:
        _check_word(word)
    count, dim = matrix.shape
    rows = tqdm(zip(words, matrix), total=count, unit="word", desc=f"writing {path.name}",
                disable=not progress, leave=False, mininterval=1.0)
    with open_file(path, "wb") as fh:
        if format != "glove":
            fh.write(f"{count} {dim}\n".encode())
        if format == "word2vec-binary":
            for word, row in rows:
                fh.write(word.encode("utf-8") + b" " + row.astype("<f4").tobytes() + b"\n")
        else:
            row_fmt = " ".join([("%.9g" if decimals is None else f"%.{decimals}f")] * dim) + "\n"
            for word, row in rows:
                fh.write(f"{word} ".encode("utf-8") + (row_fmt % tuple(row.tolist())).encode("ascii"))
    return path


# ---------------------------------------------------------------------------- the family's config


@dataclass(frozen=True)
class StaticVectorsConfig(Replaceable):
    """Settings of a static word-vector model (:func:`ctxkit.pretraining.word2vec.train_word2vec`).

    Attributes:
        model: ``"skipgram"`` or ``"cbow"``.
        dim: vector size (the common name ``hidden_size`` reads it).
        window: context words on each side.
        negative: negative samples per positive pair.
        subwords: fastText character n-grams (False: plain word2vec).
        buckets: n-gram hash buckets (with ``subwords``).

    The field names are :func:`~ctxkit.pretraining.word2vec.train_word2vec`'s arguments.
    """

    model: str = "skipgram"
    dim: int = 100
    window: int = 5
    negative: int = 5
    subwords: bool = False
    buckets: int = 2_000_000

    @property
    def hidden_size(self) -> int:
        return self.dim


STATIC_PRESETS: Dict[str, StaticVectorsConfig] = {
    "word2vec_skipgram_100": StaticVectorsConfig(),
    "word2vec_cbow_100": StaticVectorsConfig(model="cbow"),
    "fasttext_skipgram_100": StaticVectorsConfig(subwords=True),
}

# One line per preset for `ctxkit list-models` (ctxkit.zoo.families).
STATIC_DESCRIPTIONS: Dict[str, str] = {
    "word2vec_skipgram_100": "static word vectors: word2vec skip-gram, 100-d, window 5, 5 negatives (Mikolov et al. 2013); ctxkit word2vec-train",
    "word2vec_cbow_100": "static word vectors: word2vec CBOW, 100-d, window 5, 5 negatives",
    "fasttext_skipgram_100": "static word vectors: fastText skip-gram with character n-grams, 100-d (Bojanowski et al. 2017)",
}
