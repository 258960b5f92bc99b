"""Truncated backpropagation through time on the Trainer: a model that declares
``CarriesState`` runs a ``StatefulStep``.

* each step's forward gets the (detached) state the previous step returned, and ``None`` at
  every epoch's first step; the batches come in stream order, so row r of step k+1 continues
  row r of step k;
* the state is saved in the checkpoint: a run stopped mid-epoch and resumed gives the
  uninterrupted run's losses and weights bit for bit, and its first resumed step starts from
  the saved state;
* carrying the state changes the training (a stateless run of the same batches differs);
* what cannot be honoured (gradient accumulation) is refused before any step;
* (beside) a warm-up given in steps, which the XL recipe names that way, wins over the ratio.
"""

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from ctxkit.core.capabilities import CarriesState, declares
from ctxkit.core.errors import UserError
from ctxkit.training import TrainConfig, Trainer
from ctxkit.training.steps import StatefulStep

VOCAB, ROWS, SEG = 23, 4, 6


class TinyRecurrentLM(nn.Module):
    """An LSTM language model trained segment by segment; it records what state each call got."""

    carries_state = True

    def __init__(self, carry: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 12)
        self.lstm = nn.LSTM(12, 12, batch_first=True)
        self.out = nn.Linear(12, VOCAB)
        self.carry = carry
        self.calls = []  # per training forward: None, or the sum of the state it got

    def forward(self, input_ids, labels, attention_mask=None, state=None):
        if self.training:
            self.calls.append(None if state is None else float(sum(s.double().sum() for s in state)))
        hidden, (h, c) = self.lstm(self.embed(input_ids), state if self.carry else None)
        loss = F.cross_entropy(self.out(hidden).flatten(0, 1), labels.flatten())
        return {"loss": loss, "state": (h, c)}


def _features(tokens: int = ROWS * SEG * 9 + 1):
    """Segment-major features: feature ``seg * ROWS + r`` is row r's segment ``seg`` of a stream
    cut into ROWS contiguous rows, so a batch of ROWS features is one segment of every row."""
    g = torch.Generator().manual_seed(3)
    # A stream with long-range structure: the state helps predict it.
    stream = torch.cat([torch.arange(VOCAB).roll(int(torch.randint(VOCAB, (1,), generator=g))) for _ in range(tokens // VOCAB + 1)])
    stream = stream[:tokens]
    cols = (tokens - 1) // ROWS
    inputs, targets = stream[:ROWS * cols].view(ROWS, cols), stream[1:ROWS * cols + 1].view(ROWS, cols)
    return [{"input_ids": inputs[r, s:s + SEG].tolist(), "labels": targets[r, s:s + SEG].tolist()}
            for s in range(0, cols - SEG + 1, SEG) for r in range(ROWS)]


CFG = dict(epochs=2, batch_size=ROWS, lr=1e-2, warmup_ratio=0.0, device="cpu", progress=False, log_every=1, seed=7,
           eval_each_epoch=False, save_every=4)


def test_the_state_is_carried_within_an_epoch_and_cleared_at_its_start(tmp_path):
    feats = _features()
    steps_per_epoch = len(feats) // ROWS
    model = TinyRecurrentLM()
    assert declares(model, CarriesState)
    trainer = Trainer(model, feats, TrainConfig(**CFG), tmp_path / "run")
    assert isinstance(trainer.step, StatefulStep) and not trainer.plan.cuda_graphs
    result = trainer.train()
    assert len(result.losses) == 2 * steps_per_epoch
    starts = [i for i, c in enumerate(model.calls) if c is None]
    assert starts == [0, steps_per_epoch]  # cleared exactly at each epoch's first step
    # Stream order: the batches are the segments one after another, every epoch.
    from ctxkit.training.trainer import _in_stream_order

    assert _in_stream_order([SEG] * len(feats), ROWS, 7, 1) == [list(range(i, i + ROWS)) for i in range(0, len(feats), ROWS)]
    # Carrying changes the computation: the same batches without the state train differently.
    stateless = TinyRecurrentLM(carry=False)
    other = Trainer(stateless, feats, TrainConfig(**CFG), tmp_path / "stateless").train()
    assert other.losses[0] == result.losses[0] and other.losses[1:] != result.losses[1:]


def test_resume_mid_epoch_continues_from_the_saved_state_bit_for_bit(tmp_path):
    feats = _features()
    full_model = TinyRecurrentLM()
    full = Trainer(full_model, feats, TrainConfig(**CFG), tmp_path / "full").train()
    cut = 6  # mid-epoch 0 (9 steps an epoch), two steps after the checkpoint at step 4
    Trainer(TinyRecurrentLM(), feats, TrainConfig(**CFG, max_steps=cut), tmp_path / "cut").train()
    torch.manual_seed(1234)  # disturb the RNG: resume restores it
    resumed_model = TinyRecurrentLM()
    resumed = Trainer(resumed_model, feats, TrainConfig(**CFG), tmp_path / "cut").train(resume=True)
    assert resumed.losses == full.losses  # bit-identical (tests/README.md)
    for a, b in zip(resumed_model.state_dict().values(), full_model.state_dict().values()):
        assert torch.equal(a, b)
    # The first resumed step got the state step `cut` left, not a fresh one.
    assert resumed_model.calls[0] is not None and resumed_model.calls[0] == full_model.calls[cut]


def test_gradient_accumulation_is_refused_for_a_stateful_model(tmp_path):
    with pytest.raises(UserError, match="carries its state from batch to batch: train it with grad_accum 1"):
        Trainer(TinyRecurrentLM(), _features(), TrainConfig(**{**CFG, "grad_accum": 2}), tmp_path / "run")



def test_warmup_given_in_steps_wins_over_the_ratio(tmp_path):
    """``warmup_steps`` (``--warmup-steps``) counts the warm-up directly: over 18 steps,
    ``warmup_steps=4`` reaches the peak at step 4 whatever ``warmup_ratio`` says."""
    feats = _features()
    cfg = dict(CFG, epochs=2, warmup_ratio=0.5, max_steps=None)
    Trainer(TinyRecurrentLM(), feats, TrainConfig(**cfg, warmup_steps=4), tmp_path / "run").train()
    import json

    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in records if r.get("event") == "train"]  # after steps 1, 2, ...: the next step's rate
    peak = CFG["lr"]
    assert len(lrs) == 18 and lrs[:5] == pytest.approx([peak * 2 / 4, peak * 3 / 4, peak, peak, peak * (1 - 1 / 14)])
    with pytest.raises(UserError, match="warmup_steps must be >= 0"):
        Trainer(TinyRecurrentLM(), feats, TrainConfig(**cfg, warmup_steps=-1), tmp_path / "bad")
