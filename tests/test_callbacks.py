"""Watching training live: the callback interface, ``--log-to`` and its writers.

TensorBoard is read back from its event files; MLflow and W&B are replaced by fake modules
that record every call (the real packages are optional extras). The fine-tuning runs use
the randomly initialised 2-layer, 32-wide BERT (``tiny_bert_dir``): a step costs milliseconds.
"""

import importlib.util
import json
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch.nn.functional as F
from torch import nn

from ctxkit.cli import main
from ctxkit.training import TrainConfig, Trainer
from ctxkit.training.callbacks import Callback, CallbackList, JsonlWriter, make_callbacks


def _finetune(model_dir, data, out, *extra):
    return main(["finetune", "table", "--model", str(model_dir), "--data", str(data), "--out", str(out), "--epochs", "1",
                 "--batch-size", "8", "--max-length", "32", "--lr", "1e-3", "--device", "cpu", "--no-progress", "--log-every", "1",
                 *extra])


def _log(run: Path, name: str = "log.jsonl") -> list:
    return [json.loads(line) for line in (run / name).read_text(encoding="utf-8").splitlines()]


def _scalars(folder: Path) -> dict:
    """``{tag: [(step, value), ...]}`` of the TensorBoard event files in ``folder``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _f32(x: float) -> float:
    return float(np.float32(x))  # TensorBoard stores scalars as float32


# -- (a) ctxkit finetune --log-to tensorboard ---------------------------------------------


def test_finetune_tensorboard_scalars_equal_log_jsonl(tiny_bert_dir, sst_table, tmp_path):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    assert _finetune(tiny_bert_dir, sst_table, run, "--log-to", "tensorboard") == 0
    log = _log(run)
    train = [r for r in log if r["event"] == "train"]
    evals = [r for r in log if r["event"] == "eval"]
    assert [r["step"] for r in train] == list(range(1, 7)) and [r["step"] for r in evals] == [6]
    scalars = _scalars(run / "tensorboard")
    assert scalars["train/loss"] == [(r["step"], _f32(r["loss"])) for r in train]
    assert scalars["train/lr"] == [(r["step"], _f32(r["lr"])) for r in train]
    assert scalars["dev/accuracy"] == [(r["step"], _f32(r["accuracy"])) for r in evals]
    assert not any(tag.endswith(("/step", "/epoch", "/elapsed")) for tag in scalars)  # bookkeeping is not plotted


def test_tensorboard_resume_hides_what_the_interrupted_attempt_logged_after_its_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    from ctxkit.training.callbacks import TensorBoardWriter

    first = TensorBoardWriter(tmp_path)
    first.on_train_begin({"config": {"lr": 0.1}})
    for step in range(1, 6):  # checkpoint at step 3, then a crash after step 5
        first.on_log(step, {"step": step, "loss": float(step)})
    first.close()
    # TensorBoard reads event files in name order, and names start with the second of
    # creation: a real resume is a later process; here wait for the next second.
    second = int(time.time())
    while int(time.time()) == second:
        time.sleep(0.02)
    again = TensorBoardWriter(tmp_path)
    again.on_train_begin({"config": {"lr": 0.1}, "resumed_at_step": 3})
    for step in range(4, 7):
        again.on_log(step, {"step": step, "loss": 10.0 + step})
    again.close()
    assert _scalars(tmp_path / "tensorboard")["train/loss"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 14.0), (5, 15.0), (6, 16.0)]


# -- (b) pretraining loops ----------------------------------------------------------------


def test_transformer_xl_cli_logs_to_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    corpus = tmp_path / "train.txt"
    corpus.write_text("".join(f"w{i % 7} w{i % 5} w{i % 3} w{i % 2}\n" for i in range(40)), encoding="utf-8")
    out = tmp_path / "xl"
    assert main(["train-transformer-xl", "--train", str(corpus), "--valid", str(corpus), "--out", str(out), "--d-model", "16",
                 "--n-heads", "2", "--d-inner", "32", "--n-layers", "1", "--tgt-len", "8", "--mem-len", "8", "--batch-size", "2",
                 "--max-steps", "4", "--log-every", "2", "--device", "cpu", "--no-progress", "--log-to", "tensorboard"]) == 0
    log = _log(out)
    train, evals = [r for r in log if "eval" not in r], [r["eval"] for r in log if "eval" in r]
    scalars = _scalars(out / "tensorboard")
    assert scalars["train/loss"] == [(2, _f32(train[0]["loss"])), (4, _f32(train[1]["loss"]))]
    assert scalars["valid/perplexity"] == [(4, _f32(evals[-1]["perplexity"]))]


def test_word2vec_reports_each_chunk_and_the_epoch_losses():
    from ctxkit.pretraining.word2vec import train_word2vec

    class Recorder(Callback):
        def __init__(self):
            self.logs, self.begun, self.ended, self.closed = [], None, None, False

        def on_train_begin(self, run_info):
            self.begun = run_info

        def on_log(self, step, metrics):
            self.logs.append((step, metrics))

        def on_train_end(self, summary):
            self.ended = summary

        def close(self):
            self.closed = True

    rng = np.random.default_rng(0)
    sentences = [[f"w{i}" for i in rng.integers(0, 30, 8)] for _ in range(300)]
    recorder = Recorder()
    vectors = train_word2vec(sentences, dim=8, min_count=1, epochs=2, subsample=0, chunk_tokens=1000, progress=False,
                             callbacks=[recorder])
    assert recorder.begun["config"]["dim"] == 8 and recorder.begun["train_tokens"] == 2400 and recorder.closed
    steps = [s for s, _ in recorder.logs]
    assert steps == sorted(steps) and steps[-1] == 2 * 2400 and len(steps) >= 4  # 3 chunks per epoch
    last_of_epoch = [next(m for s, m in reversed(recorder.logs) if m["epoch"] == e) for e in (0, 1)]
    assert [round(m["loss"], 4) for m in last_of_epoch] == vectors.meta["epoch_losses"] == recorder.ended["epoch_losses"]


# -- (c) MLflow and W&B with fake modules ------------------------------------------------


class _Calls(list):
    def recorder(self, name, result=None):
        def record(*args, **kwargs):
            self.append((name, args, kwargs))
            return result(*args, **kwargs) if callable(result) else result
        return record


def _fake_mlflow(calls: _Calls) -> types.ModuleType:
    mlflow = types.ModuleType("mlflow")
    started = []

    def start_run(run_id=None, run_name=None):
        started.append(run_id)
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id=run_id or f"mlflow-{len(started)}"))

    for name in ("set_tracking_uri", "log_params", "log_metrics", "end_run"):
        setattr(mlflow, name, calls.recorder(name))
    mlflow.start_run = calls.recorder("start_run", start_run)
    return mlflow


def _fake_wandb(calls: _Calls) -> types.ModuleType:
    wandb = types.ModuleType("wandb")

    def init(**kwargs):
        run = types.SimpleNamespace(id=kwargs["id"] or "wandb-1")
        run.log = calls.recorder("run.log")
        run.finish = calls.recorder("run.finish")
        return run

    wandb.init = calls.recorder("init", init)
    return wandb


def _named(calls, name):
    return [(args, kwargs) for n, args, kwargs in calls if n == name]


def test_resume_continues_every_writer_mlflow_and_wandb_get_the_logged_metrics(tiny_bert_dir, sst_table, tmp_path, monkeypatch):
    for var in ("MLFLOW_TRACKING_URI", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    ml, wb = _Calls(), _Calls()
    monkeypatch.setitem(sys.modules, "mlflow", _fake_mlflow(ml))
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(wb))
    run = tmp_path / "run"
    assert _finetune(tiny_bert_dir, sst_table, run, "--max-steps", "3", "--log-to", "mlflow,wandb,tensorboard") == 0
    assert _finetune(tiny_bert_dir, sst_table, run, "--resume", "--log-to", "mlflow,tensorboard", "--log-to", "wandb") == 0
    log = _log(run)
    assert [r["event"] for r in log].count("start") == 1  # the log goes on after a resume
    train = [r for r in log if r["event"] == "train"]
    evals = [r for r in log if r["event"] == "eval"]
    assert [r["step"] for r in train] == list(range(1, 7))
    assert [r["step"] for r in evals] == [3, 6]  # the stop, then the epoch's end
    if importlib.util.find_spec("tensorboard") is not None:  # each step shows once after the resume
        scalars = _scalars(run / "tensorboard")
        assert scalars["train/loss"] == [(r["step"], _f32(r["loss"])) for r in train]
        assert scalars["dev/accuracy"] == [(r["step"], _f32(r["accuracy"])) for r in evals]

    # MLflow: a file store in the run folder, one run continued by the resume, parameters once.
    assert _named(ml, "set_tracking_uri")[0][0] == ((run / "mlruns").resolve().as_uri(),)
    assert [kw["run_id"] for _, kw in _named(ml, "start_run")] == [None, "mlflow-1"]
    params = _named(ml, "log_params")
    assert len(params) == 1 and params[0][0][0]["lr"] == "0.001" and params[0][0][0]["batch_size"] == "8"
    metrics = [(kw["step"], args[0]) for args, kw in _named(ml, "log_metrics")]
    train_metrics = [(s, m) for s, m in metrics if "train/loss" in m]
    assert [(s, m["train/loss"], m["train/lr"]) for s, m in train_metrics] == [(r["step"], r["loss"], r["lr"]) for r in train]
    assert set(train_metrics[0][1]) == {"train/loss", "train/lr", "train/seq_per_s", "train/tokens_per_s"}
    assert [(s, m) for s, m in metrics if "train/loss" not in m] == [(r["step"], {"dev/accuracy": r["accuracy"]}) for r in evals]
    assert [kw["status"] for _, kw in _named(ml, "end_run")] == ["FINISHED", "FINISHED"]

    # W&B: the same values, the run folder as dir, the same run resumed.
    inits = [kw for _, kw in _named(wb, "init")]
    assert [(kw["project"], kw["dir"], kw["id"], kw["resume"]) for kw in inits] == [("ctxkit", str(run), None, None),
                                                                                    ("ctxkit", str(run), "wandb-1", "allow")]
    assert inits[0]["config"]["lr"] == 0.001
    logged = [(kw["step"], args[0]) for args, kw in _named(wb, "run.log")]
    assert [(s, m["train/loss"]) for s, m in logged if "train/loss" in m] == [(r["step"], r["loss"]) for r in train]
    assert [(s, m) for s, m in logged if "train/loss" not in m] == [(r["step"], {"dev/accuracy": r["accuracy"]}) for r in evals]
    assert [kw["exit_code"] for _, kw in _named(wb, "run.finish")] == [0, 0]
    assert json.loads((run / "monitoring.json").read_text()) == {"mlflow_run_id": "mlflow-1", "wandb_run_id": "wandb-1"}


def test_mlflow_honours_the_tracking_uri_and_a_failed_run_ends_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    calls = _Calls()
    monkeypatch.setitem(sys.modules, "mlflow", _fake_mlflow(calls))
    (writer,) = make_callbacks(["mlflow"], tmp_path / "run")
    with pytest.raises(KeyboardInterrupt), CallbackList([writer]) as callbacks:
        callbacks.on_train_begin({"config": {"lr": 0.5, "model": {"layers": 2}}})
        callbacks.on_log(7, {"step": 7, "epoch": 0, "loss": 1.5, "note": "text is not a metric", "flag": True})
        raise KeyboardInterrupt
    assert [name for name, _, _ in calls] == ["start_run", "log_params", "log_metrics", "end_run"]
    assert calls[1][1] == ({"lr": "0.5", "model.layers": "2"},)
    assert calls[2][1:] == (({"train/loss": 1.5},), {"step": 7})
    assert calls[3][2] == {"status": "FAILED"}


# -- (d) a missing extra or a wrong name is refused before any training ---------------------


@pytest.mark.parametrize("writer, hidden", [("tensorboard", ("tensorboard", "torch.utils.tensorboard")), ("mlflow", ("mlflow",)),
                                            ("wandb", ("wandb",))])
def test_missing_extra_exits_2_with_one_line_before_training(writer, hidden, tmp_path, monkeypatch, capsys):
    for module in hidden:
        monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    run = tmp_path / "run"
    # The data does not exist: a writer checked after the data would fail with another message.
    assert main(["finetune", "sst-2", "--data", str(tmp_path / "nodata"), "--out", str(run), "--log-to", writer]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"pip install 'ctxkit[{writer}]'" in err[0] and err[0].startswith("ctxkit: error: ")
    assert not run.exists()


def test_missing_extra_is_refused_by_every_training_verb(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)
    nothing = str(tmp_path / "missing.txt")
    verbs = [["pretrain", "--data", nothing], ["lm-train", "--train", nothing, "--valid", nothing],
             ["translate-train", "--train-src", nothing, "--train-tgt", nothing, "--valid-src", nothing, "--valid-tgt", nothing],
             ["word2vec-train", nothing], ["pretrain-elmo", "--train", nothing], ["pretrain-xlnet", "--data", nothing],
             ["train-transformer-xl", "--train", nothing, "--max-steps", "1"]]
    for verb in verbs:
        out = tmp_path / verb[0] / ("vectors.vec" if verb[0] == "word2vec-train" else "run")
        assert main([*verb, "--out", str(out), "--log-to", "wandb"]) == 2, verb[0]
        assert "pip install 'ctxkit[wandb]'" in capsys.readouterr().err, verb[0]
        assert not out.parent.exists(), verb[0]


def test_unknown_writer_names_the_valid_ones(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["finetune", "sst-2", "--data", "x", "--out", "y", "--log-to", "tensorboard,tensorbord"])
    assert exit_.value.code == 2
    assert "unknown writer 'tensorbord'; choose from tensorboard, mlflow, wandb" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a trainer verb with its own parser checks the same way
        main(["pretrain-elmo", "--train", "x", "--out", "y", "--log-to", "neptune"])
    assert "choose from tensorboard, mlflow, wandb" in capsys.readouterr().err


# -- (e) a failing callback stops training and every callback is still closed --------------


class _Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(20, 2)

    def forward(self, input_ids, labels, **_):
        return {"loss": F.cross_entropy(self.bag(input_ids), labels)}


class _Recorder(Callback):
    def __init__(self, fail_at=None):
        self.steps, self.closed, self.fail_at = [], 0, fail_at

    def on_log(self, step, metrics):
        self.steps.append(step)
        if step == self.fail_at:
            raise RuntimeError(f"writer broke at step {step}")

    def close(self):
        self.closed += 1


def test_a_callback_raising_mid_training_still_closes_the_others(tmp_path):
    features = [{"input_ids": [1 + i % 7, 2 + i % 5, 3], "labels": i % 2} for i in range(32)]
    before, broken, after = _Recorder(), _Recorder(fail_at=3), _Recorder()
    trainer = Trainer(_Toy(), features, TrainConfig(epochs=2, batch_size=4, lr=0.1, device="cpu", progress=False, log_every=1),
                      tmp_path, callbacks=[before, broken, after])
    with pytest.raises(RuntimeError, match="writer broke at step 3"):
        trainer.train()
    assert before.steps == broken.steps == after.steps == [1, 2, 3]  # step 3 still reached every callback
    assert (before.closed, broken.closed, after.closed) == (1, 1, 1)
    assert [r["step"] for r in _log(tmp_path) if r["event"] == "train"] == [1, 2, 3]  # log.jsonl is written first


def test_callback_list_closes_every_callback_when_one_close_fails():
    class BadClose(_Recorder):
        def close(self):
            super().close()
            raise OSError("disk full")

    first, bad, last = _Recorder(), BadClose(), _Recorder()
    with pytest.raises(OSError, match="disk full"):  # training went well: the failed close is reported
        with CallbackList([first, bad, last]):
            pass
    assert (first.closed, bad.closed, last.closed) == (1, 1, 1)
    with pytest.raises(ValueError, match="training failed"):  # the training error wins over the close error
        with CallbackList([BadClose()]):
            raise ValueError("training failed")


def test_jsonl_writer_layouts(tmp_path):
    events, plain = JsonlWriter(tmp_path / "events.jsonl"), JsonlWriter(tmp_path / "plain.jsonl", style="plain")
    for writer in (events, plain):
        writer.on_train_begin({"config": {"lr": 1}})
        writer.on_train_begin({"config": {"lr": 1}, "resumed_at_step": 2})
        writer.on_log(2, {"step": 2, "loss": 0.5})
        writer.on_eval(2, {"epoch": 0, "step": 2, "accuracy": 1.0})
        writer.on_train_end({"steps": 2})
    assert (tmp_path / "events.jsonl").read_text() == (
        '{"event": "start", "config": {"lr": 1}}\n{"event": "train", "step": 2, "loss": 0.5}\n'
        '{"event": "eval", "epoch": 0, "step": 2, "accuracy": 1.0}\n{"event": "end", "steps": 2}\n')
    assert (tmp_path / "plain.jsonl").read_text() == (
        '{"step": 2, "loss": 0.5}\n{"eval": {"epoch": 0, "step": 2, "accuracy": 1.0}}\n')
