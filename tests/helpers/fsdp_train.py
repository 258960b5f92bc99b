"""FSDP runs for tests/test_distributed.py: functions its one torchrun launch calls on every
rank (and its pytest process calls once, alone, for the single-process references).

    toy(OUT, FROM=None)       toy classifier runs with ``parallel="fsdp"`` (plain training in
                              one process): ``full`` (gradient accumulation, save_best),
                              ``cut`` (stopped at step 3, then resumed), ``lamb`` (LAMB +
                              activation checkpointing), ``cut3`` (stopped at step 3),
                              ``budget`` (time budget spent at once) and, given FROM,
                              ``cross``: FROM/cut3 copied and resumed here; rank 0 writes
                              ``OUT/result.json``.
    pretrain_runs(OUT, SHARDS) ``ctxkit pretrain`` on SHARDS with ``--parallel`` ddp and fsdp
                              into ``OUT/ddp`` and ``OUT/fsdp``.

Several runs share one launch because starting torchrun costs more than a toy run. Run as a
script (``fsdp_train.py toy OUT [FROM]`` / ``fsdp_train.py pretrain OUT SHARDS``) it does
the same, for trying a run by hand.
"""

import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_trainer import _model, _toy_features  # noqa: E402

from ctxkit.core.checkpoint import save_weights  # noqa: E402
from ctxkit.training import TrainConfig, Trainer  # noqa: E402


def _cfg(**kw) -> TrainConfig:
    base = dict(epochs=2, batch_size=16, grad_accum=2, lr=1e-3, device="cpu", progress=False, log_every=1, seed=5, parallel="fsdp")
    return TrainConfig(**{**base, **kw})


def _weights(trainer: Trainer):
    state = trainer.full_state_dict()  # collective under FSDP: every rank calls it
    return None if state is None else {k: v.flatten().tolist() for k, v in state.items()}


def _save_best(model, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_weights(model.state_dict(), folder / "model.safetensors")


def toy(out: Path, resume_from=None) -> None:
    feats = _toy_features(64)
    results = {}
    trainer = Trainer(_model(0.0), feats, _cfg(eval_each_epoch=False), out / "full", save_best=_save_best)
    trainer.train()
    results["full"] = _weights(trainer)
    Trainer(_model(0.0), feats, _cfg(max_steps=3), out / "cut").train()
    torch.manual_seed(123)  # resume must restore every RNG
    trainer = Trainer(_model(0.0), feats, _cfg(), out / "cut")
    trainer.train(resume=True)
    results["cut"] = _weights(trainer)
    trainer = Trainer(_model(0.0), feats, _cfg(grad_accum=1, optimizer="lamb", fast="auto+ckpt"), out / "lamb")
    trainer.train()
    results["lamb"] = _weights(trainer)
    Trainer(_model(0.0), feats, _cfg(max_steps=3), out / "cut3").train()
    Trainer(_model(0.0), feats, _cfg(max_minutes=1e-9), out / "budget").train()
    if resume_from is not None:
        if trainer.rank == 0:
            shutil.copytree(resume_from / "cut3", out / "cross")
        if trainer.world > 1:
            torch.distributed.barrier()  # the copy is complete before any rank reads it
        trainer = Trainer(_model(0.0), feats, _cfg(), out / "cross")
        trainer.train(resume=True)
        results["cross"] = _weights(trainer)
    try:
        Trainer(_model(0.0), feats, _cfg(), out / "eval", evaluate=lambda m: {})
    except ValueError as err:
        results["evaluate_error"] = str(err)
    if trainer.rank == 0:
        (out / "result.json").write_text(json.dumps({"world": trainer.world, **results}))


def pretrain_runs(out: Path, shards: Path) -> int:
    """Also writes ``OUT/<parallel>/rows.rank<R>.json``: the instances each rank fetched from
    the shards (``PretrainDataset.__getitem__``), in order."""
    from ctxkit.cli import main
    from ctxkit.pretraining.shards import PretrainDataset

    real, fetched = PretrainDataset.__getitem__, []

    def counted(self, i):
        fetched.append(int(i))
        return real(self, i)

    PretrainDataset.__getitem__ = counted
    try:
        for parallel in ("ddp", "fsdp"):
            fetched.clear()
            rc = main(["pretrain", "--data", str(shards), "--preset", "bert_2_128_2", "--out", str(out / parallel), "--max-steps", "5",
                       "--batch-size", "8", "--warmup-ratio", "0.2", "--max-predictions", "5", "--seed", "7", "--device", "cpu",
                       "--log-every", "1", "--no-progress", "--parallel", parallel])
            if rc:
                return rc
            (out / parallel / f"rows.rank{torch.distributed.get_rank()}.json").write_text(json.dumps(fetched))
    finally:
        PretrainDataset.__getitem__ = real
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "toy":
        toy(Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
    else:
        sys.exit(pretrain_runs(Path(sys.argv[2]), Path(sys.argv[3])))
