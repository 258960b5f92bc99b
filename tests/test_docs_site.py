"""The documentation site (mkdocs.yml, docs/hooks.py) builds under ``mkdocs build --strict``.

One build into a temporary folder, shared by the checks below, the way the README builds the
site (plain ``mkdocs build``: every tutorial shown with outputs, executed in smoke mode when
no current outputs exist), made cheap for the suite:

* the tutorials come from a temporary folder (``CTXKIT_DOCS_TUTORIALS``) holding copies of
  the ten real ones plus ``00_docs_check.py``, a tiny tutorial that prints a value and draws
  a figure;
* the cache of executed notebooks (``CTXKIT_DOCS_CACHE``) is a temporary folder where the
  fixture has put, for each real tutorial, a notebook stamped with the script's SHA-256 (as
  ``tutorials/build.py`` stamps a smoke run) with a marker output and a small PNG; so the
  build reuses those (no kernel) and executes only ``00_docs_check.py``, for real, in smoke
  mode (a kernel, ~5 s), caching it;
* the search plugin is left out (``BUILD_WITHOUT_SEARCH``): no check reads its index, and
  it was about a tenth of the build's CPU.

The checks: the API reference carries the docstrings' tensor shapes, the results,
performance and performance-history pages are rendered from ``benchmarks/results/*.json``,
the model zoo is there with ids that do not break mid-word (div.ctxkit-zoo and the no-break
rule of docs/stylesheets/ctxkit.css), code blocks scroll instead of clipping (the same
stylesheet), every tutorial has a page with its outputs, figures as ``<img>`` and the smoke
label; the hook's choice of outputs (current / stale / full / none) is checked in-process.
``--strict`` turns every warning into a failure: a broken link or ``#anchor`` in docs/*.md,
a docstring mkdocstrings cannot parse, a tutorial showing an error output or failing.
About 43 s of CPU for the module on the 2-core development machine with the search index,
of which the tiny tutorial's kernel is ~4 s (the same build without any outputs took ~36 s:
mkdocstrings over the whole package, the search index, eleven notebook pages, `ctxkit
list-models`); leaving the search plugin out took 3-5 s off that.

The whole site with every real tutorial executed (what the README's ``mkdocs build`` does,
minutes on a cold cache) is ``test_full_build_shows_every_tutorial_with_outputs``, skipped
unless ``CTXKIT_DOCS_FULL_BUILD=1``::

    CTXKIT_DOCS_FULL_BUILD=1 .venv/bin/python -m pytest -q -n 0 tests/test_docs_site.py -k full_build
"""

import ast
import base64
import html as html_lib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TUTORIAL_PATTERN = "[0-9][0-9]_*.py"
CHECK_TUTORIAL = "00_docs_check.py"
# What the tiny tutorial prints in smoke mode (N = 3 there, 300 in full mode).
CHECK_PRINTS = "docs check: smoke=True n=3 total=3"
PLANTED = "planted by tests/test_docs_site.py"
SMOKE_LABEL = "Outputs from a smoke run: small settings"
# A 1x1 PNG: the figure of each planted notebook.
PNG_1PX = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201a2f3c7b30000000049454e44ae426082")).decode()

CHECK_SOURCE = """# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Docs check: a tiny tutorial
#
# **Lecture step:** the documentation build.

# %% tags=["parameters"]
import os

SMOKE = os.environ.get("CTXKIT_TUTORIAL_SMOKE") == "1"
N = 3 if SMOKE else 300

# %%
import matplotlib.pyplot as plt

print(f"docs check: smoke={SMOKE} n={N} total={sum(range(N))}")
fig, ax = plt.subplots(figsize=(2, 1.5))
ax.plot(range(N), [i * i for i in range(N)])
plt.show()
"""


# ``mkdocs build`` (its command line, logging and --strict) with mkdocs.yml's plugins minus
# ``search``: no check reads the search index, and building it (Material's HTML parser over
# every page, the API reference's large ones above all) was about a tenth of the build's CPU.
BUILD_WITHOUT_SEARCH = """
import sys

import yaml
from mkdocs import config
from mkdocs.__main__ import cli

load_config = config.load_config


def without_search(config_file=None, **options):
    with open(config_file.name, encoding="utf-8") as f:
        plugins = yaml.safe_load(f)["plugins"]
    options["plugins"] = [p for p in plugins if "search" not in (p if isinstance(p, dict) else {p: None})]
    return load_config(config_file=config_file, **options)


config.load_config = without_search
cli(sys.argv[1:])
"""


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _records_io():
    return _load("ctxkit_test_records_io", REPO / "benchmarks" / "records_io.py")


