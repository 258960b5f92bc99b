"""The tutorials (``tutorials/NN_slug.py``, jupytext percent scripts) keep their format and run.

* ``test_tutorial_format``: the jupytext header, a title cell, a ``parameters``-tagged first
  code cell that reads ``CTXKIT_TUTORIAL_SMOKE``, at least one ``assert`` and one plot call
  (cheap: no kernel).
* ``test_tutorial_runs_in_smoke_mode``: each tutorial executed as a notebook with nbclient,
  in a fresh kernel on this very interpreter (``tutorials/build.py`` writes a kernel spec whose
  argv is ``sys.executable``; a probe cell appended to the run reports the kernel's
  ``sys.executable``, threads, cwd and settings, and the test compares them). The kernels are
  forked by ``run_tutorial(preload=True)``'s server, which has imported numpy, torch and
  IPython once (``build.PRELOAD``: third-party modules only, not ctxkit nor matplotlib), so
  each kernel is a new process that ran no notebook code yet skips ~7 s of imports; with
  ``CTXKIT_TUTORIAL_SMOKE=1``, ``CTXKIT_DATA`` from the ``shared_data`` fixture, one thread,
  cwd ``tutorials/``. A failing cell fails the test with the cell's source and traceback; the
  wall time is recorded (``record_property("wall_s")``, printed) and must stay within
  ``SMOKE_BUDGET_S``; at least one figure must reach the notebook.
* ``test_a_failing_or_slow_cell_is_named``: the harness on a two-line broken notebook (an
  assert that fails, then a cell that outlives the budget).
* ``test_build_converts_without_executing`` and ``test_readme_lists_every_tutorial``.

The kernels' temporary folders (the tutorials' ``tempfile.mkdtemp()`` run folders) go to
pytest's ``tmp_path`` through ``TMPDIR``.

Every file matching ``tutorials/[0-9][0-9]_*.py`` is picked up, whoever wrote it.
"""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TUTORIALS = REPO / "tutorials"
PATHS = sorted(TUTORIALS.glob("[0-9][0-9]_*.py"))
# The smoke runs are split over two modules (this one and test_tutorials_second_half.py) so
# that pytest-xdist's --dist loadfile gives the halves to different workers.
FIRST_HALF, SECOND_HALF = PATHS[: len(PATHS) // 2], PATHS[len(PATHS) // 2 :]

# The conventions give smoke mode 20 s on one core, kernel start included; CI machines are
# slower and shared, hence three times that before a run counts as too slow.
SMOKE_BUDGET_S = 60
# No single cell should need most of the budget: a hung cell fails early, naming itself.
CELL_TIMEOUT_S = 45

HEADER = """# ---
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
"""
SMOKE_SWITCH = re.compile(r"""^SMOKE\s*=\s*os\.environ\.get\(\s*["']CTXKIT_TUTORIAL_SMOKE["']\s*\)\s*==\s*["']1["']""", re.M)
ASSERT = re.compile(r"^\s*(assert\b|torch\.testing\.assert_close\(|np\.testing\.assert_)", re.M)
# pyplot calls, axes methods that draw, or ctxkit's figure helpers (ctxkit.core.plots)
PLOT = re.compile(r"\bplt\.\w+\(|\bax\w*\.(plot|imshow|bar|hist|scatter)\("
                  r"|\bplot_(attention|alignment|positional_encoding|training_curve)\(")


def _ids(path: Path) -> str:
    return path.stem


@pytest.fixture(scope="module")
def build():
    """``tutorials/build.py`` as a module: the one place that knows how to run a tutorial."""
    for name in ("jupytext", "nbclient", "nbformat", "ipykernel"):
        pytest.importorskip(name, reason="the tutorials need jupytext, nbclient, nbformat and ipykernel")
    if "ctxkit_tutorials_build" in sys.modules:  # both halves share it, and its preloading kernel server
        return sys.modules["ctxkit_tutorials_build"]
    spec = importlib.util.spec_from_file_location("ctxkit_tutorials_build", TUTORIALS / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_tutorials_exist_and_are_numbered_once():
    assert PATHS, f"no tutorials found in {TUTORIALS}"
    numbers = [p.name[:2] for p in PATHS]
    assert len(numbers) == len(set(numbers)), f"two tutorials share a number: {[p.name for p in PATHS]}"


@pytest.mark.parametrize("path", PATHS, ids=_ids)
def test_tutorial_format(path, build):
    text = path.read_text(encoding="utf-8")
    assert text.startswith(HEADER), f"{path.name}: must start with the jupytext percent header of tutorials/README.md"
    nb = build.read_tutorial(path)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), \
        f"{path.name}: the first cell must be markdown with the title"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name}: no code cells"
    first = code[0]
    assert "parameters" in first.metadata.get("tags", []), f'{path.name}: the first code cell needs # %% tags=["parameters"]'
    assert SMOKE_SWITCH.search(first.source), \
        f'{path.name}: the parameters cell must set SMOKE = os.environ.get("CTXKIT_TUTORIAL_SMOKE") == "1"'
    sources = "\n".join(c.source for c in code)
    assert ASSERT.search(sources), f"{path.name}: no assert (a tutorial ends by checking what it showed)"
    assert PLOT.search(sources), f"{path.name}: no plot call (every tutorial shows at least one figure)"


