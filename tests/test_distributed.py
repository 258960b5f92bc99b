"""Data parallelism under torchrun on CPU (gloo, 2 processes).

DDP and FSDP2 (``parallel="fsdp"``) train exactly like one process on the same global
batches: same logged losses, same weights. Checkpoints of several ranks are sharded
(torch.distributed.checkpoint), read whole they hold what one process's hold, resume is
exact, and ``pretrain`` writes the gathered model. (Resuming at another world size:
tests/test_resume_world_size.py.)

Every 2-process run of this module comes from one torchrun launch of this very file (its
``__main__`` below), made once by the ``runs`` fixture: starting torchrun and two workers
that import torch costs more than all the toy runs together. That launch is the multi-node
recipe of docs/scaling.md in miniature (two torchrun "nodes" on this host, one process each,
meeting through a c10d rendezvous on a loopback port), so one launch also checks that
recipe. The single-process references run in the pytest process itself, on one thread like
every torchrun rank.
"""

import importlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HELPERS = Path(__file__).resolve().parent / "helpers"
# Two processes sum each step's gradients in another order than one process does, and the
# runs drift apart by that rounding, step after step: a trajectory, which tests/README.md
# does not derive from eps but bounds with a stated margin. Over these 8-step runs the
# largest drift measured is 1.2e-6 on weights (FSDP, AdamW, ATEN_CPU_CAPABILITY=default;
# 6.5e-7 with avx512, 5.8e-7 with avx2) and 1.2e-7 (one float32 unit) on losses, the same
# under OMP_NUM_THREADS 1 and 4 (every process runs one thread, whatever the caller's
# setting): 1e-5 leaves 8x.
TRAJECTORY = 1e-5
# Adam's first moments drift by at most 1.5e-8 (second moments 1.5e-11) in those runs: 60x.
MOMENTS = 1e-6


def _launch(script: Path, args: list, nproc: int) -> None:
    """``script ARGS`` on ``nproc`` ranks on this host, started as ``torchrun --standalone``
    starts them (its environment variables) but without torchrun's agent, a further process
    importing torch. This process hosts the rendezvous store, as the agent does: bound to
    port 0 by the store itself, so no other process of the suite can take the port between
    pick and bind."""
    cmd = [sys.executable, str(script), *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    store = None
    if nproc > 1:
        store = torch.distributed.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                   TORCHELASTIC_USE_AGENT_STORE="True")
    ranks = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(nproc)]
    errors = [rank.communicate(timeout=300)[1] for rank in ranks]
    del store
    # the first rank's error first (the root cause, usually), then the others'
    for rank, err in zip(ranks, errors):
        assert rank.returncode == 0, "\n...\n".join(e[-2500:] for e in errors)


def _launch_two_nodes(script: Path, args: list) -> None:
    """``script ARGS`` as two torchrun "nodes" of one process each on this host, meeting
    through a c10d rendezvous on a loopback port (gloo): world size 2."""
    import socket

    with socket.socket() as probe:  # a free port for the rendezvous (the first node to come hosts its store)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "ctxkit-two-nodes", str(script), *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outputs = [node.communicate(timeout=300) for node in nodes]
    for node, (_, err) in zip(nodes, outputs):
        first = "\n".join(line for line in err.splitlines() if line.startswith("[rank0]"))[-2000:]
        assert node.returncode == 0, first + "\n...\n" + err[-3000:]


def _losses(run: Path) -> list:
    return [r["loss"] for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if r["event"] == "train"]


def _fsdp_train():
    """helpers/fsdp_train.py as a module: its runs are functions, nothing runs on import."""
    if str(HELPERS) not in sys.path:
        sys.path.insert(0, str(HELPERS))
    return importlib.import_module("fsdp_train")


def _ddp_run(out: Path, grad_accum: int) -> None:
    """A toy classifier trained with the default ``parallel="ddp"`` (plain training in one
    process); rank 0 writes ``out/result.json`` with the world size and classifier weights."""
    sys.path.insert(0, str(HELPERS.parent))
    from test_trainer import _model, _toy_features

    from ctxkit.training import TrainConfig, Trainer

    cfg = TrainConfig(epochs=2, batch_size=16, grad_accum=grad_accum, lr=1e-3, device="cpu", progress=False, log_every=1, seed=5)
    trainer = Trainer(_model(0.0), _toy_features(64), cfg, out)
    trainer.train()
    if trainer.rank == 0:
        weights = {k: v.tolist() for k, v in trainer.model.state_dict().items() if k.endswith("classifier.weight")}
        (out / "result.json").write_text(json.dumps({"world": trainer.world, "weights": weights}))


