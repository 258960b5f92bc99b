"""GLUE tasks and the user's own text tables as :class:`TextExample` lists.

GLUE files are tab-separated and must be read with quoting off (sentences contain lone
``"``), so a row is exactly one line split on tabs. The column layout of each task is
declared once in :data:`GLUE_TASKS`; readers check every row against it.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import (DataError, ProblemLog, ReadResult, check_input, iter_lines, loads_json, lone_surrogate,
                     open_input)
from ..core.errors import MissingFileError, UnknownNameError, UserError, capped_join, quote

__all__ = ["TextExample", "GlueTask", "GLUE_TASKS", "get_glue_task", "read_glue", "read_table", "TextReadResult", "read_sst2"]

PathLike = Union[str, os.PathLike]
Column = Union[str, int]  # a header name, or a 0-based position for files without a header


@dataclass
class TextExample:
    """One single-sentence or sentence-pair example.

    Attributes:
        text: The (first) sentence.
        text_pair: The second sentence, or ``None`` for single-sentence tasks.
        label: Index into the label list (classification), a float (regression), or
            ``None`` for unlabelled data such as GLUE test files.
        guid: ``"file:line"`` of the row (file name only, 1-based line).
    """

    text: str
    text_pair: Optional[str]
    label: Union[int, float, None]
    guid: str


class TextReadResult(ReadResult):
    """A :class:`ReadResult` of :class:`TextExample` that also knows its label set.

    Attributes:
        labels: Label strings, ``example.label`` indexes them; ``None`` for regression or
            unlabelled data.
        is_regression: Whether labels are floats.
    """

    def __init__(self, items=(), path=None, skipped=None, labels: Optional[Sequence[str]] = None,
                 is_regression: bool = False):
        super().__init__(items, path, skipped)
        self.labels = None if labels is None else list(labels)
        self.is_regression = is_regression


@dataclass(frozen=True)
class GlueTask:
    """Layout of one GLUE task's files.

    Attributes:
        name: Folder name in the GLUE distribution (``"SST-2"``).
        files: Split -> file name (``train``/``dev``/``test``; MNLI has ``dev_matched``,
            ``dev_mismatched``, ``test_matched``, ``test_mismatched``).
        header: Whether train/dev files start with a header row. GLUE test files always do.
        text_column: Header name, or 0-based position when there is no header.
        pair_column: Same for the second sentence; ``None`` for single-sentence tasks.
        label_column: Same for the label.
        labels: Label strings in index order; ``None`` for regression.
        metrics: Metric names: ``"accuracy"``, ``"f1"``, ``"mcc"``, ``"pearson"``, ``"spearman"``.
        num_columns: Column count of header-less files (checked on every row).
        test_text_column: Name of the text column in the test file's header when it
            differs from ``text_column`` (CoLA, whose train/dev have no header).
        label_range: Inclusive bounds of a regression target.
    """

    name: str
    files: Mapping[str, str] = field(hash=False)
    header: bool
    text_column: Column
    pair_column: Optional[Column]
    label_column: Column
    labels: Optional[Tuple[str, ...]]
    metrics: Tuple[str, ...]
    num_columns: Optional[int] = None
    test_text_column: Optional[str] = None
    label_range: Optional[Tuple[float, float]] = None

    @property
    def is_regression(self) -> bool:
        """Whether the target is a float score."""
        return self.labels is None

    @property
    def num_labels(self) -> int:
        """Output size of a head: number of classes, or 1 for regression."""
        return 1 if self.labels is None else len(self.labels)

    @property
    def splits(self) -> Tuple[str, ...]:
        """All split names of this task."""
        return tuple(self.files)

    @property
    def dev_splits(self) -> Tuple[str, ...]:
        """The labelled evaluation splits (MNLI has two)."""
        return tuple(s for s in self.files if s.startswith("dev"))


_STD = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
_BINARY, _NLI2 = ("0", "1"), ("entailment", "not_entailment")

GLUE_TASKS: Dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("SST-2", _STD, True, "sentence", None, "label", _BINARY, ("accuracy",)),
    # CoLA train/dev: source, label, original star annotation, sentence; no header.
    GlueTask("CoLA", _STD, False, 3, None, 1, _BINARY, ("mcc",), num_columns=4, test_text_column="sentence"),
    GlueTask("MRPC", _STD, True, "#1 String", "#2 String", "Quality", _BINARY, ("f1", "accuracy")),
    GlueTask("STS-B", _STD, True, "sentence1", "sentence2", "score", None, ("pearson", "spearman"),
             label_range=(0.0, 5.0)),
    GlueTask("QQP", _STD, True, "question1", "question2", "is_duplicate", _BINARY, ("accuracy", "f1")),
    # MNLI dev has label1..label5 before gold_label; only the gold label is used.
    GlueTask("MNLI", {"train": "train.tsv", "dev_matched": "dev_matched.tsv", "dev_mismatched": "dev_mismatched.tsv",
                      "test_matched": "test_matched.tsv", "test_mismatched": "test_mismatched.tsv"},
             True, "sentence1", "sentence2", "gold_label", ("contradiction", "entailment", "neutral"), ("accuracy",)),
    GlueTask("QNLI", _STD, True, "question", "sentence", "label", _NLI2, ("accuracy",)),
    GlueTask("RTE", _STD, True, "sentence1", "sentence2", "label", _NLI2, ("accuracy",)),
    GlueTask("WNLI", _STD, True, "sentence1", "sentence2", "label", _BINARY, ("accuracy",)),
)}


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def get_glue_task(name: Union[str, GlueTask]) -> GlueTask:
    """Look a task up by name, ignoring case, ``-`` and ``_`` (``"sst2"``, ``"STS-B"``, ``"stsb"``)."""
    if isinstance(name, GlueTask):
        return name
    found = {_key(k): t for k, t in GLUE_TASKS.items()}.get(_key(str(name)))
    if found is None:
        raise UnknownNameError(f"unknown GLUE task {name!r}; known: {', '.join(GLUE_TASKS)}")
    return found


def _glue_file(task: GlueTask, path_or_dir: PathLike, split: str) -> Path:
    if split not in task.files:
        raise UserError(f"{task.name} has no split {split!r}; splits: {', '.join(task.files)}")
    path = Path(path_or_dir)
    if path.exists() and not path.is_dir():  # a file, or a FIFO / <(...)
        return path
    # Accept the task folder or the GLUE root that holds it.
    tried = [path / task.files[split], path / task.name / task.files[split]]
    for candidate in tried:
        if candidate.is_file():
            return candidate
    raise MissingFileError(f"{path}: no {task.name} {split} file; tried {', '.join(map(str, tried))}")


#: characters of a label echoed in an error (labels are short words; a longer one is a broken line)
LABEL_QUOTE = 100


def _header(columns: Sequence[str]) -> str:
    """A header row for an error: its columns quoted, each and their number capped (a file that
    is one 20 MB line without newlines is all header)."""
    return "[" + capped_join(quote(c, 60) for c in columns) + "]"


def _resolve(columns: List[str], wanted: Optional[Column], problems: ProblemLog, what: str) -> Optional[int]:
    """Position of a named column in a header row; a missing one ends the read."""
    if wanted is None or isinstance(wanted, int):
        return wanted
    if wanted not in columns:
        raise problems.fatal(1, "missing column", f"no {what} column {wanted!r} in header {_header(columns)}")
    return columns.index(wanted)


def read_glue(task: Union[str, GlueTask], path_or_dir: PathLike, split: str = "dev",
              on_error: str = "raise") -> TextReadResult:
    """Read one split of a GLUE task.

    Args:
        task: A :class:`GlueTask` or its name (see :func:`get_glue_task`).
        path_or_dir: The split's file, the task folder, or the GLUE root folder.
        split: ``"train"``, ``"dev"``, ``"test"`` (MNLI: ``dev_matched`` etc.). Splits
            named ``test*`` are read as unlabelled (header, no label column).
        on_error: ``"raise"`` or ``"skip"`` (see :mod:`ctxkit.data.errors`).

    Returns:
        :class:`TextReadResult` of :class:`TextExample`, with ``labels`` set to the
        task's label strings.

    Raises:
        DataError: Wrong column count, unknown label (the allowed ones are listed), empty
            text, non-numeric or out-of-range score; or a header lacking a needed column.
    """
    task = get_glue_task(task)
    path = _glue_file(task, path_or_dir, split)
    problems = ProblemLog(path, on_error)
    labelled = not split.startswith("test")
    has_header = task.header or not labelled
    text_col: Column = task.text_column
    if not labelled and task.test_text_column:
        text_col = task.test_text_column
    label_index = {s: i for i, s in enumerate(task.labels or ())}
    examples: List[TextExample] = []
    cols = None
    with open_input(path) as fh:
        for line_no, line in iter_lines(fh, problems):
            if cols is None and has_header:
                if line is None:
                    raise problems.fatal(1, "unreadable header")
                header = line.split("\t")
                cols = (len(header), _resolve(header, text_col, problems, "text"),
                        _resolve(header, task.pair_column, problems, "pair"),
                        _resolve(header, task.label_column, problems, "label") if labelled else None)
                continue
            if cols is None:
                cols = (task.num_columns, text_col, task.pair_column, task.label_column)
            if not line:  # undecodable (already reported) or blank: no data here
                continue
            fields = line.split("\t")
            n_cols, ti, pi, li = cols
            if len(fields) != n_cols:
                problems.report(line_no, "wrong column count",
                                f"expected {n_cols} tab-separated columns, found {len(fields)}")
                continue
            text, pair = fields[ti], None if pi is None else fields[pi]
            if not text.strip() or (pair is not None and not pair.strip()):
                problems.report(line_no, "empty text", "first sentence" if not text.strip() else "second sentence")
                continue
            label: Union[int, float, None] = None
            if li is not None:
                raw = fields[li].strip()
                if task.is_regression:
                    label = _score(raw, task.label_range, line_no, problems)
                    if label is None:
                        continue
                elif raw in label_index:
                    label = label_index[raw]
                else:
                    problems.report(line_no, "unknown label", f"{quote(raw, LABEL_QUOTE)}; allowed: {', '.join(task.labels)}")
                    continue
            examples.append(TextExample(text, pair, label, f"{path.name}:{line_no}"))
    if cols is None and has_header:
        raise problems.fatal(1, "missing header", "the file is empty")
    result = TextReadResult(examples, labels=task.labels, is_regression=task.is_regression)
    return problems.finish(result)


def _score(raw: str, bounds: Optional[Tuple[float, float]], line_no: int, problems: ProblemLog) -> Optional[float]:
    """Parse a regression target; reports and returns ``None`` when unusable."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        problems.report(line_no, "non-numeric score", repr(raw))
        return None
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        problems.report(line_no, "score out of range", f"{value} not in [{bounds[0]:g}, {bounds[1]:g}]")
        return None
    return value


