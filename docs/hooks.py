"""Build-time hooks of the documentation site (``hooks:`` in ``mkdocs.yml``).

Generated pages. ``results.md``, ``performance.md`` and ``notes/performance-history.md`` are
rendered from ``benchmarks/results/*.json`` by ``benchmarks/make_tables.py`` (the same
functions its ``main()`` writes the committed files with; performance.md is generated whole,
and the hand-written "Engineering notes" at the end of the history page are kept), and
``zoo.md`` from ``ctxkit list-models --markdown``. The committed files are the same views; the
site never shows a stale one.

Tutorials. Every ``tutorials/NN_slug.py`` (jupytext percent script) becomes the page
``tutorials/NN_slug/``, listed in the nav and on ``tutorials/index.md``, always with its outputs
and figures (mkdocs-jupyter renders the notebook this hook hands it; matplotlib figures are
``<img>`` elements of the page). The outputs come from the first that applies:

1. ``tutorials/_build/NN_slug.ipynb`` executed from the script as it is now (its metadata
   records the SHA-256 of the script it ran: ``tutorials/build.py: run_info``), written by
   ``python tutorials/build.py --execute`` (full outputs) or ``--smoke``;
2. ``tutorials/_build/smoke/NN_slug.ipynb``, a smoke run of the script as it is now, which an
   earlier build executed and cached;
3. otherwise the tutorial is executed now, in smoke mode (``CTXKIT_TUTORIAL_SMOKE=1``: seconds
   to a minute each; all missing ones ``CTXKIT_DOCS_JOBS`` at a time, default 2, one kernel
   each, through ``tutorials/build.py: run_tutorials``: a kernel on this interpreter, cwd
   ``tutorials/``), and cached as in 2. A rebuild re-executes only the scripts that changed.

A page with smoke outputs says so at its top ("Outputs from a smoke run: small settings"),
a page with full outputs says when they were made. ``CTXKIT_DOCS_EXECUTE`` changes step 3:
``full`` (or ``1``) executes in full mode instead and caches as in 1 (minutes each);
``0`` (or ``off``) executes nothing and shows a tutorial without cached outputs as code, with a
note (the test suite's build). A smoke run that fails is a warning (fatal under ``--strict``)
and its page shows the code with the reason; a failing full run fails the build. A notebook
that shows an error output is a warning. ``CTXKIT_DOCS_TUTORIALS`` points at another folder of
tutorials, ``CTXKIT_DOCS_CACHE`` at another folder than ``tutorials/_build`` for 1 and 2 (both
for testing this hook).

API reference. Each ``docs/api/<package>.md`` names its modules (``::: ctxkit.layers.attention``)
in reading order; a public module of that package the page does not name is appended to it,
and a subpackage without a page gets a generated one, so new code is documented before anyone
edits the pages (both are logged at INFO level). A page naming a module that no longer exists
is a warning.
"""

from __future__ import annotations

import html
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
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
CACHE_ENV = "CTXKIT_DOCS_CACHE"
JOBS_ENV = "CTXKIT_DOCS_JOBS"
#: Seconds a tutorial may take in smoke mode during a build (the suite's budget is 60 s on one
#: thread; a build runs several at once on a machine that may be busy).
SMOKE_TIMEOUT_S = 300

# Per build (mkdocs serve loads the hooks afresh for every rebuild).
_state: Dict[str, object] = {}


@dataclass
class Tutorial:
    """One ``NN_slug.py`` script and how its page was made."""

    path: Path
    title: str
    step: str = ""  # the "**Lecture step:** ..." paragraph of the first cell
    outputs: str = "none"  # "none", "full", "smoke" or "unrecorded" (an old tutorials/build.py notebook)
    run: Dict[str, object] = field(default_factory=dict)  # tutorials/build.py: run_info of the notebook shown
    origin: str = ""  # where the outputs came from (for the log and the page's note)
    problem: str = ""  # why there are no outputs (a failed smoke run)
    notebook: Optional[nbformat.NotebookNode] = None

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
    tutorials: List[Tutorial] = _state["tutorials"]
    if tutorials:
        _find_outputs(tutorials, tmp)
    for tutorial in tutorials:
        notebook = _page_notebook(tutorial)
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
    if page.file.src_uri == "zoo.md":
        # docs/stylesheets/ctxkit.css keeps the ids in these tables whole (no break mid-word)
        return f'<div class="ctxkit-zoo">\n{html}\n</div>'
    return None


