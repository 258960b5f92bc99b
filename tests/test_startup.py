"""Start-up (issue 38 item 8): ``import ctxkit``, ``ctxkit --help`` and ``--version`` import no
torch, and building the whole parser tree imports none of the heavy optional modules; the
cached top-level help is exactly what the parser prints."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
HEAVY = ("torch._dynamo", "triton", "onnxruntime", "matplotlib", "fastapi", "uvicorn", "transformers", "sklearn")


def _python(code_or_args, **env):
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args
    run_env = {**os.environ, "PYTHONPATH": str(SRC), **env}
    done = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, env=run_env, timeout=300)
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return done, imported


def test_import_ctxkit_imports_no_torch_until_a_name_is_used():
    done, imported = _python("import ctxkit; print(ctxkit.__version__, sorted(ctxkit.__all__))")
    assert done.returncode == 0 and "torch" not in imported and "ctxkit" in imported
    assert "pipeline" in done.stdout
    done, imported = _python("import ctxkit; print(ctxkit.get_model.__module__, ctxkit.pipeline.__module__)")
    assert done.stdout.split() == ["ctxkit.zoo", "ctxkit.inference.pipelines"] and "torch" in imported
    done, _ = _python("import ctxkit; ctxkit.no_such_name")
    assert "module 'ctxkit' has no attribute 'no_such_name'" in done.stderr


@pytest.mark.parametrize("flag", ["--help", "-h", "--version"])
def test_help_and_version_import_no_torch(flag):
    done, imported = _python(["-m", "ctxkit", flag])
    assert done.returncode == 0 and "torch" not in imported and not any(m.startswith("ctxkit.cli") for m in imported)
    if flag == "--version":
        from ctxkit.core.version import __version__

        assert done.stdout == f"ctxkit {__version__}\n"
    else:
        assert done.stdout == (SRC / "ctxkit" / "cli" / "help.txt").read_text(encoding="utf-8")


STALE = "the cached help is stale: COLUMNS=100 python -c \"from ctxkit.cli import write_help; write_help()\""


def test_cached_help_is_the_parsers_own(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    from ctxkit.cli import build_parser, help_texts

    parser = build_parser()
    cached = (SRC / "ctxkit" / "cli" / "help.txt").read_text(encoding="utf-8")
    assert cached == parser.format_help(), STALE
    verbs = json.loads((SRC / "ctxkit" / "cli" / "help.json").read_text(encoding="utf-8"))
    assert verbs == help_texts(parser), STALE
    assert {"finetune", "pretrain", "serve", "bench pretrain", "pipeline"} <= set(verbs)


@pytest.mark.parametrize("argv", [["finetune", "--help"], ["bench", "pretrain", "-h"]])
def test_a_verbs_help_imports_no_torch(argv):
    done, imported = _python(["-m", "ctxkit", *argv])
    assert done.returncode == 0 and "torch" not in imported and not any(m.startswith("ctxkit.cli") for m in imported)
    verbs = json.loads((SRC / "ctxkit" / "cli" / "help.json").read_text(encoding="utf-8"))
    assert done.stdout == verbs[" ".join(argv[:-1])]
    assert done.stdout.startswith(f"usage: ctxkit {' '.join(argv[:-1])} ")


def test_the_parser_tree_imports_no_heavy_module():
    # One fresh interpreter answers both checks (each start imports torch, ~3 s): what building
    # the parser tree imported, taken before anything else runs; then ``ctxkit ... --help`` with
    # a positional argument before --help (not a cached key: argparse answers as before).
    code = (
        "import contextlib, io, json, sys\n"
        "from ctxkit.cli import build_parser\n"
        "build_parser()\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "from ctxkit.__main__ import run\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    try:\n"
        "        code = run(['pipeline', 'fill-mask', '--help'])\n"
        "    except SystemExit as exit:\n"
        "        code = exit.code\n"
        "print(json.dumps({'heavy': heavy, 'code': code, 'help': out.getvalue()}))\n"
    )
    done, _ = _python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["heavy"] == [], result["heavy"]
    assert result["code"] == 0 and "question-answering" in result["help"]
