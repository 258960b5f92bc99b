"""``ctxkit serve``: a JSON HTTP API for a fine-tuned run, with dynamic micro-batching.

Requests that arrive within ``max_wait_ms`` of each other are merged (up to
``max_batch`` texts) and run as one forward pass through the task's own
``predict_lines`` (:mod:`.serve_batcher`), so answers equal those of ``ctxkit predict``;
``/embed`` runs its windows within a per-request budget, a forward pass at a time
(:mod:`.serve_embed`). ``/docs`` and ``/redoc`` render the OpenAPI schema from assets served
by the app itself (:mod:`.serve_docs`). See ``docs/serving.md``.

FastAPI, pydantic and uvicorn are imported inside functions: the CLI registers this verb
(:mod:`ctxkit.cli.deploy`) on every ``ctxkit`` call, and ``import ctxkit`` must not need them.
"""

import asyncio
import contextlib
import copy
import errno
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional

import torch

from ..core.capabilities import WarmsUp
from ..core.deps import require_all
from ..core.errors import UserError
from ..core.version import __version__
from . import serve_schema as schema
from .serve_batcher import MicroBatcher, ShuttingDown, log, log_event
from .serve_conn import ConnectionLimits, bind_sockets, server_class
from .serve_docs import DOC_ENDPOINTS, add_docs
from .serve_embed import WINDOWS_PER_ITEM, EmbedPlanner, WorkBudgetExceeded, embed_step_fn
from .serve_generate import causal_lm_folder, create_generation_app, load_causal_lm
from .serve_limits import (SERVE_NEEDS, PathRedactor, QueueFull, RequestGuard, TokenCheck, available_cores, choose_threads,
                           public_name, set_model_thread, torch_threads)
from ..tasks.ner import ConllNerTask
from ..tasks.qa import SquadTask
from ..tasks.text import GlueClassificationTask, TableClassificationTask
from ..features.embed import POOLING_CHOICES
from ..tasks import load_run
from .backends import _is_bert, with_backend


__all__ = ["MicroBatcher", "QueueFull", "ShuttingDown", "create_app", "log_event", "serve"]


def _task_kind(task) -> str:

    for classes, kind in (((GlueClassificationTask, TableClassificationTask), "classify"), (ConllNerTask, "ner"), (SquadTask, "qa")):
        if isinstance(task, classes):
            return kind
    raise UserError(f"task {task.name!r} cannot be served (classification, NER and QA runs can)")


def _finite(value):
    """``value`` with non-finite floats replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return [_finite(v) for v in value] if isinstance(value, (list, tuple)) else value


def _json_type(value) -> str:
    """The JSON name of a parsed JSON value's type (``null``, not ``NoneType``)."""
    for types, name in ((type(None), "null"), (bool, "a boolean"), ((int, float), "a number"), (str, "a string"), (list, "an array")):
        if isinstance(value, types):
            return name
    return type(value).__name__


def _validation_error(errors, content_type: str):
    """``(status, message)`` for FastAPI's request validation errors."""
    for e in errors:
        if e.get("type") == "json_invalid":
            return 400, f"malformed JSON: {e.get('ctx', {}).get('error', 'decode error')} (at character {e['loc'][-1]})"
    if "json" not in content_type.lower() and any(tuple(e.get("loc", ())) == ("body",) for e in errors):
        return 415, f"send the request body as JSON with 'Content-Type: application/json' (got {content_type or 'none'!r})"
    parts = []
    for e in errors:
        loc = [x for x in e.get("loc", ()) if x != "body"]
        where = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in loc).lstrip(".") or "body"
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        if where == "body" and e.get("type") == "missing":
            msg = "the request body is empty; send a JSON object"
        elif where == "body" and e.get("type") in ("model_attributes_type", "model_type", "dict_type"):
            msg = f"the request body must be a JSON object, not {_json_type(e.get('input'))}"
        parts.append(f"{where}: {msg}")
    return 422, "invalid request: " + "; ".join(parts)


def _undecodable(cause: Optional[BaseException]) -> str:
    """The 400 message for a body ``json.loads`` failed on other than by a syntax error."""
    if isinstance(cause, RecursionError):
        return "malformed JSON: nested too deeply"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):  # sys.get_int_max_str_digits
        return f"malformed JSON: a number has too many digits ({str(cause).split(';')[0]})"
    return "malformed JSON: the body could not be decoded; send UTF-8 JSON"