# --------------------------------------------------------------------------- user tables

_Row = Tuple[int, str, Optional[str], Optional[str]]  # line, text, pair, raw label


def read_table(path: PathLike, text_column: str = "text", pair_column: Optional[str] = "text_pair",
               label_column: Optional[str] = "label", labels: Optional[Sequence[str]] = None,
               on_error: str = "raise", regression: Optional[bool] = None) -> TextReadResult:
    """Read the user's own labelled or unlabelled text from ``.csv``, ``.tsv`` or ``.jsonl``.

    ``.csv`` uses normal CSV quoting; ``.tsv`` has quoting off (like GLUE); both need a
    header row. ``.jsonl`` holds one JSON object per line. The pair and label columns are
    optional: when the header (or the first JSON object) lacks them, pairs / labels are
    ``None``; once present, every record must have them.

    Labels: with ``labels`` given, each value must be one of them. Otherwise the set is
    inferred: if every value is a number and some are not integers the task is regression
    (float labels, ``result.labels`` is ``None``); else it is classification over the sorted
    unique values (numerically sorted when all are integers, so ``"10"`` follows ``"9"``).

    Args:
        path: The file; its suffix picks the format.
        text_column, pair_column, label_column: Column names / JSON keys; pass ``None``
            to ignore the pair or label column.
        labels: Allowed label strings in index order, or ``None`` to infer them.
        on_error: ``"raise"`` or ``"skip"``.
        regression: Force (``True``) or forbid (``False``) regression instead of inferring.

    Returns:
        :class:`TextReadResult` with ``labels`` and ``is_regression`` set.

    Raises:
        DataError: Naming the line: wrong column count, broken JSON, missing field, empty
            text or label, unknown label, non-numeric regression label.
        ValueError: Unsupported file suffix.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    problems = ProblemLog(path, on_error)
    cols = (text_column, pair_column, label_column)
    if suffix == ".csv":
        rows = _csv_rows(path, cols, problems)
    elif suffix == ".tsv":
        rows = _tsv_rows(path, cols, problems)
    elif suffix == ".jsonl":
        rows = _jsonl_rows(path, cols, problems)
    else:
        raise UserError(f"{path}: unsupported table format {suffix!r}; use .csv, .tsv or .jsonl")
    kept: List[_Row] = []
    for row in rows:
        line_no, text, pair, raw = row
        if not text.strip() or (pair is not None and not pair.strip()):
            problems.report(line_no, "empty text", "first text" if not text.strip() else "second text")
        elif raw is not None and not raw.strip():
            problems.report(line_no, "empty label")
        else:
            kept.append((line_no, text, pair, None if raw is None else raw.strip()))
    raw_labels = [r[3] for r in kept if r[3] is not None]
    if not raw_labels:
        label_list, is_reg = None, False
    elif labels is not None:
        label_list, is_reg = list(labels), False
    else:
        label_list, is_reg = _infer_labels(raw_labels, regression)
    label_index = {s: i for i, s in enumerate(label_list or ())}
    examples = []
    for line_no, text, pair, raw in kept:
        label: Union[int, float, None] = None
        if raw is not None and is_reg:
            label = _score(raw, None, line_no, problems)
            if label is None:
                continue
        elif raw is not None:
            if raw not in label_index:
                problems.report(line_no, "unknown label", f"{quote(raw, LABEL_QUOTE)}; allowed: {capped_join(label_list)}")
                continue
            label = label_index[raw]
        examples.append(TextExample(text, pair, label, f"{path.name}:{line_no}"))
    return problems.finish(TextReadResult(examples, labels=None if is_reg else label_list, is_regression=is_reg))


def _infer_labels(raw_labels: List[str], regression: Optional[bool]) -> Tuple[Optional[List[str]], bool]:
    numbers = []
    for raw in raw_labels:
        try:
            numbers.append(float(raw))
        except ValueError:
            numbers = None
            break
    numeric = numbers is not None and all(math.isfinite(x) for x in numbers)
    if regression is None:
        regression = numeric and any(not x.is_integer() for x in numbers)
    if regression:
        return None, True
    unique = set(raw_labels)
    if numeric and all(x.is_integer() for x in numbers):
        return sorted(unique, key=lambda s: (float(s), s)), False
    return sorted(unique), False


def _header_positions(header: List[str], cols, problems: ProblemLog) -> Tuple[int, Optional[int], Optional[int]]:
    text_col, pair_col, label_col = cols
    if text_col not in header:
        raise problems.fatal(1, "missing column", f"no text column {text_col!r} in header {_header(header)}")

    def find(name):  # pair and label are optional: a table without them is single-text / unlabelled
        return header.index(name) if name is not None and name in header else None

    return header.index(text_col), find(pair_col), find(label_col)


def _pick(fields: List[str], positions) -> Tuple[str, Optional[str], Optional[str]]:
    ti, pi, li = positions
    return fields[ti], None if pi is None else fields[pi], None if li is None else fields[li]


def _tsv_rows(path: Path, cols, problems: ProblemLog):
    header = positions = None
    with open_input(path) as fh:
        for line_no, line in iter_lines(fh, problems):
            if header is None:
                if line is None:
                    raise problems.fatal(1, "unreadable header")
                header = line.split("\t")
                positions = _header_positions(header, cols, problems)
                continue
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != len(header):
                problems.report(line_no, "wrong column count",
                                f"expected {len(header)} tab-separated columns, found {len(fields)}")
                continue
            yield (line_no, *_pick(fields, positions))
    if header is None:
        raise problems.fatal(1, "missing header", "the file is empty")


def _csv_rows(path: Path, cols, problems: ProblemLog):
    with open_input(path) as fh:  # one read: a FIFO cannot be read twice
        data = fh.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        # A quoted field may span lines, so a bad line cannot be skipped safely.
        raise problems.fatal(data[:exc.start].count(b"\n") + 1, "invalid UTF-8") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    header = positions = None
    start = 1
    try:
        for fields in reader:
            line_no, start = start, reader.line_num + 1  # a record may span several lines
            if not fields:
                continue
            if header is None:
                header, positions = fields, _header_positions(fields, cols, problems)
                continue
            if len(fields) != len(header):
                problems.report(line_no, "wrong column count", f"expected {len(header)} columns, found {len(fields)}")
                continue
            yield (line_no, *_pick(fields, positions))
    except csv.Error as exc:
        raise problems.fatal(reader.line_num, "malformed CSV", str(exc)) from None
    if header is None:
        raise problems.fatal(1, "missing header", "the file is empty")


def _json_label(value) -> Optional[str]:
    """JSON label value as the string it is matched by (``1`` -> ``"1"``, ``true`` -> ``"true"``)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    return None


