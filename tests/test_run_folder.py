"""A run folder belongs to one training command at a time, and --resume keeps its promise
(issue 44 items 2 and 6).

* Two commands into one ``--out``: the second ends at once in one line naming the first (pid,
  command, start time), exit 2, and leaves the folder as it was; the lock goes with the
  process that held it, ``kill -9`` included; a process may take its own lock again.
* ``--resume`` with settings the checkpoint was not trained with (``--batch-size``,
  ``--data``, ``--lr``, ...) is refused in one line listing each change, unless
  ``--allow-changes``, which is recorded; ``log.jsonl`` after a resume holds each step once.

The model is the randomly initialised 2-layer, 32-wide BERT of ``tiny_bert_dir``.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctxkit.cli import build_parser, main, run_guard
from ctxkit.core.run_folder import LOCK_NAME, RunFolderBusyError, hold_run_folder, trim_log

SRC = str(Path(__file__).resolve().parents[1] / "src")
# Each line of a held folder's refusal: who holds it, which command, since when.
BUSY = r"ctxkit: error: run folder {folder} is in use by pid {pid} \({command}, started \d\d:\d\d:\d\d\); wait for it or pick another --out"


def _argv(model_dir, data, out, *extra, epochs="2"):
    return ["finetune", "table", "--model", str(model_dir), "--data", str(data), "--out", str(out), "--epochs", epochs,
            "--batch-size", "8", "--max-length", "32", "--lr", "1e-3", "--device", "cpu", "--no-progress", "--log-every", "1",
            "--seed", "42", *extra]


def _env() -> dict:
    # One thread, as the in-process runs of the suite use at most: the same rounding.
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}


def _snapshot(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes, and every folder."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def _log(run: Path) -> list:
    return [json.loads(line) for line in (run / "log.jsonl").read_text(encoding="utf-8").splitlines()]


def _steps(run: Path) -> list:
    return [r["step"] for r in _log(run) if r["event"] == "train"]


def _errors(capsys) -> list:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("ctxkit: error:")]


class _Holder:
    """Another process holding ``folder``'s lock, as a training command does, until ``stop()``."""

    def __init__(self, folder: Path, command: str = "ctxkit finetune sst-2 --out run"):
        code = ("import sys\nfrom ctxkit.core.run_folder import hold_run_folder\n"
                f"with hold_run_folder({str(folder)!r}, {command!r}):\n"
                "    print('held', flush=True)\n    sys.stdin.read()\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=_env())
        assert self.proc.stdout.readline().strip() == "held"

    def stop(self) -> int:
        self.proc.stdin.close()
        return self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def uninterrupted(tiny_bert_dir, sst_table, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    assert main(_argv(tiny_bert_dir, sst_table, run)) == 0
    return run


# ------------------------------------------------------------------ one command per run folder


def test_a_command_into_a_held_folder_is_refused_in_one_line_and_touches_nothing(tiny_bert_dir, sst_table, uninterrupted,
                                                                                  tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(uninterrupted, run)
    before = _snapshot(run)
    holder = _Holder(run)
    try:
        capsys.readouterr()
        for extra in ((), ("--resume",)):  # a fresh start and a resume alike
            assert main(_argv(tiny_bert_dir, sst_table, run, *extra)) == 2
            errors = _errors(capsys)
            assert len(errors) == 1, errors
            assert re.fullmatch(BUSY.format(folder=re.escape(str(run)), pid=holder.proc.pid,
                                            command=re.escape("ctxkit finetune sst-2 --out run")), errors[0]), errors[0]
            assert _snapshot(run) == {**before, LOCK_NAME: (run / LOCK_NAME).read_bytes()}  # the holder's file only
    finally:
        assert holder.stop() == 0
    assert _snapshot(run) == before  # the holder's lock file goes with it
    assert main(_argv(tiny_bert_dir, sst_table, run, "--resume")) == 0  # free again


def test_two_finetunes_into_one_out_the_second_is_refused_and_the_first_ends_whole(tiny_bert_dir, sst_table, tmp_path, capsys):
    """The audit's case: a second ``ctxkit finetune --out R`` started while the first runs."""
    run = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "ctxkit", *_argv(tiny_bert_dir, sst_table, run, epochs="6")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline = time.time() + 120
        while not ((run / LOCK_NAME).is_file() and str(first.pid) in (run / LOCK_NAME).read_text(encoding="utf-8")):
            assert first.poll() is None and time.time() < deadline, first.communicate()[1][-2000:]
            time.sleep(0.02)
        capsys.readouterr()
        assert main(_argv(tiny_bert_dir, sst_table, run, "--resume")) == 2
        errors = _errors(capsys)
        assert len(errors) == 1 and re.fullmatch(BUSY.format(folder=re.escape(str(run)), pid=first.pid, command=r"ctxkit finetune table .*"),
                                                 errors[0]), errors
        assert first.poll() is None, "the first run ended before the second started: the test proves nothing"
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err[-2000:]
    assert _steps(run) == list(range(1, 37))  # 6 epochs of 6 steps, each logged once
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")]


def test_the_lock_goes_with_a_killed_process_and_the_resume_logs_each_step_once(tiny_bert_dir, sst_table, tmp_path, capsys):
    """kill -9 mid-run (after some checkpoints, maybe mid-save): the folder is free at once,
    and --resume ends with the steps of a run that was never killed, each logged once."""
    run = tmp_path / "run"
    argv = _argv(tiny_bert_dir, sst_table, run, "--save-every", "3", epochs="3")
    proc = subprocess.Popen([sys.executable, "-m", "ctxkit", *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline = time.time() + 120
        while not ((run / "log.jsonl").is_file() and '"step": 4' in (run / "log.jsonl").read_text(encoding="utf-8")):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-2000:]
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert (run / LOCK_NAME).is_file()  # what kill -9 leaves: the file, not the lock
    assert main(argv + ["--resume"]) == 0
    assert _steps(run) == list(range(1, 19))  # 3 epochs of 6 steps
    assert not (run / LOCK_NAME).exists()


def test_the_same_process_may_take_its_lock_again_and_a_new_run_after_the_last(tmp_path):
    folder = tmp_path / "a" / "run"
    with hold_run_folder(folder, "first") as lock:
        with hold_run_folder(folder, "the trainer under the command line") as again:
            assert again == lock == folder / LOCK_NAME
        assert lock.is_file() and json.loads(lock.read_text())["command"] == "first"  # still held, still the first's
    assert not (tmp_path / "a").exists()  # nothing written into it: the folders it made go too
    with hold_run_folder(folder, "second"):
        (folder / "log.jsonl").write_text("{}\n")
    assert sorted(p.name for p in folder.iterdir()) == ["log.jsonl"]


def test_a_held_folder_refuses_another_process_and_ranks_other_than_0_take_no_lock(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    holder = _Holder(folder, command="ctxkit pretrain --out run")
    try:
        code = f"from ctxkit.core.run_folder import hold_run_folder\nwith hold_run_folder({str(folder)!r}):\n    pass\n"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
        assert "RunFolderBusyError" in done.stderr and f"in use by pid {holder.proc.pid} (ctxkit pretrain --out run" in done.stderr
        # Under torchrun every rank runs the command: rank 0 holds the lock, the others take none (no deadlock, no refusal).
        monkeypatch.setenv("RANK", "1")
        args = argparse.Namespace(verb="pretrain", out=str(folder), command_line="ctxkit pretrain --out run")
        with run_guard.guard(args):
            pass
        with hold_run_folder(folder, enabled=False) as lock:
            assert lock is None
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(RunFolderBusyError, match="wait for it or pick another --out$"):
            with run_guard.guard(args):
                pass
    finally:
        assert holder.stop() == 0


def test_every_training_verb_is_locked_and_every_resume_but_word2vecs_takes_allow_changes():
    verbs = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    options = {name: {o for a in p._actions for o in a.option_strings} for name, p in verbs.items()}
    assert {name for name, o in options.items() if "--on-sigterm" in o} == set(run_guard.RUN_FOLDER_OPTION)
    resumable = {name for name, o in options.items() if "--resume" in o}
    # word2vec-train's loop compares every setting itself (and its --checkpoint is replaced whole).
    assert {name for name in resumable if "--allow-changes" in options[name]} == resumable - {"word2vec-train"}


# ------------------------------------------------------------------ --resume keeps its promise


def test_resume_with_another_batch_size_is_refused_then_allowed_and_recorded(tiny_bert_dir, sst_table, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_argv(tiny_bert_dir, sst_table, run, "--max-steps", "3")) == 0
    before = _snapshot(run)
    capsys.readouterr()
    changed = [a if a != "8" else "16" for a in _argv(tiny_bert_dir, sst_table, run, "--resume")]
    changed[changed.index("--lr") + 1] = "2e-3"
    assert main(changed) == 2
    errors = _errors(capsys)
    assert errors == [f"ctxkit: error: --resume would change what the checkpoint in {run} was trained with: --batch-size 8 -> 16, "
                      f"--lr 0.001 -> 0.002; resume with the recorded settings ({run / 'settings.json'}), or add "
                      "--allow-changes to resume with these anyway"]
    assert _snapshot(run) == before  # refused before anything was read or written
    # What may change: how long it runs, how often it saves and logs, where it runs.
    assert main(_argv(tiny_bert_dir, sst_table, run, "--resume", "--max-steps", "4", "--save-every", "1", "--log-every", "2")) == 0
    assert main(changed + ["--allow-changes"]) == 0
    err = capsys.readouterr().err
    assert ("ctxkit: note: resuming with changed settings (--allow-changes): --batch-size 8 -> 16, --lr 0.001 -> 0.002; "
            f"recorded in {run / 'settings.json'}") in err
    record = json.loads((run / "settings.json").read_text(encoding="utf-8"))
    assert record["settings"]["batch_size"] == 16 and record["settings"]["lr"] == 0.002
    assert [h["changes"] for h in record["history"]] == [{"batch_size": [8, 16], "lr": [0.001, 0.002]}]
    assert record["history"][0]["command"].startswith("ctxkit finetune table") and "--allow-changes" in record["history"][0]["command"]


def test_resume_compares_the_data_by_its_files_not_its_path(tiny_bert_dir, sst_table, tmp_path, capsys):
    run, same, other = tmp_path / "run", tmp_path / "same", tmp_path / "other"
    assert main(_argv(tiny_bert_dir, sst_table, run, "--max-steps", "2")) == 0
    shutil.copytree(sst_table, same)
    shutil.copytree(sst_table, other)
    lines = (other / "train.csv").read_text(encoding="utf-8").splitlines(keepends=True)
    (other / "train.csv").write_text("".join([lines[0], *reversed(lines[1:])]), encoding="utf-8")  # same size, other order
    capsys.readouterr()
    assert main(_argv(tiny_bert_dir, other, run, "--resume")) == 2
    assert _errors(capsys)[0].endswith(f"was trained with: --data {sst_table} -> {other}; resume with the recorded settings "
                                       f"({run / 'settings.json'}), or add --allow-changes to resume with these anyway")
    assert main(_argv(tiny_bert_dir, same, run, "--resume", "--max-steps", "3")) == 0  # a copy elsewhere is the same data
    (same / "dev.csv").write_text((same / "dev.csv").read_text(encoding="utf-8").replace(",pos", ",neg", 1), encoding="utf-8")
    assert main(_argv(tiny_bert_dir, same, run, "--resume")) == 2
    assert f"--data {same} (its files changed);" in _errors(capsys)[0]


def test_a_failed_fresh_start_keeps_the_record_of_the_checkpoint_there(tiny_bert_dir, sst_table, tmp_path, capsys):
    """A command that fails before its first checkpoint leaves the record that describes the
    checkpoint in the folder (and, into a new folder, no folder at all)."""
    run = tmp_path / "run"
    assert main(_argv(tiny_bert_dir, sst_table, run, "--max-steps", "2")) == 0
    record = (run / "settings.json").read_bytes()
    assert main(_argv(tiny_bert_dir, tmp_path / "no-such-data", run, "--batch-size", "4")) == 2
    assert (run / "settings.json").read_bytes() == record
    assert main(_argv(tiny_bert_dir, tmp_path / "no-such-data", tmp_path / "new")) == 2
    assert not (tmp_path / "new").exists()


def test_a_run_interrupted_after_a_checkpoint_logs_each_step_once_after_resume(tiny_bert_dir, sst_table, uninterrupted, tmp_path,
                                                                                monkeypatch, capsys):
    """Killed at step 5 with its last checkpoint at step 4: step 5 was logged twice before
    (55 of 96 resumed runs had such duplicates); the resume drops it from the log first."""
    from ctxkit.cli import tasks
    from ctxkit.training.callbacks import Callback

    class Crash(Callback):
        def on_log(self, step, metrics):
            if step == 5:
                raise KeyboardInterrupt  # after log.jsonl got step 5 (it is the first writer)

    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(tasks, "make_callbacks", lambda *args, **kwargs: [Crash()])
        assert main(_argv(tiny_bert_dir, sst_table, run, "--save-every", "2")) == 130
    assert _steps(run) == [1, 2, 3, 4, 5]
    assert json.loads((run / "checkpoint" / "trainer_state.json").read_text())["step"] == 4
    assert main(_argv(tiny_bert_dir, sst_table, run, "--save-every", "2", "--resume")) == 0
    assert _steps(run) == list(range(1, 13)) == _steps(uninterrupted)
    train = [r for r in _log(run) if r["event"] == "train"]
    reference = [r for r in _log(uninterrupted) if r["event"] == "train"]
    assert [r["loss"] for r in train] == [r["loss"] for r in reference]  # the same steps, bit-exactly


def test_trim_log_drops_later_steps_and_a_cut_line_in_one_rewrite(tmp_path):
    log = tmp_path / "log.jsonl"
    records = [{"event": "start", "config": {}}, {"event": "train", "step": 1}, {"eval": {"step": 2, "ppl": 3.0}},
               {"event": "train", "step": 2}, {"event": "eval", "epoch": 0, "step": 3}, {"step": 4, "loss": 1.0},
               {"event": "end", "steps": 4}]
    log.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"event": "train", "st', encoding="utf-8")
    assert trim_log(log, 2) == 4
    assert [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] == records[:4]
    stamp = log.stat().st_mtime_ns
    assert trim_log(log, 2) == 0 and log.stat().st_mtime_ns == stamp  # nothing to drop: not rewritten
    assert trim_log(tmp_path / "none.jsonl", 0) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]


def test_the_guard_refuses_before_anything_and_says_which_option(tmp_path):
    """The guard alone: a verb whose run folder is --checkpoint says so; an unknown verb passes."""
    folder = tmp_path / "ckpt"
    args = argparse.Namespace(verb="word2vec-train", checkpoint=str(folder), command_line="ctxkit word2vec-train")
    with run_guard.guard(args):
        assert (tmp_path / ".ckpt.lock").is_file() and not folder.exists()  # beside: the folder is replaced whole
    assert not (tmp_path / ".ckpt.lock").exists()
    with run_guard.guard(argparse.Namespace(verb="evaluate", run_dir=str(tmp_path))):
        pass
    with hold_run_folder(folder, option="--checkpoint", beside=True):
        code = ("from ctxkit.core.run_folder import hold_run_folder\n"
                f"with hold_run_folder({str(folder)!r}, option='--checkpoint', beside=True):\n    pass\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert f"{folder} is in use by pid {os.getpid()} (" in last and last.endswith("; wait for it or pick another --checkpoint")
