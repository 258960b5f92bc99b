"""The documentation site (mkdocs.yml, docs/hooks.py) builds under ``mkdocs build --strict``.

One build into a temporary folder, with nothing executed (``CTXKIT_DOCS_EXECUTE`` unset:
tutorials are rendered as code), shared by the checks below: the API reference carries
the docstrings' tensor shapes, the results, performance and performance-history pages are
rendered from ``benchmarks/results/*.json``, the model zoo is there, and every tutorial has a
page.
``--strict`` turns every warning into a failure: a broken link or ``#anchor`` in docs/*.md,
a docstring mkdocstrings cannot parse, a tutorial showing an error output.
About 14 s of CPU (mkdocstrings over the whole package ~5 s, search index ~3 s, nine
tutorials ~4 s, `ctxkit list-models` for the zoo page ~2 s in a subprocess).
"""

import ast
import html as html_lib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TUTORIAL_PATTERN = "[0-9][0-9]_*.py"


def _records_io():
    spec = importlib.util.spec_from_file_location("ctxkit_test_records_io", REPO / "benchmarks" / "records_io.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _make_tables():
    """benchmarks/make_tables.py as a module (it puts benchmarks/ on sys.path for its helpers)."""
    spec = importlib.util.spec_from_file_location("ctxkit_test_docs_make_tables", REPO / "benchmarks" / "make_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Build the site once; returns (site folder, tutorial scripts rendered)."""
    assert importlib.util.find_spec("mkdocs"), "mkdocs is missing: install the docs extra (pip install -e '.[docs]')"
    tmp = tmp_path_factory.mktemp("docs")
    env = {k: v for k, v in os.environ.items() if k not in ("CTXKIT_DOCS_EXECUTE", "CTXKIT_DOCS_TUTORIALS")}
    env["NO_MKDOCS_2_WARNING"] = "1"  # Material's end-of-life banner, printed on every build
    tutorials = sorted((REPO / "tutorials").glob(TUTORIAL_PATTERN))
    assert tutorials, "no tutorials/NN_slug.py to render"
    out = tmp / "site"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
               "--site-dir", str(out)]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    problems = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("INFO"))
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{problems[-6000:]}"
    return out, tutorials


def _page(site_dir: Path, path: str) -> str:
    page = site_dir / path / "index.html"
    assert page.is_file(), f"{path}/ was not built"
    return page.read_text(encoding="utf-8")


def _docstring_of(path: Path, class_name: str, method: str) -> str:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)
    return ast.get_docstring(fn)


def test_api_page_carries_the_docstring_shapes(site):
    site_dir, _ = site
    shape = "(batch, query_len, embed_dim)"
    assert shape in _docstring_of(REPO / "src/ctxkit/layers/attention.py", "MultiHeadAttention", "forward")
    html = _page(site_dir, "api/layers")
    start = html.index('id="ctxkit.layers.attention.MultiHeadAttention"')
    # The class's section runs until the next object that is not one of its members.
    ids = [(m.start(), m.group(1)) for m in re.finditer(r'id="(ctxkit\.[\w.]+)"', html) if m.start() > start]
    end = next((pos for pos, name in ids if not name.startswith("ctxkit.layers.attention.MultiHeadAttention")),
               len(html))
    section = html[start:end]
    assert shape in section
    assert 'id="ctxkit.layers.attention.MultiHeadAttention.forward"' in section
    # every subpackage has its page, and the front door is documented
    for package in sorted(p.parent.name for p in (REPO / "src/ctxkit").glob("*/__init__.py")):
        assert f'id="ctxkit.{package}' in _page(site_dir, f"api/{package}"), package
    assert 'id="ctxkit.zoo.get_model"' in _page(site_dir, "api")


def test_results_and_performance_pages_come_from_the_records(site):
    site_dir, _ = site
    fmt = _records_io().fmt
    results = _page(site_dir, "results")
    rows = json.loads((REPO / "benchmarks/results/finetune_minilm.json").read_text())
    scores = [r for r in rows if "frozen" not in r["task"]]
    assert scores
    for r in scores:
        assert re.search(rf"<td>{re.escape(r['task'])}</td>\s*<td>{re.escape(r['split'])}</td>\s*"
                         rf"<td>{re.escape(r['metric'])}</td>\s*<td>{re.escape(fmt(r['value']))}</td>", results), r
    # performance.md: the newest product figure (a ctxkit command) per (benchmark, case, peer), its row as make_tables renders it
    tables = _make_tables()
    performance = _page(site_dir, "performance")
    history = _page(site_dir, "notes/performance-history")
    for _, _, section in tables.READER_SECTIONS:
        for table in section:
            newest = table.records()
            for r in newest:
                cells = [html_lib.escape(c, quote=False) for c in tables.reader_cells(table, r)[1:]]
                assert re.search(r"<td>" + r"</td>\s*<td>".join(map(re.escape, cells)) + "</td>", performance), \
                    (table.name, r["case"])
            # the rest (older runs of the same case) is on the history page
            for r in tables._load(table.name):
                if ("benchmark" in r and r not in newest and not tables.is_product(r)
                        and table.name in ("pretrain_throughput.json", "inference_gpu.json")):
                    assert f"<td>{fmt(r['speedup'])}</td>" in history, (table.name, r["case"], r["speedup"])
    # the hand-written part is kept on the history page (the nav names "Engineering notes" on every page)
    notes = 'id="engineering-notes-moved-from-architecturemd"'
    assert notes in history and notes not in performance
    assert 'id="pretraining-status-issue-4-in-progress"' in history
    assert 'href="notes/performance-history/"' in performance or 'href="../notes/performance-history/"' in performance


def test_zoo_page(site):
    site_dir, _ = site
    html = _page(site_dir, "zoo")
    assert "Model zoo" in html and "bert-base-uncased" in html and "all_minilm_l6_v2" in html


def test_every_tutorial_has_a_page(site):
    site_dir, tutorials = site
    index = _page(site_dir, "tutorials")
    for script in tutorials:
        html = _page(site_dir, f"tutorials/{script.stem}")
        assert "jp-Notebook" in html or "jupyter-wrapper" in html, script.name  # rendered by mkdocs-jupyter
        title = next(line[4:].strip() for line in script.read_text(encoding="utf-8").splitlines()
                     if line.startswith("# # "))  # the first markdown heading of the script
        assert html_lib.escape(title, quote=False) in html, script.name
        assert f'href="{script.stem}/"' in index, script.name
