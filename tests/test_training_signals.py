"""SIGTERM and SIGUSR1 stop every training loop gracefully (issue 39 item 4; the Trainer's verbs
are tested in test_finetune_reliability.py): the step (for word2vec the batch) finishes, the
checkpoint is written, one line, exit 143 (0 with ``--on-sigterm exit0``); a second signal
stops at once; the same command with ``--resume`` then ends as a run never stopped did.

Each loop is signalled in a real process, mid-training (the test waits for its first log
record or checkpoint); the resumed and the reference runs go on in this process, with one
thread, as the signalled one ran (the same rounding). Tiny models, a few seconds each.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ctxkit.cli import build_parser, main
from ctxkit.core.interrupts import StopSignals

pytestmark = pytest.mark.usefixtures("one_thread")

SRC = str(Path(__file__).resolve().parents[1] / "src")
ENV = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}

# Every verb that trains: each takes --on-sigterm.
TRAINING_VERBS = ("finetune", "distill", "pretrain", "distill-pretrain", "lm-train", "translate-train", "pretrain-xlnet",
                  "pretrain-elmo", "train-transformer-xl", "word2vec-train")


def _corpus(path: Path) -> Path:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    path.write_text("".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) + "\n" for _ in range(60)),
                    encoding="utf-8")
    return path


def _signalled(args, ready, sig=signal.SIGTERM) -> subprocess.CompletedProcess:
    """``ctxkit ARGS`` in its own process, sent ``sig`` once ``ready()`` says it is training."""
    proc = subprocess.Popen([sys.executable, "-m", "ctxkit", *args], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not ready():
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be signalled: " + proc.stderr.read()[-2000:]
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=240)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _logged(run: Path) -> bool:
    log = run / "log.jsonl"
    return log.is_file() and '"loss"' in log.read_text(encoding="utf-8")


def _losses(run: Path) -> list:
    """``(step, loss)`` of every training record of a plain log.jsonl (one per step here)."""
    records = [json.loads(line) for line in (run / "log.jsonl").read_text(encoding="utf-8").splitlines()]
    return [(r["step"], r["loss"]) for r in records if "loss" in r]


def _same_weights(a: Path, b: Path) -> None:
    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def _no_debris(run: Path) -> None:
    assert not [p.name for p in run.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp")]


# Two epochs: the signal comes after the first logged step, 40 steps before the end, and the
# resume crosses an epoch boundary (4 epochs did not test more, at twice the CPU time).
ELMO = ["--filters", "[[1,4],[2,4]]", "--n-highway", "1", "--cell-size", "16", "--projection-dim", "8", "--dropout", "0.2",
        "--softmax", "sampled", "--num-samples", "8", "--batch-size", "4", "--unroll", "6", "--epochs", "2", "--save-every", "1000",
        "--log-every", "1", "--device", "cpu", "--no-progress"]


def test_pretrain_elmo_stops_on_sigusr1_and_resumes_exactly(tmp_path, capsys):
    train, run, reference = _corpus(tmp_path / "train.txt"), tmp_path / "run", tmp_path / "reference"
    done = _signalled(["pretrain-elmo", "--train", str(train), "--out", str(run), *ELMO], lambda: _logged(run), signal.SIGUSR1)
    assert done.returncode == 143, done.stderr[-2000:]
    assert "SIGUSR1 at step" in done.stderr and "checkpoint written" in done.stderr
    line = [x for x in done.stderr.splitlines() if x.startswith("ctxkit: stopped by a signal")]
    assert line == [f"ctxkit: stopped by a signal at step {json.loads(done.stdout)['stopped']['step']}; {run}/checkpoint "
                    "holds it; add --resume to continue"]
    assert not (run / "final").exists() and not (run / "results.json").exists()  # no evaluation or export of a partial run
    _no_debris(run)
    assert main(["pretrain-elmo", "--train", str(train), "--out", str(run), *ELMO, "--resume"]) == 0
    assert main(["pretrain-elmo", "--train", str(train), "--out", str(reference), *ELMO]) == 0
    assert _losses(run) == _losses(reference) and len(_losses(run)) == 42  # 2 epochs of 21 chunks
    _same_weights(run / "final", reference / "final")


# 60 steps (14 an epoch of the corpus): signalled after its first logged step, the run has
# ~59 steps left, and the resume crosses epoch boundaries, as it did with 120.
XL = ["--d-model", "16", "--n-heads", "2", "--d-inner", "32", "--n-layers", "2", "--tgt-len", "8", "--mem-len", "8", "--batch-size",
      "4", "--max-steps", "60", "--warmup-steps", "2", "--dropout", "0.1", "--save-every", "1000", "--log-every", "1", "--device", "cpu",
      "--no-progress"]


def test_train_transformer_xl_stops_on_sigterm_with_exit0_when_asked_and_resumes_exactly(tmp_path, capsys):
    train, run, reference = _corpus(tmp_path / "train.txt"), tmp_path / "run", tmp_path / "reference"
    done = _signalled(["train-transformer-xl", "--train", str(train), "--out", str(run), *XL, "--on-sigterm", "exit0"],
                      lambda: _logged(run))
    assert done.returncode == 0, done.stderr[-2000:]  # --on-sigterm exit0: for a scheduler that needs success
    assert "SIGTERM at step" in done.stderr and "ctxkit: stopped by a signal at step" in done.stderr
    assert json.loads(done.stdout)["stopped"]["reason"] == "signal" and not (run / "final").exists()
    _no_debris(run)
    assert main(["train-transformer-xl", "--train", str(train), "--out", str(run), *XL, "--resume"]) == 0
    assert main(["train-transformer-xl", "--train", str(train), "--out", str(reference), *XL]) == 0
    assert _losses(run) == _losses(reference) and len(_losses(run)) == 60
    _same_weights(run / "final", reference / "final")


W2V = ["--dim", "8", "--window", "2", "--negative", "2", "--min-count", "1", "--epochs", "8", "--batch-size", "4", "--subsample", "0",
       "--save-every", "1", "--no-progress"]


def test_word2vec_train_stops_between_batches_and_resumes_exactly(tmp_path, capsys):
    """The checkpoint keeps the position inside a chunk (the batch, and the generator state that
    drew the chunk's examples), so a stop between two batches resumes exactly too."""
    corpus, ckpt = _corpus(tmp_path / "train.txt"), tmp_path / "checkpoint"
    args = ["word2vec-train", str(corpus), *W2V, "--out", str(tmp_path / "run.txt"), "--checkpoint", str(ckpt)]
    done = _signalled(args, lambda: (ckpt / "trainer_state.json").is_file())  # after the first epoch
    assert done.returncode == 143, done.stderr[-2000:]
    line = [x for x in done.stderr.splitlines() if x.startswith("ctxkit: stopped by a signal at epoch ")]
    assert len(line) == 1 and line[0].endswith(f"; {ckpt} holds it; add --resume to continue"), done.stderr
    assert not (tmp_path / "run.txt").exists()  # no vectors of an unfinished run
    position = json.loads((ckpt / "trainer_state.json").read_text())["position"]
    assert 1 <= position["epoch"] < 8
    assert main([*args, "--resume"]) == 0
    assert main(["word2vec-train", str(corpus), *W2V, "--out", str(tmp_path / "reference.txt")]) == 0
    assert (tmp_path / "run.txt").read_text() == (tmp_path / "reference.txt").read_text()


def test_word2vec_resume_without_a_checkpoint_starts_from_the_beginning(tmp_path, capsys):
    """--resume on a run that crashed before its first checkpoint (issue 39 item 6): a one-line
    note, then what a fresh run gives; finished vectors whose checkpoint is gone are refused."""
    corpus, ckpt, out = _corpus(tmp_path / "train.txt"), tmp_path / "checkpoint", tmp_path / "run.txt"
    few = [*W2V, "--epochs", "2"]
    assert main(["word2vec-train", str(corpus), *few, "--out", str(tmp_path / "fresh.txt")]) == 0
    assert main(["word2vec-train", str(corpus), *few, "--out", str(out), "--checkpoint", str(ckpt), "--resume"]) == 0
    notes = [x for x in capsys.readouterr().err.splitlines() if "no complete checkpoint" in x]
    assert notes == [f"ctxkit: note: {ckpt}: no complete checkpoint to resume from: starting from the beginning"]
    assert out.read_text() == (tmp_path / "fresh.txt").read_text()
    shutil.rmtree(ckpt)
    assert main(["word2vec-train", str(corpus), *few, "--out", str(out), "--checkpoint", str(ckpt), "--resume"]) == 2
    assert "run.txt: from a finished run with no checkpoint left to resume from" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["lm-train", "lm-train --char", "translate-train", "pretrain-xlnet", "distill-pretrain"])