def on_serve(server, config, builder):
    # tutorials/ itself only: a build writes its executed notebooks under tutorials/_build
    if TUTORIALS.exists():
        server.watch(str(TUTORIALS), recursive=False)
    for path in (REPO / "benchmarks" / "results", REPO / "benchmarks" / "make_tables.py", SRC):
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
    """What a build executes for a tutorial without current outputs: "smoke" (the default),
    "full", or None (nothing)."""
    value = os.environ.get(EXECUTE_ENV, "").strip().lower()
    if value in ("", "smoke", "auto"):
        return "smoke"
    if value in ("1", "yes", "true", "full"):
        return "full"
    if value in ("0", "no", "false", "off", "none"):
        return None
    raise PluginError(f"{EXECUTE_ENV}={value!r}: leave it unset (or smoke) to run tutorials without current outputs "
                      "in smoke mode, full (or 1) for full mode, 0 (or off) to run nothing")


def _cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or TUTORIALS / "_build")


def _runner():
    """tutorials/build.py as a module: the one place that knows how to run a tutorial."""
    if "runner" not in _state:
        path = REPO / "tutorials" / "build.py"
        if not path.is_file():
            raise PluginError(f"{path} (the tutorial runner) does not exist")
        _state["runner"] = _load_script("ctxkit_docs_tutorials_build", path)
    return _state["runner"]


def _has_outputs(notebook) -> bool:
    return any(c.cell_type == "code" and c.get("outputs") for c in notebook.cells)


def _current(path: Path, tutorial: Tutorial, digest: str) -> Optional[Tuple[nbformat.NotebookNode, dict]]:
    """The notebook at ``path`` and its run_info if it was executed from the script as it is now."""
    if not path.is_file():
        return None
    try:
        notebook = nbformat.read(str(path), as_version=4)
    except (OSError, ValueError, KeyError) as err:  # a half-written or foreign file: not a cache hit
        log.info("%s is not a readable notebook (%s): ignored", path, err)
        return None
    if not _has_outputs(notebook):
        return None  # `python tutorials/build.py` without --execute writes those
    info = _runner().run_info(notebook)
    if info is not None:
        if info.get("source_sha256") == digest:
            return notebook, info
        log.info("%s was executed from an older %s: not shown", path, tutorial.path.name)
        return None
    # written before tutorials/build.py recorded what it ran: trusted while newer than the script
    if path.stat().st_mtime >= tutorial.path.stat().st_mtime:
        return notebook, {"mode": "unrecorded"}
    return None


def _find_outputs(tutorials: List[Tutorial], tmp: Path) -> None:
    """Give each tutorial its executed notebook: current cached outputs, else a run now
    (smoke mode unless CTXKIT_DOCS_EXECUTE says otherwise), cached for the next build."""
    runner, cache, mode = _runner(), _cache_dir(), _execute_mode()
    pending: List[Tutorial] = []
    for tutorial in tutorials:
        digest = runner.source_hash(tutorial.path)
        candidates = [cache / f"{tutorial.stem}.ipynb"] + ([cache / "smoke" / f"{tutorial.stem}.ipynb"]
                                                           if mode != "full" else [])
        for path in candidates:
            found = _current(path, tutorial, digest)
            if found is not None and not (mode == "full" and found[1]["mode"] == "smoke"):
                tutorial.notebook, tutorial.run = found
                tutorial.outputs, tutorial.origin = str(found[1]["mode"]), str(path)
                break
        else:
            if mode is not None:
                pending.append(tutorial)
    if not pending:
        return
    smoke = mode == "smoke"
    default_jobs = max(1, min(2, os.cpu_count() or 1)) if smoke else 1
    try:
        jobs = int(os.environ.get(JOBS_ENV) or default_jobs)
    except ValueError:
        raise PluginError(f"{JOBS_ENV}={os.environ[JOBS_ENV]!r}: a number of tutorials to run at once") from None
    log.info("executing %d tutorial(s) in %s mode, %d at a time (cached in %s): %s", len(pending), mode, jobs,
             cache / "smoke" if smoke else cache, " ".join(t.path.name for t in pending))
    kernel_tmp = tmp / "kernel-tmp"  # the tutorials' tempfile folders, deleted with the build's temporary folder
    kernel_tmp.mkdir(exist_ok=True)
    by_path = {t.path: t for t in pending}

    def done(path: Path, result) -> None:
        tutorial = by_path[path]
        if isinstance(result, runner.TutorialError):
            tutorial.problem = str(result)
            return
        tutorial.notebook, tutorial.run = result.notebook, runner.run_info(result.notebook) or {}
        tutorial.outputs, tutorial.origin = mode, f"executed during this build ({result.seconds:.0f} s)"
        target = (cache / "smoke" if smoke else cache) / f"{tutorial.stem}.ipynb"
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")  # atomic: concurrent builds share it
            nbformat.write(result.notebook, str(partial))
            os.replace(partial, target)
        except OSError as err:
            log.info("%s: %s run in %.1f s, not cached (%s): the next build runs it again", tutorial.path.name,
                     mode, result.seconds, err)
            return
        log.info("%s: %s run in %.1f s, cached in %s", tutorial.path.name, mode, result.seconds, target)

    runner.run_tutorials([t.path for t in pending], smoke=smoke, jobs=jobs, on_done=done, tmpdir=kernel_tmp,
                         total_timeout=SMOKE_TIMEOUT_S if smoke else None)
    failed = [t for t in pending if t.problem]
    if failed and not smoke:
        raise PluginError(f"{len(failed)} tutorial(s) failed while building the docs ({EXECUTE_ENV}=full):\n"
                          + "\n\n".join(t.problem for t in failed))
    for tutorial in failed:
        log.warning("tutorial %s failed in smoke mode while building the docs; its page shows the code without "
                    "outputs:\n%s", tutorial.path.name, tutorial.problem[-3000:])


