"""``ctxkit finetune | evaluate | predict`` as a user meets them: the same seed gives the same
model, a stop is resumable bit-exactly from any point, and bad input is refused with
``file:line`` before any training time is spent.

The model is a randomly initialised 2-layer, 32-wide BERT (``tiny_bert_dir``): these tests
are about the pipeline, so a step costs milliseconds.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ctxkit.cli import main

pytestmark = pytest.mark.usefixtures("tiny_bert_dir")

STEPS_PER_EPOCH = 6  # 48 training rows, batch 8


def _finetune(model_dir, data, out, *extra, epochs="2"):
    return main(["finetune", "table", "--model", str(model_dir), "--data", str(data), "--out", str(out), "--epochs", epochs,
                 "--batch-size", "8", "--max-length", "32", "--lr", "1e-3", "--device", "cpu", "--no-progress", "--log-every", "1",
                 *extra])


def _weights(folder: Path) -> dict:
    out = dict(load_file(str(folder / "model.safetensors")))
    if (folder / "head.safetensors").is_file():
        out.update({"head." + k: v for k, v in load_file(str(folder / "head.safetensors")).items()})
    return out


def _assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def _train_losses(run: Path) -> list:
    log = [json.loads(line) for line in (run / "log.jsonl").read_text(encoding="utf-8").splitlines()]
    return [(r["step"], r["loss"]) for r in log if r["event"] == "train"]


@pytest.fixture(scope="module")
def uninterrupted(tiny_bert_dir, sst_table, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("uninterrupted")
    assert _finetune(tiny_bert_dir, sst_table, run, "--seed", "42", "--save-every", "1") == 0
    return run


def test_same_seed_gives_the_same_model_through_the_cli(tiny_bert_dir, sst_table, uninterrupted, tmp_path, capsys):
    """The task head is seeded too: a second run with --seed 42 is identical, tensor for tensor."""
    again, other = tmp_path / "again", tmp_path / "other"
    assert _finetune(tiny_bert_dir, sst_table, again, "--seed", "42") == 0
    _assert_identical(_weights(uninterrupted / "best"), _weights(again / "best"))
    assert _train_losses(again) == _train_losses(uninterrupted)
    assert _finetune(tiny_bert_dir, sst_table, other, "--seed", "7", "--epochs", "1") == 0
    head_42 = load_file(str(again / "best" / "head.safetensors"))
    head_7 = load_file(str(other / "best" / "head.safetensors"))
    assert not torch.equal(head_42["dense.weight"] if "dense.weight" in head_42 else next(iter(head_42.values())),
                           head_7["dense.weight"] if "dense.weight" in head_7 else next(iter(head_7.values())))


@pytest.mark.parametrize("cut", [1, STEPS_PER_EPOCH, STEPS_PER_EPOCH + 3])
def test_stop_then_resume_equals_uninterrupted_bit_exactly(tiny_bert_dir, sst_table, uninterrupted, tmp_path, cut, capsys):
    """--max-steps stops anywhere (mid-epoch, at the epoch boundary); --resume then ends with
    the same weights, losses, best epoch and scores as a run that never stopped."""
    run = tmp_path / "run"
    assert _finetune(tiny_bert_dir, sst_table, run, "--seed", "42", "--max-steps", str(cut)) == 0
    stopped = json.loads((run / "results.json").read_text(encoding="utf-8"))
    if cut % STEPS_PER_EPOCH:
        assert stopped["stopped"] == {"reason": "max_steps", "step": cut, "resume": stopped["stopped"]["resume"]}
        assert "stopped by --max-steps at step" in capsys.readouterr().err
    assert (run / "best" / "head.safetensors").is_file()  # a usable model at the stop
    assert main(["evaluate", str(run), "--device", "cpu", "--no-progress"]) == 0
    assert _finetune(tiny_bert_dir, sst_table, run, "--seed", "42", "--resume") == 0
    _assert_identical(_weights(uninterrupted / "checkpoint"), _weights(run / "checkpoint"))
    _assert_identical(_weights(uninterrupted / "best"), _weights(run / "best"))
    assert _train_losses(run) == _train_losses(uninterrupted)  # every step's loss, before and after the stop
    done, reference = (json.loads((r / "results.json").read_text(encoding="utf-8")) for r in (run, uninterrupted))
    assert done["results"] == reference["results"] and done["best_epoch"] == reference["best_epoch"]
    assert "stopped" not in done


def test_run_folder_works_from_another_directory_and_records_limits(tiny_bert_dir, sst_table, tmp_path, monkeypatch, capsys):
    """Paths are stored absolute, and --limit-eval is recorded and applied again by evaluate."""
    monkeypatch.chdir(sst_table.parent)
    run = tmp_path / "run"
    assert main(["finetune", "table", "--model", str(tiny_bert_dir), "--data", sst_table.name, "--out", str(run),
                 "--epochs", "1", "--batch-size", "8", "--max-length", "32", "--device", "cpu", "--no-progress",
                 "--limit-eval", "10"]) == 0
    summary = json.loads(capsys.readouterr().out)
    info = json.loads((run / "task.json").read_text(encoding="utf-8"))
    assert info["data"] == str(sst_table.resolve()) and info["limit_eval"] == 10
    assert summary["limit_eval"] == 10 and summary["eval_examples"] == {"dev": 10}
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate", str(run), "--device", "cpu", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["dev"]["accuracy"] == summary["results"]["dev"]["accuracy"]
    assert "scoring the first 10 examples of each split, as in training" in captured.err
    assert main(["evaluate", str(run), "--device", "cpu", "--limit-eval", "0"]) == 0  # progress on, as by default
    captured = capsys.readouterr()
    all_24 = json.loads(captured.out)["dev"]["accuracy"]
    assert "evaluate dev:" in captured.err and "/24 [" in captured.err  # a bar over the 24 inputs
    assert all_24 * 24 / 100 == pytest.approx(round(all_24 * 24 / 100))  # a share of 24 examples, not of 10
    moved = tmp_path / "gone"
    info["data"] = str(moved)
    (run / "task.json").write_text(json.dumps(info), encoding="utf-8")
    assert main(["evaluate", str(run), "--device", "cpu"]) == 2
    assert f"was trained on {moved}, which does not exist here; pass --data PATH" in capsys.readouterr().err


# ------------------------------------------------------------------ refused before training


def _refused(capsys, argv, out: Path) -> str:
    """Runs the CLI, expects exit 2, and checks nothing was trained."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert not (out / "log.jsonl").exists() and not (out / "checkpoint").exists()
    lines = [line for line in err.splitlines() if line.startswith("ctxkit: error:")]
    assert len(lines) == 1, err
    return lines[0]


