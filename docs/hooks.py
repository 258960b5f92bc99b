"""Build-time hooks of the documentation site (``hooks:`` in ``mkdocs.yml``).

Generated pages. ``results.md``, ``performance.md`` and ``notes/performance-history.md`` are
rendered from ``benchmarks/results/*.json`` by ``benchmarks/make_tables.py`` (the same
functions its ``main()`` writes the committed files with; performance.md is generated whole,
and the hand-written "Engineering notes" at the end of the history page are kept), and
``zoo.md`` from ``ctxkit list-models --markdown``. The committed files are the same views; the
site never shows a stale one.

Tutorials. Every ``tutorials/NN_slug.py`` (jupytext percent script) becomes the page
``tutorials/NN_slug/``, listed in the nav and on ``tutorials/index.md``. mkdocs-jupyter
renders a notebook this hook hands it, taken from the first that applies:

1. ``tutorials/_build/NN_slug.ipynb`` when it is at least as new as the script (written by
   ``python tutorials/build.py --execute``: full-mode outputs, the published site);
2. the script executed during the build when ``CTXKIT_DOCS_EXECUTE`` is set (``1`` or
   ``full``: full mode; ``smoke``: ``CTXKIT_TUTORIAL_SMOKE=1``), through
   ``tutorials/build.py: run_tutorial`` (a kernel on this interpreter, working directory
   ``tutorials/``); a failing cell fails the build;
3. the script without outputs, with a note saying so (the test suite's build: nothing runs).

A notebook that shows an error output is reported as a warning (fatal under ``--strict``).
``CTXKIT_DOCS_TUTORIALS`` points at another folder of tutorials (for testing this hook).

API reference. Each ``docs/api/<package>.md`` names its modules (``::: ctxkit.layers.attention``)
in reading order; a public module of that package the page does not name is appended to it,
and a subpackage without a page gets a generated one, so new code is documented before anyone
edits the pages (both are logged at INFO level). A page naming a module that no longer exists
is a warning.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import jupytext
import nbformat
from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.plugins.ctxkit_docs")

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "ctxkit"
TUTORIALS = Path(os.environ.get("CTXKIT_DOCS_TUTORIALS") or REPO / "tutorials")
TUTORIAL_PATTERN = "[0-9][0-9]_*.py"
TUTORIAL_LIST_MARK = "<!-- tutorial-list -->"
EXECUTE_ENV = "CTXKIT_DOCS_EXECUTE"

# Per build (mkdocs serve loads the hooks afresh for every rebuild).
_state: Dict[str, object] = {}


@dataclass
class Tutorial:
    """One ``NN_slug.py`` script and how its page was made."""

    path: Path
    title: str
    step: str = ""  # the "**Lecture step:** ..." paragraph of the first cell
    outputs: str = "none"  # "none", "tutorials/_build", "executed (full)", "executed (smoke)"

    @property
    def stem(self) -> str:
        return self.path.stem

    @property
    def src_uri(self) -> str:
        return f"tutorials/{self.stem}.ipynb"

    @property
    def nav_title(self) -> str:
        number = self.stem[:2]
        return self.title if self.title.startswith(number) else f"{number} · {self.title}"


# ----------------------------------------------------------------------------- events


def on_config(config):
    _state.clear()
    tutorials = [Tutorial(p, *_title_and_step(p)) for p in sorted(TUTORIALS.glob(TUTORIAL_PATTERN))]
    _state["tutorials"] = tutorials
    nav = config.nav or []
    section = _nav_section(nav, "Tutorials")
    if section is not None:
        section.extend({t.nav_title: t.src_uri} for t in tutorials)
    missing = [p for p in _subpackages() if not (Path(config.docs_dir) / "api" / f"{p}.md").is_file()]
    _state["api_missing"] = missing
    api = _nav_section(nav, "API reference")
    if api is not None:
        api.extend({f"ctxkit.{p}": f"api/{p}.md"} for p in missing)
    # The zoo tables come from the code (ctxkit imports torch: ~2 s), so start now and
    # collect when the page is rendered.
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    _state["zoo"] = subprocess.Popen([sys.executable, "-m", "ctxkit", "list-models", "--markdown"], cwd=REPO,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return config


@event_priority(50)  # before mkdocs-jupyter's on_files, which wraps the notebooks added here
def on_files(files, config):
    tmp = Path(tempfile.mkdtemp(prefix="ctxkit-docs-"))
    _state["tmp"] = tmp
    for tutorial in _state["tutorials"]:
        notebook = _notebook(tutorial)
        # A real file under a temporary src_dir: mkdocs-jupyter's wrapper cannot read a
        # File.generated one (it proxies attributes, not the generated file's own path).
        target = tmp / tutorial.src_uri
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, str(target))
        files.append(File(tutorial.src_uri, src_dir=str(tmp), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    for package in _state["api_missing"]:
        log.info("docs/api/%s.md does not exist: generating the page of ctxkit.%s", package, package)
        content = f"# ctxkit.{package}\n\n::: ctxkit.{package}\n    options:\n      members: false\n" \
                  "      show_root_heading: false\n"
        files.append(File.generated(config, f"api/{package}.md", content=content))
    return files


def on_page_markdown(markdown, page, config, files):
    uri = page.file.src_uri
    if uri == "results.md":
        return _make_tables().results_page()
    if uri == "performance.md":
        return _make_tables().performance_page()
    if uri == "notes/performance-history.md":
        tables = _make_tables()
        return tables.with_kept_notes(tables.history_page(), markdown)
    if uri == "zoo.md":
        return _zoo_markdown(markdown)
    if uri == "tutorials/index.md":
        return markdown.replace(TUTORIAL_LIST_MARK, _tutorial_list())
    if uri.startswith("api/") and uri.endswith(".md") and uri != "api/index.md":
        return _complete_api_page(uri[len("api/"):-len(".md")], markdown)
    return None


def on_page_content(html, page, config, files):
    if page.file.src_uri.startswith("api/"):
        return _sphinx_roles_to_links(html)
    return None


def on_serve(server, config, builder):
    for path in (TUTORIALS, REPO / "benchmarks" / "results", REPO / "benchmarks" / "make_tables.py", SRC):
        if path.exists():
            server.watch(str(path))
    return server


def on_post_build(config):
    _cleanup()


def on_build_error(error):
    _cleanup()


# ----------------------------------------------------------------------------- generated pages


def _make_tables():
    """benchmarks/make_tables.py as a module (it is a script beside its helpers, not a package)."""
    if "make_tables" not in _state:
        # (it puts benchmarks/ on sys.path for its helpers)
        _state["make_tables"] = _load_script("ctxkit_docs_make_tables", REPO / "benchmarks" / "make_tables.py")
    return _state["make_tables"]


def _zoo_markdown(committed: str) -> str:
    proc: subprocess.Popen = _state.pop("zoo")
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    if proc.returncode != 0 or not out.strip():
        log.warning("`ctxkit list-models --markdown` failed (exit %s); showing the committed docs/zoo.md:\n%s",
                    proc.returncode, err.strip()[-2000:])
        return committed
    if out != committed:
        log.info("docs/zoo.md differs from `ctxkit list-models --markdown`; the site shows the latter")
    return out


# ----------------------------------------------------------------------------- tutorials


def _title_and_step(path: Path) -> Tuple[str, str]:
    """The first ``# Title`` of the script's first markdown cell (else the file name) and its
    ``**Lecture step:**`` paragraph (else "")."""
    notebook = jupytext.read(str(path), fmt="py:percent")
    first = next((c.source for c in notebook.cells if c.cell_type == "markdown"), "")
    title = next((ln[2:].strip() for ln in first.splitlines() if ln.startswith("# ")), "")
    step = next((" ".join(par.split())[len("**Lecture step:**"):].strip() for par in first.split("\n\n")
                 if par.startswith("**Lecture step:**")), "")
    return title or path.stem[3:].replace("_", " "), step


def _execute_mode() -> Optional[str]:
    value = os.environ.get(EXECUTE_ENV, "").strip().lower()
    if value in ("", "0", "no", "false"):
        return None
    if value in ("1", "yes", "true", "full"):
        return "full"
    if value == "smoke":
        return "smoke"
    raise PluginError(f"{EXECUTE_ENV}={value!r}: use 1 (or full) to run the tutorials in full mode, "
                      "smoke for smoke mode")


def _notebook(tutorial: Tutorial) -> nbformat.NotebookNode:
    built = TUTORIALS / "_build" / f"{tutorial.stem}.ipynb"
    mode = _execute_mode()
    if built.is_file() and built.stat().st_mtime >= tutorial.path.stat().st_mtime:
        notebook = nbformat.read(str(built), as_version=4)
        tutorial.outputs = "tutorials/_build"
    elif mode is not None:
        log.info("executing %s (%s mode)", tutorial.path.name, mode)
        notebook = _run(tutorial.path, smoke=mode == "smoke")
        tutorial.outputs = f"executed ({mode})"
    else:
        if built.is_file():
            log.info("%s is older than %s: showing the script without outputs", built, tutorial.path.name)
        notebook = jupytext.read(str(tutorial.path), fmt="py:percent")
    if not any(c.cell_type == "code" and c.get("outputs") for c in notebook.cells):
        tutorial.outputs = "none"
        # nbconvert's markdown has no admonitions: a quoted paragraph.
        note = (f"> **Shown without outputs.** This page was built without running the tutorial. Run it "
                f"yourself (`python tutorials/build.py --execute {tutorial.stem[:2]}` writes "
                f"`tutorials/_build/{tutorial.stem}.ipynb`), or build the site with the outputs: "
                f"`python tutorials/build.py --execute && mkdocs build`.")
        notebook.cells.insert(_after_title(notebook), nbformat.v4.new_markdown_cell(note))
    for cell in notebook.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.get("output_type") == "error":
                log.warning("tutorial %s shows an error output (%s: %s)", tutorial.path.name,
                            output.get("ename"), output.get("evalue"))
    return notebook


def _after_title(notebook) -> int:
    """Index after the title cell (the first markdown cell), where the note goes."""
    return 1 if notebook.cells and notebook.cells[0].cell_type == "markdown" else 0


def _run(path: Path, smoke: bool) -> nbformat.NotebookNode:
    """Execute a tutorial with tutorials/build.py's runner (its kernel, cwd and timeouts)."""
    runner_path = REPO / "tutorials" / "build.py"
    if not runner_path.is_file():
        raise PluginError(f"{EXECUTE_ENV} is set but {runner_path} (the tutorial runner) does not exist")
    runner = _load_script("ctxkit_docs_tutorials_build", runner_path)
    try:
        return runner.run_tutorial(path, smoke=smoke).notebook
    except runner.TutorialError as err:
        raise PluginError(f"tutorial {path.name} failed while building the docs ({EXECUTE_ENV} is set):\n"
                          f"{err}") from None


