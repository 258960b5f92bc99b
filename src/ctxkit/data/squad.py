"""SQuAD v1.1 / v2.0 JSON as flat :class:`QAExample` lists, with every answer offset checked.

Only SQuAD dev files are available in this project, so :func:`split_by_article` carves a
fine-tuning set out of one: articles, not questions, are divided, so no passage is seen
in both halves.
"""

from __future__ import annotations

import io
import os
import random
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

from .errors import DataError, ProblemLog, ReadResult, loads_json, lone_surrogate, open_input
from ..core.errors import UserError, quote

__all__ = ["Answer", "QAExample", "read_squad", "split_by_article"]

PathLike = Union[str, os.PathLike]
_MISSING = object()


@dataclass
class Answer:
    """A reference answer span: ``context[start:start + len(text)] == text``."""

    text: str
    start: int

    @property
    def end(self) -> int:
        """Exclusive end character offset."""
        return self.start + len(self.text)


@dataclass
class QAExample:
    """One question about one paragraph.

    Attributes:
        qid: Question id.
        title: Title of the article the paragraph belongs to.
        question: Question text.
        context: The paragraph.
        answers: Reference answers (several annotators; may repeat). Empty when impossible.
        is_impossible: SQuAD 2.0 unanswerable question.
    """

    qid: str
    title: str
    question: str
    context: str
    answers: List[Answer] = field(default_factory=list)
    is_impossible: bool = False


def _load_json(path: Path):
    """Parse the file (or the single ``.json`` inside a ``.zip``); returns ``(shown_path, document)``."""
    shown = str(path)
    with open_input(path) as fh:  # read once, so a FIFO works too
        data = fh.read()
    if path.suffix.lower() == ".zip":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                members = [n for n in zf.namelist() if n.lower().endswith(".json") and not n.startswith("__MACOSX/")]
                if len(members) != 1:
                    raise DataError(path, "archive", "expected one .json file in the zip", f"found {members}")
                shown = f"{path}/{members[0]}"  # the zipfile.Path spelling of a member
                data = zf.read(members[0])
        except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError,
                ValueError, OSError) as exc:  # corrupt, truncated, encrypted or exotic archives
            if isinstance(exc, DataError):
                raise
            raise DataError(shown, "archive", "unreadable zip file", str(exc) or type(exc).__name__) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(shown, data[:exc.start].count(b"\n") + 1, "invalid UTF-8", exc.reason) from None
    return shown, loads_json(text, shown)


class _Fields:
    """Typed field access that reports a missing or mistyped field for one record."""

    def __init__(self, problems: ProblemLog):
        self.problems = problems

    def get(self, obj, key: str, typ, where: str):
        if not isinstance(obj, dict):
            self.problems.report(where, "bad record", f"expected a JSON object, got {type(obj).__name__}")
            return _MISSING
        if key not in obj:
            self.problems.report(where, "missing field", quote(key))
            return _MISSING
        value = obj[key]
        # bool is an int subclass; an answer_start of true is a data error, not 1.
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            self.problems.report(where, "bad field type", f"{quote(key)} is {type(value).__name__}")
            return _MISSING
        if typ is str and (i := lone_surrogate(value)) is not None:
            self.problems.report(where, "invalid text", f"{quote(key)} has a lone surrogate U+{ord(value[i]):04X} "
                                                        f"at index {i} (not a character)")
            return _MISSING
        return value


