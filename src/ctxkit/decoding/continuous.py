"""Continuous batching: requests join and leave a running batch at every decoding step.

A server that decodes one request at a time leaves the accelerator idle between tiny
matrix-vector products; one that batches whole requests makes the short ones wait for the
longest. Continuous batching (Orca; vLLM, text-generation-inference) keeps a fixed number
of *slots*, each holding one request's KV cache row, and runs one step for all of them:

1. **admit**: a waiting request takes a free slot; its prompt runs alone (the *prefill*,
   exactly :func:`~ctxkit.decoding.generate`'s prompt pass), its first token is chosen
   and its keys and values are copied into the slot's row;
2. **step**: every occupied slot advances one token in one forward pass over a static
   KV cache (fixed shapes: a key mask says which columns each row may see);
3. **leave**: a request that ended (its token budget, end-of-text, a stop string, or a
   client that went away) frees its slot at once, for the next admit.

The cache's columns are a ring: each step writes one column for every row at the same
index, and a request's columns (prompt, then one per new token) are the ring positions
before its current one. A request never holds more columns than the ring has, so its own
columns are never overwritten; attention over a set of columns does not depend on their
order (positions were added to the embeddings before the cache).

Every request gets its own random generator, and tokens are chosen per row with
:func:`~ctxkit.decoding.sampling.next_tokens`, the plain loop's own choice: a request
draws the same tokens whatever else shares the batch, and (greedy, or with the same seed)
the tokens ``generate`` draws for it alone.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Deque, List, Optional

import torch
from torch import Tensor

from .generate import GenerationConfig
from .sampling import next_tokens
from ..core.errors import UserError

__all__ = ["BatcherFailed", "ContinuousBatcher", "Request", "QueueFull"]

logger = logging.getLogger("ctxkit")


class BatcherFailed(RuntimeError):
    """The decoding thread stopped on an error: no request can be served any more."""


class QueueFull(RuntimeError):
    """More requests are waiting than the batcher takes; ``retry_after`` is a hint in seconds."""

    def __init__(self, waiting: int, retry_after: int):
        super().__init__(f"{waiting} requests are waiting for a slot; try again in {retry_after} s")
        self.retry_after = retry_after


@dataclass(eq=False)
class Request:
    """One generation in the batcher.

    Attributes:
        prompt: the prompt's token ids (at least one).
        config: how to choose tokens (``max_new_tokens``, sampling, ``eos_token_id``).
        emit: called on the batcher's thread with each new token id, then once with
            ``(None, reason)`` when the request ends: ``"length"``, ``"eos"``, ``"stop"``
            (the caller's ``stop`` said so) or ``"cancelled"``.
        stop: called with each new token id; True ends the request after that token (e.g.
            a stop string seen in the text).
        generator: this request's random numbers (seeded: reproducible).
    """

    prompt: List[int]
    config: GenerationConfig
    emit: Callable[[Optional[int], Optional[str]], None]
    stop: Optional[Callable[[int], bool]] = None
    generator: Optional[torch.Generator] = None
    id: int = field(default_factory=itertools.count().__next__)
    tokens: List[int] = field(default_factory=list)  # generated so far
    slot: int = -1
    cancelled: bool = False


class ContinuousBatcher:
    """Decode many requests at once over ``slots`` KV-cache rows (see the module docstring).

    Args:
        model: a causal LM with ``new_cache`` and a static-cache step (GPT-2), in eval mode.
        slots: requests decoded together at most.
        max_len: cache columns per row: the longest prompt + new tokens of one request
            (default and upper bound: the model's context).
        max_waiting: requests waiting for a slot at most; more raise :class:`QueueFull`.

    Use :meth:`submit` from any thread and :meth:`run` on one thread (or :meth:`step`
    in a loop of your own).
    """

    def __init__(self, model, slots: int = 16, max_len: Optional[int] = None, max_waiting: int = 256):
        if not getattr(model, "supports_static_cache", False):
            raise UserError(f"{type(model).__name__} cannot be served with continuous batching (no static-cache step)")
        if slots < 1 or max_waiting < 1:
            raise UserError(f"slots and max_waiting must be >= 1, got {slots} and {max_waiting}")
        self.model = model
        context = model.config.max_position
        self.max_len = min(max_len or context, context)
        self.slots = slots
        self.max_waiting = max_waiting
        self.device = next(model.parameters()).device
        self.cache = model.new_cache(slots, self.max_len)
        self.column = 0  # the ring column the next step writes (host copy of the cache's index)
        self._write = torch.zeros(1, dtype=torch.long, device=self.device)
        self.cache.set_static(self._write)
        self.key_mask = torch.zeros(slots, self.max_len, dtype=torch.long, device=self.device)
        self.last = torch.zeros(slots, 1, dtype=torch.long, device=self.device)  # each row's newest token
        self.position = torch.zeros(slots, 1, dtype=torch.long, device=self.device)
        self.active: List[Optional[Request]] = [None] * slots
        self.waiting: Deque[Request] = collections.deque()
        self._wake = threading.Condition()
        self._closed = False
        self.failed: Optional[str] = None  # why the decoding thread stopped, when it did
        self.stats = {"admitted": 0, "finished": 0, "cancelled": 0, "steps": 0, "rows_stepped": 0, "rows_active": 0}

    # -- any thread ---------------------------------------------------------------------------

    def submit(self, request: Request) -> Request:
        """Queue ``request``; its tokens arrive through ``request.emit``.

        Raises:
            UserError: an empty prompt, or prompt + ``max_new_tokens`` beyond ``max_len``.
            QueueFull: ``max_waiting`` requests are waiting already.
        """
        request.config.check()
        need = len(request.prompt) + request.config.max_new_tokens
        if not request.prompt:
            raise UserError("the prompt has no tokens")
        if need > self.max_len:
            raise UserError(f"prompt ({len(request.prompt)} tokens) + max_new_tokens ({request.config.max_new_tokens}) "
                            f"= {need} exceeds the context of {self.max_len} tokens")
        with self._wake:
            if self.failed is not None:
                raise BatcherFailed(f"the decoding thread stopped on an error: {self.failed}")
            if self._closed:
                raise UserError("the batcher is closed")
            if len(self.waiting) >= self.max_waiting:
                busy = sum(r is not None for r in self.active)
                raise QueueFull(len(self.waiting), max(1, round(len(self.waiting) / max(busy, 1))))
            self.waiting.append(request)
            self._wake.notify()
        return request

    def cancel(self, request: Request) -> None:
        """End ``request`` at the next step (e.g. its client went away); its slot is freed."""
        request.cancelled = True
        with self._wake:
            self._wake.notify()

    def close(self) -> None:
        """Stop :meth:`run` after the current step; requests still queued or running are cancelled."""
        with self._wake:
            self._closed = True
            self._wake.notify()

    @property
    def busy(self) -> int:
        """Requests holding a slot."""
        return sum(r is not None for r in self.active)

    # -- the decoding thread ------------------------------------------------------------------

    def run(self) -> None:
        """Admit and step until :meth:`close`; sleeps while there is nothing to do. An error
        in a step ends every running and waiting request with ``"error"`` and sets
        :attr:`failed` (later submits raise :class:`BatcherFailed`), instead of leaving them
        waiting for a thread that is gone."""
        while True:
            with self._wake:
                while not self._closed and not self.waiting and not any(self.active):
                    self._wake.wait()
                if self._closed:
                    break
            try:
                self.step()
            except Exception as err:  # noqa: BLE001 - reported to every request and to /health
                self.failed = f"{type(err).__name__}: {err}"
                logger.error("the decoding thread stopped: %s", self.failed)
                break
        reason = "cancelled" if self.failed is None else "error"
        with self._wake:
            pending = [*self.active, *self.waiting]
        for request in pending:
            if request is not None:
                request.emit(None, reason)
        self.active, self.waiting = [None] * self.slots, collections.deque()

    @torch.inference_mode()
    def step(self) -> bool:
        """Free cancelled slots, admit waiting requests, advance every occupied slot one token.

        Returns:
            False when there was nothing to do.
        """
        for request in [r for r in self.active if r is not None and r.cancelled]:
            self._finish(request, "cancelled")
        while None in self.active:
            with self._wake:
                request = self.waiting.popleft() if self.waiting else None
            if request is None:
                break
            if request.cancelled:
                request.emit(None, "cancelled")
                self.stats["cancelled"] += 1
                continue
            self._admit(request, self.active.index(None))
        rows = [r for r in self.active if r is not None]
        if not rows:
            return False
        # Only the rows up to the highest occupied slot run, rounded up to a power of two (few
        # shapes: a CUDA graph each, later): a request admitted takes the lowest free slot,
        # so a half-empty server steps about half the rows.
        width = 1
        while width < rows[-1].slot + 1:
            width *= 2
        width = min(width, self.slots)
        col = self.column
        self.key_mask[:width, col] = 1  # each row's new key (a free row sees it alone: no empty softmax)
        logits = self.model(self.last[:width], cache=self.cache.first_rows(width), attention_mask=self.key_mask[:width],
                            position_ids=self.position[:width])[:, -1].float()
        self.column = (col + 1) % self.max_len
        self._write.fill_(self.column)  # the model advanced it by one; the ring wraps here
        self.position[:width] += 1
        # A free row advances too: capped, or after a context's worth of steps free its position
        # would index past the position table (an IndexError here, a device assert on a GPU).
        # Occupied rows stay below the cap (prompt + new tokens <= max_len <= the context).
        self.position.clamp_(max=self.model.config.max_position - 1)
        self.stats["steps"] += 1
        self.stats["rows_stepped"] += width  # computed (occupied or not)
        self.stats["rows_active"] += len(rows)
        # Every row's token chosen on the device, then one read-back for the step (not one per row).
        chosen = torch.cat([self._choose(r, logits[r.slot : r.slot + 1]) for r in rows])
        self.last[torch.tensor([r.slot for r in rows], device=self.device), 0] = chosen
        for request, token in zip(rows, chosen.tolist()):
            self._take(request, token)
        return True

    def _admit(self, request: Request, slot: int) -> None:
        """The prompt's pass alone (as ``generate`` runs it), its first token, its keys and
        values copied into ``slot``'s ring columns just before the current one."""
        n = len(request.prompt)
        ids = torch.tensor([request.prompt], device=self.device)
        own = self.model.new_cache(1, n)
        logits = self.model(ids, cache=own, attention_mask=None, position_ids=torch.arange(n, device=self.device)[None])[:, -1].float()
        cols = torch.arange(self.column - n, self.column, device=self.device) % self.max_len
        for ring, alone in zip(self.cache.kv, own.kv):  # (2, batch, heads, columns, head_dim) per layer
            ring[:, slot, :, cols] = alone[:, 0, :, :n]
        self.key_mask[slot] = 0
        self.key_mask[slot, cols] = 1
        self.position[slot] = n
        request.slot = slot
        self.active[slot] = request
        self.stats["admitted"] += 1
        token = int(self._choose(request, logits)[0])
        self.last[slot, 0] = token
        self._take(request, token)

    def _choose(self, request: Request, logits: Tensor) -> Tensor:
        """``request``'s next token ``(1,)`` (on the device) from its logits ``(1, vocab)``,
        drawn from its own generator."""
        seen = torch.tensor([request.prompt + request.tokens], device=self.device) \
            if request.config.repetition_penalty != 1.0 else None
        return next_tokens(logits, seen, request.config, request.generator)

    def _take(self, request: Request, token: int) -> None:
        """Hand ``token`` out (its row's input for the next step is set already) and end the
        request if it is done."""
        request.tokens.append(token)
        eos = request.config.eos_token_id is not None and token == request.config.eos_token_id
        if not eos:
            request.emit(token, None)
        reason = "eos" if eos else "stop" if request.stop is not None and request.stop(token) else \
            "length" if len(request.tokens) >= request.config.max_new_tokens else None
        if reason is not None:
            self._finish(request, reason)

    def _finish(self, request: Request, reason: str) -> None:
        self.active[request.slot] = None
        self.key_mask[request.slot] = 0
        self.stats["cancelled" if reason == "cancelled" else "finished"] += 1
        request.emit(None, reason)
