"""Property-based tests (hypothesis) for every reader and the tokenizers.

The contract: whatever bytes or structure a file holds, a reader either returns examples of
the documented shape or raises :class:`ctxkit.data.DataError` (``PATH:LINE: reason``) or
another :class:`ctxkit.core.errors.UserError` whose one-line message starts with the path;
never another exception, never a hang. Valid generated files read back exactly.

Inputs are arbitrary bytes, and real rows (from ``shared/data``) or generated valid files
with random mutations: inserted tabs, quotes, newlines, ``\\r``, NUL, BOMs, invalid UTF-8,
deleted spans, truncation. Every run draws the same examples (``derandomize``), so CI is
reproducible.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import lzma
import os
import re
import tempfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkit.core.errors import MissingFileError, UserError
from ctxkit.data import DataError, read_conll, read_glue, read_squad, read_table
from ctxkit.models.static.io import read_corpus, read_vectors, write_vectors
from ctxkit.pretraining.corpus import FORMATS as DOC_FORMATS
from ctxkit.pretraining.corpus import read_documents
from ctxkit.tasks.translation import read_parallel
from ctxkit.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer, read_lines

# CI must be reproducible: the same examples every run, no example database.
PROPS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                        HealthCheck.filter_too_much])
FEW = settings(PROPS, max_examples=30)

# Byte sequences that break naive readers.
NASTY = [b"\t", b",", b'"', b"'", b"\n", b"\r", b"\r\n", b"\n\n", b"\x00", b"\xef\xbb\xbf", b"\xff", b"\xc3",
         b"\xed\xa0\x80", b"{", b"}", b"[", b"]", b":", b"\\", b" ", b"-DOCSTART- -X- O", b"\\ud800", b"1e999",
         b"NaN", b"-1", b"\xe2\x80\xa8", b"\xc2\x85", b"\x0c", b"\x1c", b"<doc id=1>", b"</doc>", b'"text"',
         b"99999999999999999999", b"[" * 40, b"\xfd\x37\x7a\x58\x5a\x00",
         b"[" * 3000, b"{\"a\":" * 1500, b"7" * 4400,  # deeper than Python's recursion limit; too many digits
         b"4e38", b"\xc2\xb2"]  # beyond float32 (but not float64); a digit int() refuses


# --------------------------------------------------------------------------- helpers


def outcome(fn, *args, timeout: float = 10.0, **kwargs):
    """Run ``fn``; return ``(result, None)`` or ``(None, user_error)``.

    Any other exception fails the test, and so does running past ``timeout`` (a hang).
    """
    box = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - sorted below
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)} did not finish within {timeout}s"
    exc = box.get("error")
    if exc is None:
        return box["value"], None
    if not isinstance(exc, UserError):
        raise AssertionError(f"raised {type(exc).__name__} instead of a UserError: {exc}") from exc
    return None, exc


def check_error(exc: UserError, path, num_lines: int | None = None) -> None:
    """The documented error: one printable line starting with the path, ``PATH:WHERE: `` for DataError."""
    msg = str(exc)
    assert "\n" not in msg, msg
    msg.encode("utf-8")  # printable: no lone surrogates from the data
    assert msg.startswith(str(path)), msg
    if isinstance(exc, DataError):
        assert exc.path.startswith(str(path))
        assert msg.startswith(f"{exc.path}:{exc.where}: {exc.reason}"), msg
        if isinstance(exc.where, int):
            assert 1 <= exc.where <= (num_lines if num_lines is not None else exc.where), msg


def lines_in(data: bytes) -> int:
    return data.count(b"\n") + 1


@contextlib.contextmanager
def files(*named):
    """Write ``(name, bytes)`` pairs into a fresh folder; yields their paths."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name, data in named:
            path = Path(tmp) / name
            path.write_bytes(data)
            paths.append(path)
        yield paths


@st.composite
def mutated(draw, base: bytes, max_edits: int = 4):
    """``base`` with a few random edits: nasty bytes inserted or swapped in, spans dropped or
    duplicated, the tail cut off."""
    data = bytearray(base)
    for _ in range(draw(st.integers(0, max_edits))):
        kind = draw(st.sampled_from(["insert", "insert", "replace", "delete", "duplicate", "truncate"]))
        pos = draw(st.integers(0, len(data)))
        if kind == "insert":
            data[pos:pos] = draw(st.sampled_from(NASTY) | st.binary(min_size=1, max_size=3))
        elif kind == "replace":
            data[pos:pos + 1] = draw(st.sampled_from(NASTY))
        elif kind == "delete":
            del data[pos:pos + draw(st.integers(1, 12))]
        elif kind == "duplicate":
            end = min(len(data), pos + draw(st.integers(1, 40)))
            data[end:end] = data[pos:end]
        else:
            del data[pos:]
    return bytes(data)


# JSON values Python parses differently or not at all: too deep, too many digits, a lone
# surrogate escape, non-finite numbers.
RAW_JSON = ["[" * 3000 + "]" * 3000, "7" * 4400, '"\\ud800"', '"a\\udc80b"', "1e999", "-1e999", "NaN", "-0", "1.5",
            "true", "null", "{}", "[]", '""', '" "']


