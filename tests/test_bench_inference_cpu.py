"""benchmarks/cpu_batches.py: what benchmarks/inference_cpu.py feeds its SST-2 throughput peers.

The fair peer must run the very batches ctxkit's ``predict`` runs (same sentences in the same
batches, same order, same padding), or its row compares batching policies instead of model
code; the file-order peer gets the sentences in file order. Nothing is timed: the timing
loop is checked with a fake clock. Well under a second.
"""

import importlib.util
import random
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from ctxkit.training import predict

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cpu_batches():
    spec = importlib.util.spec_from_file_location("ctxkit_test_cpu_batches", REPO / "benchmarks" / "cpu_batches.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _features(n=37, seed=0):
    """Sentence features of mixed lengths (many ties), each starting with its own index + 1000."""
    rng = random.Random(seed)
    feats = []
    for i in range(n):
        length = rng.choice([3, 5, 5, 8, 8, 8, 13, 21])
        types = [0] * (length // 2) + [1] * (length - length // 2)  # a pair: token types must travel too
        feats.append({"input_ids": [1000 + i] + [rng.randrange(5, 900) for _ in range(length - 1)],
                      "token_type_ids": types, "attention_mask": [1] * length, "labels": rng.randrange(2)})
    return feats


class _Recorder(nn.Module):
    """Records every batch a task model is called with; returns zero logits."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, **rest):
        self.calls.append({"input_ids": input_ids.clone(), "token_type_ids": token_type_ids.clone(),
                           "attention_mask": attention_mask.clone(), **{k: v.clone() for k, v in rest.items()}})
        return {"logits": torch.zeros(input_ids.shape[0], 2)}


@pytest.mark.parametrize("batch_size", [1, 4, 8, 64])
def test_fair_peer_gets_the_batches_predict_runs(cpu_batches, batch_size):
    feats = _features()
    model = _Recorder()
    predict(model, feats, batch_size=batch_size, device="cpu")
    batches = cpu_batches.length_sorted_batches(feats, batch_size)
    assert len(batches) == len(model.calls) == -(-len(feats) // batch_size)
    for batch, call in zip(batches, model.calls):
        assert sorted(batch.inputs) == sorted(call) == sorted(cpu_batches.MODEL_INPUTS)  # no labels, nothing else
        for key in call:
            assert batch.inputs[key].dtype == call[key].dtype == torch.int64
            assert torch.equal(batch.inputs[key], call[key]), key
        # The rows are the sentences named by indices, in that order, padded to the batch's longest.
        assert [int(i) - 1000 for i in batch.inputs["input_ids"][:, 0]] == batch.indices
        assert batch.inputs["input_ids"].shape[1] == max(len(feats[i]["input_ids"]) for i in batch.indices)
    assert sorted(i for b in batches for i in b.indices) == list(range(len(feats)))


def test_file_order_batches_keep_the_file_order(cpu_batches):
    feats = _features()
    batches = cpu_batches.file_order_batches(feats, 8)
    assert [b.indices for b in batches] == [list(range(s, min(s + 8, len(feats)))) for s in range(0, len(feats), 8)]
    for b in batches:
        assert b.inputs["input_ids"].shape == (len(b.indices), max(len(feats[i]["input_ids"]) for i in b.indices))
        for row, i in enumerate(b.indices):
            n = len(feats[i]["input_ids"])
            assert b.inputs["input_ids"][row, :n].tolist() == feats[i]["input_ids"]
            assert b.inputs["token_type_ids"][row, :n].tolist() == feats[i]["token_type_ids"]
            assert b.inputs["attention_mask"][row].tolist() == [1] * n + [0] * (b.inputs["input_ids"].shape[1] - n)
            assert not b.inputs["input_ids"][row, n:].any()
    real = sum(len(f["input_ids"]) for f in feats)
    sorted_tokens = cpu_batches.token_counts(cpu_batches.length_sorted_batches(feats, 8))
    file_tokens = cpu_batches.token_counts(batches)
    assert sorted_tokens["real"] == file_tokens["real"] == real
    assert real <= sorted_tokens["computed"] < file_tokens["computed"]


def test_rounds_alternate_sides_and_rotate(cpu_batches):
    assert cpu_batches.interleaved_order(["a", "b"], ["P", "Q", "R"], 0) == ["a", "P", "b", "Q", "R"]
    assert cpu_batches.interleaved_order(["a", "b"], ["P", "Q", "R"], 1) == ["P", "b", "Q", "R", "a"]
    assert cpu_batches.interleaved_order(["a", "b"], ["P", "Q", "R"], 5) == ["a", "P", "b", "Q", "R"]

    now = [0.0]
    calls = []
    # Runner "a" takes 1, 5, 2 s in its timed rounds (median 2); "P" always 3 s.
    durations = {"a": iter([9.0, 1.0, 5.0, 2.0]), "P": iter([9.0, 3.0, 3.0, 3.0])}

    def runner(name):
        def run():
            calls.append(name)
            now[0] += next(durations[name])
        return run

    seconds = cpu_batches.interleaved_seconds({"a": runner("a")}, {"P": runner("P")}, rounds=3, warmup=1, clock=lambda: now[0])
    assert calls == ["a", "P", "a", "P", "P", "a", "a", "P"]  # warm-ups, then rounds 1-3 rotated
    assert seconds == {"a": [1.0, 5.0, 2.0], "P": [3.0, 3.0, 3.0]}
    assert cpu_batches.median_seconds(seconds) == {"a": 2.0, "P": 3.0}
    with pytest.raises(ValueError, match="both sides"):
        cpu_batches.interleaved_seconds({"a": runner("a")}, {"a": runner("a")}, rounds=1)
