"""Trainer: exact resume, accumulation, schedule, logging, batching."""

import json

import pytest
import torch

from ctxkit.data.batching import collate, length_grouped_batches
from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead
from ctxkit.models import BertModel, get_preset
from ctxkit.training import TrainConfig, Trainer, linear_warmup_decay, predict
from tolerance import assert_close_to_reference, assert_paths_agree

TINY = get_preset("bert_2_128_2").config.replace(vocab_size=50, hidden_size=32, num_heads=2, ffn_size=64, max_position=32)


def _toy_features(n=96, seed=0):
    """Label = whether token 7 occurs; lengths vary so padding and grouping matter."""
    g = torch.Generator().manual_seed(seed)
    feats = []
    for i in range(n):
        length = int(torch.randint(4, 20, (1,), generator=g))
        ids = torch.randint(8, 50, (length,), generator=g).tolist()
        label = i % 2
        if label:
            ids[int(torch.randint(1, length, (1,), generator=g))] = 7
        ids = [2] + ids + [3]
        feats.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids), "labels": label})
    return feats


def _model(dropout=0.1):
    torch.manual_seed(0)
    return EncoderWithHead(BertModel(TINY.replace(dropout=dropout, attention_dropout=dropout)), SequenceClassificationHead(32, 2, dropout))


def _accuracy(model, feats):
    logits = predict(model, feats, batch_size=16, device="cpu")
    return {"accuracy": sum(int(l.argmax() == f["labels"]) for l, f in zip(logits, feats)) / len(feats)}


def test_resume_equals_uninterrupted(tmp_path):
    feats = _toy_features()
    cfg = dict(epochs=2, batch_size=8, lr=1e-3, device="cpu", progress=False, log_every=1, seed=5)
    full_trainer = Trainer(_model(), feats, TrainConfig(**cfg), tmp_path / "full")
    full = full_trainer.train()
    assert len(full.losses) == 24
    # Stop after 7 steps (mid-epoch 0), then resume in a fresh process-like setting.
    Trainer(_model(), feats, TrainConfig(**cfg, max_steps=7), tmp_path / "cut").train()
    state = json.loads((tmp_path / "cut" / "checkpoint" / "trainer_state.json").read_text())
    assert (state["epoch"], state["batch_in_epoch"], state["step"]) == (0, 7, 7)
    torch.manual_seed(1234)  # disturb every RNG: resume must restore them
    other = _model()
    resumed = Trainer(other, feats, TrainConfig(**cfg), tmp_path / "cut").train(resume=True)
    assert len(resumed.losses) == 24
    # The same computation replayed from the checkpoint (tests/README.md): bit-identical.
    assert resumed.losses == full.losses
    for a, b in zip(other.state_dict().values(), full_trainer.model.state_dict().values()):
        assert torch.equal(a, b)
    # Dropout is on, so equal losses mean the RNG stream was restored too.
    assert full.losses[7] != full.losses[8]


def test_resume_across_epoch_boundary_with_evaluation(tmp_path):
    feats = _toy_features()
    cfg = dict(epochs=3, batch_size=16, lr=1e-3, device="cpu", progress=False, seed=1)
    evaluate = lambda m: _accuracy(m, feats[:32])  # noqa: E731
    full = Trainer(_model(), feats, TrainConfig(**cfg), tmp_path / "a", evaluate, "accuracy").train()
    Trainer(_model(), feats, TrainConfig(**cfg, max_steps=6), tmp_path / "b", evaluate, "accuracy").train()  # exactly 1 epoch
    resumed = Trainer(_model(), feats, TrainConfig(**cfg), tmp_path / "b", evaluate, "accuracy").train(resume=True)
    assert resumed.losses == full.losses  # bit-identical (tests/README.md)
    assert [h["accuracy"] for h in resumed.history] == [h["accuracy"] for h in full.history]


