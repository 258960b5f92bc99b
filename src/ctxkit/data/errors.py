"""Problems found while reading data files, and the policy for them.

Every reader takes ``on_error="raise"`` or ``"skip"``:

* ``"raise"``: the first problem raises :class:`DataError`, whose message starts with
  ``"{path}:{where}: "`` (a 1-based line number, or a record such as
  ``article 3 / paragraph 0 / question 5733be28``).
* ``"skip"``: each problem is logged as a warning on the ``ctxkit`` logger with the same
  ``path:where: reason`` text, the bad record is left out and counted, and a single summary
  line is logged at the end. Readers return a :class:`ReadResult` carrying the counts, so
  nothing is dropped silently.

Problems that leave nothing sensible to read (a missing header column, broken JSON in a
single-document file) always raise.
"""

from __future__ import annotations

import gzip
import json
import logging
import lzma
import os
import stat
import zlib
from collections import Counter
from typing import IO, Any, Iterable, Iterator, Optional, Tuple, Union

from ..core.errors import MissingFileError, UserError, clip

__all__ = ["DataError", "ReadResult", "ON_ERROR", "summarize", "ProblemLog", "iter_lines",
           "check_input", "open_input", "is_rereadable", "require_rereadable", "raw_lines", "json_error_detail",
           "loads_json", "lone_surrogate"]

PathLike = Union[str, os.PathLike]
ON_ERROR = ("raise", "skip")
logger = logging.getLogger("ctxkit")


class DataError(UserError):
    """A data file holds something a reader cannot use.

    Attributes:
        path: The file (as given to the reader).
        where: 1-based line number, or a record description for JSON documents.
        reason: Short category used for counting in skip mode (e.g. ``"unknown label"``).
        detail: The rest of the explanation (readers quote input with
            :func:`ctxkit.core.errors.quote`; longer details are cut here as a last guard, so
            no input makes the message longer than a few hundred characters).
    """

    #: the most characters of ``detail`` kept (a quoted field of ~200 plus the explanation)
    DETAIL_LIMIT = 400

    def __init__(self, path: PathLike, where: Union[int, str], reason: str, detail: str = ""):
        detail = clip(detail, self.DETAIL_LIMIT)
        self.path, self.where, self.reason, self.detail = str(path), where, reason, detail
        super().__init__(f"{self.path}:{where}: {reason}" + (f": {detail}" if detail else ""))


class ReadResult(list):
    """The examples a reader returned, plus what it left out.

    A plain ``list`` of examples, so it can be indexed, sliced and passed anywhere a list goes.

    Attributes:
        path: The file that was read.
        skipped: ``Counter`` of reason -> number of records left out (empty with
            ``on_error="raise"`` or a clean file).
    """

    def __init__(self, items: Iterable = (), path: Optional[PathLike] = None, skipped: Optional[Counter] = None):
        super().__init__(items)
        self.path = None if path is None else str(path)
        self.skipped: Counter = Counter() if skipped is None else Counter(skipped)

    @property
    def num_skipped(self) -> int:
        """Total number of records left out."""
        return sum(self.skipped.values())

    @property
    def summary(self) -> str:
        """One line: how many examples were read and what was skipped, e.g. for a log."""
        return summarize(self.path, len(self), self.skipped)


def summarize(path: Optional[PathLike], num_read: int, skipped: Counter, what: str = "examples") -> str:
    """Build the one-line report of a read.

    Example: ``"read 8551 examples from X; skipped 3 (wrong column count: 2, unknown label: 1)"``.

    Args:
        path: File that was read.
        num_read: Number of examples kept.
        skipped: Reason -> count of records left out.
        what: Plural noun for the examples.
    """
    line = f"read {num_read} {what} from {path}"
    total = sum(skipped.values())
    if not total:
        return line + "; skipped 0"
    reasons = ", ".join(f"{reason}: {n}" for reason, n in skipped.most_common())
    return f"{line}; skipped {total} ({reasons})"


class ProblemLog:
    """Applies the ``on_error`` policy for one file: raise, or log, count and carry on.

    Args:
        path: File being read (used in every message).
        on_error: ``"raise"`` or ``"skip"``.
    """

    def __init__(self, path: PathLike, on_error: str):
        if on_error not in ON_ERROR:
            raise UserError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.path, self.on_error = str(path), on_error
        self.skipped: Counter = Counter()

    def report(self, where: Union[int, str], reason: str, detail: str = "") -> None:
        """Record one problem; raises :class:`DataError` unless skipping.

        Args:
            where: Line number (1-based) or record description.
            reason: Short category, the key counted in :attr:`skipped`.
            detail: Specifics (expected vs found values).
        """
        err = DataError(self.path, where, reason, detail)
        if self.on_error == "raise":
            raise err
        logger.warning("%s", err)
        self.skipped[reason] += 1

    def fatal(self, where: Union[int, str], reason: str, detail: str = "") -> DataError:
        """A problem that ends the read in any mode; returns the error for ``raise``."""
        return DataError(self.path, where, reason, detail)

    def finish(self, result: ReadResult, what: str = "examples") -> ReadResult:
        """Attach the counts to ``result`` and log the summary line; returns ``result``."""
        result.path, result.skipped = self.path, Counter(self.skipped)
        message = summarize(self.path, len(result), result.skipped, what)
        # The summary is a warning only when something was left out; a clean read is routine.
        logger.log(logging.WARNING if result.skipped else logging.INFO, "%s", message)
        return result


