"""Crash safety by fault injection: a writer killed at every write boundary, in turn.

A forked child runs the save and ``os._exit``s at boundary ``k`` (no ``finally``, no
cleanup: what a ``kill -9`` leaves), for every ``k``; the parent then checks that a
complete copy exists, that the debris goes, and that work continues as if nothing happened.
Not timing: every instant between two system calls of the sequence is hit once.
"""

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from ctxkit.core import durable
from ctxkit.core.durable import MANIFEST, IncompleteFolderError, recover_folder, remove_debris, verify_manifest, write_folder

# One torch thread: a child forked after the parent ran an OpenMP team of 2 threads (pytest
# -n0 on 2 cores) hangs in its first parallel kernel (libgomp is not fork-safe); one thread
# never starts a team. It is also what each of the 2 xdist workers runs anyway.
pytestmark = [pytest.mark.skipif(not hasattr(os, "fork"), reason="fault injection forks a child writer"),
              pytest.mark.usefixtures("one_thread")]


def _contents(version: str):
    def write(folder: Path) -> None:
        durable.atomic_write(folder / "weights.bin", lambda tmp: Path(tmp).write_bytes(version.encode() * 1000))
        durable.atomic_write(folder / "state.json", lambda tmp: Path(tmp).write_text(json.dumps({"version": version})))
    return write


def _version(folder: Path) -> str:
    """The version a folder holds; asserts it is complete and consistent."""
    assert verify_manifest(folder)
    version = json.loads((folder / "state.json").read_text())["version"]
    assert (folder / "weights.bin").read_bytes() == version.encode() * 1000  # not one version's state with another's weights
    return version


def _boundaries(action) -> list:
    names = []
    durable.fault_hook = names.append
    try:
        action()
    finally:
        durable.fault_hook = None
    return names


def _crash_at(k: int, action, must_reach: bool = True) -> bool:
    """Run ``action`` in a forked child that dies at its ``k``-th write boundary; returns
    whether it got there (or finished first, allowed only without ``must_reach``)."""
    pid = os.fork()
    if pid == 0:  # the child: no pytest, no cleanup on the way out
        count = [0]

        def hook(name):
            if count[0] == k:
                os._exit(17)
            count[0] += 1

        durable.fault_hook = hook
        try:
            action()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) in ((17,) if must_reach else (0, 17)), f"the child did not reach boundary {k}"
    return os.WEXITSTATUS(status) == 17


@pytest.fixture
def no_fsync(monkeypatch):
    """No fsync: a killed process's writes stay in the page cache, so what it leaves is the
    same with or without fsync (that is for power loss, which no test here simulates);
    ``_fsync`` holds no write boundary, and each flush waits ~5 ms, dozens per killed save."""
    monkeypatch.setattr(durable, "_fsync", lambda path: None)


def _debris(parent: Path) -> list:
    return sorted(p.name for p in parent.iterdir() if p.name != "ckpt")


@pytest.mark.usefixtures("no_fsync")
def test_a_folder_save_killed_at_any_boundary_leaves_one_complete_copy(tmp_path):
    final = tmp_path / "run" / "ckpt"
    write_folder(final, _contents("A"))
    names = _boundaries(lambda: write_folder(final, _contents("B")))
    assert len(names) >= 10 and "move ckpt aside" in names and "rename new ckpt into place" in names
    for k in range(len(names)):
        run = tmp_path / f"k{k}" / "run"
        run.mkdir(parents=True)
        write_folder(run / "ckpt", _contents("A"))
        _crash_at(k, lambda: write_folder(run / "ckpt", _contents("B")))
        # A restart finds a complete copy (the old or the new one), and nothing else stays.
        recovered = recover_folder(run / "ckpt")
        assert recovered is not None, (k, names[k], _debris(run))
        assert _version(recovered) in ("A", "B"), names[k]
        remove_debris(run, names=("ckpt",))
        assert _debris(run) == [], (k, names[k])
        write_folder(run / "ckpt", _contents("C"))
        assert _version(run / "ckpt") == "C" and _debris(run) == []


@pytest.mark.usefixtures("no_fsync")
def test_a_second_crash_never_loses_the_only_complete_copy(tmp_path):
    """Killed between its two renames, a save leaves only .ckpt.old; the next save, killed
    anywhere too, must not delete that copy before its own is in place (no recovery between)."""
    write_folder(tmp_path / "probe" / "ckpt", _contents("A"))
    names = _boundaries(lambda: write_folder(tmp_path / "probe" / "ckpt", _contents("B")))
    between = names.index("rename new ckpt into place")  # after "move ckpt aside"
    k2, crashed = 0, True
    while crashed:
        run = tmp_path / f"k{k2}" / "run"
        run.mkdir(parents=True)
        write_folder(run / "ckpt", _contents("A"))
        write_folder(run / "ckpt", _contents("B"))
        _crash_at(between, lambda: write_folder(run / "ckpt", _contents("C")))
        assert not (run / "ckpt").exists() and (run / ".ckpt.old").is_dir()  # the window the issue found
        crashed = _crash_at(k2, lambda: write_folder(run / "ckpt", _contents("D")), must_reach=False)
        recovered = recover_folder(run / "ckpt")
        assert recovered is not None and _version(recovered) in ("B", "C", "D"), k2
        k2 += 1
    assert k2 >= 8  # every boundary of the second save was hit before it could finish