def test_eval_every_evaluates_mid_epoch_keeps_the_best_and_resumes_exactly(tmp_path):
    """``eval_every=4`` over epochs of 6 steps: evaluations at steps 4, 6 (the epoch's), 8 and 12
    (the epoch's; step 12's own is not doubled); each is a candidate for best/; a run stopped
    at step 5 and resumed gives the same losses and the same evaluations."""
    feats = _toy_features()
    cfg = dict(epochs=2, batch_size=16, lr=2e-3, device="cpu", progress=False, seed=3, eval_every=4)
    evaluate = lambda m: _accuracy(m, feats[:48])  # noqa: E731
    saved = []

    def save_best(model, folder):
        saved.append(sum(float(p.detach().sum()) for p in model.parameters()))

    full = Trainer(_model(), feats, TrainConfig(**cfg), tmp_path / "a", evaluate, "accuracy", save_best=save_best).train()
    assert [h["step"] for h in full.history] == [4, 6, 8, 12]
    assert [h["epoch"] for h in full.history] == [0, 0, 1, 1]
    accuracies = [h["accuracy"] for h in full.history]
    improved = [i for i, a in enumerate(accuracies) if a > max(accuracies[:i], default=-1.0)]
    assert len(saved) == len(improved) and full.best_metric == max(accuracies)
    log = [json.loads(line) for line in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["event"] == "eval"] == [4, 6, 8, 12]
    Trainer(_model(), feats, TrainConfig(**cfg, max_steps=5), tmp_path / "b", evaluate, "accuracy").train()
    resumed = Trainer(_model(), feats, TrainConfig(**cfg), tmp_path / "b", evaluate, "accuracy").train(resume=True)
    assert resumed.losses == full.losses  # bit-identical (tests/README.md)
    assert [(h["step"], h["accuracy"]) for h in resumed.history if h.get("stop") is None] == \
        [(h["step"], h["accuracy"]) for h in full.history]
    with pytest.raises(ValueError, match="eval_every must be >= 0"):
        Trainer(_model(), feats, TrainConfig(**{**cfg, "eval_every": -1}), tmp_path / "c", evaluate, "accuracy")


def test_learns_toy_task_logs_and_saves_best(tmp_path):
    feats = _toy_features(192)
    saved = []
    trainer = Trainer(
        _model(), feats, TrainConfig(epochs=6, batch_size=16, lr=2e-3, device="cpu", progress=False, log_every=5),
        tmp_path, lambda m: _accuracy(m, feats), "accuracy", save_best=lambda m, d: saved.append(d),
    )
    result = trainer.train()
    assert result.best_metric >= 0.9  # chance is 0.5
    assert saved and result.best_epoch is not None
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert log[0]["event"] == "start" and log[-1]["event"] == "end"
    assert sum(r["event"] == "eval" for r in log) == 6
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_curve_is_redrawn_at_most_every_curve_every_s_and_after_the_last_epoch(tmp_path, monkeypatch):
    from ctxkit.core import plots
    from ctxkit.training import trainer as trainer_module

    drawn = []
    monkeypatch.setattr(plots, "plot_training_curve", lambda points, history, *a, **k: drawn.append(len(history)))
    feats = _toy_features(64)
    cfg = TrainConfig(epochs=4, batch_size=16, lr=1e-3, device="cpu", progress=False)
    Trainer(_model(), feats, cfg, tmp_path / "a", lambda m: _accuracy(m, feats), "accuracy").train()
    assert drawn == [4]  # four short epochs: one drawing, after the last, with every epoch's evaluation
    drawn.clear()
    monkeypatch.setattr(trainer_module, "CURVE_EVERY_S", 0.0)
    Trainer(_model(), feats, cfg, tmp_path / "b", lambda m: _accuracy(m, feats), "accuracy").train()
    assert drawn == [1, 2, 3, 4]  # no minimum interval: a drawing at every epoch end