def _make_tables():
    """benchmarks/make_tables.py as a module (it puts benchmarks/ on sys.path for its helpers)."""
    return _load("ctxkit_test_docs_make_tables", REPO / "benchmarks" / "make_tables.py")


@pytest.fixture(scope="module")
def runner():
    """tutorials/build.py: the tutorial runner the docs hook uses."""
    for name in ("jupytext", "nbclient", "nbformat", "ipykernel"):
        pytest.importorskip(name, reason="the docs need the docs extra (pip install -e '.[docs]')")
    return _load("ctxkit_test_docs_runner", REPO / "tutorials" / "build.py")


def _planted(runner, script: Path, mode: str = "smoke", digest=None):
    """The notebook of ``script`` as if run_tutorial had executed it: a marker output and a
    PNG in its first code cell, the run stamped with the script's hash."""
    nbformat = runner.nbformat
    nb = runner.read_tutorial(script)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"{PLANTED}: {script.stem}\n"),
                    nbformat.v4.new_output("display_data", data={"image/png": PNG_1PX, "text/plain": "<Figure>"})]
    cell.execution_count = 1
    nb.metadata[runner.METADATA_KEY] = {"mode": mode, "source_sha256": digest or runner.source_hash(script),
                                        "seconds": 1.0, "executed_at": "2026-01-01T00:00:00+00:00"}
    return nb


@pytest.fixture(scope="module")
def site(tmp_path_factory, runner):
    """Build the site once; returns (site folder, real tutorial scripts, cache folder, build log)."""
    assert importlib.util.find_spec("mkdocs"), "mkdocs is missing: install the docs extra (pip install -e '.[docs]')"
    tmp = tmp_path_factory.mktemp("docs")
    tutorials = sorted((REPO / "tutorials").glob(TUTORIAL_PATTERN))
    assert tutorials, "no tutorials/NN_slug.py to render"
    folder, cache = tmp / "tutorials", tmp / "cache"
    (cache / "smoke").mkdir(parents=True)
    folder.mkdir()
    for script in tutorials:
        copy = folder / script.name
        copy.write_bytes(script.read_bytes())
        runner.nbformat.write(_planted(runner, copy), str(cache / "smoke" / f"{script.stem}.ipynb"))
    (folder / CHECK_TUTORIAL).write_text(CHECK_SOURCE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXKIT_DOCS_")}
    env.update(CTXKIT_DOCS_TUTORIALS=str(folder), CTXKIT_DOCS_CACHE=str(cache))
    env["NO_MKDOCS_2_WARNING"] = "1"  # Material's end-of-life banner, printed on every build
    out = tmp / "site"
    command = [sys.executable, "-c", BUILD_WITHOUT_SEARCH, "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
               "--site-dir", str(out)]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    problems = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("INFO"))
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{problems[-6000:]}"
    return out, tutorials, cache, proc.stderr


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
    site_dir = site[0]
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
    site_dir = site[0]
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


def _stylesheet(site_dir: Path, page_html: str) -> str:
    """docs/stylesheets/ctxkit.css as the page links it (mkdocs.yml: extra_css)."""
    link = re.search(r'<link rel="stylesheet" href="((?:\.\./)*stylesheets/ctxkit\.css)"', page_html)
    assert link, "the page does not link stylesheets/ctxkit.css (mkdocs.yml: extra_css)"
    return (site_dir / "stylesheets" / "ctxkit.css").read_text(encoding="utf-8")