def create_app(run, device: str = "auto", max_batch: int = 32, max_wait_ms: float = 5.0, max_text_chars: int = 10_000,
               max_items: int = 64, max_body_bytes: Optional[int] = None, pooling: str = "mean",
               backend: Optional[str] = "pytorch", precision: Optional[str] = None, threads: Optional[int] = None,
               max_queue: Optional[int] = None, fast: Optional[str] = None, connections: Optional[ConnectionLimits] = None,
               expose_paths: bool = False, max_windows: Optional[int] = None):
    """Build the FastAPI app for a fine-tuned run.

    Args:
        run: a run folder, or ``(task, model, tokenizer, info)`` as :func:`ctxkit.tasks.load_run` returns.
        device: torch device when ``run`` is a folder.
        max_batch: most texts per forward pass.
        max_wait_ms: how long a request may wait for others to share its forward pass.
        max_text_chars: longest text (or question, or context) accepted.
        max_items: most texts per request.
        max_body_bytes: largest request body (default: room for ``max_items`` texts of
            ``max_text_chars`` characters).
        pooling: ``/embed`` vectors: ``mean`` over tokens or the ``cls`` vector.
        backend, precision: the task endpoint's runtime (:func:`ctxkit.inference.backends.with_backend`;
            backend None = the GPU encoder for a BERT-family run on a CUDA device, else
            PyTorch; precision None = that backend's default); ``/embed`` always uses the PyTorch
            encoder (with ``gpu``, the task endpoint gets its own bf16 copy of the model).
        threads: torch (and ONNX Runtime) intra-op threads of the model thread; None:
            ``OMP_NUM_THREADS`` if set, else one per available core but one
            (:func:`ctxkit.inference.serve_limits.choose_threads`). The caller's own
            thread count is left as it was.
        max_queue: most texts waiting per endpoint; more get 429 (default: 4 batches' worth).
        fast: the fast plan (:class:`~ctxkit.fast.FastPlan` string) of the task endpoint's model;
            None: the plan the run was trained with, what of it runs here, else ``auto``
            (:func:`ctxkit.tasks.load_run`). The gpu backend compiles and captures its first
            shapes before the server answers (logged as ``warmup``).
        connections: the HTTP front's settings and counters (:func:`serve` passes them),
            shown in ``/health``; None: not served through it (``"connections": null``).
        expose_paths: ``/health`` shows the run folder's and model's paths, and error
            messages keep this host's paths (local debugging); otherwise only names.
        max_windows: most forward-pass windows of the encoder's length one ``/embed`` request
            may need (long texts are embedded window by window); more get 413 before any
            forward pass (default: 2 per text of ``max_items``).

    Returns:
        The ASGI app; its lifespan starts and drains the batchers.

    Raises:
        UserError: a bad option (threads or max_queue < 1, unknown pooling ...).
    """
    require_all(SERVE_NEEDS, "ctxkit serve")
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, ConfigDict, Field, model_validator
    from starlette.exceptions import HTTPException as StarletteHTTPException

    if pooling not in POOLING_CHOICES:
        raise UserError(f"pooling must be one of {', '.join(POOLING_CHOICES)}, got {pooling!r}")
    threads, threads_source = choose_threads(threads)
    max_queue = 4 * max_batch if max_queue is None else max_queue
    if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
        raise UserError(f"--max-queue must be an integer >= 1, got {max_queue!r}")
    max_windows = WINDOWS_PER_ITEM * max_items if max_windows is None else max_windows
    if isinstance(max_windows, bool) or not isinstance(max_windows, int) or max_windows < 1:
        raise UserError(f"--max-windows must be an integer >= 1, got {max_windows!r}")

    # ONNX Runtime sessions (an int8 run, --backend onnxruntime) take torch's thread
    # count when they are created: create them at the serving count.
    with torch_threads(threads):
        if isinstance(run, (str, Path)):
            run_dir, (task, model, tokenizer, info) = str(run), load_run(run, device, fast=fast)
        else:
            run_dir, (task, model, tokenizer, info) = None, run
        plan = fast if fast is not None else info.get("fast")
        kind = _task_kind(task)
        base = model
        first = next(iter(base.parameters()), None)
        if backend is None:  # the fastest exact runtime without timing anything at startup
            backend = "gpu" if first is not None and first.is_cuda and _is_bert(base) else "pytorch"
        # The GPU encoder casts its model to bf16 in place: give it a copy, so /embed keeps
        # the fp32 encoder (and its answers equal offline `ctxkit embed`).
        on_gpu = first is not None and first.is_cuda and (backend == "gpu" or (backend == "auto" and _is_bert(base)))
        keep = None if info.get("hf_task") else run_dir  # auto's choice is kept in run folders, not in transformers checkpoints
        model, backend_name = with_backend(copy.deepcopy(base) if on_gpu else base, backend, precision, run_dir=keep, plan=plan)
    token_check = TokenCheck(tokenizer)
    params = list(base.parameters())
    dev = str(params[0].device) if params else "cpu"  # an int8 run (ONNX Runtime) has no torch parameters
    can_embed = hasattr(base, "encoder")  # exported runs hold only the task graph, no encoder to pool
    if max_body_bytes is None:
        max_body_bytes = 4 * max_items * max_text_chars + 65536  # JSON escapes can reach several bytes a char

    def predict(lines: List[str]) -> List[dict]:
        return task.predict_lines(model, tokenizer, lines, max_batch, dev)

    # /embed: windows counted off the model thread, then run max_batch at a time (serve_embed).
    planner = EmbedPlanner(tokenizer, base.encoder.config.max_position, max_windows) if can_embed else None
    embed_texts = embed_step_fn(base.encoder, tokenizer, pooling, max_batch) if can_embed else None

    endpoints = ["GET /health", f"POST /{kind}"] + (["POST /embed"] if can_embed else []) + ["GET /openapi.json", *DOC_ENDPOINTS]
    # What /health says of the run and model: names, not this host's paths (--expose-paths: both).
    about = {"run": public_name(run_dir), "model": public_name(info.get("model"))}
    if expose_paths:
        about.update(model=info.get("model"), run_dir=None if run_dir is None else str(Path(run_dir).resolve()))
    redact = (lambda text: text) if expose_paths else PathRedactor(run_dir, info.get("model"))
    executor: List[ThreadPoolExecutor] = []
    batchers: Dict[str, MicroBatcher] = {}
    started = time.time()
    threads_info = {"torch": threads, "source": threads_source, "cores": available_cores()}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        # Fresh workers on every start: the same app may be started again after a stop
        # (a second `with TestClient(app)`, a test runner restarting it), and a stopped
        # executor takes no work. torch's thread count belongs to each OS thread, so the
        # model thread sets its own.
        executor[:] = [ThreadPoolExecutor(1, thread_name_prefix="ctxkit-serve", initializer=set_model_thread, initargs=(threads,)),
                       ThreadPoolExecutor(1, thread_name_prefix="ctxkit-plan")]  # /embed's tokenizing, beside the model

        # What the model thread really runs with (reported, not assumed).
        threads_info["torch"] = await asyncio.get_running_loop().run_in_executor(executor[0], torch.get_num_threads)
        warm_up = model.warm_up if isinstance(model, WarmsUp) else None
        if warm_up is not None:  # the GPU encoder: compile and capture now, not in the first client's request
            t0 = time.time()
            await asyncio.get_running_loop().run_in_executor(executor[0], warm_up, max_batch)
            log_event("warmup", seconds=round(time.time() - t0, 1), backend=backend_name)
        for name, fn in ((kind, predict), ("embed", embed_texts))[: 2 if can_embed else 1]:
            batchers[name] = MicroBatcher(name, fn, executor[0], max_batch, max_wait_ms, max_queue, stepwise=name == "embed")
            batchers[name].start()
        log_event("startup", task=task.name, run_dir=run_dir, device=dev, backend=backend_name, endpoints=endpoints,
                  max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue, threads=threads_info,
                  **({} if connections is None else {"connections": {k: v for k, v in connections.health().items() if k != "stats"}}))
        yield
        for b in batchers.values():  # in-flight and queued requests still get answers
            await b.close()
        for pool in executor:
            pool.shutdown(wait=True)
        log_event("shutdown", stats={n: b.stats for n, b in batchers.items()})

    app = FastAPI(title=f"ctxkit serve: {task.name}", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json",
                  description=f"JSON API of a {task.name} run (ctxkit serve). Every error answers {{\"error\": \"<message>\"}}.")
    add_docs(app)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError):
        status, message = _validation_error(exc.errors(), request.headers.get("content-type", ""))
        return JSONResponse({"error": redact(message)}, status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException):
        message = exc.detail
        if exc.status_code == 400:  # FastAPI's generic "error parsing the body", from json.loads
            message = _undecodable(exc.__cause__)
        elif exc.status_code in (404, 405):
            message = f"no endpoint {request.method} {request.url.path}; this {task.name} run serves: {', '.join(endpoints)}"
        message = redact(message) if isinstance(message, str) else message
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse({"error": f"internal error ({type(exc).__name__}); see the server log"}, status_code=500)

    class ErrorBody(BaseModel):
        """Every 4xx/5xx answer: one message naming the field and, for a limit, its option."""
        error: str = Field(min_length=1)

    def schema_of(published: dict):
        """pydantic config that publishes ``published`` as the model's JSON schema."""
        def replace(schema, _cls):
            schema.clear()
            schema.update(copy.deepcopy(published))
        return ConfigDict(extra="forbid", strict=True, json_schema_extra=replace)

    class _Body(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

    class TextRequest(_Body):
        text: Optional[str] = None
        texts: Optional[List[str]] = None
        pair: Optional[str] = None
        pairs: Optional[List[str]] = None

        @model_validator(mode="after")
        def _shape(self):
            if (self.text is None) == (self.texts is None):
                raise UserError("give either 'text' (a string) or 'texts' (a list of strings)")
            if (self.pair is not None and self.text is None) or (self.pairs is not None and self.texts is None):
                raise UserError("'pair' goes with 'text', 'pairs' with 'texts'")
            if self.pairs is not None and len(self.pairs) != len(self.texts):
                raise UserError(f"'pairs' has {len(self.pairs)} items but 'texts' has {len(self.texts)}")
            return self

    # One validating model, published with each endpoint's own schema (only /classify takes pairs).
    class ClassifyRequest(TextRequest):
        model_config = schema_of(schema.text_request_schema("classify", max_items, max_text_chars))

    class NerRequest(TextRequest):
        model_config = schema_of(schema.text_request_schema("ner", max_items, max_text_chars))

    class EmbedRequest(TextRequest):
        model_config = schema_of(schema.text_request_schema("embed", max_items, max_text_chars))

    class QAItem(_Body):
        question: str
        context: str

    class QARequest(_Body):
        model_config = schema_of(schema.qa_request_schema(max_items, max_text_chars))

        question: Optional[str] = None
        context: Optional[str] = None
        items: Optional[List[QAItem]] = None

        @model_validator(mode="after")
        def _shape(self):
            single = (self.question, self.context) != (None, None)
            if single == (self.items is not None) or (single and None in (self.question, self.context)):
                raise UserError("give either 'question' and 'context' (strings) or 'items' (a list of {question, context})")
            return self

    async def run(request: Request, name: str, many: bool, fields: Dict[str, List[str]], lines: list, key="prediction"):
        """Check the limits (naming the offending field), batch ``lines``, answer as JSON."""
        if len(lines) > max_items:
            raise HTTPException(413, f"{len(lines)} items in one request; the limit is {max_items} (--max-items)")
        if not lines:
            raise HTTPException(422, "invalid request: the list is empty; give at least one item")
        for field, values in fields.items():
            for i, value in enumerate(values):
                if len(value) > max_text_chars:
                    raise HTTPException(413, f"{field.format(i=i)} has {len(value)} characters; "
                                             f"the limit is {max_text_chars} (--max-text-chars)")
                if not value.strip():
                    raise HTTPException(422, f"invalid request: {field.format(i=i)} is empty or only whitespace")
                if not value.isascii():  # JSON can carry a lone surrogate ("\ud800"); UTF-8 cannot
                    try:
                        value.encode("utf-8")
                    except UnicodeEncodeError:
                        raise HTTPException(422, f"invalid request: {field.format(i=i)} has an unpaired surrogate "
                                                 "(\\ud800-\\udfff), not a character") from None
                # Checked here, not in the batch: the model would answer [CLS] [SEP] with a
                # prediction that means nothing.
                if not token_check.has_tokens(value):
                    raise HTTPException(422, f"invalid request: {field.format(i=i)} has no tokens: the tokenizer drops "
                                             "every character of it (control, format and zero-width characters, "
                                             "combining marks without a base)")
        request.scope["ctxkit_items"] = len(lines)
        if name == "embed":  # long texts are many windows: counted (and refused past the budget) first
            lines = await plan_embed(lines, [f.format(i=i) for f, values in fields.items() for i in range(len(values))])
        try:
            outputs = await batchers[name].submit(lines)
        except ShuttingDown as err:
            raise HTTPException(503, str(err)) from None
        except QueueFull as err:
            raise HTTPException(429, str(err), headers={"Retry-After": str(err.retry_after)}) from None
        except ValueError as err:  # an input the task itself rejects
            raise HTTPException(422, f"invalid request: {err}") from None
        extra = {"dim": len(outputs[0])} if name == "embed" else {}
        payload = {key + "s": outputs, **extra} if many else {key: outputs[0], **extra}
        try:  # JSONResponse directly: FastAPI's jsonable_encoder is slow on long float lists
            return JSONResponse(payload)
        except ValueError:  # inf/nan (QA's score when no span fits) are not JSON: send null
            return JSONResponse(_finite(payload))

    async def plan_embed(texts: List[str], names: List[str]) -> list:
        """``(text, plan)`` items for the /embed batcher, tokenized on the planning thread.

        Raises:
            HTTPException: 413 past --max-windows, 422 for a text the tokenizer refuses.
        """
        try:
            plans = await asyncio.get_running_loop().run_in_executor(executor[1], planner.plan, texts, names)
        except WorkBudgetExceeded as err:
            raise HTTPException(413, str(err)) from None
        except UserError as err:
            raise HTTPException(422, f"invalid request: {err}") from None
        return list(zip(texts, plans))

    def text_lines(body: TextRequest, endpoint: str):
        many = body.texts is not None
        texts, pairs = (body.texts, body.pairs) if many else ([body.text], None if body.pair is None else [body.pair])
        fields = {"texts[{i}]" if many else "text": texts}
        if endpoint != "classify":
            if pairs is not None:
                raise HTTPException(422, f"invalid request: /{endpoint} takes no 'pair'/'pairs'")
            return many, fields, texts
        # predict_lines splits text and pair at a tab; to BERT's tokenizer a tab is a space.
        lines = [t.replace("\t", " ") for t in texts]
        if pairs is not None:
            fields["pairs[{i}]" if many else "pair"] = pairs
            lines = [f"{t}\t{p.replace(chr(9), ' ')}" for t, p in zip(lines, pairs)]
        return many, fields, lines

    def responses(ok: dict, what: str, errors=(400, 408, 413, 415, 422, 429, 431, 503)) -> dict:
        out = {200: {"description": what, "content": {"application/json": {"schema": ok}}}}
        out.update({code: {"model": ErrorBody, "description": schema.ERRORS[code], **schema.ERROR_HEADERS.get(code, {})}
                    for code in errors})
        return out

    @app.get("/health", operation_id="health", summary="The run, its limits and counters",
             responses=responses(schema.HEALTH_SCHEMA, "the run, the limits and per-endpoint counters", ()))
    async def health():
        return {"status": "ok", "task": task.name, "kind": kind, "labels": getattr(task, "labels", None),
                **about, "device": dev, "backend": backend_name, "endpoints": endpoints,
                "batching": {"max_batch": max_batch, "max_wait_ms": max_wait_ms, "max_queue": max_queue}, "threads": threads_info,
                "limits": {"max_items": max_items, "max_text_chars": max_text_chars, "max_body_bytes": max_body_bytes,
                           "max_windows": max_windows if can_embed else None},
                "connections": None if connections is None else connections.health(),
                "uptime_s": round(time.time() - started, 1), "stats": {n: dict(b.stats) for n, b in batchers.items()}}

    # An exported run has no /embed: its schema leaves it out (requests get the 404 below).
    @app.post("/embed", operation_id="embed", summary="Vectors from the run's encoder", include_in_schema=can_embed,
              responses=responses(schema.EMBED_SCHEMA, "one vector per text"))
    async def embed_route(body: EmbedRequest, request: Request):
        if not can_embed:
            raise HTTPException(404, "this run is an exported model (ctxkit quantize) without an encoder to embed with; "
                                     "serve the original run for /embed")
        return await run(request, "embed", *text_lines(body, "embed"), key="embedding")

    answer = schema.answer_schema(kind, getattr(task, "labels", None), bool(getattr(task, "is_regression", False)))
    if kind == "qa":
        @app.post("/qa", operation_id="qa", summary="Answer questions from their contexts",
                  responses=responses(answer, "one answer per question"))
        async def qa_route(body: QARequest, request: Request):
            many = body.items is not None
            items = body.items if many else [body]
            fields = {("items[{i}]." if many else "") + f: [getattr(q, f) for q in items] for f in ("question", "context")}
            lines = [json.dumps({"question": q.question, "context": q.context}, ensure_ascii=False) for q in items]
            return await run(request, "qa", many, fields, lines)
    else:
        summary = {"classify": "Classify texts or sentence pairs", "ner": "Find named entities"}[kind]
        KindRequest = ClassifyRequest if kind == "classify" else NerRequest  # noqa: N806 (a class)

        @app.post(f"/{kind}", operation_id=kind, summary=summary, responses=responses(answer, "one prediction per text"))
        async def text_route(body: KindRequest, request: Request):
            return await run(request, kind, *text_lines(body, kind))

    return RequestGuard(app, max_body_bytes, log_event)


def check_address(host: str, port: int) -> None:
    """Raise a one-line :class:`UserError` when ``host:port`` cannot be listened on (taken by
    another server, or an address this machine does not have); the sockets are closed again.

    Checked before the run is loaded, so the answer takes milliseconds, not a model load; a
    server that takes the port in between still fails at start-up (exit 3)."""
    try:
        for sock in bind_sockets(host, port, backlog=1):
            sock.close()
    except OSError as err:
        why = "is in use (another server?)" if err.errno == errno.EADDRINUSE else f"cannot be listened on ({err.strerror or err})"
        raise UserError(f"{host}:{port} {why}: pick another --port or --host") from None


def serve(run_dir, host: str = "127.0.0.1", port: int = 8000, graceful_timeout: float = 30.0, header_timeout: float = 10.0,
          body_timeout: float = 30.0, keep_alive_timeout: float = 5.0, max_header_bytes: int = 32768,
          max_connections: Optional[int] = None, **app_options) -> None:
    """Serve a run until SIGINT/SIGTERM: then stop accepting, answer what is in flight, exit.

    Args:
        run_dir: the fine-tuned run folder.
        host, port: where to listen.
        graceful_timeout: seconds to wait for in-flight requests after a signal.
        header_timeout, body_timeout, keep_alive_timeout, max_header_bytes, max_connections:
            the HTTP front's limits (:class:`ctxkit.inference.serve_conn.ConnectionLimits`).
        **app_options: passed to :func:`create_app` (for a causal LM: ``max_batch``, ``max_queue``,
            ``fast``, ``precision``, ``device`` and ``prefill_chunk``, the generation server's alone,
            to :func:`~ctxkit.inference.serve_generate.create_generation_app`).

    Raises:
        UserError: a bad option, before the run is loaded.
    """
    require_all(SERVE_NEEDS, "ctxkit serve")  # one line naming the extra, before the model loads
    import uvicorn  # lazy: the serve extra, imported when a server starts

    limits = ConnectionLimits(header_timeout, body_timeout, keep_alive_timeout, max_header_bytes, max_connections)
    check_address(host, port)  # a taken port is one line now, not after the model loaded
    prefill_chunk = app_options.pop("prefill_chunk", None)  # the generation server's alone (None: its default)
    lm = causal_lm_folder(run_dir)
    if lm is not None:  # a causal LM: text generation with continuous batching (serve_generate)
        slots = app_options.get("max_batch", 32)
        model, tokenizer = load_causal_lm(lm, app_options.get("device", "auto"))
        name = Path(str(run_dir)).name if Path(str(run_dir)).exists() else str(run_dir)
        app = create_generation_app(model, tokenizer, name=name, slots=slots, max_waiting=app_options.get("max_queue") or 4 * slots,
                                    fast=app_options.get("fast") or "auto", precision=app_options.get("precision"),
                                    **({} if prefill_chunk is None else {"prefill_chunk": prefill_chunk}))
        about = app.state.about()  # precision, plan, CUDA graph widths, prefill chunk: on the start line
        app = RequestGuard(app, app_options.get("max_body_bytes") or 4 * app_options.get("max_text_chars", 10_000) + 65536, log_event)
        log_event("startup", task="text-generation", run=name, slots=slots, **about,
                  endpoints=["POST /generate", "POST /v1/completions", "GET /health", *DOC_ENDPOINTS])
    else:
        app = create_app(run_dir, connections=limits, **app_options)
    # httptools: the protocol serve_conn extends; no WebSocket upgrade (the app has no
    # WebSocket route, and an upgraded connection would leave the front's bookkeeping).
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="on", http="httptools",
                            ws="none", timeout_keep_alive=keep_alive_timeout, timeout_graceful_shutdown=graceful_timeout)
    server_class(log_event)(config, limits).run()