@st.composite
def json_with_raw_value(draw, doc, ensure_ascii=True):
    """``json.dumps(doc)`` with one value (or the whole document) swapped for a raw literal of RAW_JSON."""
    doc = json.loads(json.dumps(doc))
    spots = list(nodes(doc))
    raw = draw(st.sampled_from(RAW_JSON))
    if not spots or draw(st.integers(0, 9)) == 0:
        return raw.encode()
    parent, key = draw(st.sampled_from(spots))
    parent[key] = "@@RAW@@"
    return json.dumps(doc, ensure_ascii=ensure_ascii).replace('"@@RAW@@"', raw, 1).encode()


def arbitrary_or_mutated(base: bytes):
    return st.one_of(st.binary(max_size=200), mutated(base), st.just(b""), st.just(base.split(b"\n")[0] + b"\n"))


# Text without lone surrogates (what a UTF-8 file can hold) and without line breaks.
line_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\n\r\ufeff"), max_size=12)
nonblank = line_text.filter(lambda t: t.strip())


@pytest.fixture(scope="module")
def seeds(shared_data):
    """A few real rows of each format, to mutate (read from shared/data, never copied into the repo)."""

    def head(path, n):
        with open(path, "rb") as fh:
            return b"".join(fh.readline() for _ in range(n))

    glue = shared_data / "glue"
    with zipfile.ZipFile(shared_data / "squad_v1.1" / "dev-v1.1.json.zip") as zf:
        squad = json.loads(zf.read(next(n for n in zf.namelist() if n.endswith(".json"))))
    article = squad["data"][0]
    para = dict(article["paragraphs"][0], qas=article["paragraphs"][0]["qas"][:3])
    small_squad = {"version": "1.1", "data": [{"title": article["title"], "paragraphs": [para]}]}
    with lzma.open(shared_data / "wikipedia-en-extract" / "AA" / "wiki_00.xz", "rb") as fh:
        wiki = b"".join(fh.readline() for _ in range(12))
        wiki += b"</doc>\n" if not wiki.rstrip().endswith(b"</doc>") else b""
    return {
        "SST-2": head(glue / "SST-2" / "dev.tsv", 5), "CoLA": head(glue / "CoLA" / "dev.tsv", 4),
        "STS-B": head(glue / "STS-B" / "dev.tsv", 4), "MRPC": head(glue / "MRPC" / "dev.tsv", 4),
        "SST-2-test": head(glue / "SST-2" / "test.tsv", 4),
        "conll": head(shared_data / "conll2003" / "valid.txt", 30),
        "squad": json.dumps(small_squad, indent=1).encode(),
        "wiki": wiki,
        "de": head(shared_data / "multi30k" / "train.de", 4), "en": head(shared_data / "multi30k" / "train.en", 4),
    }


# --------------------------------------------------------------------------- plain text lines