@pytest.mark.parametrize("path", FIRST_HALF, ids=_ids)
def test_tutorial_runs_in_smoke_mode(path, build, shared_data, minilm_dir, record_property, tmp_path):
    try:
        # TMPDIR = tmp_path: the run folders a tutorial makes with tempfile go with pytest's cleanup
        result = build.run_tutorial(path, smoke=True, data=shared_data, threads=1, total_timeout=SMOKE_BUDGET_S,
                                    cell_timeout=CELL_TIMEOUT_S, probe=True, tmpdir=tmp_path, preload=True)
    except build.TutorialError as err:
        record_property("wall_s", round(err.seconds, 1))
        pytest.fail(str(err), pytrace=False)
    probe = result.probe
    record_property("wall_s", round(result.seconds, 1))
    assert probe is not None, f"{path.name}: the probe cell printed nothing"
    record_property("kernel_cpu_s", probe["cpu_s"])
    slowest = sorted((round(s, 1) for s in result.cell_seconds), reverse=True)[:3]
    print(f"{path.name}: smoke run {result.seconds:.1f} s wall, {probe['cpu_s']:.1f} s kernel CPU; slowest cells {slowest} s")
    # The kernel was this interpreter, with the settings the conventions promise.
    assert probe["executable"] == sys.executable, f"kernel ran {probe['executable']}, pytest runs {sys.executable}"
    assert Path(probe["cwd"]).resolve() == TUTORIALS
    assert probe["torch_threads"] == 1 and probe["smoke"] == "1"
    assert Path(probe["data"]).resolve() == Path(shared_data).resolve()
    assert Path(probe["tmpdir"]).resolve() == tmp_path.resolve()
    figures = sum("image/png" in out.get("data", {}) for cell in result.notebook.cells if cell.cell_type == "code"
                  for out in cell.outputs)
    assert figures, f"{path.name}: no figure reached the notebook (a plt.show() while matplotlib was on Agg?)"
    assert result.seconds <= SMOKE_BUDGET_S, f"{path.name}: smoke run took {result.seconds:.1f} s (budget {SMOKE_BUDGET_S} s)"


def test_a_failing_or_slow_cell_is_named(build, tmp_path):
    """The harness itself: an error names the cell and its traceback; the time budget stops a run."""
    script = tmp_path / "99_broken.py"
    script.write_text(HEADER + '\n# %% [markdown]\n# # Broken\n\n# %% tags=["parameters"]\nimport os\nimport time\n\n'
                      '# %%\nanswer = 6 * 7\nassert answer == 41, "wrong answer"\n\n# %%\ntime.sleep(30)\n', encoding="utf-8")
    with pytest.raises(build.TutorialError) as failed:
        build.run_tutorial(script, smoke=True, total_timeout=SMOKE_BUDGET_S, tmpdir=tmp_path)
    message = str(failed.value)
    assert "answer = 6 * 7" in message and "AssertionError" in message and "wrong answer" in message
    assert "\x1b[" not in message  # colour codes stripped
    script.write_text(script.read_text(encoding="utf-8").replace("41", "42"), encoding="utf-8")
    with pytest.raises(build.TutorialError, match=r"(?s)out of time.*time\.sleep\(30\)"):
        build.run_tutorial(script, smoke=True, total_timeout=6, tmpdir=tmp_path)


def test_build_converts_without_executing(build, tmp_path, capsys):
    assert build.main(["--out", str(tmp_path), PATHS[0].name[:2]]) == 0
    nb = build.nbformat.read(str(tmp_path / (PATHS[0].stem + ".ipynb")), as_version=4)
    build.nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata["tags"] and not any(c.outputs for c in code)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert PATHS[0].name in capsys.readouterr().out


def test_readme_lists_every_tutorial():
    readme = (TUTORIALS / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in PATHS if p.name not in readme]
    assert not missing, f"tutorials/README.md does not list {missing}"