def test_with_background_saves_the_curve_is_redrawn_on_a_thread_and_finally_in_the_run(tmp_path, monkeypatch):
    """Where checkpoints go on a thread (the GPU default) the redraws between epochs go on one
    too (the device keeps stepping); the last drawing waits for them and is the run's own."""
    import threading

    from ctxkit.core import plots
    from ctxkit.training import trainer as trainer_module

    drawn, release = [], threading.Event()

    def draw(points, history, *a, **k):
        if threading.current_thread() is not threading.main_thread():
            release.wait(120)  # a slow drawing: the next epoch's redraw is skipped, not queued
        drawn.append((threading.current_thread().name, len(history), len(points)))

    monkeypatch.setattr(plots, "plot_training_curve", draw)
    monkeypatch.setattr(trainer_module, "CURVE_EVERY_S", 0.0)
    feats = _toy_features(64)
    cfg = TrainConfig(epochs=4, batch_size=16, lr=1e-3, device="cpu", progress=False, background_saves=True)
    evaluations = []

    def evaluate(model):
        evaluations.append(1)
        if len(evaluations) == 4:  # the last epoch's: the first drawing may finish now
            release.set()
        return _accuracy(model, feats)

    Trainer(_model(), feats, cfg, tmp_path / "a", evaluate, "accuracy").train()
    # The first epoch's redraw ran on the thread and held it while epochs 2 and 3 ended (their
    # redraws skipped); the final drawing waited for it, in the training thread, with all 16 steps.
    assert drawn == [("ctxkit-curve", 1, 4), ("MainThread", 4, 16)]

def test_gradient_accumulation_matches_large_batch(tmp_path):
    feats = _toy_features(64)
    cfg = dict(epochs=1, lr=1e-3, device="cpu", progress=False, seed=3)
    one = Trainer(_model(0.0), feats, TrainConfig(batch_size=16, **cfg), tmp_path / "one")
    acc = Trainer(_model(0.0), feats, TrainConfig(batch_size=16, grad_accum=2, **cfg), tmp_path / "acc")
    # Same examples per optimiser step (the grouping is by micro-batch, so compare on one fixed batch).
    batch = collate(feats[:16])
    one.model.train(), acc.model.train()
    loss = one.model(**batch)["loss"]
    loss.backward()
    for half in (feats[:8], feats[8:16]):
        (acc.model(**collate(half))["loss"] * 0.5).backward()
    # The same gradient summed in another order over other padded shapes (tests/README.md): the
    # backward pass goes through the head, 2 layers and the embeddings twice over (depth 8),
    # its longest reductions run over the tokens of the batch (16 rows of up to 21). Gradients
    # are sums that cancel (the key bias's is zero in exact arithmetic, softmax ignoring a
    # shift shared by all keys; the classifier bias's sums p - y over the batch), so the scale
    # is the size of their terms, sum |terms|, not of the result: per logit the mean
    # cross-entropy contributes |p - y| / batch, at most 1 summed over the batch; the
    # classifier multiplies it by the tanh pooler output (|x| <= 1) and the layers below pass
    # it back through weights of std 0.02, which shrink it. So 1.
    for (name, p), q in zip(one.model.named_parameters(), acc.model.parameters()):
        assert_paths_agree(p.grad, q.grad, depth=8, k=16 * 21, scale=1.0, name=f"gradient of {name}")
    with pytest.raises(ValueError, match="not divisible"):
        Trainer(_model(), feats, TrainConfig(batch_size=10, grad_accum=3), tmp_path / "bad")


