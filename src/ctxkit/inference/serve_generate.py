"""``ctxkit serve MODEL`` for a causal LM: text generation over HTTP with continuous batching.

Routes:

* ``POST /generate`` -- ``{"prompt", "max_new_tokens", "temperature", "top_k", "top_p",
  "seed", "stop", "stream"}``; ``temperature: 0`` is greedy. The answer is ``{"text",
  "finish_reason", "prompt_tokens", "completion_tokens"}``, or with ``"stream": true``
  server-sent events: ``{"text": piece}`` per piece, then ``{"finish_reason", ...}`` and
  ``[DONE]``.
* ``POST /v1/completions`` -- OpenAI's completions API (``prompt``, ``max_tokens``,
  ``temperature``, ``top_p``, ``stop``, ``seed``, ``stream``), the same answer shapes.
* ``GET /health`` -- the model's name, how it runs (precision, plan, CUDA graph widths,
  prefill chunk), slots, busy and waiting requests, counters.

All requests share one :class:`~ctxkit.decoding.continuous.ContinuousBatcher` on its own
thread: a request's prompt is prefilled in chunks between decoding steps, it joins the
running batch when its prompt is done and leaves it when it ends; a client that goes away
frees its slot at the next step; more waiting requests than ``max_waiting`` get 429 with
``Retry-After``. The tokens a request gets do not depend on what else is running (its own
generator): with the same ``seed`` (or greedy) they are the tokens ``ctxkit generate``
prints for the same model in the same precision.

The model runs in the precision ``auto`` means everywhere in ctxkit (bf16 on a GPU, fp32
on a CPU: :func:`~ctxkit.core.run_state.resolve_precision`, what ``ctxkit bench decode``
measures and the decode plan is resolved for), or in ``--precision`` fp32/bf16.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' body types, classes
# made inside create_generation_app, from the annotations at run time.
import asyncio
import contextlib
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import List, Optional, Union

import torch

from ..core.deps import require_all
from ..core.errors import UserError
from ..decoding.continuous import PREFILL_CHUNK, BatcherFailed, ContinuousBatcher, QueueFull, Request
from ..decoding.generate import GenerationConfig
from ..decoding.streamers import StopStringText
from ..core.checkpoint import model_folder_of_run
from ..core.device import resolve_device
from ..core.run_state import resolve_precision
from ..models.common import check_vocab_fits
from ..models.gpt2.model import load_gpt2
from ..tokenizers import ByteLevelBPETokenizer
from ..zoo import checkpoint_folder
from .serve_docs import add_docs
from .serve_limits import SERVE_NEEDS

__all__ = ["causal_lm_folder", "create_generation_app", "load_causal_lm", "serving_dtype"]

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
_PRECISION_NAMES = {dtype: word for word, dtype in _DTYPES.items()}
#: sys.setswitchinterval while the decoding thread runs: every torch op gives up the GIL, and
#: with the event loop busy writing streams the decoding thread would wait up to the default
#: 5 ms to take it back, per op (see docs/notes/gpu-serving.md)
SWITCH_INTERVAL_S = 0.0002


def causal_lm_folder(run) -> Optional[Path]:
    """The model folder of ``run`` when it is a causal LM ctxkit serves with generation (a
    GPT-2: an ``lm-train`` run, an HF-format folder, a checkpoint name or Hub id); else None."""
    if not isinstance(run, (str, os.PathLike)):
        return None
    path = Path(run)
    if path.exists():
        folder = model_folder_of_run(path)
    elif "gpt2" in str(run).lower():  # gpt2, distilgpt2, openai-community/gpt2, org/my-gpt2 ...
        try:  # a name or Hub id: its files, fetched once
            folder = checkpoint_folder(str(run))
        except (UserError, OSError):
            return None
    else:
        return None
    config = folder / "config.json"
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type") if config.is_file() else None
    except (OSError, ValueError):
        return None
    return folder if model_type == "gpt2" else None


def load_causal_lm(folder: Path, device: str = "auto"):
    """``(model, tokenizer)`` of a GPT-2 folder, on ``device``, in eval mode."""
    model, tokenizer = load_gpt2(folder), ByteLevelBPETokenizer.from_dir(folder)
    check_vocab_fits(model, tokenizer, folder)
    return model.to(resolve_device(device)).eval(), tokenizer


def serving_dtype(precision: Optional[str], device: torch.device) -> torch.dtype:
    """The dtype the generation server's model runs in: ``precision`` ``"fp32"`` or ``"bf16"``;
    None or ``"auto"``: bf16 on CUDA, fp32 elsewhere (:func:`~ctxkit.core.run_state.resolve_precision`).

    Raises:
        UserError: another precision (fp8 and bf16-gelu-tanh are the encoder server's gpu backend's).
    """
    if precision not in (None, "auto", "fp32", "bf16"):
        raise UserError(f"--precision {precision} is a precision of the task server's gpu backend; the generation server "
                        "runs fp32 or bf16 (default: bf16 on a GPU, fp32 on a CPU)")
    return _DTYPES[resolve_precision(precision, torch.device(device))]


def _request_models():
    """The request bodies (pydantic, from the serve extra: imported when a server is built)."""
    from pydantic import BaseModel, ConfigDict, Field

    class GenerateRequest(BaseModel):
        """What ``POST /generate`` takes."""

        model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
            {"prompt": "The river bank was", "max_new_tokens": 32, "temperature": 0.8, "top_p": 0.95, "seed": 0},
            {"prompt": "Once upon a time", "max_new_tokens": 16, "temperature": 0, "stop": ["\n"]},
            {"prompt": "The river bank was", "max_new_tokens": 32, "stream": True}]})
        prompt: str = Field(min_length=1, examples=["The river bank was"])
        max_new_tokens: int = Field(64, ge=1)
        temperature: float = Field(1.0, ge=0.0, description="0: greedy")
        top_k: int = Field(0, ge=0)
        top_p: float = Field(1.0, gt=0.0, le=1.0)
        seed: Optional[int] = Field(None, ge=0, description="reproducible sampling")
        stop: Union[str, List[str], None] = None
        stream: bool = False

    class CompletionRequest(BaseModel):
        """OpenAI's ``POST /v1/completions`` (one prompt, one choice)."""

        model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [  # clients send user, logit_bias, ...: ignored
            {"model": "gpt2", "prompt": "The river bank was", "max_tokens": 16, "temperature": 0.7, "seed": 0},
            {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "stream": True}]})
        model: Optional[str] = None
        prompt: str = Field(min_length=1, examples=["The river bank was"])
        max_tokens: int = Field(16, ge=1)
        temperature: float = Field(1.0, ge=0.0)
        top_p: float = Field(1.0, gt=0.0, le=1.0)
        stop: Union[str, List[str], None] = None
        seed: Optional[int] = Field(None, ge=0)
        stream: bool = False
        n: int = Field(1, ge=1, le=1, description="one choice per request")

    return GenerateRequest, CompletionRequest