def _tutorial_list() -> str:
    tutorials: List[Tutorial] = _state["tutorials"]
    if not tutorials:
        return "*No tutorials yet: `tutorials/NN_slug.py` files appear here as they are written.*"
    labels = {"none": "code only (not run for this build)", "tutorials/_build": "outputs of `tutorials/build.py`",
              "executed (full)": "outputs of a full run during this build",
              "executed (smoke)": "outputs of a smoke run during this build"}
    rows = ["| tutorial | lecture step | source | shown with |", "|---|---|---|---|"]
    for t in tutorials:
        step = t.step.replace("|", "\\|")
        rows.append(f"| [{t.nav_title}]({t.src_uri[len('tutorials/'):]}) | {step} | `tutorials/{t.path.name}` | "
                    f"{labels[t.outputs]} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------- API pages


def _subpackages() -> List[str]:
    return sorted(p.parent.name for p in SRC.glob("*/__init__.py") if not p.parent.name.startswith("_"))


def _public_modules(package: str) -> List[str]:
    return sorted(p.stem for p in (SRC / package).glob("*.py") if not p.stem.startswith("_"))


def _complete_api_page(package: str, markdown: str) -> str:
    if not (SRC / package / "__init__.py").is_file():
        return markdown
    prefix = f"ctxkit.{package}."
    named = re.findall(r"^:::\s*(\S+)", markdown, flags=re.M)
    for name in named:
        module = name[len(prefix):] if name.startswith(prefix) else ""
        if module and "." not in module and not (SRC / package / f"{module}.py").is_file() \
                and not (SRC / package / module).is_dir():
            # Without this, mkdocstrings stops the build with a collection error.
            log.warning("docs/api/%s.md names %s, which no longer exists: remove it from the page", package, name)
            markdown = re.sub(rf"^:::\s*{re.escape(name)}\s*\n(?:[ \t]+.*\n?)*", "", markdown, flags=re.M)
    for module in _public_modules(package):
        if prefix + module not in named:
            log.info("docs/api/%s.md does not name ctxkit.%s.%s: appending it", package, package, module)
            markdown = markdown.rstrip("\n") + f"\n\n::: {prefix}{module}\n"
    return markdown


# A Sphinx role as the Google-style docstrings write it (":class:`~ctxkit.x.Y`"), after
# Markdown: the role name, then the target as inline code.
_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|const):<code>(~?)(\.?[\w.]+)</code>")
_OBJECT_ID = re.compile(r'id="(ctxkit(?:\.\w+)*)"')