def expected_lines(data: bytes):
    """What read_lines documents: UTF-8 lines, a leading BOM and the line ends dropped."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    raw = data.split(b"\n")
    if raw[-1] == b"":
        raw.pop()
    return [r.decode("utf-8").rstrip("\r") for r in raw]


def first_bad_line(data: bytes) -> int:
    for i, raw in enumerate(data.split(b"\n"), 1):
        try:
            (raw[3:] if i == 1 and raw.startswith(b"\xef\xbb\xbf") else raw).decode("utf-8")
        except UnicodeDecodeError:
            return i
    raise AssertionError("all lines decode")


@PROPS
@given(data=st.binary(max_size=120) | st.lists(st.sampled_from(NASTY + [b"abc", "é".encode()]), max_size=12).map(b"".join),
       compress=st.sampled_from(["", ".xz", ".gz"]))
def test_read_lines_gives_the_file_lines_or_names_the_bad_line(data, compress):
    packed = {"": data, ".xz": lzma.compress(data) if compress == ".xz" else b"",
              ".gz": gzip.compress(data) if compress == ".gz" else b""}[compress]
    with files((f"t.txt{compress}", packed)) as (path,):
        got, err = outcome(lambda: list(read_lines(path)))
    try:
        want = expected_lines(data)
    except UnicodeDecodeError:
        assert isinstance(err, DataError) and err.where == first_bad_line(data) and "invalid UTF-8" in str(err)
        check_error(err, path, lines_in(data))
        return
    assert err is None and got == want


@FEW
@given(data=st.binary(min_size=1, max_size=80), cut=st.integers(1, 200), kind=st.sampled_from([".xz", ".gz"]))
def test_corrupt_or_truncated_compressed_text_is_named(data, cut, kind):
    packed = (lzma.compress if kind == ".xz" else gzip.compress)(data)
    packed = packed[: min(cut, len(packed) - 1)]
    with files((f"c.txt{kind}", packed)) as (path,):
        got, err = outcome(lambda: list(read_lines(path)))
    assert got is None and isinstance(err, DataError), "a cut stream must not read as complete"
    check_error(err, path, lines_in(data) + 1)


# --------------------------------------------------------------------------- user tables (.csv/.tsv/.jsonl)


def check_table(res, path, num_lines):
    assert len(res) + res.num_skipped >= 0 and res.path == str(path)
    for ex in res:
        assert isinstance(ex.text, str) and ex.text.strip()
        assert ex.text_pair is None or (isinstance(ex.text_pair, str) and ex.text_pair.strip())
        (ex.text + (ex.text_pair or "")).encode("utf-8")  # real text: no lone surrogates from "\ud800"
        if res.is_regression:
            assert res.labels is None and isinstance(ex.label, float) and np.isfinite(ex.label)
        elif ex.label is not None:
            assert res.labels is not None and 0 <= ex.label < len(res.labels)
        name, line = ex.guid.rsplit(":", 1)
        assert name == path.name and 1 <= int(line) <= num_lines


@PROPS
@given(suffix=st.sampled_from([".csv", ".tsv", ".jsonl"]), on_error=st.sampled_from(["raise", "skip"]), data=st.data())
def test_read_table_on_any_bytes(suffix, on_error, data):
    base = {".csv": b'text,label\n"a, b",pos\nc,neg\n', ".tsv": b"text\tlabel\na b\tpos\nc\tneg\n",
            ".jsonl": b'{"text": "a", "label": "pos"}\n{"text": "b", "text_pair": "c", "label": 1}\n'}[suffix]
    _table_parses_or_names_the_line("t" + suffix, data.draw(arbitrary_or_mutated(base)), on_error)


@PROPS
@given(on_error=st.sampled_from(["raise", "skip"]), labels=st.lists(st.sampled_from(["x", 1, 2.5, True]), min_size=1,
                                                                   max_size=3), data=st.data())
def test_read_table_jsonl_with_odd_json_values(on_error, labels, data):
    records = [{"text": "a", "text_pair": "b", "label": y} for y in labels]
    raw = b"".join(data.draw(st.one_of(json_with_raw_value(r), st.just(json.dumps(r).encode()))) + b"\n"
                   for r in records)
    _table_parses_or_names_the_line("t.jsonl", raw, on_error)


def _table_parses_or_names_the_line(name: str, raw: bytes, on_error: str) -> None:
    with files((name, raw)) as (path,):
        res, err = outcome(read_table, path, on_error=on_error)
    if err is not None:
        check_error(err, path, lines_in(raw))
    else:
        check_table(res, path, lines_in(raw))


@PROPS
@given(suffix=st.sampled_from([".csv", ".tsv", ".jsonl"]),
       rows=st.lists(st.tuples(st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=15),
                               st.sampled_from(["neg", "pos", "neutral"])), min_size=1, max_size=6),
       ascii_json=st.booleans())
def test_read_table_reads_back_what_was_written(suffix, rows, ascii_json):
    if suffix == ".tsv":  # no quoting: a text cannot hold a tab or a line break
        rows = [(re.sub(r"[\t\r\n]", " ", t), y) for t, y in rows]
    rows = [(t, y) for t, y in rows if t.strip()]
    if suffix == ".csv":
        buf = io.StringIO(newline="")
        csv.writer(buf).writerows([("text", "label"), *rows])
        raw = buf.getvalue().encode()
    elif suffix == ".tsv":
        raw = "".join(f"{t}\t{y}\n" for t, y in [("text", "label"), *rows]).encode()
    else:
        raw = "".join(json.dumps({"text": t, "label": y}, ensure_ascii=ascii_json) + "\n" for t, y in rows).encode()
    with files(("t" + suffix, raw)) as (path,):
        res, err = outcome(read_table, path)
    if not rows:
        assert err is None and len(res) == 0
        return
    assert err is None, err
    assert [(e.text, res.labels[e.label]) for e in res] == rows
    assert res.labels == sorted({y for _, y in rows}) and not res.skipped


# --------------------------------------------------------------------------- GLUE


GLUE_CASES = [("SST-2", "dev", "SST-2"), ("CoLA", "dev", "CoLA"), ("STS-B", "dev", "STS-B"), ("MRPC", "dev", "MRPC"),
              ("SST-2", "test", "SST-2-test")]


@PROPS
@given(case=st.sampled_from(GLUE_CASES), on_error=st.sampled_from(["raise", "skip"]), data=st.data())
def test_read_glue_on_mutated_real_rows(seeds, case, on_error, data):
    from ctxkit.data import get_glue_task

    task_name, split, seed = case
    task = get_glue_task(task_name)
    raw = data.draw(arbitrary_or_mutated(seeds[seed]))
    with files((f"{split}.tsv", raw)) as (path,):
        res, err = outcome(read_glue, task_name, path, split, on_error=on_error)
    if err is not None:
        check_error(err, path, lines_in(raw))
        return
    for ex in res:
        assert isinstance(ex.text, str) and ex.text.strip()
        assert (ex.text_pair is None) == (task.pair_column is None)
        if split == "test":
            assert ex.label is None
        elif task.is_regression:
            assert 0.0 <= ex.label <= 5.0
        else:
            assert ex.label in range(len(task.labels))
        assert 1 <= int(ex.guid.rsplit(":", 1)[1]) <= lines_in(raw)


@PROPS
@given(rows=st.lists(st.tuples(nonblank.map(lambda t: t.replace("\t", " ")).filter(str.strip), st.sampled_from("01")),
                     max_size=6))
def test_read_glue_reads_back_generated_sst2(rows):
    raw = "".join(f"{t}\t{y}\n" for t, y in [("sentence", "label"), *rows]).encode()
    with files(("dev.tsv", raw)) as (path,):
        res, err = outcome(read_glue, "SST-2", path, "dev")
    assert err is None, err
    assert [(e.text, str(e.label)) for e in res] == rows and [e.guid for e in res] == [
        f"dev.tsv:{i}" for i in range(2, len(rows) + 2)]


# --------------------------------------------------------------------------- CoNLL


TAG = re.compile(r"O|[BI]-\S+")


@st.composite
def bio_sentences(draw):
    word = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=6).filter(
        lambda w: not any(c.isspace() for c in w) and "\ufeff" not in w and w != "-DOCSTART-")
    sentences = []
    for _ in range(draw(st.integers(0, 4))):
        tags, prev = [], "O"
        for _ in range(draw(st.integers(1, 5))):
            options = ["O", "B-PER", "B-LOC"] + ([f"I-{prev[2:]}"] if prev != "O" else [])
            prev = draw(st.sampled_from(options))
            tags.append(prev)
        words = [draw(word) for _ in tags]
        sentences.append((words, tags, draw(st.booleans())))  # bool: a -DOCSTART- before it
    return sentences


@PROPS
@given(sentences=bio_sentences(), crlf=st.booleans())
def test_read_conll_reads_back_generated_sentences(sentences, crlf):
    end = "\r\n" if crlf else "\n"
    out, docs, started = [], 0, False
    for words, tags, docstart in sentences:
        if docstart:
            out.append(f"-DOCSTART- -X- -X- O{end}{end}")
            docs += started
            started = True
        out.append("".join(f"{w} NN B-NP {t}{end}" for w, t in zip(words, tags)) + end)
        started = True
    raw = "".join(out).encode()
    with files(("c.txt", raw)) as (path,):
        res, err = outcome(read_conll, path, scheme="bio")
    assert err is None, err
    assert [(s.words, s.tags) for s in res] == [(w, t) for w, t, _ in sentences]
    assert res.num_documents == (docs + 1 if started else 0) and res.source_scheme == "bio"


@PROPS
@given(scheme=st.sampled_from(["auto", "bio", "iob1"]), on_error=st.sampled_from(["raise", "skip"]), data=st.data())
def test_read_conll_on_mutated_real_lines(seeds, scheme, on_error, data):
    line = st.builds(lambda cols: " ".join(cols) + "\n", st.lists(
        st.sampled_from(["EU", "rejects", "O", "B-ORG", "I-ORG", "I-PER", "B-", "X", "-DOCSTART-", "\t", "ü"]),
        max_size=5))
    raw = data.draw(st.one_of(arbitrary_or_mutated(seeds["conll"]), st.lists(line, max_size=12).map(
        lambda ls: "".join(ls).encode())))
    with files(("c.txt", raw)) as (path,):
        res, err = outcome(read_conll, path, scheme=scheme, on_error=on_error)
    if err is not None:
        check_error(err, path, lines_in(raw))
        return
    for sent in res:  # output is always well-formed BIO
        assert sent.words and len(sent.words) == len(sent.tags)
        assert all(TAG.fullmatch(t) for t in sent.tags) and all(w and not w.isspace() for w in sent.words)
        prev = "O"
        for t in sent.tags:
            assert not t.startswith("I-") or prev[2:] == t[2:], sent.tags
            prev = t
        assert 1 <= int(sent.guid.rsplit(":", 1)[1]) <= lines_in(raw)


# --------------------------------------------------------------------------- SQuAD


@st.composite
def squad_docs(draw):
    text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
    data, qid = [], 0
    for _ in range(draw(st.integers(0, 2))):
        paragraphs = []
        for _ in range(draw(st.integers(0, 2))):
            context = draw(text.filter(bool))
            qas = []
            for _ in range(draw(st.integers(0, 2))):
                answers = []
                for _ in range(draw(st.integers(1, 2))):
                    start = draw(st.integers(0, len(context) - 1))
                    end = draw(st.integers(start + 1, len(context)))
                    answers.append({"text": context[start:end], "answer_start": start})
                qas.append({"id": f"q{qid}", "question": draw(text), "answers": answers})
                qid += 1
            paragraphs.append({"context": context, "qas": qas})
        data.append({"title": draw(text), "paragraphs": paragraphs})
    return {"version": "1.1", "data": data}


@PROPS
@given(doc=squad_docs(), ascii_json=st.booleans(), as_zip=st.booleans())
def test_read_squad_reads_back_generated_documents(doc, ascii_json, as_zip):
    raw = json.dumps(doc, ensure_ascii=ascii_json).encode()
    if as_zip:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr("inner/dev.json", raw)
        raw = buf.getvalue()
    with files(("s.zip" if as_zip else "s.json", raw)) as (path,):
        res, err = outcome(read_squad, path)
    assert err is None, err
    want = [(q["id"], a["title"], q["question"], p["context"], [(x["text"], x["answer_start"]) for x in q["answers"]])
            for a in doc["data"] for p in a["paragraphs"] for q in p["qas"]]
    assert [(e.qid, e.title, e.question, e.context, [(x.text, x.start) for x in e.answers]) for e in res] == want


json_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 10**30) | st.floats() |
                           st.text(max_size=5) | st.just("\ud800"),
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
                           max_leaves=6)


def nodes(value):
    """Every (container, key) position in a JSON tree."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield value, k
            yield from nodes(v)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield value, i
            yield from nodes(v)


