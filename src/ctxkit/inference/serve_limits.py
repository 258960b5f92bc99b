"""What keeps ``ctxkit serve`` fast and honest under load: its torch thread count, its
bounded request queue, its body-size limit, the refusal of texts the tokenizer
reduces to nothing, answers that say nothing about the host's paths, and a log that
sums up bursts of the same event instead of writing a line each.

Threads: on a CPU, the forward passes share the cores with the event loop (HTTP parsing,
JSON, validation), the tokenizer, and often the clients and other jobs. PyTorch's intra-op
pool is OpenMP: each parallel region ends at a barrier where every thread waits for the
slowest, so when anything else takes a core from one of them, the others spin until it
gets the core back. On 2 cores (benchmarks/serve_load.py, docs/serving.md), 2 torch threads
served no more requests than 1 with the machine otherwise idle, burning 1.6 cores instead
of 1.0, and with two busy processes beside the server they served 37 requests/s against
87 (p99 2.4 s against 0.6 s). :func:`choose_threads` therefore leaves one core to the rest.

torch's thread count is per OS thread once that thread has run a parallel op, so the
server sets it on its model thread (:func:`set_model_thread`), not only where it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple

import torch

from ..core.errors import UserError

__all__ = ["BurstLog", "PathRedactor", "QueueFull", "RequestGuard", "TokenCheck", "at_least_one", "available_cores", "choose_threads",
           "positive_seconds", "public_name", "set_model_thread", "torch_threads"]

SERVE_NEEDS = ("fastapi", "uvicorn", "httptools", "pydantic", "starlette", "fastapi_offline")  # the `serve` extra, imported directly


def available_cores() -> int:
    """CPU cores this process may run on: its affinity mask, capped by a cgroup CPU quota.

    ``os.cpu_count()`` counts the machine's cores, not the ones a container or ``taskset``
    grants; sizing a thread pool by it oversubscribes exactly where cores are scarce.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    try:  # cgroup v2: "max 100000" (no quota) or "<quota> <period>" in microseconds
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        if quota != "max" and int(period) > 0:
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def _positive(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{what} must be an integer >= 1, got {value!r}")
    return value


def choose_threads(threads: Optional[int] = None, environ: Optional[Mapping[str, str]] = None,
                   cores: Optional[int] = None) -> Tuple[int, str]:
    """The model thread's torch intra-op thread count, and where it comes from.

    Args:
        threads: an explicit count (``--threads``); wins over everything else.
        environ: the environment (default ``os.environ``); a set ``OMP_NUM_THREADS`` is
            obeyed as the user's choice, even above the core count.
        cores: cores available (default :func:`available_cores`).

    Returns:
        ``(n, source)``, source being ``"--threads"``, ``"OMP_NUM_THREADS"`` or ``"auto"``:
        one thread per available core but one, which is left to the event loop,
        tokenization and the clients on the same machine (at least 1).

    Raises:
        UserError: ``threads`` or ``OMP_NUM_THREADS`` is not an integer >= 1.
    """
    if threads is not None:
        return _positive(threads, "--threads"), "--threads"
    environ = os.environ if environ is None else environ
    omp = environ.get("OMP_NUM_THREADS", "").strip()
    if omp:
        first = omp.split(",")[0].strip()  # OpenMP allows a list, one count per nesting level
        if not first.isdigit() or int(first) < 1:
            raise UserError(f"OMP_NUM_THREADS must be an integer >= 1, got {omp!r}; unset it or pass --threads")
        return int(first), "OMP_NUM_THREADS"
    cores = available_cores() if cores is None else cores
    return max(1, cores - 1), "auto"


def set_model_thread(threads: int) -> None:
    """Set the calling thread's torch intra-op threads (a ThreadPoolExecutor initializer)."""

    torch.set_num_threads(threads)


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """The calling thread on ``threads`` torch threads, restored afterwards.

    ONNX Runtime sessions take their intra-op thread count from torch's when they are
    created (:mod:`ctxkit.tasks.ort_model`): loading a run inside this block sizes them.
    """

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class QueueFull(RuntimeError):
    """A batcher's queue holds ``limit`` items already: the request is refused (429).

    Attributes:
        endpoint: the batcher's name.
        queued: items waiting when the request came.
        limit: ``--max-queue``.
        retry_after: whole seconds the queue needs to drain, by the recent batch times (>= 1).
    """

    def __init__(self, endpoint: str, queued: int, limit: int, retry_after: int):
        self.endpoint, self.queued, self.limit, self.retry_after = endpoint, queued, limit, retry_after
        super().__init__(f"the /{endpoint} queue is full ({queued} texts waiting, limit {limit}: --max-queue); "
                         f"retry in {retry_after} s")


class TokenCheck:
    """Whether a text gives the run's tokenizer any token besides [CLS]/[SEP].

    BERT's normalizer drops control and format characters (``"\\u0001"``, zero-width
    ``"\\u200b"``), and with accent stripping every combining mark (a lone ``"\\u0301"``):
    a text of only those reaches the model as ``[CLS] [SEP]`` and gets a prediction that
    means nothing. The tokenizer normalizes and splits character by character, so a text
    has a token exactly when one of its characters has one on its own; each character's
    answer is asked of the tokenizer once and remembered. A text is usually settled by its
    first character, so the check costs the event loop next to nothing.

    Args:
        tokenizer: the run's tokenizer (:class:`~ctxkit.tokenizers.WordPieceTokenizer`, or
            anything with ``encode(text, add_special_tokens=False)``).
        cache_size: most characters remembered (bounds memory under hostile input).
    """

    def __init__(self, tokenizer, cache_size: int = 65536):
        backend = getattr(tokenizer, "backend", None)
        if backend is not None and hasattr(backend, "to_str"):
            from tokenizers import Tokenizer

            # A private copy for the event loop's thread: the model thread switches
            # truncation on and off on the shared one while it encodes a batch.
            copy = Tokenizer.from_str(backend.to_str())
            copy.no_truncation()
            copy.no_padding()
            self._count: Callable[[str], int] = lambda text: len(copy.encode(text, add_special_tokens=False).ids)
        else:
            self._count = lambda text: len(_ids(tokenizer.encode(text, add_special_tokens=False)))
        self._kept: Dict[str, bool] = {}
        self._cache_size = cache_size

    def has_tokens(self, text: str) -> bool:
        """True if ``text`` tokenizes to at least one token (special tokens not counted)."""
        kept = self._kept
        for char in text:
            answer = kept.get(char)
            if answer is None:
                answer = self._count(char) > 0
                if len(kept) < self._cache_size:
                    kept[char] = answer
            if answer:
                return True
        return False


class RequestGuard:
    """ASGI middleware: the body-size limit (413) and one log event per request.

    Args:
        app: the ASGI app behind it.
        max_body_bytes: largest body passed on (--max-body-bytes).
        log_event: ``log_event("request", **fields)`` writes the request's log line.
    """

    def __init__(self, app, max_body_bytes: int, log_event: Callable[..., None]):
        self.app, self.max_body_bytes, self.log_event = app, max_body_bytes, log_event

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [0]

        async def send_logged(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        # Read the whole body first (it is bounded): an over-long one is drained, not
        # refused mid-upload, so the client can read the 413 instead of a reset.
        body, size, more = [], 0, True
        while more and size <= 16 * self.max_body_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
            if size <= self.max_body_bytes:
                body.append(message.get("body", b""))
        replay = [{"type": "http.request", "body": b"".join(body), "more_body": False}]

        async def receive_replayed():
            return replay.pop() if replay else await receive()

        try:
            if size > self.max_body_bytes:
                from starlette.responses import JSONResponse

                error = f"request body over {self.max_body_bytes} bytes (--max-body-bytes)"
                await JSONResponse({"error": error}, status_code=413)(scope, receive, send_logged)
            else:
                await self.app(scope, receive_replayed, send_logged)
        finally:
            self.log_event("request", method=scope["method"], path=scope["path"], status=status[0],
                      items=scope.get("ctxkit_items", 0), latency_ms=round((time.perf_counter() - started) * 1000, 2))


def _local_path(value) -> Optional[Path]:
    """``value`` as an absolute path if it names a place on this host (an absolute or
    ``~``/``.`` path, or an existing file or folder), else None (a Hub id, a zoo name)."""
    text = str(value)
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # "~someone" with no such user
        path = Path(text)
    if path.is_absolute() or text.startswith(("~", ".")) or path.exists():
        return path.resolve()
    return None


def public_name(value) -> Optional[str]:
    """What a client may see of a run or model reference: a folder's name, not its path.

    ``/home/me/runs/sst2`` gives ``sst2``; a Hub id (``org/name``) or a zoo name, which
    say nothing about the host, are kept as they are.
    """
    if value is None:
        return None
    local = _local_path(value)
    return str(value) if local is None else (local.name or str(value))


class PathRedactor:
    """Replaces this host's paths in messages sent to clients.

    An error raised deep in a task or a runtime may quote a file it read; the client gets
    the message with the run's folder as the run's name, the model's as the model's name,
    the home folder as ``~`` and the interpreter's and temporary folders as
    ``<python>``/``<tmp>``. The server's log keeps the full message.

    Args:
        run, model: the run and model references (paths, Hub ids or names; None: unknown).
    """

    def __init__(self, run=None, model=None):
        replacements: Dict[str, str] = {}
        for value in (run, model):
            local = None if value is None else _local_path(value)
            if local is not None:
                replacements[str(local)] = local.name or "<path>"
                if os.path.isabs(str(value)):  # as given, when it differs from the resolved path (a symlink)
                    replacements.setdefault(str(value).rstrip(os.sep), local.name or "<path>")
        for folder, label in ((sys.prefix, "<python>"), (sys.base_prefix, "<python>"), (tempfile.gettempdir(), "<tmp>"),
                              (str(Path.home()), "~")):
            if folder and len(folder) > 1:  # never "/" (a home of "/" in some containers)
                replacements.setdefault(folder, label)
        # Longest first: a run inside the home folder is named, not turned into "~/...".
        self._pairs = sorted(replacements.items(), key=lambda item: -len(item[0]))

    def __call__(self, text: str) -> str:
        """``text`` with every known host path replaced."""
        for path, label in self._pairs:
            if path in text:
                text = text.replace(path, label)
        return text


def positive_seconds(text: str) -> float:
    """argparse type of the timeouts: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


class BurstLog:
    """Log an event once when it starts happening and once, summed up, when it stops.

    Under attack the same event (a refused connection, an idle connection timing out, an
    accept failing for want of file descriptors) can come thousands of times a second;
    one line each would bury the log (and cost the event loop the writes).

    Args:
        log_event: ``log_event(event, **fields)``, the server's structured log line.
        quiet_s: a burst ends after this many seconds without its event.
    """

    def __init__(self, log_event: Callable[..., None], quiet_s: float = 2.0):
        self.log_event, self.quiet_s = log_event, quiet_s
        self._bursts: Dict[tuple, list] = {}  # (event, *fields) -> [count, first time, last time, timer]

    def note(self, event: str, **fields: Any) -> None:
        """Count one ``event``; the first of a burst is logged with ``fields``, which also
        tell bursts apart (``timeout`` of kind ``idle`` and of kind ``body``)."""
        key = (event, *sorted(fields.items()))
        now = time.monotonic()
        burst = self._bursts.get(key)
        if burst is not None:
            burst[0] += 1
            burst[2] = now
            return
        self.log_event(event, **fields)
        self._bursts[key] = [1, now, now, asyncio.get_running_loop().call_later(self.quiet_s, self._check, key)]

    def _check(self, key: tuple) -> None:
        burst = self._bursts[key]
        left = burst[2] + self.quiet_s - time.monotonic()
        if left > 0:  # still going: look again when it could have stopped
            burst[3] = asyncio.get_running_loop().call_later(left, self._check, key)
            return
        self._end(key)

    def _end(self, key: tuple) -> None:
        count, first, last, timer = self._bursts.pop(key)
        timer.cancel()
        if count > 1:
            self.log_event(key[0], **dict(key[1:]), burst_end=True, count=count, seconds=round(last - first, 2))

    def close(self) -> None:
        """Write the summaries of the bursts still open (the server is stopping)."""
        for key in list(self._bursts):
            self._end(key)


def _option(name: str, convert: Callable[[str], Any], ok: Callable[[Any], bool], what: str) -> Callable[[str], Any]:
    """An argparse type: ``convert(text)`` when ``ok`` says so, else argparse's one-line error."""

    def check(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):  # `not ok` also refuses nan
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    check.__name__ = check.__qualname__ = name
    check.__doc__ = f"argparse type: {what}."
    return check


#: --threads, --max-queue, --max-batch, --max-items, ...: an integer >= 1
at_least_one = _option("at_least_one", int, lambda v: v >= 1, "an integer >= 1")
#: --max-wait-ms: a number >= 0
non_negative = _option("non_negative", float, lambda v: v >= 0, "a number >= 0")
#: --port: 0 (any free port) to 65535
port_number = _option("port_number", int, lambda v: 0 <= v <= 65535, "a TCP port, 0 to 65535")


def _ids(encoding) -> list:
    for name in ("ids", "input_ids"):
        if hasattr(encoding, name):
            return list(getattr(encoding, name))
    return list(encoding)
