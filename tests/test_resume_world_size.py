"""Resume at another world size (issue 42 items 4 and 5), on CPU: gloo, 2 processes.

A run stopped mid-epoch on 2 ranks (FSDP2, a sharded torch.distributed.checkpoint) goes on
in 1 process, and one stopped in 1 process goes on on 2 ranks (DDP; stopped again there, its
sharded checkpoint resumed by 2 DDP ranks). Against an uninterrupted run in 1 process:

* the data order is the same (exact): the sample ids each step reads, after the resume as
  before it;
* the optimiser state the resumed run holds is the one that was saved (exact, gathered);
* the final weights agree to float rounding: two ranks sum each step's gradient in another
  order, and the runs drift apart by that rounding, step after step (tests/README.md,
  trajectories), so the bound is float32's eps times a stated factor times the weights' scale.

And each rank reads only its own rows of the data (item 5): the 2-rank run counts the rows
every rank fetched.

Every 2-process run comes from one torchrun launch of this file (its ``__main__``), as in
tests/test_distributed.py: starting torchrun costs more than the toy runs.
"""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from test_distributed import _launch, _skip_curves
from test_trainer import _model, _toy_features

from ctxkit.training import TrainConfig, Trainer
from ctxkit.training.world_resume import EpochOrder, read_checkpoint

N, BATCH, CUT, AGAIN, STEPS = 32, 8, 3, 6, 8  # 4 steps an epoch, 2 epochs; stopped mid-epoch 0 (and 1)
# Weights drift from the uninterrupted run by float rounding (two ranks sum each gradient in
# another order), in units of float32 eps times the largest weight (~1, the LayerNorm scales).
# Measured over these 8-step runs: 1.6 eps (2 -> 1) and 0.06 eps (1 -> 2) with
# ATEN_CPU_CAPABILITY=default, 0.2 and 0.03 with avx512; 64 eps leaves 40x.
DRIFT_EPS = 64


class Recorded:
    """The toy examples, recording every index fetched: what this process read."""

    def __init__(self, n: int = N):
        self.examples = _toy_features(n)
        self.lengths = [len(f["input_ids"]) for f in self.examples]  # as PretrainDataset's: no example read for them
        self.fetched = []

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        self.fetched.append(int(i))
        return self.examples[i]


def _cfg(**kw) -> TrainConfig:
    base = dict(epochs=2, batch_size=BATCH, lr=1e-3, device="cpu", progress=False, log_every=1, seed=5, eval_each_epoch=False)
    return TrainConfig(**{**base, **kw})


def _write(path: Path, value) -> None:
    path.write_text(json.dumps(value))


def _read(path: Path):
    return json.loads(path.read_text())


def _two_ranks(out: Path, one: Path) -> None:
    """What every torchrun rank runs (collectives: every rank, in the same order)."""
    from ctxkit.training.distributed import full_optimizer_state

    # cut: FSDP on 2 ranks, stopped after step CUT (a sharded checkpoint), then its gathered
    # optimiser state and weights, which a resume elsewhere must hold.
    data = Recorded()
    trainer = Trainer(_model(0.0), data, _cfg(parallel="fsdp", max_steps=CUT), out / "cut")
    trainer.train()
    _write(out / f"cut.rank{trainer.rank}.json", data.fetched)
    saved = full_optimizer_state(trainer.model, trainer.optimizer)
    weights = trainer.full_state_dict()
    if trainer.rank == 0:
        torch.save({"optimizer": saved, "weights": weights}, out / "cut.saved.pt")
    # from1: one process's checkpoint at step CUT, resumed here by 2 DDP ranks, stopped again
    # at step AGAIN (their sharded checkpoint) and resumed to the end.
    if trainer.rank == 0:
        shutil.copytree(one / "cut", out / "from1")
    torch.distributed.barrier()  # the copy is complete before any rank reads it
    data = Recorded()
    trainer = Trainer(_model(0.0), data, _cfg(max_steps=AGAIN), out / "from1")
    trainer.load_checkpoint()
    if trainer.rank == 0:  # DDP: every rank holds the whole state
        torch.save(trainer.optimizer.state_dict(), out / "from1.restored.pt")
    trainer.train(resume=True)
    trainer = Trainer(_model(0.0), data, _cfg(), out / "from1")
    trainer.train(resume=True)
    _write(out / f"from1.rank{trainer.rank}.json", data.fetched)
    if trainer.rank == 0:
        torch.save(trainer.model.state_dict(), out / "from1.final.pt")