def test_schedule_and_batching():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = linear_warmup_decay(opt, warmup_steps=4, total_steps=12)
    lrs = []
    for _ in range(12):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[4:] == pytest.approx([1 - i / 8 for i in range(8)])
    lengths = [5, 30, 6, 29, 7, 28, 8, 27] * 10
    a = length_grouped_batches(lengths, 4, seed=1, epoch=0)
    assert a == length_grouped_batches(lengths, 4, seed=1, epoch=0)
    assert a != length_grouped_batches(lengths, 4, seed=1, epoch=1)
    assert sorted(i for b in a for i in b) == list(range(80))
    padded = sum(max(lengths[i] for i in b) * len(b) for b in a)
    assert padded < 1.2 * sum(lengths)  # grouping keeps padding small
    batch = collate([{"input_ids": [1, 2, 3], "labels": [0, 1, 2], "score": 0.5}, {"input_ids": [4], "labels": [1], "score": 1.0}], multiple_of=4)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 0], [4, 0, 0, 0]]
    assert batch["labels"].tolist() == [[0, 1, 2, -100], [1, -100, -100, -100]]
    assert batch["score"].dtype == torch.float32


def test_lamb_step_matches_its_definition():
    from ctxkit.training.optim import Lamb

    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = Lamb([w], lr=0.1, weight_decay=0.5, eps=0.0)
    w.grad = torch.tensor([1.0, -2.0])
    opt.step()
    # step 1: m_hat = g, v_hat = g^2 -> adam part = sign(g) = [1, -1]; + 0.5 * w = [2.5, 1.0]
    update = torch.tensor([2.5, 1.0])
    trust = 5.0 / update.norm()  # ||w|| = 5
    exact = torch.tensor([3.0, 4.0], dtype=torch.float64) - 0.1 * (5.0 / update.double().norm()) * update.double()
    bound = dict(depth=5, k=2, scale=5.0)  # moments, sqrt, ratio, 2-term norms, the step; at the size of w (||w|| = 5)
    assert_close_to_reference(w.detach(), exact, name="LAMB step", **bound)
    assert_close_to_reference(torch.tensor([3.0, 4.0]) - 0.1 * trust * update, exact, name="the definition in float32", **bound)


def test_lamb_trains_and_keep_last_checkpoints(tmp_path):
    feats = _toy_features(64)
    cfg = TrainConfig(epochs=3, batch_size=16, lr=5e-3, device="cpu", progress=False, optimizer="lamb", keep_last=2, log_every=1)
    result = Trainer(_model(0.0), feats, cfg, tmp_path).train()
    assert result.losses[-1] < result.losses[0]
    kept = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint"))
    assert kept == ["checkpoint", "checkpoint-step8"]  # latest (step 12) + the one before
    assert json.loads((tmp_path / "checkpoint" / "trainer_state.json").read_text())["step"] == 12
    with pytest.raises(ValueError, match="optimizer must be"):
        Trainer(_model(), feats, TrainConfig(optimizer="sgd"), tmp_path / "x")


