"""The package layout holds: imports point downwards (import-linter contracts in
pyproject.toml, imports inside functions included) and nothing but ``__init__``,
``__main__`` and ``zoo`` sits at the top of the package."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "ctxkit"


def _lint_imports() -> str:
    """The ``lint-imports`` beside this interpreter (the venv's), else one on PATH."""
    beside = Path(sys.executable).with_name("lint-imports")
    if beside.is_file():
        return str(beside)
    found = shutil.which("lint-imports")
    if found is None:
        pytest.skip("import-linter is not installed (pip install import-linter): layering contracts not checked")
    return found


def test_import_contracts_hold():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([_lint_imports(), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_no_top_level_module_but_init_main_and_zoo():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert modules == ["__init__.py", "__main__.py", "zoo.py"], modules