def _steps(fetched: list, per_step: int) -> list:
    """A fetch log cut into steps of ``per_step`` rows."""
    return [fetched[i:i + per_step] for i in range(0, len(fetched), per_step)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The 1-process runs (here, on one thread like every torchrun rank) and the 2-rank ones."""
    root = tmp_path_factory.mktemp("world_size")
    one, two = root / "one", root / "two"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as patch:
            _skip_curves(patch)
            data = Recorded()
            trainer = Trainer(_model(0.0), data, _cfg(), one / "full")
            trainer.train()
            _write(one / "full.json", data.fetched)
            torch.save(trainer.model.state_dict(), one / "full.final.pt")
            Trainer(_model(0.0), Recorded(), _cfg(max_steps=CUT), one / "cut").train()
            _launch(Path(__file__), [two, one], 2)
            # 2 -> 1: FSDP's sharded checkpoint, resumed in one process with twice the
            # accumulation (the same rows per micro-batch as on each of the 2 ranks).
            shutil.copytree(two / "cut", one / "from2")
            data = Recorded()
            trainer = Trainer(_model(0.0), data, _cfg(grad_accum=2), one / "from2")
            trainer.load_checkpoint()
            restored = trainer.optimizer.state_dict()
            torch.save({"optimizer": restored, "weights": trainer.model.state_dict()}, one / "from2.restored.pt")
            torch.manual_seed(1234)  # resume restores every RNG
            trainer.train(resume=True)
            _write(one / "from2.json", data.fetched)
            torch.save(trainer.model.state_dict(), one / "from2.final.pt")
    finally:
        torch.set_num_threads(before)
    return one, two


def _assert_same_optimizer_state(restored: dict, saved: dict) -> None:
    assert set(restored["state"]) == set(saved["state"])
    for i, state in saved["state"].items():
        assert set(restored["state"][i]) == set(state), i
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(restored["state"][i][name]), torch.as_tensor(value)), (i, name)
    for mine, theirs in zip(restored["param_groups"], saved["param_groups"], strict=True):
        for key in ("params", "lr", "initial_lr", "betas", "eps", "weight_decay"):
            assert mine[key] == theirs[key], key


def _assert_drift_within_rounding(final: dict, reference: dict) -> None:
    """Weights equal to float rounding: |a - b| <= DRIFT_EPS * eps(float32) * max |weight|."""
    assert set(final) == set(reference)
    scale = max(v.abs().max().item() for v in reference.values() if v.is_floating_point())
    bound = DRIFT_EPS * torch.finfo(torch.float32).eps * scale
    for key, value in reference.items():
        if value.is_floating_point():
            assert (final[key] - value).abs().max().item() <= bound, key
    # The comparison means something only if training moved the weights far past the bound.
    start = _model(0.0).state_dict()
    assert max((reference[k] - start[k]).abs().max().item() for k in start) > 100 * bound


def test_sharded_checkpoint_resumes_in_one_process(runs):
    one, two = runs
    full = _read(one / "full.json")
    # The 2-rank run wrote DCP shards, one file per rank, and no gathered copy.
    folder = two / "cut" / "checkpoint"
    assert sorted(p.name for p in (folder / "shards").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not (folder / "model.safetensors").exists()
    state = _read(folder / "trainer_state.json")
    assert (state["step"], state["epoch"], state["step_in_epoch"], state["samples_in_epoch"], state["world_size"]) == (CUT, 0, CUT,
                                                                                                                  CUT * BATCH, 2)
    # Data order: after the resume, the same ids in the same order as the uninterrupted run
    # (at grad_accum 2 a step reads its global batch in the same order as at 1).
    assert _read(one / "from2.json") == full[CUT * BATCH:]
    # Before it, each step the two ranks read together the uninterrupted run's global batch.
    ranks = [_steps(_read(two / f"cut.rank{r}.json"), BATCH // 2) for r in (0, 1)]
    assert [sorted(a + b) for a, b in zip(*ranks, strict=True)] == [sorted(s) for s in _steps(full, BATCH)[:CUT]]
    # The optimiser state and weights restored in one process: exactly those gathered on the
    # 2 ranks at the checkpoint.
    saved, restored = torch.load(two / "cut.saved.pt"), torch.load(one / "from2.restored.pt")
    _assert_same_optimizer_state(restored["optimizer"], saved["optimizer"])
    assert all(torch.equal(restored["weights"][k], v) for k, v in saved["weights"].items())
    _assert_drift_within_rounding(torch.load(one / "from2.final.pt"), torch.load(one / "full.final.pt"))


def test_single_process_checkpoint_resumes_on_two_ranks(runs):
    """1 -> 2 (DDP), stopped there again at step AGAIN and resumed from the 2 ranks' shards."""
    one, two = runs
    full = _read(one / "full.json")
    restored = torch.load(two / "from1.restored.pt")
    saved = torch.load(one / "cut" / "checkpoint" / "optimizer.pt", weights_only=True)["optimizer"]
    _assert_same_optimizer_state(restored, saved)
    # After the resume each step the two ranks read the global batch of the uninterrupted run.
    ranks = [_steps(_read(two / f"from1.rank{r}.json"), BATCH // 2) for r in (0, 1)]
    assert [sorted(a + b) for a, b in zip(*ranks, strict=True)] == [sorted(s) for s in _steps(full, BATCH)[CUT:]]
    _assert_drift_within_rounding(torch.load(two / "from1.final.pt"), torch.load(one / "full.final.pt"))
    # Its last checkpoint (2 DDP ranks): sharded, and read whole in one process it holds the final weights.
    final = read_checkpoint(two / "from1" / "checkpoint")
    assert final.trainer_state["step"] == STEPS and final.trainer_state["world_size"] == 2
    weights = torch.load(two / "from1.final.pt")
    assert all(torch.equal(final.model_state[k], v) for k, v in weights.items())


def test_each_rank_reads_only_its_own_rows(runs):
    """Item 5: over the steps run on 2 ranks, each rank fetched (``features[i]``) its half of
    every global batch and nothing else; no row was read twice."""
    _, two = runs
    fetched = [_read(two / f"cut.rank{r}.json") for r in (0, 1)]
    assert [len(f) for f in fetched] == [CUT * BATCH // 2] * 2
    assert len(set(fetched[0]) | set(fetched[1])) == CUT * BATCH  # disjoint, and none fetched twice


def test_the_order_does_not_depend_on_world_size_or_accumulation():
    """The global batches of an epoch are one list at every world size and accumulation; each
    rank's micro-batches split them, with weights that make the mean over ranks the global one."""
    lengths = [len(f["input_ids"]) for f in _toy_features(37)]  # a short last batch of 5
    reference = EpochOrder(lengths, BATCH, 1, 5, 0, 50).global_steps
    for world, accum in ((1, 2), (2, 1), (2, 2), (4, 2), (8, 1)):
        orders = [EpochOrder(lengths, BATCH, accum, 5, 0, 50, rank, world) for rank in range(world)]
        assert all(o.global_steps == reference for o in orders)
        for s, batch in enumerate(reference):
            pieces = [(o.micro[j], o.weights[j]) for o in orders for j in range(o.bounds[s], o.bounds[s + 1])]
            assert len({o.bounds[s + 1] - o.bounds[s] for o in orders}) == 1  # as many forwards on every rank (FSDP)
            assert sorted(i for rows, w in pieces if w for i in rows) == sorted(batch)
            assert sum(w for _, w in pieces) == pytest.approx(world)  # the mean over ranks is the batch's mean
    # Rank 7 of 8 has no row of the short batch: a stand-in row with weight 0.
    short = next(s for s, b in enumerate(reference) if len(b) < BATCH)
    last = EpochOrder(lengths, BATCH, 1, 5, 0, 50, 7, 8)
    assert last.weights[last.bounds[short]] == 0 and len(last.micro[last.bounds[short]]) == 1


def test_a_checkpoint_of_an_earlier_version_finishes_its_epoch_in_its_order(tmp_path, monkeypatch):
    """Before this order, grad_accum > 1 cut epochs into global micro-batches of batch_size /
    grad_accum: a checkpoint of then, stopped mid-epoch (no ``step_in_epoch``), finishes that
    epoch in that order, and the next epoch is in this one."""
    from ctxkit.core.run_state import load_checkpoint, save_checkpoint

    _skip_curves(monkeypatch)
    run = tmp_path / "old"
    Trainer(_model(0.0), Recorded(), _cfg(grad_accum=2, max_steps=1), run).train()
    ckpt = load_checkpoint(run / "checkpoint")
    old = {k: ckpt.trainer_state[k] for k in ("epoch", "batch_in_epoch", "step", "best", "best_epoch", "history", "losses")}
    assert (old["epoch"], old["batch_in_epoch"]) == (0, 2)
    save_checkpoint(run / "checkpoint", model_state=ckpt.model_state, optimizer_state=ckpt.optimizer_state, trainer_state=old,
                    extra=ckpt.extra, rng=False)
    data = Recorded()
    Trainer(_model(0.0), data, _cfg(grad_accum=2), run).train(resume=True)
    lengths = data.lengths
    then = EpochOrder(lengths, BATCH, 2, 5, 0, 50, legacy=True)
    now = EpochOrder(lengths, BATCH, 2, 5, 1, 50)
    assert then.global_steps != EpochOrder(lengths, BATCH, 2, 5, 0, 50).global_steps  # the orders do differ
    assert data.fetched == [i for rows in then.micro[then.bounds[1]:] + now.micro for i in rows]


def test_sharded_checkpoint_is_checked_against_its_manifest(runs, tmp_path):
    from ctxkit.core.durable import IncompleteFolderError

    _, two = runs
    copy = tmp_path / "checkpoint"
    shutil.copytree(two / "cut" / "checkpoint", copy)
    with open(copy / "shards" / "__1_0.distcp", "r+b") as f:  # one rank's shard damaged
        f.seek(100)
        f.write(b"\x00\x01\x02")
    with pytest.raises(IncompleteFolderError, match="__1_0.distcp: SHA-256 differs from the manifest"):
        read_checkpoint(copy)


def test_refused_in_one_line_when_the_global_batch_does_not_split(tmp_path, monkeypatch):
    from ctxkit.training import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "setup", lambda device_type: (0, 3))  # as if on 3 ranks
    with pytest.raises(ValueError, match=r"batch_size 8 / grad_accum 1 is not divisible by 3 ranks: run on a number of ranks "
                                         r"that divides 8, or with a --grad-accum that leaves a multiple of 3"):
        Trainer(_model(0.0), Recorded(), _cfg(), tmp_path)


def test_master_weight_state_converts_to_per_parameter_adamw_and_back():
    """A one-process run with master weights (flat fp32 masters and moments) and a run on
    several ranks (per-parameter AdamW) read each other's optimiser state, exactly."""
    from ctxkit.training.master import build_master_adamw, per_parameter_state
    from ctxkit.training.optim import build_adamw

    model = _model(0.0)
    master = build_master_adamw(model, lr=1e-3)
    for step in range(2):
        torch.manual_seed(step)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-2
        master.step()
    saved = master.state_dict()
    other = _model(0.0)
    adamw = build_adamw(other, lr=1e-3)
    adamw.load_state_dict(per_parameter_state(saved, other, adamw))
    loaded = adamw.state_dict()["state"]
    ids = {id(q): i for i, q in enumerate(q for g in master.param_groups for q in g["params"])}  # the same order in both
    assert len(loaded) == len(ids)
    for kind in master.kinds:
        for p, m, v in zip(kind.params, kind.views(kind.exp_avg), kind.views(kind.exp_avg_sq), strict=True):
            mine = loaded[ids[id(p)]]
            assert torch.equal(mine["exp_avg"], m) and torch.equal(mine["exp_avg_sq"], v) and float(mine["step"]) == 2.0
    back = build_master_adamw(_model(0.0), lr=1e-3)
    back.load_per_parameter_state(adamw.state_dict())
    for mine, theirs in zip(back.kinds, master.kinds, strict=True):
        assert torch.equal(mine.exp_avg, theirs.exp_avg) and torch.equal(mine.exp_avg_sq, theirs.exp_avg_sq)
    assert float(back.step_count) == 2.0


if __name__ == "__main__":  # torchrun launches: OUT ONE (the runs fixture)
    _skip_curves(pytest.MonkeyPatch())
    _two_ranks(Path(sys.argv[1]), Path(sys.argv[2]))