def _skip_curves(patch) -> None:
    """Draws no curve.png: matplotlib takes ~0.4 s a drawing, at the end of every run (on rank
    0, while the other rank waits at the next collective), and nothing here looks at it
    (tests/test_trainer.py and tests/test_pretrain.py check it is drawn)."""
    from ctxkit.core import plots

    patch.setattr(plots, "plot_training_curve", lambda *args, **kwargs: None)


def _two_process_runs(out: Path, single_toy: Path, shards: Path) -> int:
    """What every torchrun rank runs (collectives: all ranks, same order): ``ddp1``/``ddp2``
    (DDP, grad_accum 1 and 2), ``toy`` (helpers/fsdp_train.py's FSDP runs, ``cross``
    resuming ``single_toy/cut3``) and ``pretrain`` (``ctxkit pretrain`` with ddp and fsdp).
    Each rank also writes ``node.rank<R>.json``: where torchrun placed it."""
    placed = {key: int(os.environ[key]) for key in ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"node.rank{placed['RANK']}.json").write_text(json.dumps(placed))
    for grad_accum in (1, 2):
        _ddp_run(out / f"ddp{grad_accum}", grad_accum)
    fsdp_train = _fsdp_train()
    fsdp_train.toy(out / "toy", single_toy)
    return fsdp_train.pretrain_runs(out / "pretrain", shards)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``(one, two)``: the runs in 1 process (this one) and in 2 processes (one torchrun launch)."""
    root = tmp_path_factory.mktemp("distributed")
    one, two = root / "one", root / "two"
    shards = _synthetic_shards(root / "data")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as every torchrun rank (OMP_NUM_THREADS=1)
    try:
        with pytest.MonkeyPatch.context() as patch:
            _skip_curves(patch)
            for grad_accum in (1, 2):
                _ddp_run(one / f"ddp{grad_accum}", grad_accum)
            _fsdp_train().toy(one / "toy")  # before the launch: its cut3 is what two/toy/cross resumes
    finally:
        torch.set_num_threads(before)
    _launch_two_nodes(Path(__file__), [two, one / "toy", shards])
    return one, two


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_ddp_two_processes_equal_one_process(runs, grad_accum):
    single_run, ddp_run = (r / f"ddp{grad_accum}" for r in runs)
    single_losses, single = _losses(single_run), _result(single_run)
    ddp_losses, ddp = _losses(ddp_run), _result(ddp_run)
    assert single["world"] == 1 and ddp["world"] == 2
    assert len(ddp_losses) == len(single_losses) == 8
    assert ddp_losses == pytest.approx(single_losses, abs=TRAJECTORY)
    for key, w in single["weights"].items():
        flat = [x for row in w for x in row]
        assert [x for row in ddp["weights"][key] for x in row] == pytest.approx(flat, abs=TRAJECTORY)


# -- FSDP2 ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fsdp_toy(runs):
    """The toy runs of helpers/fsdp_train.py in 1 process and in 2 FSDP processes."""
    return tuple(r / "toy" for r in runs)


def _result(run: Path) -> dict:
    return json.loads((run / "result.json").read_text())


def _assert_same_weights(a: dict, b: dict, abs_tol: float) -> None:
    assert set(a) == set(b)
    for key in a:
        assert b[key] == pytest.approx(a[key], abs=abs_tol), key


def test_unknown_parallel_value_is_rejected(tmp_path):
    sys.path.insert(0, str(HELPERS.parent))
    from test_trainer import _model, _toy_features

    from ctxkit.training import TrainConfig, Trainer

    with pytest.raises(ValueError, match="parallel must be 'ddp' or 'fsdp', got 'zero3'"):
        Trainer(_model(), _toy_features(8), TrainConfig(device="cpu", parallel="zero3"), tmp_path)


def test_fsdp_two_processes_equal_one_process(fsdp_toy):
    one, two = fsdp_toy
    single, sharded = _result(one), _result(two)
    assert single["world"] == 1 and sharded["world"] == 2
    # full: AdamW with gradient accumulation; lamb: LAMB with activation checkpointing.
    for run in ("full", "lamb"):
        assert len(_losses(two / run)) == len(_losses(one / run)) == 8
        assert _losses(two / run) == pytest.approx(_losses(one / run), abs=TRAJECTORY)
        _assert_same_weights(single[run], sharded[run], TRAJECTORY)
    # The comparison means something only if training moved the weights well past 1e-5.
    sys.path.insert(0, str(HELPERS.parent))
    from test_trainer import _model

    init = {k: v.flatten() for k, v in _model(0.0).state_dict().items()}
    assert max((torch.tensor(sharded["full"][k]) - init[k]).abs().max().item() for k in init) > 1e-3


def test_fsdp_checkpoint_is_sharded_and_best_holds_the_gathered_state(fsdp_toy):
    from ctxkit.core.checkpoint import read_weights
    from ctxkit.training.distributed import optimizer_state_by_index, param_names
    from ctxkit.training.optim import build_adamw
    from ctxkit.training.world_resume import read_checkpoint

    one, two = fsdp_toy
    # Two ranks wrote their shards (torch.distributed.checkpoint), not a gathered copy; read
    # whole in one process they hold what one process's checkpoint holds.
    assert not (two / "full" / "checkpoint" / "model.safetensors").exists()
    c1, c2 = read_checkpoint(one / "full" / "checkpoint"), read_checkpoint(two / "full" / "checkpoint")
    w1, w2 = c1.model_state, c2.model_state
    assert set(w1) == set(w2)
    assert all(torch.allclose(w1[k], w2[k], atol=TRAJECTORY) for k in w1)
    sys.path.insert(0, str(HELPERS.parent))
    from test_trainer import _model

    model = _model(0.0)
    o1, o2 = c1.optimizer_state, optimizer_state_by_index(c2.optimizer_state, param_names(model, build_adamw(model, 1e-3)))
    assert c1.extra["scheduler"] == c2.extra["scheduler"]
    assert [g["params"] for g in o1["param_groups"]] == [g["params"] for g in o2["param_groups"]]
    assert set(o1["state"]) == set(o2["state"])
    for i, state in o1["state"].items():
        for name, value in state.items():
            assert torch.allclose(value, o2["state"][i][name], atol=MOMENTS), (i, name)
    # save_best received the unsharded model with the gathered weights.
    best, gathered = read_weights(two / "full" / "best"), _result(two)["full"]
    assert {k: v.flatten().tolist() for k, v in best.items()} == gathered
    assert _result(two)["evaluate_error"] == ("fsdp is supported for runs without per-epoch evaluation, e.g. pretrain; "
                                              "use --parallel ddp for fine-tuning")


def test_fsdp_resume_equals_uninterrupted(fsdp_toy):
    _, two = fsdp_toy
    state = json.loads((two / "cut" / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 8
    assert len(_losses(two / "full")) == 8
    # Stopped mid-epoch at step 3, resumed by a fresh sharded model and optimiser: the same
    # computation replayed, so bit-identical (tests/README.md).
    assert _losses(two / "cut") == _losses(two / "full")
    assert _result(two)["full"] == _result(two)["cut"]


def test_fsdp_resumes_a_single_process_checkpoint(fsdp_toy):
    one, two = fsdp_toy
    # cross: one process stopped at step 3, two FSDP ranks took over from its checkpoint.
    assert _losses(two / "cross")[:3] == _losses(one / "cut3")
    assert _losses(two / "cross") == pytest.approx(_losses(one / "full"), abs=TRAJECTORY)
    _assert_same_weights(_result(one)["full"], _result(two)["cross"], TRAJECTORY)


def test_time_budget_stops_every_rank_at_the_same_step(fsdp_toy):
    # Budget spent at once: the stop decision (rank 0's, broadcast under torchrun) comes at
    # the first step, and the checkpoint gathered there is complete.
    for run in fsdp_toy:
        state = json.loads((run / "budget" / "checkpoint" / "trainer_state.json").read_text())
        assert (state["step"], state["batch_in_epoch"]) == (1, 2)


def _synthetic_shards(root: Path) -> Path:
    """A small random-word corpus, its WordPiece vocabulary and pretraining shards."""
    from ctxkit.pretraining import build_shards
    from ctxkit.pretraining.shards import train_vocab

    rng = random.Random(0)
    words = [f"w{a}{b}" for a in "abcdefgh" for b in "klmnop"] + ["the", "a", "river", "bank", "money", "runs"]
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) + "." for _ in range(rng.randint(3, 8)))
            for _ in range(60)]
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(docs), encoding="utf-8")
    train_vocab([corpus], 150, root / "vocab", show_progress=False)
    build_shards([corpus], root / "vocab", root / "shards", max_seq_len=32, workers=1, show_progress=False, format="blank")
    return root / "shards"


def test_fsdp_pretrain_writes_the_gathered_model(runs):
    from ctxkit.models import BertForPreTraining, load_bert
    from ctxkit.training.world_resume import read_checkpoint

    ddp, fsdp = runs[1] / "pretrain" / "ddp", runs[1] / "pretrain" / "fsdp"
    assert len(_losses(fsdp)) == 5
    assert _losses(fsdp) == pytest.approx(_losses(ddp), abs=TRAJECTORY)
    assert json.loads((fsdp / "summary.json").read_text())["steps"] == 5
    model = load_bert(fsdp / "final", with_heads=True)
    assert isinstance(model, BertForPreTraining)
    final, gathered = model.state_dict(), read_checkpoint(fsdp / "checkpoint").model_state  # the last step's, read whole
    assert {"bert." + k for k in final} == set(gathered)
    assert all(torch.equal(final[k], gathered["bert." + k]) for k in final)
    reference = load_bert(ddp / "final", with_heads=True).state_dict()
    assert all(torch.allclose(final[k], reference[k], atol=TRAJECTORY) for k in final)


def test_each_pretraining_rank_reads_only_its_rows_of_the_shards(runs):
    """Issue 42 item 5: over the 5 steps of the 2-rank pretraining runs, each rank fetched
    (``PretrainDataset.__getitem__``, one instance's tokens through the memory map) its half of
    every global batch of 8, as EpochOrder lays them out, and nothing else."""
    from ctxkit.pretraining import PretrainDataset
    from ctxkit.training.world_resume import EpochOrder

    shards = runs[1].parent / "data" / "shards"
    data = PretrainDataset(shards)
    steps = EpochOrder(data.lengths, 8, 1, 7, 0, 50).global_steps[:5]
    assert len(data) > 5 * 8  # the 5 steps stay in epoch 0
    for parallel in ("ddp", "fsdp"):
        run = runs[1] / "pretrain" / parallel
        rows = [json.loads((run / f"rows.rank{r}.json").read_text()) for r in (0, 1)]
        assert [len(r) for r in rows] == [5 * 4, 5 * 4]
        for s, batch in enumerate(steps):
            mine = [rows[r][4 * s:4 * s + 4] for r in (0, 1)]
            assert mine == [batch[0::2], batch[1::2]], (parallel, s)


def test_two_nodes_over_loopback_equal_one_process(runs):
    """The multi-node recipe of docs/scaling.md in miniature: two torchrun "nodes" on this host,
    one process each, meeting through a c10d rendezvous on a loopback port (gloo), train the
    toy classifier exactly like one process. The ``runs`` launch is that recipe: each rank
    was the only process of its own node."""
    placed = sorted((json.loads((runs[1] / f"node.rank{r}.json").read_text()) for r in (0, 1)), key=lambda p: p["RANK"])
    assert [p["RANK"] for p in placed] == [0, 1] and sorted(p["GROUP_RANK"] for p in placed) == [0, 1]
    assert all((p["LOCAL_RANK"], p["LOCAL_WORLD_SIZE"], p["WORLD_SIZE"]) == (0, 1, 2) for p in placed)
    single_run, two_nodes = runs[0] / "ddp1", runs[1] / "ddp1"
    assert _result(single_run)["world"] == 1 and _result(two_nodes)["world"] == 2
    assert len(_losses(two_nodes)) == len(_losses(single_run)) == 8
    assert _losses(two_nodes) == pytest.approx(_losses(single_run), abs=TRAJECTORY)
    for key, w in _result(single_run)["weights"].items():
        flat = [x for row in w for x in row]
        assert [x for row in _result(two_nodes)["weights"][key] for x in row] == pytest.approx(flat, abs=TRAJECTORY)


if __name__ == "__main__":  # torchrun launches: OUT SINGLE_TOY SHARDS (the runs fixture)
    _skip_curves(pytest.MonkeyPatch())
    sys.exit(_two_process_runs(*map(Path, sys.argv[1:4])))