def iter_lines(raw_lines: Iterable[bytes], problems: ProblemLog) -> Iterator[Tuple[int, Optional[str]]]:
    """Decode byte lines as UTF-8, dropping a leading BOM and the line ends.

    Lines that are not valid UTF-8 are reported to ``problems`` and yielded as ``None``
    (in skip mode) so callers can still keep line numbers and record boundaries.

    Yields:
        ``(line_number, text_or_None)`` with 1-based line numbers.
    """
    for line_no, raw in enumerate(raw_lines, start=1):
        if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            text: Optional[str] = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = raw[exc.start:exc.start + 4]
            problems.report(line_no, "invalid UTF-8", f"byte {exc.start} of the line ({bad!r})")
            text = None
        yield line_no, (None if text is None else text.rstrip("\n").rstrip("\r"))


# --------------------------------------------------------------------------- opening input files


def check_input(path: PathLike) -> None:
    """Accept anything readable that is not a directory: a regular file, but also a FIFO,
    a ``<(...)`` process substitution (``/dev/fd/N``) or ``/dev/stdin``.

    ``Path.is_file()`` is False for all of those but the first, which used to make a pipe
    look like a missing file.

    Raises:
        MissingFileError: ``"PATH: no such file"``.
        UserError: ``"PATH: is a directory, not a file"``, or the system's reason it cannot be read.
    """
    name = os.fspath(path)
    try:
        st = os.stat(name)
    except (FileNotFoundError, NotADirectoryError):
        raise MissingFileError(f"{name}: no such file") from None
    except OSError as exc:
        raise UserError(f"{name}: cannot read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{name}: is a directory, not a file")


def open_input(path: PathLike) -> IO[bytes]:
    """Open a user's input file for binary reading after :func:`check_input`.

    Opening a FIFO blocks until a writer opens its other end, as ``cat`` does.
    """
    check_input(path)
    try:
        return open(path, "rb")
    except OSError as exc:
        raise UserError(f"{os.fspath(path)}: cannot read ({exc.strerror or exc})") from None


def is_rereadable(path: PathLike) -> bool:
    """Whether ``path`` can be read more than once (a regular file, not a pipe)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True  # let the reader report the missing file


def require_rereadable(path: PathLike, why: str) -> None:
    """Refuse a FIFO / ``<(...)`` where a reader needs two passes (it would block on the second).

    Raises:
        UserError: ``"PATH: is a pipe, but {why} reads it more than once; save it to a file first"``.
    """
    check_input(path)
    if not is_rereadable(path):
        raise UserError(f"{os.fspath(path)}: is a pipe, but {why} reads it more than once; save it to a file first")


_COMPRESSED = {".xz": (lzma.open, "xz"), ".gz": (gzip.open, "gzip")}
# What a corrupt or truncated stream raises while it is decompressed.
_DECOMPRESSION_ERRORS = (lzma.LZMAError, EOFError, zlib.error, gzip.BadGzipFile)


def raw_lines(path: PathLike, compressed: Tuple[str, ...] = (".xz", ".gz")) -> Iterator[bytes]:
    """The byte lines of a user's file in one pass, decompressing the suffixes in ``compressed``.

    Works on FIFOs and ``<(...)`` too. A corrupt or truncated compressed stream raises
    :class:`DataError` naming the line where decompression failed.
    """
    name = os.fspath(path)
    suffix = next((s for s in compressed if name.endswith(s)), None)
    with open_input(path) as fh:
        if suffix is None:
            yield from fh
            return
        opener, kind = _COMPRESSED[suffix]
        line_no = 0
        try:
            with opener(fh, "rb") as stream:
                for line_no, raw in enumerate(stream, start=1):
                    yield raw
        except _DECOMPRESSION_ERRORS as exc:
            raise DataError(name, line_no + 1, f"corrupt {kind} data", str(exc) or type(exc).__name__) from None


# --------------------------------------------------------------------------- JSON


def json_error_detail(exc: json.JSONDecodeError) -> str:
    """``"Expecting value at column 7"``; messages that already end in "at"
    (``"Unterminated string starting at"``) get just the column, not a second "at"."""
    msg = exc.msg.rstrip()
    return f"{msg} column {exc.colno}" if msg.endswith(" at") else f"{msg} at column {exc.colno}"


def loads_json(text: Union[str, bytes], path: PathLike, where: Union[int, str, None] = None) -> Any:
    """``json.loads`` whose every failure is a :class:`DataError`.

    Args:
        text: The JSON text.
        path: File named in the error.
        where: Line number of ``text`` in the file (a JSON Lines record); ``None`` when
            ``text`` is the whole file, so the error's line is the decoder's.

    Raises:
        DataError: ``PATH:LINE: invalid JSON: ...``; also for JSON that Python cannot hold:
            nesting deeper than the recursion limit, integers with too many digits.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        line = exc.lineno if where is None else where
        raise DataError(path, line, "invalid JSON", json_error_detail(exc)) from None
    except UnicodeDecodeError as exc:  # bytes given
        line = text[:exc.start].count(b"\n") + 1 if where is None else where
        raise DataError(path, line, "invalid UTF-8", exc.reason) from None
    except RecursionError:
        raise DataError(path, "document" if where is None else where, "invalid JSON",
                        "arrays or objects nested too deeply") from None
    except ValueError as exc:  # e.g. an integer longer than sys.get_int_max_str_digits()
        raise DataError(path, "document" if where is None else where, "invalid JSON", str(exc).split(";")[0]) from None


def lone_surrogate(text: str) -> Optional[int]:
    """Index of the first lone surrogate in ``text`` (JSON's ``"\\ud800"`` decodes to one), or None.

    Such a string is not Unicode text: it cannot be encoded, so no tokenizer can take it.
    """
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as exc:
        return exc.start