def _rules(css: str):
    """(selectors, declarations) of each rule of a flat stylesheet, comments removed."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.DOTALL)
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        declarations = {k.strip(): v.strip() for k, _, v in (d.partition(":") for d in body.split(";") if ":" in d)}
        yield [" ".join(sel.split()) for sel in selectors.split(",")], declarations


def _declared(css: str, selector: str) -> dict:
    """The declarations that apply to exactly ``selector`` (merged over the rules naming it)."""
    found = {}
    for selectors, declarations in _rules(css):
        if selector in selectors:
            found.update(declarations)
    return found


def test_zoo_page(site):
    site_dir = site[0]
    html = _page(site_dir, "zoo")
    assert "Model zoo" in html and "bert-base-uncased" in html and "all_minilm_l6_v2" in html


def test_zoo_ids_do_not_break_mid_word(site):
    site_dir = site[0]
    html = _page(site_dir, "zoo")
    # every table of the page sits inside div.ctxkit-zoo (docs/hooks.py: on_page_content)
    start = html.index('<div class="ctxkit-zoo">')
    assert html.count("<table>") >= 4 and html.index("<table>") > start
    assert "<td><code>google-bert/bert-base-multilingual-uncased</code></td>" in html
    # ... whose id cells (inline code, and the first column) do not wrap: Material's own
    # `.md-typeset code {word-break: break-word}` is what cut them mid-word
    css = _stylesheet(site_dir, html)
    for selector in (".md-typeset .ctxkit-zoo td code", ".md-typeset .ctxkit-zoo td:first-child"):
        rule = _declared(css, selector)
        assert rule.get("white-space") == "nowrap", (selector, rule)
        assert rule.get("word-break") in ("keep-all", "normal") and rule.get("overflow-wrap") == "normal", rule


def test_code_blocks_scroll_instead_of_clipping(site):
    site_dir, tutorials = site[0], site[1]
    css = _stylesheet(site_dir, _page(site_dir, "architecture"))
    assert _declared(css, ".md-typeset pre > code").get("overflow-x") == "auto"
    # notebook pages: JupyterLab's CSS hides what overflows the input area; the code scrolls
    html = _page(site_dir, f"tutorials/{tutorials[0].stem}")
    _stylesheet(site_dir, html)
    assert '<div class="jp-CodeMirrorEditor jp-Editor jp-InputArea-editor"' in html and "highlight-ipynb" in html
    assert _declared(css, ".jupyter-wrapper .jp-InputArea-editor pre").get("overflow-x") == "auto"
    for selector in (".jupyter-wrapper .jp-InputArea", ".jupyter-wrapper .jp-InputArea-editor"):
        assert _declared(css, selector).get("min-width") == "0", selector  # the editor shrinks to the page
    assert _declared(css, ".jupyter-wrapper .jp-OutputArea-output pre").get("white-space") == "pre-wrap"


def _outputs(html: str):
    """(text outputs, figure <img> tags) of a rendered notebook page."""
    texts = re.findall(r'<div class="jp-RenderedText jp-OutputArea-output"[^>]*>\s*<pre>(.*?)</pre>', html, flags=re.DOTALL)
    images = re.findall(r'<div class="jp-RenderedImage jp-OutputArea-output"[^>]*>\s*(<img [^>]*src="data:image/png;'
                        r'base64,[^"]+"[^>]*>)', html)
    return [html_lib.unescape(t) for t in texts], images


def test_every_tutorial_has_a_page_with_outputs(site):
    site_dir, tutorials, _, log = site
    index = _page(site_dir, "tutorials")
    for script in tutorials:
        html = _page(site_dir, f"tutorials/{script.stem}")
        assert "jp-Notebook" in html or "jupyter-wrapper" in html, script.name  # rendered by mkdocs-jupyter
        title = next(line[4:].strip() for line in script.read_text(encoding="utf-8").splitlines()
                     if line.startswith("# # "))  # the first markdown heading of the script
        assert html_lib.escape(title, quote=False) in html, script.name
        assert f'href="{script.stem}/"' in index, script.name
        # the cached run (hash of this very script) is what the page shows, label included
        texts, images = _outputs(html)
        assert any(f"{PLANTED}: {script.stem}" in t for t in texts), script.name
        assert images, f"{script.name}: no figure on the page"
        assert 'class="admonition warning ctxkit-outputs ctxkit-outputs-smoke"' in html and SMOKE_LABEL in html
        assert html.index(SMOKE_LABEL) < html.index(PLANTED), "the label goes above the outputs"
    # nothing real was executed: only the tutorial without a cached run
    executing = [line for line in log.splitlines() if "executing" in line]
    assert len(executing) == 1 and "executing 1 tutorial(s) in smoke mode" in executing[0], executing
    assert CHECK_TUTORIAL in executing[0] and not any(s.name in executing[0] for s in tutorials)
    assert index.count("outputs of a smoke run (small settings)") == len(tutorials) + 1


def test_a_tutorial_without_outputs_is_run_in_smoke_mode_and_cached(site, runner):
    site_dir, _, cache, _ = site
    html = _page(site_dir, f"tutorials/{Path(CHECK_TUTORIAL).stem}")
    texts, images = _outputs(html)
    assert any(CHECK_PRINTS in t for t in texts), texts  # the kernel ran it, in smoke mode
    assert images, "the matplotlib figure is not an <img> of the page"
    assert SMOKE_LABEL in html and "CTXKIT_TUTORIAL_SMOKE=1" in html
    assert html.index(SMOKE_LABEL) < html.index("docs check: smoke=True")
    cached = runner.nbformat.read(str(cache / "smoke" / f"{Path(CHECK_TUTORIAL).stem}.ipynb"), as_version=4)
    info = runner.run_info(cached)
    assert info["mode"] == "smoke"
    assert info["source_sha256"] == runner.source_hash(site_dir.parent / "tutorials" / CHECK_TUTORIAL)
    assert not any("ctxkit-outputs" in c.source for c in cached.cells)  # the label is the page's, not the cache's


@pytest.fixture
def hooks(monkeypatch, runner, tmp_path):
    """docs/hooks.py in this process, with the runner's executions recorded instead of run."""
    for name in list(os.environ):
        if name.startswith("CTXKIT_DOCS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CTXKIT_DOCS_CACHE", str(tmp_path / "cache"))
    module = _load("ctxkit_test_docs_hooks", REPO / "docs" / "hooks.py")
    module._state.clear()
    module._state["runner"] = runner
    executed = []

    def run_tutorials(paths, smoke, jobs=1, on_done=None, **kwargs):
        for path in paths:
            executed.append((Path(path).name, "smoke" if smoke else "full"))
            result = runner.RunResult(_planted(runner, Path(path), "smoke" if smoke else "full"), 0.5)
            on_done(Path(path), result)

    monkeypatch.setattr(runner, "run_tutorials", run_tutorials)
    module.executed = executed
    return module