def test_time_budget_stops_with_a_resumable_checkpoint(tmp_path):
    feats = _toy_features(64)
    cfg = TrainConfig(epochs=50, batch_size=16, lr=1e-3, device="cpu", progress=False, max_minutes=0.0)
    result = Trainer(_model(), feats, cfg, tmp_path).train()
    assert result.steps == 1  # the first step already exceeds a zero budget
    state = json.loads((tmp_path / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 1 and state["batch_in_epoch"] == 1


def test_epoch_and_budget_lines_start_their_own_line_with_progress_on(tmp_path, capsys):
    """With the tqdm bar on stderr, "epoch N: ..." and the time-budget message clear the bar
    first and start a line of their own (they used to be glued to the end of the bar)."""
    import logging
    import sys

    from terminal import screen_lines

    handler = logging.StreamHandler(sys.stderr)  # as the command line sets it up (on the captured stderr)
    log = logging.getLogger("ctxkit")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a toy model: a second thread only adds synchronisation on a shared CPU
    try:
        feats = _toy_features(32)
        cfg = dict(batch_size=8, lr=1e-3, device="cpu", progress=True, log_every=2)
        Trainer(_model(), feats, TrainConfig(epochs=2, **cfg), tmp_path / "a", lambda m: _accuracy(m, feats[:8]), "accuracy").train()
        err = capsys.readouterr().err
        screen = screen_lines(err)
        assert [line.split(":")[0] for line in screen if "epoch" in line] == ["epoch 0", "epoch 1"], screen
        assert "" not in screen and "\rtrain:" in err  # the bar was drawn, and no blank lines
        Trainer(_model(), feats, TrainConfig(epochs=2, max_minutes=0.0, **cfg), tmp_path / "b").train()
        err = capsys.readouterr().err
        assert err.count("time budget") == 1 and "time budget of 0 min reached at step 1" in screen_lines(err)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        torch.set_num_threads(threads)


def test_a_diverged_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    """A loss that stops being finite (NaN weights train on at full speed) ends the run at the
    next log step with one line, before any checkpoint can keep the broken weights; the
    checkpoint written before it is left as it was."""
    from ctxkit.core.errors import UserError

    class Poisoned(torch.nn.Module):  # the toy classifier, its loss NaN from the 6th call on
        def __init__(self):
            super().__init__()
            self.inner, self.calls = _model(), 0

        def forward(self, **batch):
            out = self.inner(**batch)
            self.calls += 1
            return {**out, "loss": out["loss"] * (float("nan") if self.calls >= 6 else 1.0)}

    cfg = TrainConfig(epochs=2, batch_size=8, lr=1e-3, device="cpu", progress=False, log_every=2, save_every=4, seed=5)
    with pytest.raises(UserError) as error:
        Trainer(Poisoned(), _toy_features(), cfg, tmp_path / "run").train()
    message = str(error.value)
    assert "the training loss is nan at step 6: training diverged" in message and "the last checkpoint (step 4) is intact" in message
    assert "--lr (the peak was 0.001)" in message and "\n" not in message
    state = json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 4 and all(loss == loss for loss in state["losses"])  # no NaN kept


def test_background_checkpoints_resume_exactly_and_hand_their_errors_over(tmp_path, monkeypatch):
    """Checkpoints written on a thread (the GPU default, forced here) hold the state of the
    step they were taken at, although training went on while they were written: a resume
    from one equals the uninterrupted run bit for bit. A write that fails reaches the
    training thread (at the next checkpoint or the end), and the checkpoint before it stays."""
    from ctxkit.core.errors import UserError
    from ctxkit.training import world_resume as trainer_module  # the trainer's checkpoint code

    feats = _toy_features()
    cfg = dict(epochs=2, batch_size=8, lr=1e-3, device="cpu", progress=False, log_every=1, seed=5, background_saves=True)
    full = Trainer(_model(), feats, TrainConfig(**cfg), tmp_path / "full").train()
    Trainer(_model(), feats, TrainConfig(**cfg, max_steps=7, save_every=3), tmp_path / "cut").train()
    state = json.loads((tmp_path / "cut" / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 7
    torch.manual_seed(1234)
    resumed = Trainer(_model(), feats, TrainConfig(**cfg), tmp_path / "cut").train(resume=True)
    assert resumed.losses == full.losses

    real_save, calls = trainer_module.save_checkpoint, []

    def failing_second(folder, **kw):
        calls.append(kw["trainer_state"]["step"])
        if len(calls) == 2:
            raise UserError(f"no space left on device writing {folder}")
        return real_save(folder, **kw)

    monkeypatch.setattr(trainer_module, "save_checkpoint", failing_second)
    with pytest.raises(UserError, match="no space left on device"):
        Trainer(_model(), feats, TrainConfig(**cfg, save_every=2), tmp_path / "full_disk").train()
    assert calls[:2] == [2, 4] and len(calls) == 2  # raised when the third save waited for the second
    kept = json.loads((tmp_path / "full_disk" / "checkpoint" / "trainer_state.json").read_text())
    assert kept["step"] == 2