def read_squad(path: PathLike, on_error: str = "raise") -> ReadResult:
    """Read a SQuAD v1.1 or v2.0 file (``.json``, or a ``.zip`` holding one ``.json``).

    Each answer must sit at its offset: ``context[answer_start:][:len(text)] == text``.
    v2.0's ``is_impossible`` is kept (its ``plausible_answers`` are ignored); an
    answerable question needs at least one answer, an impossible one none.

    Records are named ``article N / paragraph M / question ID`` (0-based indices into the
    JSON arrays). In skip mode a bad answer is dropped and counted; a question is dropped
    when it is not impossible and no valid answer remains.

    Args:
        path: The file.
        on_error: ``"raise"`` or ``"skip"``.

    Returns:
        :class:`ReadResult` of :class:`QAExample`, in file order.

    Raises:
        DataError: Broken JSON (line and column; in any mode), a missing or mistyped field
            (named), an answer not at its offset (both strings shown), a duplicate id.
    """
    path = Path(path)
    shown, doc = _load_json(path)
    problems = ProblemLog(shown, on_error)
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise problems.fatal("top level", "missing field", "expected an object with a 'data' list")
    fields = _Fields(problems)
    examples: List[QAExample] = []
    seen_ids = set()
    for ai, article in enumerate(doc["data"]):
        where_a = f"article {ai}"
        title, paragraphs = fields.get(article, "title", str, where_a), fields.get(article, "paragraphs", list, where_a)
        if title is _MISSING or paragraphs is _MISSING:
            continue
        for pi, para in enumerate(paragraphs):
            where_p = f"{where_a} / paragraph {pi}"
            context, qas = fields.get(para, "context", str, where_p), fields.get(para, "qas", list, where_p)
            if context is _MISSING or qas is _MISSING:
                continue
            for qi, qa in enumerate(qas):
                qid = qa.get("id") if isinstance(qa, dict) else None
                printable = isinstance(qid, str) and lone_surrogate(qid) is None
                # An id is echoed only when short: the record is named by its place otherwise.
                printable = printable and len(qid) <= 64
                where_q = f"{where_p} / question {qid if printable else f'#{qi}'}"
                example = _question(qa, title, context, where_q, fields, seen_ids)
                if example is not None:
                    examples.append(example)
    return problems.finish(ReadResult(examples), what="questions")


def _question(qa, title: str, context: str, where: str, fields: _Fields, seen_ids: set) -> Optional[QAExample]:
    problems = fields.problems
    qid, question = fields.get(qa, "id", str, where), fields.get(qa, "question", str, where)
    if qid is _MISSING or question is _MISSING:
        return None
    if qid in seen_ids:
        problems.report(where, "duplicate question id")
        return None
    seen_ids.add(qid)
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):
        problems.report(where, "bad field type", f"'is_impossible' is {type(impossible).__name__}")
        return None
    # Unanswerable questions may omit the (then empty) answer list.
    raw_answers = fields.get(qa, "answers", list, where) if "answers" in qa or not impossible else []
    if raw_answers is _MISSING:
        return None
    answers = []
    for k, ans in enumerate(raw_answers):
        text, start = fields.get(ans, "text", str, where), fields.get(ans, "answer_start", int, where)
        if text is _MISSING or start is _MISSING:
            continue
        found = context[start:start + len(text)] if start >= 0 else ""
        if not text or found != text:
            problems.report(where, "answer not at its offset",
                            f"answer {k} {quote(text, 40)} at answer_start {start}, but the context there is {quote(found, 40)}")
            continue
        answers.append(Answer(text, start))
    if impossible and answers:
        problems.report(where, "impossible question with answers", f"{len(answers)} answers")
        return None
    if not impossible and not answers:
        problems.report(where, "question without a valid answer" if raw_answers else "no answers")
        return None
    return QAExample(qid, title, question, context, answers, impossible)


def split_by_article(examples: Sequence[QAExample], dev_fraction: float = 0.2,
                     seed: Optional[int] = 0) -> Tuple[List[QAExample], List[QAExample]]:
    """Split questions into train/dev by article title, so no article is in both.

    ``round(num_articles * dev_fraction)`` articles go to dev. With a ``seed`` they are
    drawn by a seeded shuffle; with ``seed=None`` the last articles in file order are
    taken, which is this project's protocol (SQuAD v1.1 dev: ``dev_fraction=10/48``
    leaves 38 articles / 8,582 questions for training; the CS224N v2.0 file:
    ``dev_fraction=0.25``). Question order within each half is the input order.

    Args:
        examples: Questions, e.g. from :func:`read_squad`.
        dev_fraction: Share of articles for dev, in ``[0, 1]``.
        seed: Shuffle seed, or ``None`` for file order.

    Returns:
        ``(train, dev)`` lists of the same example objects.
    """
    if not 0.0 <= dev_fraction <= 1.0:
        raise UserError(f"dev_fraction must be in [0, 1], got {dev_fraction}")
    titles = list(dict.fromkeys(e.title for e in examples))
    n_dev = round(len(titles) * dev_fraction)
    if seed is None:
        dev_titles = set(titles[len(titles) - n_dev:])
    else:
        order = titles[:]
        random.Random(seed).shuffle(order)
        dev_titles = set(order[:n_dev])
    train = [e for e in examples if e.title not in dev_titles]
    dev = [e for e in examples if e.title in dev_titles]
    return train, dev