def _tutorial(hooks, folder: Path, name: str = CHECK_TUTORIAL):
    path = folder / name
    path.write_text(CHECK_SOURCE, encoding="utf-8")
    return hooks.Tutorial(path, *hooks._title_and_step(path))


def test_outputs_are_reused_while_the_script_is_unchanged(hooks, runner, tmp_path):
    cache = tmp_path / "cache"
    tutorial = _tutorial(hooks, tmp_path)
    hooks._find_outputs([tutorial], tmp_path)
    assert hooks.executed == [(CHECK_TUTORIAL, "smoke")] and tutorial.outputs == "smoke"
    assert (cache / "smoke" / f"{tutorial.stem}.ipynb").is_file()
    again = _tutorial(hooks, tmp_path)
    hooks._find_outputs([again], tmp_path)  # a rebuild: the cache, no kernel
    assert len(hooks.executed) == 1 and again.outputs == "smoke" and again.notebook is not None
    # the script changes: its cached run no longer counts, it runs again
    again.path.write_text(CHECK_SOURCE + "\nprint('one more line')\n", encoding="utf-8")
    changed = hooks.Tutorial(again.path, *hooks._title_and_step(again.path))
    hooks._find_outputs([changed], tmp_path)
    assert len(hooks.executed) == 2 and changed.outputs == "smoke"