@PROPS
@given(doc=squad_docs(), on_error=st.sampled_from(["raise", "skip"]), data=st.data())
def test_read_squad_on_mutated_structure(seeds, doc, on_error, data):
    doc = data.draw(st.sampled_from([doc, json.loads(seeds["squad"])]))
    for _ in range(data.draw(st.integers(1, 3))):
        spots = list(nodes(doc))
        if not spots:
            break
        parent, key = data.draw(st.sampled_from(spots))
        if isinstance(parent, dict) and data.draw(st.booleans()):
            del parent[key]
        elif key in ("answer_start",) and data.draw(st.booleans()):
            parent[key] += data.draw(st.integers(-3, 3))
        else:
            parent[key] = data.draw(json_values)
    raw = json.dumps(doc, ensure_ascii=data.draw(st.booleans())).encode("utf-8", "surrogatepass")
    if data.draw(st.booleans()):
        raw = data.draw(st.one_of(mutated(raw, max_edits=2), json_with_raw_value(doc)))
    with files(("s.json", raw)) as (path,):
        res, err = outcome(read_squad, path, on_error=on_error)
    if err is not None:
        check_error(err, path, lines_in(raw))
        return
    assert len({e.qid for e in res}) == len(res)
    for ex in res:
        assert all(isinstance(x, str) for x in (ex.qid, ex.title, ex.question, ex.context))
        (ex.qid + ex.title + ex.question + ex.context).encode("utf-8")  # no lone surrogates
        assert bool(ex.answers) != ex.is_impossible
        for a in ex.answers:
            assert a.text and ex.context[a.start:a.end] == a.text


