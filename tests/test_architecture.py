"""The package layout holds: imports point downwards (import-linter contracts in
pyproject.toml, imports inside functions included) and nothing but ``__init__``,
``__main__`` and ``zoo`` sits at the top of the package. docs/architecture.md is the map:
its module list, its contracts and its figures are checked against the code here."""

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


def test_no_top_level_module_but_init_and_main():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert modules == ["__init__.py", "__main__.py"], modules


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
    # adamw_kernels, qkv_kernels), and start-up: the package's top-level names and the entry point (import ctxkit /
    # ctxkit --help without torch). No import circle hides behind one (training.optim <-> master did until
    # clipping became the optimiser's side: ClipsInItsUpdate).
    assert {m.split(".")[-1] for _, _, m, _ in found} <= {"plots", "decode_kernels", "gemm_kernels", "dropout_kernels",
                                                         "adamw_kernels", "qkv_kernels", "embed", "zoo",
                                                         "pipelines", "version", "cli"}, found


def test_version_in_one_place():
    import re

    from ctxkit import __version__
    from ctxkit.core.version import __version__ as core_version

    # [project] is the first table with a version key (tomllib is Python >= 3.11 only)
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M).group(1)
    assert __version__ == core_version == declared


# ---- docs/architecture.md against the code (issue 41 item 4: the map cannot go stale)

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _documented_modules() -> set:
    """The ``pkg/module.py`` paths of the module tree in docs/architecture.md."""
    import re

    block = ARCHITECTURE.read_text(encoding="utf-8").split("```\nsrc/ctxkit/\n", 1)[1].split("```", 1)[0]
    listed, folders = set(), {}  # folders: indentation -> the folder named at it ("core/", "models/bert/")
    for line in block.splitlines():
        entry = re.match(r"^( +)(\S+\.py|\S+/)(\s|$)", line)
        if not entry:
            continue  # a continuation line
        depth, name = len(entry.group(1)), entry.group(2)
        parent = next((folders[d] for d in sorted(folders, reverse=True) if d < depth), "")
        folders = {d: f for d, f in folders.items() if d < depth}
        if name.endswith("/"):
            folders[depth] = parent + name
        else:
            listed.add(parent + name)
    return listed


def test_architecture_page_lists_every_module_and_no_other():
    actual = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    documented = _documented_modules()
    # A package's __init__.py is listed only when it holds more than re-exports (cli's parser tree).
    missing = sorted(m for m in actual - documented if not m.endswith("/__init__.py"))
    stale = sorted(documented - actual)
    assert not missing and not stale, f"docs/architecture.md: modules not listed {missing}; listed but gone {stale}"


def _contracts() -> list:
    """The import-linter contracts of pyproject.toml as dicts (name, type, layers...). A small
    reader of the ``[[tool.importlinter.contracts]]`` tables, for Python < 3.11 without tomllib."""
    import ast
    import re

    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    contracts = []
    for table in text.split("[[tool.importlinter.contracts]]")[1:]:
        table = table.split("\n[", 1)[0]  # up to the next table
        fields = {}
        for key, value in re.findall(r'^(\w+) = (.+?)(?=^\w+ = |\Z)', table, re.M | re.S):
            value = re.sub(r"\s+#[^\n\"]*$", "", value.strip(), flags=re.M)  # trailing comments
            fields[key] = ast.literal_eval(value.replace("true", "True").replace("false", "False"))
        contracts.append(fields)
    return contracts


def test_architecture_page_states_the_contracts():
    contracts = _contracts()
    text = ARCHITECTURE.read_text(encoding="utf-8")
    layers = next(c for c in contracts if c["type"] == "layers")
    order = " > ".join(" | ".join(part.split(".")[-1] for part in layer.split(" | ")) for layer in layers["layers"])
    assert order.replace("ctxkit.", "") in text, f"docs/architecture.md does not give the layers as the contract does: {order}"
    assert layers["name"] == "Layers: " + order  # the contract's name says what it checks
    forbidden = [c["name"] for c in contracts if c["type"] == "forbidden"]
    listed = [line[2:] for line in text.split("## The allowed arrows", 1)[1].split("\n## ", 1)[0].splitlines() if line.startswith("* ")]
    assert sorted(listed) == sorted(forbidden)


def test_architecture_page_figures_are_the_code_s():
    """The rooms (top-level packages and modules) and the arrows between them (grimp's graph,
    which import-linter checks) that the page states."""
    import re

    pytest.importorskip("grimp")
    sys.path.insert(0, str(ROOT / "docs"))
    from package_map import package_graph  # the graph docs/img/package_map.png is drawn from

    rooms, arrows = package_graph()
    stated = re.search(r"\*\*(\d+) rooms\*\*.*?\*\*(\d+) arrows\*\*", ARCHITECTURE.read_text(encoding="utf-8"), re.S)
    assert stated, "docs/architecture.md: the '**N rooms** ... **M arrows**' sentence is gone"
    assert (int(stated.group(1)), int(stated.group(2))) == (len(rooms), len(arrows)), sorted(arrows)