def test_a_copy_that_differs_from_its_manifest_is_refused(tmp_path):
    final = write_folder(tmp_path / "best", _contents("A"))
    assert verify_manifest(final)
    (final / "weights.bin").write_bytes(b"B" * 1000)  # e.g. one file copied in from another epoch
    with pytest.raises(IncompleteFolderError, match="weights.bin: SHA-256 differs from the manifest"):
        verify_manifest(final)
    (final / "weights.bin").unlink()
    with pytest.raises(IncompleteFolderError, match="weights.bin: missing"):
        verify_manifest(final)
    (final / MANIFEST).unlink()
    assert verify_manifest(final) is False  # folders written before manifests still load


# ------------------------------------------------------------------ the trainer end to end


def _trainer_run(out: Path, resume: bool = False):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_trainer import _model, _toy_features

    from ctxkit.training import TrainConfig, Trainer

    from ctxkit.core.checkpoint import save_weights

    # Two epochs of two steps: the boundaries under test are the saves', and a kill at each
    # reruns the training up to it (32 examples, four steps an epoch, did not test more).
    feats = _toy_features(16)
    cfg = TrainConfig(epochs=2, batch_size=8, lr=1e-3, device="cpu", progress=False, log_every=1, seed=5)
    model = _model()

    def save_best(m, folder: Path) -> None:
        save_weights(m.state_dict(), folder / "model.safetensors")

    trainer = Trainer(model, feats, cfg, out, None, "score", save_best=save_best)
    # A score that grows with the optimiser steps (restored on resume): every epoch replaces best/.
    trainer.evaluate = lambda m: {"score": float(trainer.scheduler.last_epoch)}
    return trainer.train(resume=resume), model


@pytest.fixture(scope="module", autouse=True)
def _no_curves():
    """Every run here draws no curve.png: matplotlib takes ~0.4 s a drawing, at the end of
    every run (two per killed-and-resumed run), and the curve is a plain file, no write
    boundary (tests/test_trainer.py checks it is drawn)."""
    from ctxkit.core import plots

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "plot_training_curve", lambda *args, **kwargs: None)
        yield


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    result, model = _trainer_run(out)
    return result, {k: v.clone() for k, v in model.state_dict().items()}, out


def test_training_killed_at_every_boundary_of_its_last_saves_resumes_exactly(tmp_path, uninterrupted, monkeypatch):
    """The last epoch writes best/ and checkpoint/ over earlier copies: kill the run at each
    of those boundaries; --resume then ends bit-identical to the run that was never killed."""
    result, weights, reference = uninterrupted
    # A killed process's writes stay in the page cache, so what it leaves is the same with or
    # without fsync (that is for power loss); skipped, it saves ~5 ms a flush, ~60 flushes
    # per kill and resume.
    monkeypatch.setattr(durable, "_fsync", lambda path: None)
    names = _boundaries(lambda: _trainer_run(tmp_path / "count"))
    first_of_last_saves = names.index("done checkpoint") + 1  # epoch 1: best/ and checkpoint/ both exist already
    assert {"move best aside", "move checkpoint aside"} <= set(names[first_of_last_saves:])
    for k in range(first_of_last_saves, len(names)):
        out = tmp_path / f"k{k}"
        _crash_at(k, lambda: _trainer_run(out))
        resumed, model = _trainer_run(out, resume=True)
        assert resumed.losses == result.losses, (k, names[k])
        assert all(torch.equal(v, weights[key]) for key, v in model.state_dict().items()), (k, names[k])
        leftovers = sorted(p.name for p in out.iterdir() if p.name.startswith("."))
        assert leftovers == [], (k, names[k], leftovers)
        assert verify_manifest(out / "best") and verify_manifest(out / "checkpoint")


def test_a_start_removes_the_debris_of_earlier_crashes(tmp_path, uninterrupted):
    """What kill -9 left (earlier versions' .checkpoint.XXXXXXXX folders too) goes when a run starts."""
    _, _, reference = uninterrupted
    out = tmp_path / "run"
    out.mkdir()
    (out / ".checkpoint.ab12cd34").mkdir()  # the temporary folder of an earlier version
    (out / ".checkpoint.ab12cd34" / "model.safetensors").write_bytes(b"\0" * 1000)
    (out / ".best.new-xyz").mkdir()
    (out / ".log.jsonl.1234.tmp").write_text("half")
    (out / "best").mkdir()
    (out / "best" / ".model.safetensors.5678.tmp").write_bytes(b"\0" * 100)
    _trainer_run(out)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    assert sorted(p.name for p in (out / "best").iterdir()) == ["MANIFEST.json", "model.safetensors"]


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_tampered_or_hostile_optimizer_state_is_refused_in_one_line(tmp_path, uninterrupted, capsys):
    import pickle
    import shutil

    from ctxkit.core.checkpoint import CheckpointError

    _, _, reference = uninterrupted
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    with open(run / "checkpoint" / "optimizer.pt", "wb") as f:
        pickle.dump({"optimizer": _Evil()}, f)
    # The manifest catches the change first ...
    with pytest.raises(IncompleteFolderError, match="optimizer.pt: size differs from the manifest"):
        _trainer_run(run, resume=True)
    # ... and without one (a folder from before manifests) the pickle itself is refused, for
    # what it is: no "corrupted", no advice to retry without weights_only.
    (run / "checkpoint" / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match=r"optimizer.pt: refused for safety: the file holds pickled objects") as err:
        _trainer_run(run, resume=True)
    assert "corrupt" not in str(err.value) and "weights_only set to False" not in str(err.value)