def _jsonl_rows(path: Path, cols, problems: ProblemLog):
    text_col, pair_col, label_col = cols
    present = None  # (has pair, has label), fixed by the first record like a header
    with open(path, "rb") as fh:
        for line_no, line in iter_lines(fh, problems):
            if line is None or not line.strip():
                continue
            try:
                obj = loads_json(line, path, line_no)
            except DataError as exc:
                problems.report(line_no, exc.reason, exc.detail)
                continue
            if not isinstance(obj, dict):
                problems.report(line_no, "not a JSON object", f"got {type(obj).__name__}")
                continue
            if present is None:
                present = (pair_col is not None and pair_col in obj, label_col is not None and label_col in obj)
            needed = [text_col] + [c for c, p in zip((pair_col, label_col), present) if p]
            missing = [c for c in needed if c not in obj]
            if missing:
                problems.report(line_no, "missing field", ", ".join(map(repr, missing)))
                continue
            strings = [obj[text_col]] + ([obj[pair_col]] if present[0] else [])
            if not all(isinstance(s, str) for s in strings):
                problems.report(line_no, "text is not a string")
                continue
            surrogate = next((f"U+{ord(s[i]):04X} at index {i}" for s in strings
                              if (i := lone_surrogate(s)) is not None), None)
            if surrogate:
                problems.report(line_no, "invalid text", f"lone surrogate {surrogate} (not a character)")
                continue
            raw = _json_label(obj[label_col]) if present[1] else None
            if present[1] and raw is None:
                problems.report(line_no, "bad label type", f"{type(obj[label_col]).__name__}")
                continue
            yield (line_no, strings[0], strings[1] if present[0] else None, raw)


def read_sst2(path) -> Tuple[List[str], List[int]]:
    """Sentences and 0/1 labels of a GLUE SST-2 TSV (header ``sentence<TAB>label``, quoting off).

    Raises:
        ValueError: ``"{path}:{line}: ..."`` for a missing column or a bad label.
    """
    check_input(path)
    texts, labels = [], []
    with open(path, encoding="utf-8-sig", newline="") as fh:
        # Quoting off: SST-2 sentences contain unbalanced '"' characters.
        rows = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(rows, None)
        if not header or "sentence" not in header or "label" not in header:
            raise DataError(path, 1, "bad header", f"expected columns 'sentence' and 'label', found {_header(header or [])}")
        s_col, l_col = header.index("sentence"), header.index("label")
        for line_no, row in enumerate(rows, start=2):
            if len(row) != len(header):
                raise DataError(path, line_no, "wrong number of fields", f"expected {len(header)}, found {len(row)}")
            if row[l_col] not in ("0", "1"):
                raise DataError(path, line_no, "bad label", f"expected 0 or 1, found {quote(row[l_col], LABEL_QUOTE)}")
            texts.append(row[s_col])
            labels.append(int(row[l_col]))
    return texts, labels