@FEW
@given(raw=st.binary(max_size=120), suffix=st.sampled_from([".json", ".zip"]), member=st.booleans())
def test_read_squad_on_any_bytes_and_broken_zips(raw, suffix, member):
    if suffix == ".zip" and member:  # a real zip around garbage, or a damaged real zip
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("dev.json", raw)
        raw = buf.getvalue()[: len(buf.getvalue()) - (len(raw) % 7)]
    with files(("s" + suffix, raw)) as (path,):
        res, err = outcome(read_squad, path)
    if err is not None:
        check_error(err, path, None)
    else:
        assert isinstance(res, list)


def test_json_errors_do_not_say_at_at(tmp_path):
    """Regression: ``Unterminated string starting at at column``."""
    table = tmp_path / "t.jsonl"
    table.write_text('{"text": "ok"}\n{"text": "no end\n')
    with pytest.raises(DataError) as info:
        read_table(table)
    assert str(info.value) == f"{table}:2: invalid JSON: Unterminated string starting at column 10"
    squad = tmp_path / "s.json"
    squad.write_text('{"data": [\n {"title": "x\u0001"}]}')
    with pytest.raises(DataError) as info:
        read_squad(squad)
    assert str(info.value) == f"{squad}:2: invalid JSON: Invalid control character at column 14"
    assert " at at " not in str(info.value)


# --------------------------------------------------------------------------- parallel text


@PROPS
@given(pairs=st.lists(st.tuples(line_text, line_text), max_size=6), data=st.data())
def test_read_parallel_pairs_lines_or_names_the_file(seeds, pairs, data):
    src = "".join(s + "\n" for s, _ in pairs).encode()
    tgt = "".join(t + "\n" for _, t in pairs).encode()
    garbled = data.draw(st.booleans())
    if garbled:
        src, tgt = data.draw(arbitrary_or_mutated(seeds["de"])), data.draw(arbitrary_or_mutated(seeds["en"]))
    with files(("a.de", src), ("a.en", tgt)) as (sp, tp):
        res, err = outcome(read_parallel, sp, tp)
    if not garbled:
        one_sided = [i for i, (s, t) in enumerate(pairs, 1) if bool(s.strip()) != bool(t.strip())]
        if one_sided:
            i = one_sided[0]
            side = sp if not pairs[i - 1][0].strip() else tp
            assert err is not None and str(err).startswith(f"{side}:{i}: empty line"), err
        else:
            assert err is None and res == [(s.strip(), t.strip()) for s, t in pairs if s.strip()]
        return
    if err is not None:
        assert str(err).startswith((str(sp), str(tp))) and "\n" not in str(err)
    else:
        assert all(s and t and s == s.strip() and t == t.strip() for s, t in res)


# --------------------------------------------------------------------------- corpora


@PROPS
@given(fmt=st.sampled_from(DOC_FORMATS), compress=st.booleans(), data=st.data())
def test_read_documents_on_mutated_corpora(seeds, fmt, compress, data):
    line = st.sampled_from(["<doc id=1 title=a>", "</doc>", "Title", "Some text.", "", "  ", "<doc ", "x</doc>"])
    raw = data.draw(st.one_of(arbitrary_or_mutated(seeds["wiki"]),
                              st.lists(line, max_size=10).map(lambda ls: "\n".join(ls).encode())))
    name, packed = ("c.txt.xz", lzma.compress(raw)) if compress else ("c.txt", raw)
    with files((name, packed)) as (path,):
        docs, err = outcome(lambda: list(read_documents(path, fmt)))
    if err is not None:
        check_error(err, path, lines_in(raw))
        return
    for doc in docs:
        assert doc and all(isinstance(x, str) and x and x == x.strip() for x in doc)
    if fmt == "file" or (fmt in ("blank", "auto") and not raw.startswith(b"<doc ")):
        want = [ln.strip() for ln in expected_lines(raw) if ln.strip()]
        assert [x for d in docs for x in d] == want and (fmt != "file" or len(docs) <= 1)


@PROPS
@given(docs=st.lists(st.tuples(st.text("abc XYZ", min_size=1, max_size=5),
                               st.lists(nonblank.filter(lambda t: not t.startswith("<doc ") and t.strip() != "</doc>"),
                                        max_size=3)), max_size=4))
def test_read_documents_reads_back_wikiextractor_blocks(docs):
    raw = "".join(f'<doc id="{i}" url="u" title="{t}">\n{t}\n' + "".join(b + "\n" for b in body) + "</doc>\n"
                  for i, (t, body) in enumerate(docs)).encode()
    with files(("w.txt", raw)) as (path,):
        got, err = outcome(lambda: list(read_documents(path)))
    assert err is None, err
    assert got == [[b.strip() for b in body] for _, body in docs if body]