def create_generation_app(model, tokenizer, name: str = "model", slots: int = 16, max_waiting: int = 256,
                          max_len: Optional[int] = None, max_new_tokens: int = 1024, fast="auto", precision: Optional[str] = None,
                          prefill_chunk: Optional[int] = PREFILL_CHUNK, switch_interval: Optional[float] = SWITCH_INTERVAL_S):
    """The generation server's app for a causal LM.

    Args:
        model: a GPT-2 (:class:`~ctxkit.models.gpt2.model.GPT2LMHeadModel`) in eval mode, on its
            device; cast in place to the serving dtype (:func:`serving_dtype`).
        tokenizer: its tokenizer (``encode``, ``decode``, ``eos_id``).
        name: the model's name in answers and ``/health`` (never a path of this host).
        slots: requests decoded together.
        max_waiting: requests waiting for a slot at most (then 429).
        max_len: prompt + new tokens of one request at most (default: the model's context).
        max_new_tokens: the most new tokens one request may ask for.
        fast: the plan (resolved for decoding on the model's device): its fused q/k/v is
            applied as ``ctxkit generate`` applies it, so both compute the same logits; its
            ``graphs`` (``auto`` on a GPU) captures the decoding step per batch width.
        precision: ``"fp32"``, ``"bf16"`` or None (bf16 on a GPU, fp32 on a CPU).
        prefill_chunk: prompt tokens prefilled per step while other requests decode (None:
            whole prompts).
        switch_interval: the process's ``sys.setswitchinterval`` while the server runs
            (restored when it stops); None leaves it.

    Raises:
        UserError: a precision other than fp32 or bf16.
    """
    require_all(SERVE_NEEDS, "ctxkit serve")
    from fastapi import FastAPI, HTTPException  # lazy: the serve extra
    from fastapi.responses import JSONResponse, StreamingResponse

    GenerateRequest, CompletionRequest = _request_models()  # noqa: N806 (classes)
    dtype = serving_dtype(precision, next(model.parameters()).device)
    model.to(dtype)  # before the batcher: its caches, fused weights and graphs take the model's dtype
    # Events emitted on the decoding thread during a step, handed to the event loop(s) in one
    # wake-up per step (call_soon_threadsafe writes to the loop's self-pipe and takes the GIL
    # back and forth: once per token it was ~60 wake-ups per step at 60 rows).
    outbox: list = []  # (loop, queue, event); appended and flushed on the decoding thread only

    def flush() -> None:
        if not outbox:
            return
        batch = outbox[:]
        del outbox[:]
        by_loop: dict = {}
        for loop, queue, event in batch:
            by_loop.setdefault(loop, []).append((queue, event))
        for loop, events in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a loop closed under a stopping server
                loop.call_soon_threadsafe(deliver, events)

    def deliver(events) -> None:  # on the event loop
        for queue, event in events:
            queue.put_nowait(event)

    batcher = ContinuousBatcher(model, slots=slots, max_len=max_len, max_waiting=max_waiting, prefill_chunk=prefill_chunk,
                                plan=fast, on_step=flush)
    plan = batcher.plan
    device = batcher.device
    eos = getattr(tokenizer, "eos_id", None)
    state = {"thread": None}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        previous = sys.getswitchinterval()
        if switch_interval is not None:
            sys.setswitchinterval(switch_interval)
        thread = threading.Thread(target=batcher.run, name="ctxkit-generate", daemon=True)
        thread.start()
        state["thread"] = thread
        try:
            yield
        finally:
            batcher.close()
            thread.join(timeout=30)
            sys.setswitchinterval(previous)

    app = FastAPI(title="ctxkit generation server", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description=f"Text generation with {name} (ctxkit serve): POST /generate, or OpenAI's POST /v1/completions.")
    add_docs(app)  # /docs and /redoc from this server's own files, no CDN

    def start(prompt: str, new_tokens: int, temperature: float, top_k: int, top_p: float, seed: Optional[int], stop):
        """Queue one request; returns (request, text assembler, asyncio queue of events)."""
        if new_tokens > max_new_tokens:
            raise HTTPException(422, f"max new tokens {new_tokens} is over this server's limit of {max_new_tokens}")
        ids = tokenizer.encode(prompt)
        if not ids:
            raise HTTPException(422, "the prompt has no tokens")
        config = GenerationConfig(max_new_tokens=new_tokens, do_sample=temperature > 0, temperature=temperature or 1.0,
                                  top_k=top_k, top_p=top_p, eos_token_id=eos, pad_token_id=eos if eos is not None else 0)
        generator = torch.Generator(device=device)
        generator.manual_seed(seed if seed is not None else int(torch.randint(2**62, (1,))))
        text = StopStringText(tokenizer, [stop] if isinstance(stop, str) else (stop or []))
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def emit(token: Optional[int], reason: Optional[str]) -> None:  # on the batcher's thread
            piece = text.push(token) if token is not None else text.flush()
            outbox.append((loop, events, (piece, reason)))  # delivered by flush, after the step

        request = Request(ids, config, emit, stop=lambda token: text.stopped, generator=generator)
        try:
            batcher.submit(request)
        except QueueFull as err:
            raise HTTPException(429, str(err), headers={"Retry-After": str(err.retry_after)}) from None
        except BatcherFailed as err:
            raise HTTPException(503, str(err)) from None
        except UserError as err:
            raise HTTPException(422, str(err)) from None
        return request, events

    async def pieces(request: Request, events: asyncio.Queue):
        """(piece, None)... then ("", finish_reason); the request is cancelled if the
        consumer stops early (a client that went away)."""
        ended = False
        try:
            while True:
                piece, reason = await events.get()
                if reason is not None:
                    ended = True
                    yield piece, (reason if reason in ("length", "error") else "stop")
                    return
                if piece:
                    yield piece, None
        finally:
            if not ended:
                batcher.cancel(request)

    def sse(payload) -> str:
        return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"

    @app.post("/generate")
    async def generate_route(body: GenerateRequest):
        request, events = start(body.prompt, body.max_new_tokens, body.temperature, body.top_k, body.top_p, body.seed, body.stop)
        usage = lambda: {"prompt_tokens": len(request.prompt), "completion_tokens": len(request.tokens)}  # noqa: E731

        if body.stream:
            async def stream():
                async for piece, reason in pieces(request, events):
                    if piece:
                        yield sse({"text": piece})
                    if reason is not None:
                        yield sse({"finish_reason": reason, **usage()})
                yield sse("[DONE]")

            return StreamingResponse(stream(), media_type="text/event-stream")
        parts, reason = [], None
        async for piece, reason in pieces(request, events):
            parts.append(piece)
        if reason == "error":
            raise HTTPException(503, f"the decoding thread stopped on an error: {batcher.failed}")
        return JSONResponse({"text": "".join(parts), "finish_reason": reason, **usage()})

    @app.post("/v1/completions")
    async def completions_route(body: CompletionRequest):
        request, events = start(body.prompt, body.max_tokens, body.temperature, 0, body.top_p, body.seed, body.stop)
        head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
                "model": body.model or name}

        def usage() -> dict:
            return {"prompt_tokens": len(request.prompt), "completion_tokens": len(request.tokens),
                    "total_tokens": len(request.prompt) + len(request.tokens)}

        if body.stream:
            async def stream():
                async for piece, reason in pieces(request, events):
                    if piece or reason is not None:
                        yield sse({**head, "choices": [{"text": piece, "index": 0, "logprobs": None, "finish_reason": reason}]})
                yield sse("[DONE]")

            return StreamingResponse(stream(), media_type="text/event-stream")
        parts, reason = [], None
        async for piece, reason in pieces(request, events):
            parts.append(piece)
        if reason == "error":
            raise HTTPException(503, f"the decoding thread stopped on an error: {batcher.failed}")
        return JSONResponse({**head, "choices": [{"text": "".join(parts), "index": 0, "logprobs": None, "finish_reason": reason}],
                             "usage": usage()})

    def about() -> dict:
        """How the model runs: also the server's start line (``ctxkit serve`` logs it)."""
        return {"precision": _PRECISION_NAMES.get(batcher.dtype, str(batcher.dtype)), "fast": str(plan), "device": str(device),
                "fast_off": list(plan.notes), "cuda_graphs": sorted(batcher.graphs) if batcher.graphs is not None else None,
                "prefill_chunk": batcher.prefill_chunk}

    @app.get("/health")
    async def health():
        if batcher.failed is not None:  # the decoding thread is gone: say so, as a load balancer reads it
            return JSONResponse({"status": "error", "error": batcher.failed, "model": name}, status_code=503)
        return {"status": "ok", "model": name, "task": "text-generation", **about(), "slots": batcher.slots, "busy": batcher.busy,
                "waiting": len(batcher.waiting), "max_len": batcher.max_len, "max_new_tokens": max_new_tokens,
                "stats": dict(batcher.stats)}

    app.state.batcher = batcher
    app.state.about = about
    return app
