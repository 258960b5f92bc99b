"""The micro-batcher of ``ctxkit serve``: concurrent requests merged into one model call.

Requests that arrive within ``max_wait_ms`` of each other are merged (up to ``max_batch``
items) and run as one call of the endpoint's batch function on the model thread; a failing
batch is retried request by request, so one bad request never fails the others. A stepwise
function (``/embed``'s windows) runs one part per job, so other endpoints' batches run
between its parts. Also the server's structured log line (:func:`log_event`).
"""

import asyncio
import collections
import contextlib
import json
import logging
import math
import time
from typing import Any, Callable, List, Optional

from ..core.errors import UserError
from .serve_limits import QueueFull

__all__ = ["MicroBatcher", "ShuttingDown", "log_event"]

log = logging.getLogger("ctxkit.serve")


def log_event(event: str, **fields: Any) -> None:
    """Emit one structured log line: a JSON object with ``event`` and ``fields``."""
    if log.isEnabledFor(logging.INFO):
        log.info(json.dumps({"event": event, "time": round(time.time(), 3), **fields}, ensure_ascii=False))


class ShuttingDown(RuntimeError):
    """The batcher no longer takes work (server stopping, or not started)."""


_Job = collections.namedtuple("_Job", "items future arrived")  # one request in a batcher's queue


class MicroBatcher:
    """Merges concurrent requests into batches for one model function.

    A request's items never split across batches; a request larger than ``max_batch``
    runs alone. The batch function runs on ``executor`` so the event loop keeps accepting
    and validating requests while the model computes.

    Args:
        name: endpoint name, for logs and stats.
        fn: ``fn(items) -> outputs``, one output per item, in order.
        executor: where ``fn`` runs (one thread: torch parallelises each call itself).
        max_batch: most items per call of ``fn``.
        max_wait_ms: how long the oldest queued request may wait for company.
        max_queue: most items waiting (not counting the batch being computed); a request
            that would go over is refused with :class:`QueueFull`, unless the queue is
            empty (a request larger than the limit is never refused for ever). None: no limit.
        stepwise: ``fn(items)`` is a generator that does a bounded part of the work per
            ``next()`` and returns the outputs; each part runs as its own job on ``executor``,
            so other batchers' jobs on the same executor run between them (``/embed``'s
            windows: one request's long texts never hold the model thread for long).
    """

    def __init__(self, name: str, fn: Callable[[list], list], executor, max_batch: int = 32, max_wait_ms: float = 5.0,
                 max_queue: Optional[int] = None, stepwise: bool = False):
        if max_batch < 1 or max_wait_ms < 0 or (max_queue is not None and max_queue < 1):
            raise UserError(f"max_batch and max_queue must be >= 1 and max_wait_ms >= 0, got {max_batch}, {max_queue}, {max_wait_ms}")
        self.name, self.fn, self.executor, self.stepwise = name, fn, executor, stepwise
        self.max_batch, self.max_wait, self.max_queue = max_batch, max_wait_ms / 1000.0, max_queue
        self._pending: collections.deque = collections.deque()
        self._wakeup = asyncio.Event()
        self._task: Optional[asyncio.Task] = None
        self._closing = False
        self._batch_s = 0.0  # moving average of a batch's compute time, for Retry-After
        self.stats = {"requests": 0, "items": 0, "batches": 0, "largest_batch": 0, "queued": 0, "rejected": 0}

    def start(self) -> None:
        """Start the worker on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"batcher-{self.name}")

    async def close(self) -> None:
        """Stop taking requests, run everything already queued, then stop."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task

    async def submit(self, items: list) -> list:
        """Queue ``items`` (one request) and wait for their outputs.

        Raises:
            ShuttingDown: the batcher is closing or was never started.
            QueueFull: ``max_queue`` items are waiting already.
            Exception: whatever ``fn`` raised on this request's items.
        """
        if self._closing or self._task is None:
            raise ShuttingDown("the server is shutting down")
        queued = self.stats["queued"]
        if self.max_queue is not None and queued and queued + len(items) > self.max_queue:
            self.stats["rejected"] += 1
            # The queue drains one batch per forward pass, plus the pass in progress.
            retry_after = max(1, math.ceil((queued / self.max_batch + 1) * self._batch_s))
            raise QueueFull(self.name, queued, self.max_queue, retry_after)
        job = _Job(items, asyncio.get_running_loop().create_future(), time.perf_counter())
        self._pending.append(job)
        self.stats["queued"] += len(items)
        self._wakeup.set()
        return await job.future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
            # The wait counts from the oldest request's arrival: one that queued during
            # the previous forward pass has already waited and goes at once.
            deadline = self._pending[0].arrived + self.max_wait
            while self.stats["queued"] < self.max_batch and not self._closing:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
            batch = [self._pending.popleft()]
            size = len(batch[0].items)
            while self._pending and size + len(self._pending[0].items) <= self.max_batch:
                batch.append(self._pending.popleft())
                size += len(batch[-1].items)
            self.stats["queued"] -= size
            await self._run_batch(loop, batch, size)

    async def _steps(self, loop, batch: List[_Job], items: list) -> Optional[list]:
        """Drive a stepwise ``fn``: each ``next()`` a job of its own on the executor; None if
        every request of the batch was cancelled (a client gone) before the work ended."""
        steps = self.fn(items)  # a generator: nothing runs until its first next()
        try:
            while True:
                done, value = await loop.run_in_executor(self.executor, _step, steps)
                if done:
                    return value
                if all(job.future.done() for job in batch):
                    return None
        finally:
            # Between parts the generator is idle; if this task was cancelled during a part, the
            # part is still running (ValueError) and the generator is closed when collected.
            with contextlib.suppress(ValueError):
                steps.close()

    async def _run_batch(self, loop, batch: List[_Job], size: int) -> None:
        started = time.perf_counter()
        items = [item for job in batch for item in job.items]
        try:
            outputs = await (self._steps(loop, batch, items) if self.stepwise else loop.run_in_executor(self.executor, self.fn, items))
            if outputs is None:  # every request of the batch went away: its remaining work was dropped
                return
            if len(outputs) != len(items):
                raise RuntimeError(f"{self.name}: {len(outputs)} outputs for {len(items)} inputs")
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # BaseException: a Rust tokenizer's panic is one
            if len(batch) == 1:
                if not batch[0].future.done():  # done: the request was cancelled
                    batch[0].future.set_exception(err)
            else:
                # One bad request must not fail the others merged with it: retry alone.
                for job in batch:
                    await self._run_batch(loop, [job], len(job.items))
                return
        else:
            at = 0
            for job in batch:
                if not job.future.done():
                    job.future.set_result(outputs[at:at + len(job.items)])
                at += len(job.items)
        for key, value in (("requests", len(batch)), ("items", size), ("batches", 1)):
            self.stats[key] += value
        self.stats["largest_batch"] = max(self.stats["largest_batch"], size)
        compute_s = time.perf_counter() - started
        self._batch_s = compute_s if self.stats["batches"] == 1 else 0.8 * self._batch_s + 0.2 * compute_s
        log_event("batch", endpoint=self.name, requests=len(batch), batch_size=size,
                  compute_ms=round(compute_s * 1000, 2), queue_ms=round((started - batch[0].arrived) * 1000, 2))


def _step(steps) -> tuple:
    """``(True, result)`` when ``steps`` is exhausted, else ``(False, None)`` after one part:
    StopIteration cannot travel through a future."""
    try:
        next(steps)
    except StopIteration as finished:
        return True, finished.value
    return False, None