@FEW
@given(data=st.data())
def test_word_level_lm_readers(seeds, data):
    from ctxkit.pretraining.bilm import build_vocab, corpus_stream
    from ctxkit.pretraining.xl_lm import EOS, UNK, build_xl_vocab, xl_stream

    raw = data.draw(arbitrary_or_mutated(seeds["en"]))
    with files(("lm.txt", raw)) as (path,):
        vocab, err = outcome(build_xl_vocab, [path])
        if err is not None:
            assert str(err) == f"no text in {path}" if raw == b"" else check_error(err, path, lines_in(raw)) is None
        else:
            assert EOS in vocab and UNK in vocab and len(set(vocab)) == len(vocab)
            stream, err = outcome(xl_stream, [path], vocab)
            if err is None:
                assert len(stream) == len(expected_lines(raw)) + sum(len(x.split()) for x in expected_lines(raw))
        words, err = outcome(build_vocab, [path])
        if err is not None:
            check_error(err, path, lines_in(raw))
        else:
            stream, err = outcome(corpus_stream, [path], words)
            assert err is None or str(err).startswith("no text in")
            assert err is None or not any(x.split() for x in expected_lines(raw))


# --------------------------------------------------------------------------- word vectors


def check_vectors(res):
    words, matrix, _ = res
    assert len(set(words)) == len(words) and all(isinstance(w, str) and w for w in words)
    assert matrix.dtype == np.float32 and matrix.ndim == 2 and matrix.shape[0] == len(words)
    assert np.isfinite(matrix).all()


@PROPS
@given(suffix=st.sampled_from([".txt", ".vec", ".bin", ".npz", ".txt.gz", ".dat"]), data=st.data())
def test_read_vectors_on_any_bytes(suffix, data):
    words, matrix = ["the", "köln", "a\xa0b"], np.arange(6, dtype=np.float32).reshape(3, 2) / 3
    with tempfile.TemporaryDirectory() as tmp:
        good = write_vectors(Path(tmp) / f"good{suffix if suffix != '.dat' else '.txt'}", words, matrix, progress=False)
        base = good.read_bytes()
    raw = data.draw(st.one_of(st.binary(max_size=120), mutated(base), st.just(b""),
                              st.just(b"99999999999 99999999999\n"), st.just(b"3 1000000000000\nx ")))
    with files(("v" + suffix, raw)) as (path,):
        res, err = outcome(read_vectors, path, progress=False)
    if err is not None:
        check_error(err, path, None)
    else:
        check_vectors(res)


@PROPS
@given(words=st.lists(st.text(st.characters(exclude_categories=["Cs"], exclude_characters=" \t\n\r\x0b\x0c\ufeff"),
                              min_size=1, max_size=6), min_size=1, max_size=5, unique=True),
       dim=st.integers(1, 4), fmt=st.sampled_from(["glove", "word2vec", "word2vec-binary", "npz", None]),
       data=st.data())
def test_read_vectors_reads_back_what_was_written(words, dim, fmt, data):
    matrix = np.array(data.draw(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False),
                                         min_size=len(words) * dim, max_size=len(words) * dim)),
                      dtype=np.float32).reshape(len(words), dim)
    suffix = {"glove": ".txt", "word2vec": ".vec", "word2vec-binary": ".bin", "npz": ".npz", None: ".txt"}[fmt]
    if fmt is None and dim == 1:  # "12 3" is both a header and a one-dimensional GloVe line
        fmt = "glove"
    with tempfile.TemporaryDirectory() as tmp:
        path, err = outcome(write_vectors, Path(tmp) / f"v{suffix}", words, matrix, format=fmt, progress=False)
        if err is not None:  # only words a format cannot hold are refused
            assert fmt == "npz" and "\x00" in str(err)
            return
        res, err = outcome(read_vectors, path, format=fmt, progress=False)
    assert err is None, err
    assert res[0] == words and np.array_equal(res[1], matrix)


@FEW
@given(data=st.data())
def test_read_corpus_on_any_bytes(seeds, data):
    raw = data.draw(arbitrary_or_mutated(seeds["en"]))
    with files(("c.txt", raw)) as (path,):
        got, err = outcome(lambda: list(read_corpus(path)))
    if err is not None:
        check_error(err, path, lines_in(raw))
    else:
        assert got == [ln.split() for ln in expected_lines(raw) if ln.split()]


# --------------------------------------------------------------------------- tokenizers


@pytest.fixture(scope="module")
def wordpiece():
    from ctxkit.zoo import resolve_checkpoint

    try:
        folder, _ = resolve_checkpoint("all_minilm_l6_v2", verify=False)
    except UserError as exc:
        pytest.skip(str(exc))
    return WordPieceTokenizer.from_dir(folder)


@pytest.fixture(scope="module")
def bpe(shared_data):
    lines = [ln for ln in read_lines(shared_data / "multi30k" / "train.en")][:300]
    return ByteLevelBPETokenizer.train(iter(lines), vocab_size=400, show_progress=False)


# Any str: lone surrogates, control characters, combining marks, ligatures, long runs.
any_text = st.one_of(
    st.text(st.characters(), max_size=40),
    st.text(st.characters(categories=["Cs", "Cc", "Mn", "Zs", "Lo"]), max_size=20),
    st.text("aé ﬁİß\u0301\x00\t\n[]#", max_size=30),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "é", "\u0301", " ", "\ud800", "東", "\U0001F600"]),
              st.integers(50, 3000)),
)