def _sphinx_roles_to_links(html: str) -> str:
    """Turn the roles mkdocstrings leaves as text (``:class:<code>Trainer</code>``) into
    optional cross-references, resolved like Sphinx: a dotted ``ctxkit.`` path as it is, a
    bare name (or ``Class.member``) first in the module of the object whose docstring holds
    it, then as a member of that object; ``~`` shows the last part only. Other libraries'
    objects and unresolved names stay plain code."""
    ids = [(m.start(), m.group(1)) for m in _OBJECT_ID.finditer(html)]

    def link(match) -> str:
        tilde, name = match.group(1), match.group(2)
        shown = name.rsplit(".", 1)[-1] if tilde else name.lstrip(".")
        owner = next((ident for pos, ident in reversed(ids) if pos < match.start()), "ctxkit")
        if name.startswith("ctxkit."):
            first, second = name, name
        elif "." in name.lstrip(".") and not name.lstrip(".")[0].isupper():
            return f"<code>{shown}</code>"  # another library's object (pathlib.Path, torch.nn.Module)
        else:
            first, second = f"{_module_of(owner)}.{name.lstrip('.')}", f"{owner}.{name.lstrip('.')}"
        return f'<autoref optional identifier="{first}" slug="{second}"><code>{shown}</code></autoref>'

    return _ROLE.sub(link, html)


def _module_of(identifier: str) -> str:
    """The longest prefix of a dotted ``ctxkit...`` path that is a module or package."""
    parts = identifier.split(".")
    for end in range(len(parts), 0, -1):
        rel = Path(*parts[1:end]) if end > 1 else Path()
        if (SRC / rel / "__init__.py").is_file() or (end > 1 and (SRC / rel).with_suffix(".py").is_file()):
            return ".".join(parts[:end])
    return "ctxkit"


def _nav_section(nav: list, title: str) -> Optional[list]:
    for item in nav:
        if isinstance(item, dict) and isinstance(item.get(title), list):
            return item[title]
    return None


def _load_script(name: str, path: Path):
    """A script of the repository (not in a package) as a module, registered in sys.modules
    (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _cleanup() -> None:
    tmp = _state.pop("tmp", None)
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    proc = _state.pop("zoo", None)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.communicate()