def test_every_trainer_verb_stops_on_a_signal_without_evaluating_or_exporting(verb, wiki_shards, minilm_layers, tmp_path, capsys,
                                                                              monkeypatch):
    """The other Trainer verbs stop as finetune does (test_finetune_reliability.py sends the real
    signal): the checkpoint, one line, 143, and no evaluation, results or final/ of a partial
    run in the seconds a scheduler gives before the kill. A signal that came before the first
    step (here: at once) stops after it."""
    def signalled(self):
        self.received = "SIGTERM"
        return self

    monkeypatch.setattr(StopSignals, "__enter__", signalled)
    text = _corpus(tmp_path / "text.txt")
    out = tmp_path / "run"
    common = ["--out", str(out), "--batch-size", "4", "--device", "cpu", "--no-progress"]
    argv = {
        "lm-train": ["lm-train", "--train", str(text), "--valid", str(text), "--preset", "gpt2_2_128_2", "--vocab-size", "300",
                     "--block-size", "16"],
        "lm-train --char": ["lm-train", "--char", "--preset", "char_lstm_tiny", "--alphabet", "bytes", "--train", str(text), "--valid",
                            str(text)],
        "translate-train": ["translate-train", "--train-src", str(text), "--train-tgt", str(text), "--valid-src", str(text),
                            "--valid-tgt", str(text), "--preset", "rnn_attention_256_512", "--vocab-size", "300"],
        "pretrain-xlnet": ["pretrain-xlnet", "--data", str(wiki_shards), "--d-model", "32", "--n-layers", "1", "--n-heads", "2",
                           "--d-inner", "64"],
        "distill-pretrain": ["distill-pretrain", "--data", str(wiki_shards), "--teacher", str(minilm_layers(2)), "--student-layers",
                             "1", "--head-steps", "5"],
    }[verb]
    assert main([*argv, *common]) == 143
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("ctxkit: stopped by a signal at step 1")]
    resumable = verb in ("pretrain-xlnet", "distill-pretrain")
    assert len(lines) == 1 and lines[0].endswith("; add --resume to continue" if resumable else "/checkpoint holds it"), err
    if verb == "distill-pretrain":  # stopped while fitting the teacher's missing masked-LM head
        assert "step 1 of fitting the teacher's head" in lines[0] and (out / "teacher_head" / "checkpoint").is_dir()
    else:
        assert (out / "checkpoint").is_dir()
    assert not {"final", "results.json", "summary.json"} & {p.name for p in out.iterdir()}


def test_a_second_signal_stops_at_once_and_the_handlers_come_back():
    previous = signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals:
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        time.sleep(0.01)  # the handler runs between two bytecodes of the main thread
        assert signals.received == "SIGTERM"
        with pytest.raises(KeyboardInterrupt, match="a second SIGUSR1"):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
            time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) is previous


def test_every_training_verb_takes_on_sigterm():
    verbs = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices
    resumable = {name for name, p in verbs.items() if any("--resume" in a.option_strings for a in p._actions)}
    assert resumable <= set(TRAINING_VERBS)  # a new verb with --resume belongs in the list
    for name in TRAINING_VERBS:
        action = next(a for a in verbs[name]._actions if "--on-sigterm" in a.option_strings)
        assert action.default == "exit143" and set(action.choices) == {"exit143", "exit0"}