def has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def check_encoding(enc, text, vocab_size, max_length):
    n = len(enc.input_ids)
    assert n <= max_length
    assert len(enc.offsets) == len(enc.tokens) == len(enc.token_type_ids) == len(enc.attention_mask) == n
    assert all(0 <= i < vocab_size for i in enc.input_ids)
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    starts = [s for (s, e), w in zip(enc.offsets, enc.word_ids) if w is not None]
    assert starts == sorted(starts)
    for (s, e), w in zip(enc.offsets, enc.word_ids):
        if w is not None:
            assert 0 <= s < e <= len(text), (s, e, len(text))


@PROPS
@given(text=any_text, max_length=st.sampled_from([8, 512]))
def test_wordpiece_encodes_any_str_or_names_it(wordpiece, text, max_length):
    enc, err = outcome(wordpiece.encode, text, max_length=max_length)
    if has_surrogate(text):
        assert err is not None and "lone surrogate" in str(err) and str(err).startswith("text")
        return
    assert err is None, err
    check_encoding(enc, text, wordpiece.vocab_size, max_length)
    full = wordpiece.encode(text, max_length=10**6)
    assert enc.num_truncated == len(full) - len(enc)
    if not enc.num_truncated:
        assert enc.input_ids == full.input_ids


@FEW
@given(texts=st.lists(any_text.filter(lambda t: len(t) < 200), min_size=1, max_size=4), pairs=st.booleans())
def test_wordpiece_batch_equals_single_encodes(wordpiece, texts, pairs):
    second = texts[::-1] if pairs else None
    got, err = outcome(wordpiece.encode_batch, texts, second, padding=None)
    bad = [i for i, t in enumerate(texts + (second or [])) if has_surrogate(t)]
    if bad:
        i = bad[0]
        name = f"text {i}" if i < len(texts) else f"text_pair {i - len(texts)}"
        assert err is not None and str(err).startswith(f"{name} cannot be encoded"), err
        return
    assert err is None, err
    single = [wordpiece.encode(t, None if second is None else second[i]) for i, t in enumerate(texts)]
    assert [e.input_ids for e in got] == [e.input_ids for e in single]
    assert [e.offsets for e in got] == [e.offsets for e in single]


@PROPS
@given(text=any_text)
def test_bpe_encodes_any_str_losslessly_or_names_it(bpe, text):
    ids, err = outcome(bpe.encode, text)
    if has_surrogate(text):
        assert err is not None and "lone surrogate" in str(err) and str(err).startswith("text")
        _, err = outcome(bpe.encode_batch, ["ok", text])
        assert err is not None and str(err).startswith("text 1 cannot be encoded"), err
        return
    assert err is None, err
    assert all(0 <= i < bpe.vocab_size for i in ids)
    assert bpe.decode(ids) == text  # documented: every string round-trips
    assert bpe.encode_batch([text, "x"]) == [ids, bpe.encode("x")]


def test_bpe_refuses_a_bare_str_and_non_str_items(bpe):
    with pytest.raises(TypeError, match="list/tuple of str"):
        bpe.encode_batch("abc")
    with pytest.raises(TypeError, match=r"texts\[1\] must be str, got NoneType"):
        bpe.encode_batch(["a", None])


