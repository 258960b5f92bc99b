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


def _function_level_ctxkit_imports():
    """``(file, line, module, source line)`` of every ctxkit import made inside a function."""
    import ast

    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom):
                    # `from . import name` imports the module `name`
                    module = "." * sub.level + (sub.module or sub.names[0].name)
                elif isinstance(sub, ast.Import):
                    module = sub.names[0].name
                else:
                    continue
                if module.startswith(".") or module.split(".")[0] == "ctxkit":
                    found.append((path.relative_to(ROOT).as_posix(), sub.lineno, module, lines[sub.lineno - 1]))
    return sorted(set(found))


def test_imports_inside_functions_say_why():
    """An import of ctxkit inside a function hides the real dependency graph (and once hid a
    package circle), so it is allowed only for an optional dependency and says which, in a
    ``# lazy:`` comment on its line."""
    found = _function_level_ctxkit_imports()
    silent = [f"{f}:{n}: {m}" for f, n, m, line in found if "# lazy:" not in line]
    assert not silent, "imports inside functions without a '# lazy: <why>' comment:\n" + "\n".join(silent)
    # the known lazy ones: matplotlib (core.plots), triton (fast.decode_kernels, gemm_kernels, dropout_kernels,
    # adamw_kernels, qkv_kernels), one import cycle (training.optim's clipped_step needs training.master, which imports
    # optim), and start-up: the package's top-level names and the entry point (import ctxkit / ctxkit --help without torch)
    assert {m.split(".")[-1] for _, _, m, _ in found} <= {"plots", "decode_kernels", "gemm_kernels", "dropout_kernels",
                                                         "adamw_kernels", "qkv_kernels", "master", "embed", "zoo",
                                                         "pipelines", "version", "cli"}, found


def test_version_in_one_place():
    import re

    from ctxkit import __version__
    from ctxkit.core.version import __version__ as core_version

    # [project] is the first table with a version key (tomllib is Python >= 3.11 only)
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M).group(1)
    assert __version__ == core_version == declared
