"""Continuous batching: requests join and leave a running batch at every decoding step.

A server that decodes one request at a time leaves the accelerator idle between tiny
matrix-vector products; one that batches whole requests makes the short ones wait for the
longest. Continuous batching (Orca; vLLM, text-generation-inference) keeps a fixed number
of *slots*, each holding one request's KV cache row, and runs one step for all of them:

1. **prefill**: a waiting request's prompt runs alone through a cache of its own, exactly
   :func:`~ctxkit.decoding.generate`'s prompt pass, but in *chunks* of at most
   ``prefill_chunk`` tokens per step while other requests are decoding (a 512-token prompt
   would otherwise stall every running row for its whole length); when its last chunk has
   run, its first token is chosen and its keys and values are copied into the lowest free
   slot's row;
2. **step**: every occupied slot advances one token in one forward pass over a static
   KV cache (fixed shapes: a key mask says which columns each row may see);
3. **leave**: a request that ended (its token budget, end-of-text, a stop string, or a
   client that went away) frees its slot at once, for the next prefill.

The cache's columns are a ring: each step writes one column for every row at the same
index, and a request's columns (prompt, then one per new token) are the ring positions
before its current one. A request never holds more columns than the ring has, so its own
columns are never overwritten; attention over a set of columns does not depend on their
order (positions were added to the embeddings before the cache).

A step runs only the rows up to the highest occupied slot, rounded up to a power of two
(:func:`bucket_width`; a request takes the lowest free slot), so a half-empty server steps
about half the rows. With the plan's ``graphs`` on a GPU, each of those widths is one CUDA
graph, captured when the batcher is built (:meth:`ContinuousBatcher.capture`): the step
reads and writes only buffers that live as long as the batcher, so a replay is the step.

Every request gets its own random generator. A step's tokens are chosen together by
:func:`~ctxkit.decoding.sampling.choose_rows` (one batched penalty/temperature/top-k/top-p/
softmax per group of rows sharing a config, one argmax for the greedy rows, one draw per
sampled row from its own generator), row for row what the plain loop's
:func:`~ctxkit.decoding.sampling.next_tokens` chooses: a request draws the same tokens
whatever else shares the batch, and (greedy, or with the same seed) the tokens
``generate`` draws for it alone. The step's tokens are read back once, and ``on_step``
(a server's flush) runs once per step, after all of its tokens were emitted.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Deque, List, Optional, Union

import torch
from torch import Tensor

from .generate import GenerationConfig
from .sampling import choose_rows
from ..core.errors import UserError
from ..core.capabilities import StaticCacheDecoder, declares
from ..fast import FastPlan, GraphCache, capture_graph, fuse_qkv, prepare_inference, resolve, varying_shape_attention

__all__ = ["BatcherFailed", "ContinuousBatcher", "Request", "QueueFull", "bucket_width", "bucket_widths", "graphs_wanted"]

logger = logging.getLogger("ctxkit")

#: prompt tokens prefilled per step while other requests decode (``ctxkit serve --prefill-chunk``)
PREFILL_CHUNK = 256
_PRECISIONS = {torch.bfloat16: "bf16", torch.float16: "fp16"}  # a parameter dtype -> the plan's precision word


def bucket_width(rows: int, slots: int) -> int:
    """The batch width a step runs for the first ``rows`` slots: the next power of two,
    at most ``slots`` (few widths: one CUDA graph each)."""
    width = 1
    while width < rows:
        width *= 2
    return min(width, slots)


def bucket_widths(slots: int) -> List[int]:
    """Every width :func:`bucket_width` gives for ``slots`` slots, ascending (1, 2, 4, ...,
    ``slots``): the graphs a batcher captures."""
    return sorted({bucket_width(rows, slots) for rows in range(1, slots + 1)})


def graphs_wanted(plan: FastPlan, device: torch.device) -> bool:
    """Whether the decoding step is replayed from CUDA graphs: the plan's ``graphs``, on a
    CUDA device only (elsewhere the same step runs eagerly)."""
    return bool(plan.cuda_graphs) and torch.device(device).type == "cuda"


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
        prefilled: prompt tokens run so far (the prefill goes chunk by chunk).
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
    prefilled: int = 0


class ContinuousBatcher:
    """Decode many requests at once over ``slots`` KV-cache rows (see the module docstring).

    Args:
        model: a causal LM with ``new_cache`` and a static-cache step (GPT-2), in eval mode,
            in the dtype it should run in (the server casts it: bf16 on a GPU).
        slots: requests decoded together at most.
        max_len: cache columns per row: the longest prompt + new tokens of one request
            (default and upper bound: the model's context).
        max_waiting: requests waiting for a slot at most; more raise :class:`QueueFull`.
        prefill_chunk: prompt tokens run per step while other requests decode (one chunk
            of one prompt, or the ends of several short ones); None: whole prompts. With
            nothing decoding, a prompt runs whole (it stalls no one).
        plan: the fast plan (:class:`~ctxkit.fast.FastPlan` or its string), resolved for
            ``decode`` on the model's device: ``qkv`` fuses the projections (as ``generate``
            does), ``graphs`` captures one CUDA graph per batch width (CUDA only). The
            batcher neither compiles its step nor runs the one-row decoding kernels: those
            options are dropped with a note (:attr:`plan` says what runs).

        on_step: called on the decoding thread by :meth:`run` after every step (and once
            after the last emits when it stops): a server hands the step's tokens, emitted
            one by one, to its event loop in one wake-up instead of one per token.

    Use :meth:`submit` from any thread and :meth:`run` on one thread (or :meth:`step`
    in a loop of your own).
    """

    def __init__(self, model, slots: int = 16, max_len: Optional[int] = None, max_waiting: int = 256,
                 prefill_chunk: Optional[int] = PREFILL_CHUNK, plan: Union[str, FastPlan, None] = "auto",
                 on_step: Optional[Callable[[], None]] = None):
        if not declares(model, StaticCacheDecoder):
            raise UserError(f"{type(model).__name__} cannot be served with continuous batching (no static-cache step)")
        if slots < 1 or max_waiting < 1:
            raise UserError(f"slots and max_waiting must be >= 1, got {slots} and {max_waiting}")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise UserError(f"prefill_chunk must be >= 1 (or None: whole prompts), got {prefill_chunk}")
        self.model = model
        context = model.config.max_position
        self.max_len = min(max_len or context, context)
        self.slots = slots
        self.max_waiting = max_waiting
        self.prefill_chunk = prefill_chunk
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        self.plan = self._narrowed(resolve(plan, use="decode", device=self.device, precision=_PRECISIONS.get(param.dtype, "fp32")))
        if self.plan.fused_qkv:
            fuse_qkv(model)  # q/k/v in one GEMM, as generate applies it: both compute the same logits
        self.cache = model.new_cache(slots, self.max_len)
        self.column = 0  # the ring column the next step writes (host copy of the cache's index)
        self._write = torch.zeros(1, dtype=torch.long, device=self.device)
        self.cache.set_static(self._write)
        self.key_mask = torch.zeros(slots, self.max_len, dtype=torch.long, device=self.device)
        self.last = torch.zeros(slots, 1, dtype=torch.long, device=self.device)  # each row's newest token
        self.position = torch.zeros(slots, 1, dtype=torch.long, device=self.device)
        self.active: List[Optional[Request]] = [None] * slots
        self.waiting: Deque[Request] = collections.deque()
        self._filling: Optional[Request] = None  # the request whose prompt is being prefilled
        self._own = None  # its KV cache (one row, the prompt's length)
        self._wake = threading.Condition()
        self._closed = False
        self.failed: Optional[str] = None  # why the decoding thread stopped, when it did
        self.on_step = on_step
        self._slot_index: dict = {}  # the step's occupied slots (a tuple) -> that index on the device
        self.stats = {"admitted": 0, "finished": 0, "cancelled": 0, "steps": 0, "rows_stepped": 0, "rows_active": 0,
                      "prefill_chunks": 0, "prefill_tokens": 0}
        self.graphs: Optional[GraphCache] = None  # batch width -> (CUDA graph, its logits)
        if graphs_wanted(self.plan, self.device):
            self.capture()

    @staticmethod
    def _narrowed(plan: FastPlan) -> FastPlan:
        """``plan`` less what the batcher does not run (said in its notes)."""
        plan = plan.without("rows", "one-row products are for compiled one-row static decoding")
        plan = plan.without("compile", "the batcher's step is not compiled")
        return plan.without("decodelayers", "the Triton decoding layers are for one-row static decoding")

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
                raise QueueFull(len(self.waiting), max(1, round(len(self.waiting) / max(self.busy, 1))))
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
        """Requests holding a slot (decoding, or their prompt being prefilled)."""
        return sum(r is not None for r in self.active) + (self._filling is not None)

    # -- the decoding thread ------------------------------------------------------------------

    def run(self) -> None:
        """Admit and step until :meth:`close`; sleeps while there is nothing to do. An error
        in a step ends every running and waiting request with ``"error"`` and sets
        :attr:`failed` (later submits raise :class:`BatcherFailed`), instead of leaving them
        waiting for a thread that is gone."""
        # The current CUDA device is per thread: this one's must be the model's (graph replays).
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            while True:
                with self._wake:
                    while not self._closed and not self.waiting and self._filling is None and not any(self.active):
                        self._wake.wait()
                    if self._closed:
                        break
                try:
                    self.step()
                except Exception as err:  # noqa: BLE001 - reported to every request and to /health
                    self.failed = f"{type(err).__name__}: {err}"
                    logger.error("the decoding thread stopped: %s", self.failed)
                    break
                if self.on_step is not None:
                    self.on_step()
        reason = "cancelled" if self.failed is None else "error"
        with self._wake:
            pending = [*self.active, self._filling, *self.waiting]
        for request in pending:
            if request is not None:
                request.emit(None, reason)
        if self.on_step is not None:  # the last emits (and a failed step's) go out too
            self.on_step()
        self.active, self.waiting, self._filling, self._own = [None] * self.slots, collections.deque(), None, None

    @torch.inference_mode()
    def step(self) -> bool:
        """Free cancelled slots, prefill up to ``prefill_chunk`` prompt tokens, advance every
        occupied slot one token.

        Returns:
            False when there was nothing to do.
        """
        for request in [r for r in self.active if r is not None and r.cancelled]:
            self._finish(request, "cancelled")
        if self._filling is not None and self._filling.cancelled:
            self._drop_filling()
        prefilled = self._prefill()
        rows = [r for r in self.active if r is not None]
        if not rows:
            return prefilled
        width = bucket_width(rows[-1].slot + 1, self.slots)
        if self.graphs is not None:
            graph, logits = self.graphs.get(width)
            graph.replay()
        else:
            logits = self._decode(width)
        self.column = (self.column + 1) % self.max_len  # the step advanced (and wrapped) _write alike
        self.stats["steps"] += 1
        self.stats["rows_stepped"] += width  # computed (occupied or not)
        self.stats["rows_active"] += len(rows)
        # Every row's token chosen on the device in a few batched ops (not ~6 per row: each is
        # a launch, and gives up the GIL), then one read-back for the step (not one per row).
        slots = tuple(r.slot for r in rows)
        index = self._slot_index.get(slots)
        if index is None:  # the occupied slots change only when a request joins or leaves
            if len(self._slot_index) > 4 * self.slots:
                self._slot_index.clear()
            index = self._slot_index[slots] = torch.tensor(slots, device=self.device)
        # Slots 0..n-1 busy (the usual case: requests take the lowest free slot): a view, no gather.
        mine = logits[: len(rows)] if slots[-1] == len(rows) - 1 else logits.index_select(0, index)
        chosen = self._choose(rows, mine)
        self.last[index, 0] = chosen
        for request, token in zip(rows, chosen.tolist()):
            self._take(request, token)
        return True

    def _decode(self, width: int) -> Tensor:
        """One decoding step of rows ``0..width-1``: each row's newest token in, its next
        logits ``(width, vocab)`` float32 out. It reads and writes only the batcher's own
        buffers (the ring through a view, the key mask, the write index, the positions), so
        a CUDA graph of it replays the step; the host adds nothing but the tokens."""
        self.key_mask[:width].index_fill_(1, self._write, 1)  # each row's new key (a free row sees it alone: no empty softmax)
        logits = self.model(self.last[:width], cache=self.cache.first_rows(width), attention_mask=self.key_mask[:width],
                            position_ids=self.position[:width])[:, -1].float()
        self._write.remainder_(self.max_len)  # the model advanced it by one; the ring wraps here
        # A free row advances too: capped, or after a context's worth of steps free its position
        # would index past the position table (an IndexError here, a device assert on a GPU).
        # Occupied rows stay below the cap (prompt + new tokens <= max_len <= the context).
        self.position[:width].add_(1).clamp_(max=self.model.config.max_position - 1)
        return logits

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one CUDA graph of :meth:`_decode` per width of :func:`bucket_widths`, through
        :func:`~ctxkit.fast.capture_graph` into :attr:`graphs` (CUDA; done by the constructor
        when the plan has ``graphs``). Runs before any request: the warm-up calls write the
        ring and move the indices, which are reset after.

        Raises:
            RuntimeError: requests are running or waiting (their rows would be overwritten).
        """
        if self.busy or self.waiting:
            raise RuntimeError("capture the decoding step's graphs before any request is submitted")
        prepare_inference(self.model)  # fused q/k/v weights concatenated now, outside the graphs
        graphs = GraphCache(max_entries=None)  # few widths (log2 slots + 1), each needed again
        for width in bucket_widths(self.slots):
            graphs.put(width, capture_graph(lambda w=width: self._decode(w), warmup=2, device=self.device))
        # The graphs read those concatenated weights by address: held here, they outlive a
        # module dropping its cache (FusedQKVAttention.train() does).
        self._graph_weights = [m.__dict__.get("_fused_cache") for m in self.model.modules() if "_fused_cache" in m.__dict__]
        # What the warm-ups wrote is garbage under a zero key mask: every request's prefill
        # sets its row's mask, position and columns.
        self._write.zero_()
        self.key_mask.zero_()
        self.position.zero_()
        self.last.zero_()
        self.column = 0
        self.graphs = graphs

    def _prefill(self) -> bool:
        """Run prompt chunks of waiting requests, in arrival order, while a slot is free: at
        most ``prefill_chunk`` tokens while other requests decode (whole prompts while none
        does). A request whose prompt is done joins the batch. Returns whether any ran."""
        spent, ran = 0, False
        while True:
            limit = self.prefill_chunk if self.prefill_chunk is not None and any(self.active) else None
            if limit is not None and spent >= limit:
                break
            if self._filling is None and not self._start_filling():
                break
            request = self._filling
            start = request.prefilled
            end = len(request.prompt) if limit is None else min(len(request.prompt), start + limit - spent)
            ids = torch.tensor([request.prompt[start:end]], device=self.device)
            positions = torch.arange(start, end, device=self.device)[None]
            last = end == len(request.prompt)
            # Only the last chunk needs logits (of its last position): the others run the
            # body alone for their keys and values, skipping the vocabulary-wide head.
            body = self.model if last else getattr(self.model, "transformer", self.model)
            with varying_shape_attention(self.device):  # every chunk a new (query, key) shape
                out = body(ids, cache=self._own, attention_mask=None, position_ids=positions)
            request.prefilled = end
            spent += end - start
            ran = True
            self.stats["prefill_chunks"] += 1
            self.stats["prefill_tokens"] += end - start
            if last:
                own, self._filling, self._own = self._own, None, None
                self._join(request, own, out[:, -1].float())
        return ran

    def _start_filling(self) -> bool:
        """Take the next waiting request for prefilling, when a slot is free (it joins the
        lowest free slot when its prompt is done). False: none to take."""
        while None in self.active:
            with self._wake:
                request = self.waiting.popleft() if self.waiting else None
            if request is None:
                return False
            if request.cancelled:
                request.emit(None, "cancelled")
                self.stats["cancelled"] += 1
                continue
            request.prefilled = 0
            self._own = self.model.new_cache(1, len(request.prompt))
            self._filling = request
            return True
        return False

    def _drop_filling(self) -> None:
        request, self._filling, self._own = self._filling, None, None
        self.stats["cancelled"] += 1
        request.emit(None, "cancelled")

    def _join(self, request: Request, own, logits: Tensor) -> None:
        """A prefilled request takes the lowest free slot: its keys and values (``own``) are
        copied into that row's ring columns just before the current one, and its first
        token is chosen from the prompt's last ``logits (1, vocab)``."""
        n = len(request.prompt)
        slot = self.active.index(None)
        cols = torch.arange(self.column - n, self.column, device=self.device) % self.max_len
        for ring, alone in zip(self.cache.kv, own.kv):  # (2, batch, heads, columns, head_dim) per layer
            ring[:, slot, :, cols] = alone[:, 0, :, :n]
        self.key_mask[slot] = 0
        self.key_mask[slot, cols] = 1
        self.position[slot] = n
        request.slot = slot
        self.active[slot] = request
        self.stats["admitted"] += 1
        token = int(self._choose([request], logits)[0])
        self.last[slot, 0] = token
        self._take(request, token)

    @staticmethod
    def _choose(requests: List[Request], logits: Tensor) -> Tensor:
        """The next token of each of ``requests`` ``(rows,)`` (on the device) from their logits
        ``(rows, vocab)``, each drawn from its request's own generator."""
        seen = [r.prompt + r.tokens if r.config.repetition_penalty != 1.0 else None for r in requests]
        return choose_rows(logits, seen, [r.config for r in requests], [r.generator for r in requests])

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