def test_full_outputs_win_and_off_runs_nothing(hooks, runner, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    tutorial = _tutorial(hooks, tmp_path)
    # tutorials/_build/NN.ipynb of `tutorials/build.py --execute`, current: shown, labelled as full
    runner.nbformat.write(_planted(runner, tutorial.path, "full"), str(cache / f"{tutorial.stem}.ipynb"))
    hooks._find_outputs([tutorial], tmp_path)
    assert hooks.executed == [] and tutorial.outputs == "full"
    page = hooks._page_notebook(tutorial)
    assert "ctxkit-outputs-full" in page.cells[1].source and "Outputs of a full run" in page.cells[1].source
    # ... but not once the script changed (and with CTXKIT_DOCS_EXECUTE=0 nothing runs)
    tutorial.path.write_text(CHECK_SOURCE + "\n# changed\n", encoding="utf-8")
    monkeypatch.setenv("CTXKIT_DOCS_EXECUTE", "0")
    stale = hooks.Tutorial(tutorial.path, *hooks._title_and_step(tutorial.path))
    hooks._find_outputs([stale], tmp_path)
    assert hooks.executed == [] and stale.notebook is None
    page = hooks._page_notebook(stale)
    assert stale.outputs == "none" and "Shown without outputs" in page.cells[1].source
    assert not any(c.get("outputs") for c in page.cells if c.cell_type == "code")
    # CTXKIT_DOCS_EXECUTE=full runs it in full mode, into tutorials/_build/NN.ipynb
    monkeypatch.setenv("CTXKIT_DOCS_EXECUTE", "full")
    hooks._find_outputs([stale], tmp_path)
    assert hooks.executed == [(CHECK_TUTORIAL, "full")] and stale.outputs == "full"
    assert runner.run_info(runner.nbformat.read(str(cache / f"{tutorial.stem}.ipynb"), as_version=4))["mode"] == "full"


def test_smoke_notebooks_of_build_py_count_as_smoke(hooks, runner, tmp_path, monkeypatch):
    """`tutorials/build.py --smoke` writes tutorials/_build/NN.ipynb too: labelled smoke, and
    not what CTXKIT_DOCS_EXECUTE=full asks for."""
    cache = tmp_path / "cache"
    cache.mkdir()
    tutorial = _tutorial(hooks, tmp_path)
    runner.nbformat.write(_planted(runner, tutorial.path, "smoke"), str(cache / f"{tutorial.stem}.ipynb"))
    hooks._find_outputs([tutorial], tmp_path)
    assert hooks.executed == [] and tutorial.outputs == "smoke"
    assert "Outputs from a smoke run: small settings" in hooks._page_notebook(tutorial).cells[1].source
    monkeypatch.setenv("CTXKIT_DOCS_EXECUTE", "full")
    again = hooks.Tutorial(tutorial.path, *hooks._title_and_step(tutorial.path))
    hooks._find_outputs([again], tmp_path)
    assert hooks.executed == [(CHECK_TUTORIAL, "full")] and again.outputs == "full"


@pytest.mark.skipif(os.environ.get("CTXKIT_DOCS_FULL_BUILD") != "1",
                    reason="the whole site with every tutorial executed: minutes (CTXKIT_DOCS_FULL_BUILD=1 runs it)")
def test_full_build_shows_every_tutorial_with_outputs(runner, tmp_path):
    """``mkdocs build`` as the README says, into a temporary folder, with the repository's
    cache (tutorials/_build): on a cold cache it executes every tutorial in smoke mode (the
    README gives the time), then only the ones that changed. Every page has text outputs, a
    figure and the label of where its outputs come from."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXKIT_DOCS_")}
    env["NO_MKDOCS_2_WARNING"] = "1"
    out = tmp_path / "site"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=3600, check=False)
    seconds = time.monotonic() - start
    problems = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("INFO"))
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{problems[-6000:]}"
    print(f"mkdocs build: {seconds:.0f} s; " + " ".join(ln.split("-  ", 1)[-1] for ln in proc.stderr.splitlines()
                                                        if "executing" in ln or "smoke run in" in ln))
    for script in sorted((REPO / "tutorials").glob(TUTORIAL_PATTERN)):
        html = _page(out, f"tutorials/{script.stem}")
        texts, images = _outputs(html)
        assert texts and images, f"{script.name}: {len(texts)} text outputs, {len(images)} figures"
        assert re.search(r'class="admonition \w+ ctxkit-outputs ctxkit-outputs-(smoke|full)"', html), script.name
        if "ctxkit-outputs-smoke" in html:
            assert SMOKE_LABEL in html, script.name