def _page_notebook(tutorial: Tutorial) -> nbformat.NotebookNode:
    """The notebook mkdocs-jupyter renders: the executed one (or the script), with a note
    under the title saying where the outputs come from."""
    notebook = tutorial.notebook if tutorial.notebook is not None else _runner().read_tutorial(tutorial.path)
    notebook = nbformat.from_dict(notebook)  # a copy: the note must not reach the cache
    if tutorial.notebook is None:
        tutorial.outputs = "none"
    notebook.cells.insert(_after_title(notebook), nbformat.v4.new_markdown_cell(_outputs_note(tutorial)))
    for cell in notebook.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.get("output_type") == "error":
                log.warning("tutorial %s shows an error output (%s: %s)", tutorial.path.name,
                            output.get("ename"), output.get("evalue"))
    return notebook


def _outputs_note(tutorial: Tutorial) -> str:
    """The note under a tutorial's title: raw HTML (nbconvert's markdown has no admonitions),
    styled by Material's admonition classes; ``ctxkit-outputs-<kind>`` names the kind."""
    number = tutorial.stem[:2]
    when = str(tutorial.run.get("executed_at", ""))[:10]
    seconds = tutorial.run.get("seconds")
    made = f" (executed {when}" + (f", {float(seconds):.0f} s" if seconds is not None else "") + ")" if when else ""
    full_run = (f"<code>python tutorials/build.py --execute {number}</code> runs it in full mode (minutes) and the "
                f"next <code>mkdocs build</code> shows those outputs; see "
                f'<a href="../#running-them">Running them</a>.')
    if tutorial.outputs == "smoke":
        title, kind, style = "Outputs from a smoke run: small settings", "smoke", "warning"
        body = (f"This page was executed with <code>CTXKIT_TUTORIAL_SMOKE=1</code>{made}: every size knob of the "
                f"first code cell is shrunk so that the tutorial runs in seconds, so the outputs and figures show "
                f"what each cell does, but the numbers (losses, accuracies, timings) say little. {full_run}")
    elif tutorial.outputs == "full":
        title, kind, style = "Outputs of a full run", "full", "info"
        body = f"The outputs below come from running this tutorial in full mode{made}."
    elif tutorial.outputs == "unrecorded":
        title, kind, style = "Outputs of tutorials/build.py", "unrecorded", "info"
        body = (f"The outputs below come from <code>tutorials/_build/{tutorial.stem}.ipynb</code>, written before "
                f"<code>tutorials/build.py</code> recorded how it ran a tutorial (full or smoke mode).")
    else:
        title, kind, style = "Shown without outputs", "none", "note"
        why = (f"Running it in smoke mode failed during this build: <code>{html.escape(_first_line(tutorial.problem))}"
               f"</code>." if tutorial.problem else
               f"This page was built without running the tutorial (<code>{EXECUTE_ENV}=0</code>).")
        body = f"{why} {full_run} Without <code>{EXECUTE_ENV}</code>, <code>mkdocs build</code> runs it in smoke mode."
    return (f'<div class="admonition {style} ctxkit-outputs ctxkit-outputs-{kind}">\n'
            f'<p class="admonition-title">{title}</p>\n<p>{body}</p>\n</div>')


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    error = next((ln for ln in reversed(lines) if re.match(r"^\w*(Error|Exception)\b", ln)), None)
    return (error or (lines[0] if lines else "unknown error"))[:300]


def _after_title(notebook) -> int:
    """Index after the title cell (the first markdown cell), where the note goes."""
    return 1 if notebook.cells and notebook.cells[0].cell_type == "markdown" else 0


def _tutorial_list() -> str:
    tutorials: List[Tutorial] = _state["tutorials"]
    if not tutorials:
        return "*No tutorials yet: `tutorials/NN_slug.py` files appear here as they are written.*"
    labels = {"none": "code only (not run for this build)", "full": "outputs of a full run",
              "smoke": "outputs of a smoke run (small settings)", "unrecorded": "outputs of `tutorials/build.py`"}
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