def _table_argv(model_dir, data, out, *extra):
    return ["finetune", "table", "--model", str(model_dir), "--data", str(data), "--out", str(out), "--epochs", "1",
            "--batch-size", "8", "--max-length", "32", "--device", "cpu", "--no-progress", *extra]


def test_header_only_dev_and_empty_train_are_refused_before_training(tiny_bert_dir, sst_table, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text((sst_table / "train.csv").read_text(encoding="utf-8"), encoding="utf-8")
    (data / "dev.csv").write_text("text,label\n", encoding="utf-8")
    error = _refused(capsys, _table_argv(tiny_bert_dir, data, tmp_path / "r1"), tmp_path / "r1")
    assert error == f"ctxkit: error: {data / 'dev.csv'}: no dev examples to evaluate on (checked before training)"
    (data / "train.csv").write_text("", encoding="utf-8")
    error = _refused(capsys, _table_argv(tiny_bert_dir, data, tmp_path / "r2"), tmp_path / "r2")
    assert str(data / "train.csv") in error


def _squad_file(path: Path, articles: int) -> Path:
    context = "The bridge was opened in 1932 after six years of work by 400 men."
    data = [{"title": f"Article_{a}", "paragraphs": [{"context": context, "qas": [
        {"id": f"q{a}_{i}", "question": question, "answers": [{"text": answer, "answer_start": context.index(answer)}]}
        for i, (question, answer) in enumerate([("When was the bridge opened?", "1932"), ("How many men worked?", "400")])]}]}
        for a in range(articles)]
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return path


def test_squad_file_with_few_articles_is_refused_then_split_as_asked(tiny_bert_dir, tmp_path, capsys):
    data = _squad_file(tmp_path / "mine.json", 5)
    argv = ["finetune", "squad", "--model", str(tiny_bert_dir), "--data", str(data), "--epochs", "1", "--batch-size", "4",
            "--max-length", "64", "--doc-stride", "32", "--device", "cpu", "--no-progress"]
    error = _refused(capsys, argv + ["--out", str(tmp_path / "r1")], tmp_path / "r1")
    assert error == (f"ctxkit: error: {data}: 5 articles; the article split trains on the first 38 and leaves none to "
                     "evaluate: pass --eval-articles N (the last N articles evaluate) or --eval-data FILE (a separate "
                     "evaluation file)")
    assert main(argv + ["--out", str(tmp_path / "r2"), "--eval-articles", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["train_examples"] == 6 and summary["eval_examples"] == {"dev": 4}
    dev = _squad_file(tmp_path / "dev.json", 3)
    assert main(argv + ["--out", str(tmp_path / "r3"), "--eval-data", str(dev)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["train_examples"] == 10 and summary["eval_examples"] == {"dev": 6}
    assert main(["evaluate", str(tmp_path / "r3"), "--device", "cpu", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["dev"]["f1"] == summary["results"]["dev"]["f1"]


def _conll(path: Path, sentences) -> Path:
    blocks = ["-DOCSTART- -X- -X- O\n"]
    for words in sentences:
        blocks.append("".join(f"{w} NNP B-NP {t}\n" for w, t in words))
    path.write_text("\n".join(blocks), encoding="utf-8")
    return path


ORG = [("Acme", "B-ORG"), ("Corp", "I-ORG"), ("hired", "O"), ("Ann", "B-PER"), (".", "O")]


def test_conll_entity_type_typo_warns_in_training_and_is_refused_in_evaluation(tiny_bert_dir, tmp_path, capsys):
    data = tmp_path / "conll"
    data.mkdir()
    typo = [("Globex", "B-ORGANISATION"), ("left", "O"), (".", "O")]
    _conll(data / "train.txt", [ORG] * 30 + [typo] + [ORG] * 5)
    _conll(data / "valid.txt", [ORG] * 4)
    _conll(data / "test.txt", [ORG] * 2 + [[("Bob", "B-PERSON"), ("ran", "O")]])
    argv = ["finetune", "conll2003", "--model", str(tiny_bert_dir), "--data", str(data), "--epochs", "1",
            "--batch-size", "8", "--device", "cpu", "--no-progress"]
    error = _refused(capsys, argv + ["--out", str(tmp_path / "r1")], tmp_path / "r1")
    # Sentence k starts at line 3 + 6 k: the test file's third sentence at line 15.
    assert error.startswith(f"ctxkit: error: {data / 'test.txt'}:15: 1 tag(s) outside the model's label set")
    assert "B-PERSON x1 (first at" in error and "--allow-unknown-tags" in error
    assert main(argv + ["--out", str(tmp_path / "r2"), "--allow-unknown-tags"]) == 0
    err = capsys.readouterr().err
    assert (f"ctxkit: warning: {data / 'train.txt'}:183: entity type 'ORGANISATION': 1 entity, close to 'ORG' (35): a typo?"
            in err)
    assert f"{data / 'test.txt'}: 1 tag(s) the model cannot predict, scored as missed entities: B-PERSON" in err
    error = _refused(capsys, argv + ["--out", str(tmp_path / "r3"), "--labels", "O,B-ORG,I-ORG,B-PER,I-PER"], tmp_path / "r3")
    assert error.startswith(f"ctxkit: error: {data / 'train.txt'}:183: 1 tag(s) outside the label set given with --labels")


def test_predict_checks_the_input_format_before_loading_the_model(tiny_bert_dir, sst_table, uninterrupted, tmp_path, capsys, monkeypatch):
    """A single-sentence run given 'text<TAB>label' lines says which line, instead of reading a pair."""
    import ctxkit.tasks as tasks

    inputs = tmp_path / "in.tsv"
    inputs.write_text("a wonderful film\tpos\n\nthe worst mess\tneg\n", encoding="utf-8")
    loaded = []
    monkeypatch.setattr(tasks, "load_run", lambda *a, **k: loaded.append(1))
    assert main(["predict", str(uninterrupted), str(inputs), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"ctxkit: error: {inputs}:1: 2 tab-separated columns, but table reads one text (a single column; "
                           "no tabs); a label column must not be given to predict (remove it, or pass --extra-columns drop)")
    assert loaded == []  # refused before the weights were read
    monkeypatch.undo()
    assert main(["predict", str(uninterrupted), str(inputs), "--device", "cpu", "--backend", "pytorch",
                 "--extra-columns", "drop"]) == 0
    captured = capsys.readouterr()
    assert "dropped the columns after column 1 on 2 line(s)" in captured.err
    rows = [json.loads(line) for line in captured.out.splitlines()]
    plain = tmp_path / "plain.txt"
    plain.write_text("a wonderful film\nthe worst mess\n", encoding="utf-8")
    assert main(["predict", str(uninterrupted), str(plain), "--device", "cpu", "--backend", "pytorch"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == rows
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    help_text = capsys.readouterr().out
    assert "'text<TAB>pair', exactly two columns" in help_text and "JSON {\"question\": ..., \"context\": ...}" in help_text


def test_a_bug_prints_its_traceback_and_is_not_called_bad_input(sst_table, tmp_path, capsys, monkeypatch):
    """User errors are one line with exit 2; anything else is a bug: traceback and exit 1."""
    import ctxkit.tasks.runs as base

    def broken(*args, **kwargs):
        return [][0]  # an IndexError deep inside, as a bug would raise

    monkeypatch.setattr(base, "_read_splits", broken)
    assert main(_table_argv("all_minilm_l6_v2", sst_table, tmp_path / "r")) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "IndexError: list index out of range" in err
    assert err.rstrip().endswith("this is a bug in ctxkit, not a problem with your input; please report it with the traceback above")
    monkeypatch.undo()
    assert main(["finetune", "no-such-task", "--data", str(sst_table), "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.startswith("ctxkit: error: unknown task 'no-such-task'; known tasks: sst-2")


def test_resume_without_a_checkpoint_starts_from_the_beginning(tiny_bert_dir, sst_table, uninterrupted, tmp_path, capsys):
    """A command that crashed before its first checkpoint can simply be run again with --resume
    (issue 39 item 6): a one-line note, then the run a fresh start gives; a finished run whose
    checkpoint is gone is refused in one line instead of being trained over."""
    run = tmp_path / "crashed"
    run.mkdir()
    (run / "task.json").write_text("{}")  # what a crash right after the start leaves
    assert _finetune(tiny_bert_dir, sst_table, run, "--seed", "42", "--save-every", "1", "--resume") == 0
    assert "no complete checkpoint to resume from: starting from the beginning" in capsys.readouterr().err
    assert _train_losses(run) == _train_losses(uninterrupted)
    _assert_identical(_weights(uninterrupted / "best"), _weights(run / "best"))
    shutil.rmtree(run / "checkpoint")
    assert _finetune(tiny_bert_dir, sst_table, run, "--seed", "42", "--resume") == 2
    assert "a finished run with no checkpoint left to resume from" in capsys.readouterr().err


def test_sigterm_stops_after_the_step_with_a_checkpoint_and_resumes_exactly(tiny_bert_dir, sst_table, tmp_path):
    """SIGTERM (what SLURM, Kubernetes and systemd send before a kill) is a graceful stop
    (issue 39 item 4), also with loader processes in the signalled group: the step finishes, a checkpoint is written, one line, exit 143, no
    debris; the same command with --resume then ends as a run that was never stopped."""
    import os
    import signal
    import subprocess
    import sys
    import time

    args = ["finetune", "table", "--model", str(tiny_bert_dir), "--data", str(sst_table), "--epochs", "6", "--batch-size", "8",
            "--max-length", "32", "--lr", "1e-3", "--device", "cpu", "--no-progress", "--log-every", "1", "--seed", "42"]
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    run = tmp_path / "run"
    # Loader processes, and the signal sent to the whole process group, as SLURM, systemd and
    # `timeout` do: a worker must not die of it under the stopping run (once "DataLoader worker
    # ... killed by signal: Terminated", an internal error).
    proc = subprocess.Popen([sys.executable, "-m", "ctxkit", *args, "--data-workers", "2", "--out", str(run)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        log = run / "log.jsonl"
        if log.is_file() and '"event": "train"' in log.read_text(encoding="utf-8"):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be signalled"
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    assert "SIGTERM at step" in err and "stopped by a signal at step" in err
    stopped = json.loads((run / "results.json").read_text(encoding="utf-8"))["stopped"]
    assert stopped["reason"] == "signal" and 1 <= stopped["step"] < 36
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")]  # no debris of a half-written save
    # The resumed and the reference runs go on in this process, with one thread as the signalled
    # process ran (the same rounding), as in test_training_signals.py: the process that matters
    # is the one signalled, and two more interpreter starts cost more than the runs.
    reference = tmp_path / "reference"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for extra in (["--out", str(run), "--resume"], ["--out", str(reference)]):
            assert main([*args, *extra]) == 0
    finally:
        torch.set_num_threads(threads)
    assert _train_losses(run) == _train_losses(reference)
    _assert_identical(_weights(reference / "best"), _weights(run / "best"))
