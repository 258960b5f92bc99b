"""``ctxkit ui``: one page in the browser that shows what the models at hand do.

The page (``ui_assets/index.html``, ``ui.js``, ``ui.css``: vanilla, shipped in the package,
nothing fetched from elsewhere) has one panel per question a lecture asks of a model; each
panel calls one JSON route of the app :func:`create_ui_app` builds:

=================  ================================  =========================================
panel              route                             model
=================  ================================  =========================================
retail or river    ``POST /api/similarity``          the encoder: contextual vs static cosine
bank?                                                similarities of a word's occurrences
                                                     (:func:`~ctxkit.features.senses.word_similarities`)
attention          ``POST /api/attention``           the encoder: weights of every layer and
                                                     head (:func:`~ctxkit.features.senses.attention_maps`)
fill-mask          ``POST /api/fill-mask``           the encoder's masked-LM head (the
                                                     ``fill-mask`` pipeline)
question answering ``POST /api/qa``                  a question-answering run
named entities     ``POST /api/ner``                 an NER run (``ner`` pipeline, ``simple`` groups)
generation         ``POST /api/generate``            a GPT-2, streamed as server-sent events:
                                                     one ``{"text", "index"}`` per token, then
                                                     ``{"done", "finish_reason", ...}``, ``[DONE]``
=================  ================================  =========================================

``GET /api/info`` says which panels have a model (and, for those without, why and which
option adds one); a route whose model is missing answers 404 with that message, an input the
model cannot take 422 with the reason. :func:`load_ui_models` sorts the models a user names
into these roles.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' body types, classes made
# inside create_ui_app, from the annotations at run time.
import asyncio
import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..core.deps import require_all
from ..core.device import resolve_device
from ..core.errors import UserError
from ..decoding.generate import GenerationConfig, generate
from ..decoding.streamers import StopStringText
from ..features.senses import DEMO_WORDS, attention_maps, word_similarities
from ..tasks import load_task
from ..zoo import get_model
from .pipelines import QuestionAnsweringPipeline, TokenClassificationPipeline, pipeline
from .serve_generate import causal_lm_folder, load_causal_lm
from .serve_limits import SERVE_NEEDS

__all__ = ["ASSETS", "DEFAULT_ENCODER", "PANELS", "UIModels", "create_ui_app", "load_ui_models", "model_role", "run_ui"]

#: the page's files, package data (pyproject.toml: [tool.setuptools.package-data])
ASSETS = Path(__file__).with_name("ui_assets")
_MEDIA = {"index.html": "text/html; charset=utf-8", "ui.js": "text/javascript; charset=utf-8", "ui.css": "text/css; charset=utf-8"}

#: the encoder when no model is named: the checkpoint ``ctxkit demo`` runs
DEFAULT_ENCODER = "all_minilm_l6_v2"

#: panel -> the role of :class:`UIModels` that answers it
PANELS = {"similarity": "encoder", "attention": "encoder", "fill-mask": "fill_mask", "qa": "qa", "ner": "ner",
          "generate": "generator"}

# What a missing role's panel says, and which option fills it.
_HOW = {
    "encoder": "start ctxkit ui with --encoder NAME (a BERT-family checkpoint, Hub id or folder)",
    "fill_mask": "start ctxkit ui with --encoder NAME of a checkpoint with its masked-LM head (e.g. bert-base-uncased)",
    "qa": "start ctxkit ui with --qa RUN (a question-answering run of ctxkit finetune squad, or a transformers "
          "*ForQuestionAnswering checkpoint)",
    "ner": "start ctxkit ui with --ner RUN (an NER run of ctxkit finetune conll2003, or a transformers "
           "*ForTokenClassification checkpoint)",
    "generator": "start ctxkit ui with --generator GPT2 (an lm-train run, a GPT-2 folder, or gpt2)",
}


@dataclass
class UIModels:
    """The models behind the panels; a role left None has a message instead.

    Attributes:
        encoder: ``(model, tokenizer)`` of a BERT-family encoder: similarities and attention.
        fill_mask: a ``fill-mask`` pipeline (the encoder with its masked-LM head).
        qa: a ``question-answering`` pipeline.
        ner: a ``ner`` pipeline.
        generator: ``(model, tokenizer)`` of a GPT-2.
        names: role -> the model's name shown on the page (a folder's name, never its path).
        why_not: role -> why it has no model (the page shows it in the panel).
    """

    encoder: Optional[Tuple[torch.nn.Module, Any]] = None
    fill_mask: Any = None
    qa: Any = None
    ner: Any = None
    generator: Optional[Tuple[torch.nn.Module, Any]] = None
    names: Dict[str, str] = field(default_factory=dict)
    why_not: Dict[str, str] = field(default_factory=dict)

    def message(self, role: str) -> str:
        """Why ``role`` has no model, and how to give it one."""
        return self.why_not.get(role) or f"no model for this panel: {_HOW[role]}"


def _shown(name: str) -> str:
    """A model's name for the page: a folder's own name (its path stays on this host)."""
    path = Path(str(name))
    return path.resolve().name if path.exists() else str(name)


def model_role(name: str) -> str:
    """Which role a model plays: ``"generator"`` (a GPT-2), ``"qa"`` or ``"ner"`` (a run
    folder or transformers task checkpoint of that task), else ``"encoder"``.

    Raises:
        UserError: a run of another task (text classification has no panel).
    """
    if causal_lm_folder(name) is not None:
        return "generator"
    if not Path(str(name)).exists():  # a checkpoint name or Hub id: task checkpoints come with --qa / --ner
        return "encoder"
    try:
        task, info = load_task(name)
    except (UserError, OSError, ValueError):  # not a run: a model folder
        return "encoder"
    kind = info.get("hf_task") or task.name
    if kind in QuestionAnsweringPipeline.kinds:
        return "qa"
    if kind in TokenClassificationPipeline.kinds:
        return "ner"
    raise UserError(f"{name} is a {kind} run; ctxkit ui shows question-answering and NER runs (--qa, --ner), "
                    "encoders (--encoder) and GPT-2s (--generator)")


def load_ui_models(model: Optional[str] = None, encoder: Optional[str] = None, generator: Optional[str] = None,
                   qa: Optional[str] = None, ner: Optional[str] = None, device: str = "auto") -> UIModels:
    """Load the models the page shows.

    Args:
        model: the model at hand, put where it fits (:func:`model_role`).
        encoder: a BERT-family encoder (name, Hub id or folder): similarities, attention,
            and fill-mask when its checkpoint has the masked-LM head.
        generator: a GPT-2 (an ``lm-train`` run, a folder, ``gpt2``).
        qa: a question-answering run (or transformers checkpoint).
        ner: an NER run (or transformers checkpoint).
        device: where the models run.

    Returns:
        The models; with none named at all, the encoder is :data:`DEFAULT_ENCODER`.

    Raises:
        UserError: a model that does not load, or two models for one role.
    """
    asked: Dict[str, Optional[str]] = {"encoder": encoder, "generator": generator, "qa": qa, "ner": ner}
    roles_of_model = None
    if model is not None:
        role = model_role(model)
        if asked[role] is not None:
            raise UserError(f"MODEL {model} is a {role} and --{role} names {asked[role]}: give one of them")
        asked[role], roles_of_model = model, role
    if not any(asked.values()):
        asked["encoder"] = DEFAULT_ENCODER
    dev = str(resolve_device(device))
    out = UIModels()
    if asked["encoder"]:
        _load_encoder(out, asked["encoder"], dev)
    if asked["qa"]:
        out.qa = pipeline("question-answering", asked["qa"], device=dev)
        out.names["qa"] = _shown(asked["qa"])
    if asked["ner"]:
        out.ner = pipeline("ner", asked["ner"], device=dev, aggregation_strategy="simple")
        out.names["ner"] = _shown(asked["ner"])
    if asked["generator"]:
        folder = causal_lm_folder(asked["generator"])
        if folder is None:
            raise UserError(f"--generator {asked['generator']}: not a GPT-2 (an lm-train run, a GPT-2 folder, or gpt2)")
        out.generator = load_causal_lm(folder, dev)
        out.names["generator"] = _shown(asked["generator"])
    if roles_of_model is not None:  # the panels the model at hand cannot fill say so in its words
        what = {"encoder": "an encoder", "generator": "a GPT-2 language model", "qa": "a question-answering run",
                "ner": "an NER run"}[roles_of_model]
        shown = _shown(model)
        for role, does in (("generator", "does not generate text"), ("encoder", "is no encoder to compare or show attention of"),
                           ("qa", "does not answer questions"), ("ner", "does not tag entities")):
            if role != roles_of_model and asked[role] is None:
                out.why_not.setdefault(role, f"{shown} is {what}: it {does}; {_HOW[role]}")
    return out


def _load_encoder(out: UIModels, name: str, device: str) -> None:
    """The encoder, through the fill-mask pipeline when its checkpoint has the masked-LM head
    (one copy of the weights serves both), else alone."""
    out.names["encoder"] = out.names["fill_mask"] = _shown(name)
    try:
        fill = pipeline("fill-mask", name, device=device)
    except UserError as err:
        if "masked-LM head" not in str(err):  # a name that does not load at all: said as it is
            raise
        fill = None
    body = getattr(getattr(fill, "model", None), "bert", None)
    if body is not None:
        out.fill_mask, out.encoder = fill, (body, fill.tokenizer)
        return
    out.why_not["fill_mask"] = f"{_shown(name)} has no masked-LM head in its checkpoint; {_HOW['fill_mask']}"
    net, tokenizer = get_model(name, device=device)
    if tokenizer is None:
        raise UserError(f"--encoder {name}: a model without a vocabulary (an untrained preset?); name a checkpoint")
    out.encoder = (net, tokenizer)


def _plain(value, digits: int = 4):
    """Arrays and floats as JSON: rounded, NaN as null (JSON has no NaN)."""
    if isinstance(value, np.ndarray):
        return _plain(np.round(value.astype(np.float64), digits).tolist(), digits)
    if isinstance(value, dict):
        return {k: _plain(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, digits) for v in value]
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else round(float(value), digits)
    return value


def _request_models(max_text_chars: int, max_new_tokens: int):
    """The request bodies (pydantic, from the serve extra: imported when the app is built)."""
    from pydantic import BaseModel, ConfigDict, Field

    # (class bodies cannot see a function's names that they redefine: text, max_new_tokens)
    bounded, most_new = dict(min_length=1, max_length=max_text_chars), max_new_tokens

    class SimilarityRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        word: str = Field(min_length=1, max_length=100, examples=["bank"])
        sentences: List[str] = Field(min_length=2, max_length=32)
        senses: Optional[List[str]] = Field(None, description="one sense name per sentence")

    class TextRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        text: str = Field(**bounded)

    class FillMaskRequest(TextRequest):
        top_k: int = Field(5, ge=1, le=50)

    class QARequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        question: str = Field(**bounded)
        context: str = Field(**bounded)

    class GenerateRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        prompt: str = Field(**bounded)
        max_new_tokens: int = Field(48, ge=1, le=most_new)
        temperature: float = Field(1.0, ge=0.0, le=10.0, description="0: greedy")
        top_k: int = Field(0, ge=0)
        top_p: float = Field(1.0, gt=0.0, le=1.0)
        seed: Optional[int] = Field(None, ge=0, le=2**63 - 1)

    return SimilarityRequest, TextRequest, FillMaskRequest, QARequest, GenerateRequest


def create_ui_app(models: UIModels, max_text_chars: int = 4000, max_new_tokens: int = 256, max_attention_tokens: int = 64):
    """The page and its JSON routes (see the module docstring) over ``models``.

    Args:
        models: what answers the panels (:func:`load_ui_models`, or built by hand).
        max_text_chars: the longest text, question, context or prompt.
        max_new_tokens: the most tokens one generation may ask for.
        max_attention_tokens: the longest text the attention panel draws (its answer grows
            with the square of the length, times layers and heads).
    """
    require_all(SERVE_NEEDS, "ctxkit ui")
    from fastapi import FastAPI, HTTPException  # lazy: the serve extra
    from fastapi.responses import Response, StreamingResponse

    SimilarityRequest, TextRequest, FillMaskRequest, QARequest, GenerateRequest = _request_models(  # noqa: N806 (classes)
        max_text_chars, max_new_tokens)
    # No /docs or /redoc: FastAPI's pages load their scripts from a CDN, and this app fetches
    # nothing from elsewhere (its schema stays at /openapi.json).
    app = FastAPI(title="ctxkit ui", description="The demo page's routes (ctxkit ui).", docs_url=None, redoc_url=None)
    # One request at a time per model: the routes run on the server's thread pool, and a
    # model's forward passes (and the generator's KV cache) are not shared between threads.
    locks = {role: threading.Lock() for role in set(PANELS.values())}

    def run(role: str, work):
        if getattr(models, role) is None:
            raise HTTPException(404, models.message(role))
        with locks[role]:
            try:
                return work(getattr(models, role))
            except UserError as err:  # the input cannot be answered (no [MASK], a word not in the text, ...)
                raise HTTPException(422, str(err)) from None

    def asset(name: str) -> Response:
        return Response((ASSETS / name).read_bytes(), media_type=_MEDIA[name], headers={"Cache-Control": "no-cache"})

    @app.get("/", include_in_schema=False)
    def page():
        return asset("index.html")

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str):
        if name not in _MEDIA or name == "index.html":
            raise HTTPException(404, f"no file {name}")
        return asset(name)

    @app.get("/api/info")
    def info():
        panels = {}
        for panel, role in PANELS.items():
            there = getattr(models, role) is not None
            panels[panel] = {"available": there, "model": models.names.get(role) if there else None,
                             "message": None if there else models.message(role)}
        return {"panels": panels, "demo_words": DEMO_WORDS,
                "limits": {"max_text_chars": max_text_chars, "max_new_tokens": max_new_tokens,
                           "max_attention_tokens": max_attention_tokens}}

    @app.post("/api/similarity")
    def similarity(body: SimilarityRequest):
        def work(encoder):
            net, tokenizer = encoder
            if any(len(s) > max_text_chars for s in body.sentences):
                raise UserError(f"a sentence is longer than {max_text_chars} characters")
            return _plain(word_similarities(net, tokenizer, body.sentences, body.word, senses=body.senses))

        return run("encoder", work)

    @app.post("/api/attention")
    def attention(body: TextRequest):
        def work(encoder):
            tokens, weights = attention_maps(*encoder, body.text, max_tokens=max_attention_tokens)
            return {"tokens": tokens, "layers": weights.shape[0], "heads": weights.shape[1], "weights": _plain(weights, 3)}

        return run("encoder", work)

    @app.post("/api/fill-mask")
    def fill_mask(body: FillMaskRequest):
        return run("fill_mask", lambda fill: {"candidates": _plain(fill(body.text, top_k=body.top_k))})

    @app.post("/api/qa")
    def qa(body: QARequest):
        return run("qa", lambda answer: _plain(answer(question=body.question, context=body.context)))

    @app.post("/api/ner")
    def ner(body: TextRequest):
        return run("ner", lambda tag: {"entities": _plain(tag(body.text))})

    @app.post("/api/generate")
    async def generate_route(body: GenerateRequest):
        if models.generator is None:
            raise HTTPException(404, models.message("generator"))
        model, tokenizer = models.generator
        try:
            request = _GenerationRequest(model, tokenizer, body, asyncio.get_running_loop())
        except UserError as err:
            raise HTTPException(422, str(err)) from None
        threading.Thread(target=request.work, args=(locks["generator"],), name="ctxkit-ui-generate", daemon=True).start()
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy may hold the pieces back
        return StreamingResponse(request.events(), media_type="text/event-stream", headers=headers)

    app.state.models = models
    return app


class _GenerationRequest:
    """One streamed generation: :func:`~ctxkit.decoding.generate` on a thread of its own, each
    token's text handed to the event loop as it is chosen; a client that goes away ends it at
    the next token."""

    def __init__(self, model, tokenizer, body, loop: asyncio.AbstractEventLoop):
        self.model, self.tokenizer, self.loop = model, tokenizer, loop
        self.ids = list(tokenizer.encode(body.prompt))
        if not self.ids:
            raise UserError("the prompt has no tokens")
        context = getattr(getattr(model, "config", None), "max_position", None)
        if context is not None and len(self.ids) + body.max_new_tokens > context:
            raise UserError(f"the prompt's {len(self.ids)} tokens and {body.max_new_tokens} new ones exceed the model's "
                            f"context of {context} tokens")
        self.eos = getattr(tokenizer, "eos_id", None)
        self.config = GenerationConfig(max_new_tokens=body.max_new_tokens, do_sample=body.temperature > 0,
                                       temperature=body.temperature or 1.0, top_k=body.top_k, top_p=body.top_p,
                                       eos_token_id=self.eos, pad_token_id=self.eos if self.eos is not None else 0)
        self.config.check()
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(body.seed if body.seed is not None else int(torch.randint(2**62, (1,))))
        self.text = StopStringText(tokenizer)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.gone = threading.Event()
        self.count = 0
        self.reason = "length"

    def _send(self, kind: str, value) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))
        except RuntimeError:  # the server's loop closed (shutdown): nobody is listening
            self.gone.set()

    def _on_tokens(self, new: torch.Tensor):
        token = int(new[0])
        if self.eos is not None and token == self.eos:  # generate stops there; the end-of-text token shows no text
            self.reason = "stop"
            return None
        self.count += 1
        self._send("token", self.text.push(token))
        if self.gone.is_set():
            self.reason = "cancelled"
            return torch.ones(1, dtype=torch.bool)
        return None

    def work(self, lock: threading.Lock) -> None:
        try:
            with lock:
                if self.gone.is_set():
                    return
                prompt = torch.tensor([self.ids], device=self.device)
                generate(self.model, prompt, None, self.config, generator=self.generator, on_tokens=self._on_tokens)
            tail = self.text.flush()
            if tail:
                self._send("token", tail)
            self._send("end", {"done": True, "finish_reason": self.reason, "prompt_tokens": len(self.ids),
                               "completion_tokens": self.count, "text": self.text.text})
        except Exception as err:  # noqa: BLE001 - told to the page, which shows it in the panel
            self._send("error", f"{type(err).__name__}: {err}")

    async def events(self):
        """The server-sent events: one per token's text (and one for text held back to the
        end, if any), then the summary and ``[DONE]``."""
        index = 0
        try:
            while True:
                kind, value = await self.queue.get()
                if kind == "token":
                    yield f"data: {json.dumps({'text': value, 'index': index})}\n\n"
                    index += 1
                else:
                    yield f"data: {json.dumps(value if kind == 'end' else {'error': value})}\n\n"
                    break
            yield "data: [DONE]\n\n"
        finally:
            self.gone.set()  # ends a generation whose client went away, at its next token


def run_ui(app, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Serve the page until Ctrl-C (uvicorn, one process)."""
    import uvicorn  # lazy: the serve extra, imported when a server starts

    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
