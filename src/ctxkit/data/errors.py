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

import logging
import os
from collections import Counter
from typing import Iterable, Iterator, Optional, Tuple, Union

__all__ = ["DataError", "ReadResult", "ON_ERROR", "summarize", "ProblemLog", "iter_lines"]

PathLike = Union[str, os.PathLike]
ON_ERROR = ("raise", "skip")
logger = logging.getLogger("ctxkit")


class DataError(ValueError):
    """A data file holds something a reader cannot use.

    Attributes:
        path: The file (as given to the reader).
        where: 1-based line number, or a record description for JSON documents.
        reason: Short category used for counting in skip mode (e.g. ``"unknown label"``).
        detail: The rest of the explanation.
    """

    def __init__(self, path: PathLike, where: Union[int, str], reason: str, detail: str = ""):
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
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
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