@FEW
@given(which=st.sampled_from(["vocab.json", "merges.txt"]), data=st.data())
def test_bpe_files_parse_or_name_the_file(bpe, which, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = bpe.save(tmp)
        (folder / "tokenizer.json").unlink()  # load from GPT-2's two files
        base = (folder / which).read_bytes()
        (folder / which).write_bytes(data.draw(st.one_of(mutated(base[:400] + base[-200:]), st.binary(max_size=60))))
        tok, err = outcome(ByteLevelBPETokenizer.from_dir, folder)
        if err is not None:
            check_error(err, folder / which, None)
        else:
            assert tok.decode(tok.encode("a test")) == "a test"


@FEW
@given(data=st.data())
def test_wordpiece_vocab_file_parses_or_names_the_file(data):
    specials = b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"
    raw = data.draw(st.one_of(mutated(specials + b"the\n##s\nwalk\n", max_edits=3), st.binary(max_size=60)))
    with files(("vocab.txt", raw)) as (path,):
        tok, err = outcome(WordPieceTokenizer.from_vocab, path)
    if err is not None:
        check_error(err, path, lines_in(raw))
    else:
        assert tok.encode("walks").tokens[0] == "[CLS]"


# --------------------------------------------------------------------------- FIFOs, <(...), missing paths


@contextlib.contextmanager
def fifo(folder, name: str, data: bytes):
    """A named pipe that a thread fills with ``data`` once a reader opens it."""
    path = os.path.join(folder, name)
    os.mkfifo(path)

    def write():
        try:
            with open(path, "wb") as fh:
                fh.write(data)
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield path
    finally:
        if writer.is_alive():  # nobody read it: be its reader until the writer is done
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            writer.join(5)
            os.close(fd)
        writer.join(5)
        assert not writer.is_alive()


def _zip_of(name, data):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(name, data)
    return buf.getvalue()


def _vectors(suffix):
    with tempfile.TemporaryDirectory() as tmp:
        return write_vectors(Path(tmp) / f"v{suffix}", ["a", "b"], np.eye(2, 3), progress=False).read_bytes()


SQUAD_DOC = json.dumps({"data": [{"title": "T", "paragraphs": [{"context": "Paris is big.", "qas": [
    {"id": "q1", "question": "Which?", "answers": [{"text": "Paris", "answer_start": 0}]}]}]}]}).encode()

FIFO_CASES = {
    "read_lines": ("t.txt", b"\xef\xbb\xbfone\r\ntwo\n", lambda p: list(read_lines(p)), ["one", "two"]),
    "read_lines .xz": ("t.txt.xz", lzma.compress(b"one\ntwo\n"), lambda p: list(read_lines(p)), ["one", "two"]),
    "csv": ("t.csv", b'text,label\n"a, b",x\n', lambda p: [(e.text, e.label) for e in read_table(p)], [("a, b", 0)]),
    "jsonl": ("t.jsonl", b'{"text": "a", "label": 1}\n', lambda p: [(e.text, e.label) for e in read_table(p)], [("a", 0)]),
    "glue": ("dev.tsv", b"sentence\tlabel\nfine\t1\n", lambda p: [(e.text, e.label) for e in read_glue("sst2", p)],
             [("fine", 1)]),
    "conll": ("c.txt", b"EU B-ORG\nrejects O\n", lambda p: [(s.words, s.tags) for s in read_conll(p)],
              [(["EU", "rejects"], ["B-ORG", "O"])]),
    "squad": ("s.json", SQUAD_DOC, lambda p: [e.answers[0].text for e in read_squad(p)], ["Paris"]),
    "squad .zip": ("s.zip", _zip_of("s.json", SQUAD_DOC), lambda p: [e.qid for e in read_squad(p)], ["q1"]),
    "documents": ("d.txt", b"a\nb\n\nc\n", lambda p: list(read_documents(p)), [["a", "b"], ["c"]]),
    "vectors sniffed": ("v.txt", b"2 3\na 1 0 0\nb 0 1 0\n", lambda p: read_vectors(p, progress=False)[0], ["a", "b"]),
    "vectors .bin": ("v.bin", _vectors(".bin"), lambda p: read_vectors(p, progress=False)[1].tolist(),
                     np.eye(2, 3).tolist()),
    "vectors .npz": ("v.npz", _vectors(".npz"), lambda p: read_vectors(p, progress=False)[0], ["a", "b"]),
}


@pytest.mark.parametrize("case", list(FIFO_CASES))
def test_readers_take_a_fifo(tmp_path, case):
    name, data, read, want = FIFO_CASES[case]
    with fifo(tmp_path, name, data) as path:
        got, err = outcome(read, path)
    assert err is None and got == want


def test_cli_input_takes_a_fifo_and_process_substitution(tmp_path):
    from ctxkit.cli.models import _read_texts

    with fifo(tmp_path, "in.txt", b"hello world\n\nlast\n") as path:
        assert _read_texts(path) == ["hello world", "", "last"]
    read_end, write_end = os.pipe()  # what bash's <(...) hands over: /dev/fd/N
    writer = threading.Thread(target=lambda: (os.write(write_end, b"x y\n"), os.close(write_end)), daemon=True)
    writer.start()
    try:
        assert _read_texts(f"/dev/fd/{read_end}") == ["x y"]
    finally:
        writer.join(5)
        os.close(read_end)


def test_ctxkit_embed_reads_a_fifo(tmp_path, capsys):
    from ctxkit.cli import main

    out = tmp_path / "o.jsonl"
    with fifo(tmp_path, "in.txt", b"a pipe works\n") as path:
        assert main(["embed", path, "--out", str(out), "--no-progress"]) == 0
    rec = json.loads(out.read_text(encoding="utf-8"))
    assert rec["words"] == ["a", "pipe", "works"] and len(rec["vectors"]) == 3
    assert "wrote 1 embeddings" in capsys.readouterr().err


def test_two_pass_readers_refuse_a_fifo_instead_of_hanging(tmp_path):
    from ctxkit.pretraining.bilm import build_vocab
    from ctxkit.pretraining.xl_lm import build_xl_vocab

    for i, read in enumerate((build_xl_vocab, build_vocab, lambda ps: list(read_corpus(ps)))):
        with fifo(tmp_path, f"p{i}.txt", b"a b\n") as path:
            _, err = outcome(read, [path], timeout=5)
        assert err is not None and str(err).startswith(f"{path}: is a pipe") and "save it to a file" in str(err)


READERS = {
    "read_lines": lambda p: list(read_lines(p)), "read_table": read_table, "read_glue": lambda p: read_glue("sst2", p),
    "read_conll": read_conll, "read_squad": read_squad, "read_documents": lambda p: list(read_documents(p)),
    "read_vectors": lambda p: read_vectors(p, progress=False), "read_corpus": lambda p: list(read_corpus(p)),
    "read_parallel": lambda p: read_parallel(p, p), "from_vocab": WordPieceTokenizer.from_vocab,
}


@pytest.mark.parametrize("reader", list(READERS))
def test_missing_path_and_directory_are_named(tmp_path, reader):
    missing = tmp_path / "missing.csv"
    _, err = outcome(READERS[reader], missing)
    assert isinstance(err, MissingFileError) and isinstance(err, FileNotFoundError)
    assert str(err).startswith(f"{missing}: no")
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    _, err = outcome(READERS[reader], folder)
    assert err is not None and str(err).startswith(f"{folder}")
    assert "directory" in str(err) or reader == "read_glue"  # a GLUE folder is searched for the split's file
