"""``ctxkit.pipeline(task, model=...)``: transformers' ``pipeline`` habit over ctxkit's models.

Each pipeline takes one text (or one question/context pair) or a list of them, with
transformers' argument names, and answers with transformers' output shapes and keys:

==========================================  ===================================================
task (aliases)                              one input gives
==========================================  ===================================================
``text-classification`` (sentiment-        ``[{"label", "score"}]``; ``top_k=k``: the k best,
analysis)                                   ``top_k=None``: every label, best first
``token-classification`` (``ner``)          ``[{"entity", "score", "index", "word", "start",
                                            "end"}]`` per non-``O`` token; with
                                            ``aggregation_strategy`` ``"simple"``, ``"first"``,
                                            ``"average"`` or ``"max"``: ``[{"entity_group",
                                            "score", "word", "start", "end"}]`` (see
                                            :mod:`~ctxkit.inference.token_groups`)
``question-answering``                      ``{"score", "start", "end", "answer"}`` (long
                                            contexts in windows of ``doc_stride``)
``fill-mask``                               ``[{"score", "token", "token_str", "sequence"}]``,
                                            ``top_k`` (5) best fillers of the ``[MASK]``;
                                            ``targets=[...]``: among those words only
``feature-extraction``                      ``[[hidden vector per token]]`` (``(1, seq, hidden)``)
``text-generation``                         ``[{"generated_text"}]`` (prompt + continuation);
                                            ``streamer=``: each token to ``put``, as
                                            transformers' streamers take them; ``stream=True``:
                                            an iterator of the continuation's text pieces
``translation`` (``translation_de_to_en``,  ``[{"translation_text"}]`` (a list of texts: one
any ``translation_X_to_Y``)                 dict each), as ``ctxkit translate`` decodes it
                                            (``num_beams``, default 1: greedy)
==========================================  ===================================================

A list of inputs gives a list of those. ``model`` is any name ctxkit loads: a run folder, a
transformers task checkpoint (folder or Hub id) for the three task pipelines; a zoo name, Hub
id or folder for the others (fill-mask: a checkpoint with the MLM head, transformers'
``BertForPreTraining``, ``BertForMaskedLM`` or ``DistilBertForMaskedLM``); a ``translate-train``
run or saved model folder for translation. Inputs are batched by length; the model runs its
fast plan (``fast``, default ``auto``). ``score`` is a probability (softmax) everywhere except question
answering, where it is ctxkit's span score (see :class:`~ctxkit.tasks.qa.SquadTask`).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch

from ..core.errors import UserError
from ..core.run_state import resolve_device
from ..data.batching import collate
from ..data.glue import TextExample
from ..decoding import GenerationConfig, TextIteratorStreamer, generate, left_pad, streamer_hook
from ..tasks import load_run
from ..tasks.translation import load_translator, translate
from ..zoo import get_model
from .token_groups import STRATEGIES, aggregate, token_entities

__all__ = ["pipeline", "PIPELINE_TASKS"]

logger = logging.getLogger("ctxkit")

#: task name -> aliases transformers accepts too
PIPELINE_TASKS = {
    "text-classification": ("sentiment-analysis",),
    "token-classification": ("ner",),
    "question-answering": (),
    "fill-mask": (),
    "feature-extraction": (),
    "text-generation": (),
    "translation": (),
}
_ALIASES = {alias: name for name, aliases in PIPELINE_TASKS.items() for alias in (name, *aliases)}
_TRANSLATION_PAIR = re.compile(r"translation_\w+_to_\w+")  # transformers' translation_en_to_de: the model knows its pair


def pipeline(task: str, model: Any = None, device: str = "auto", fast: str = "auto", batch_size: int = 32, **defaults):
    """A callable for ``task`` (see the module docstring) over ``model``.

    Args:
        task: a pipeline name or alias (``sentiment-analysis``, ``ner``).
        model: what to load (a name, Hub id, folder or run folder); required.
        device: ``auto``, ``cpu``, ``cuda``...
        fast: the fast plan the model runs (``auto``: the fastest exact one here).
        batch_size: inputs per forward pass.
        defaults: call options every call gets (``top_k``, ``aggregation_strategy``, ``streamer``, ...).

    Raises:
        UserError: an unknown task (with the known ones), or no model.
    """
    name = _ALIASES.get(str(task).lower()) or ("translation" if _TRANSLATION_PAIR.fullmatch(str(task).lower()) else None)
    if name is None:
        raise UserError(f"unknown pipeline task {task!r}; known: {', '.join(sorted(_ALIASES))}")
    if model is None:
        raise UserError(f"pipeline({task!r}) needs model=: a run folder, a transformers task checkpoint, a zoo name or a Hub id")
    cls = {"text-classification": TextClassificationPipeline, "token-classification": TokenClassificationPipeline,
           "question-answering": QuestionAnsweringPipeline, "fill-mask": FillMaskPipeline,
           "feature-extraction": FeatureExtractionPipeline, "text-generation": TextGenerationPipeline,
           "translation": TranslationPipeline}[name]
    return cls(model, resolve_device(device), fast, batch_size, defaults)


class _Pipeline:
    task = ""

    def __init__(self, model, device, fast, batch_size, defaults):
        self.device, self.fast, self.batch_size, self.defaults = device, fast, batch_size, defaults
        self._load(model)

    def __call__(self, inputs, **options):
        single = isinstance(inputs, (str, dict))
        items = [inputs] if single else list(inputs)
        out = self._run(items, **{**self.defaults, **options})
        return out[0] if single else out

    def _load(self, model):
        raise NotImplementedError

    def _run(self, items: list, **options) -> list:
        raise NotImplementedError


class _TaskPipeline(_Pipeline):
    """The three pipelines over a fine-tuned run (or a transformers task checkpoint)."""

    kinds: tuple = ()

    def _load(self, model):
        self.task_obj, self.model, self.tokenizer, self.info = load_run(model, str(self.device), fast=self.fast)
        if self.task_obj.name not in self.kinds and not any(k in self.kinds for k in (self.info.get("hf_task"),)):
            raise UserError(f"{model} is a {self.task_obj.name} run; the {self.task} pipeline needs a "
                            f"{' or '.join(self.kinds)} model")


class TextClassificationPipeline(_TaskPipeline):
    task = "text-classification"
    kinds = ("sequence",)

    def _load(self, model):
        self.task_obj, self.model, self.tokenizer, self.info = load_run(model, str(self.device), fast=self.fast)
        if not hasattr(self.task_obj, "is_regression"):
            raise UserError(f"{model} is a {self.task_obj.name} run; text-classification needs a sentence classifier")

    def _run(self, items, top_k: Optional[int] = 1, function_to_apply: str = "default", **_) -> list:
        examples = [TextExample(t["text"], t.get("text_pair"), None, "") if isinstance(t, dict) else TextExample(t, None, None, "")
                    for t in items]
        task = self.task_obj
        logits = task._outputs(self.model, self.tokenizer, examples, self.batch_size, str(self.device))
        out = []
        for row in logits:
            if task.is_regression:
                ranked = [{"label": "LABEL_0", "score": float(row)}]
            else:
                z = np.exp(row - row.max())
                scores = row if function_to_apply == "none" else z / z.sum()
                ranked = [{"label": task.labels[i], "score": float(scores[i])} for i in np.argsort(-scores, kind="stable")]
            out.append(ranked[0] if top_k == 1 else ranked[: top_k or len(ranked)])
        return out

    def __call__(self, inputs, **options):
        # transformers: a single text with the default top_k gives a one-element list
        out = super().__call__(inputs, **options)
        top_k = {**self.defaults, **options}.get("top_k", 1)
        return [out] if isinstance(inputs, (str, dict)) and top_k == 1 else out


class TokenClassificationPipeline(_TaskPipeline):
    task = "token-classification"
    kinds = ("conll2003", "token")

    def _run(self, items, aggregation_strategy: str = "none", ignore_labels: Sequence[str] = ("O",), **_) -> list:
        if aggregation_strategy not in STRATEGIES:
            raise UserError(f"aggregation_strategy {aggregation_strategy!r}: ctxkit has {', '.join(map(repr, STRATEGIES))}")
        limit = getattr(self.task_obj, "max_length", 512)
        encs = self.tokenizer.encode_batch(list(items), max_length=limit, padding=None)
        logits = _token_logits(self.model, encs, self.batch_size, self.device)
        decoder = self.tokenizer.backend.decoder
        decode = decoder.decode if decoder is not None else " ".join
        out = []
        for text, enc, lg in zip(items, encs, logits):
            z = np.exp(lg - lg.max(-1, keepdims=True))
            tokens = token_entities(text, enc, z / z.sum(-1, keepdims=True), self.tokenizer)
            found = aggregate(tokens, aggregation_strategy, self.task_obj.labels, decode)
            out.append([e for e in found if e.get("entity", e.get("entity_group")) not in ignore_labels])
        return out


@torch.inference_mode()
def _token_logits(model, encs: list, batch_size: int, device) -> list:
    """Per-token logits ``(len, labels)`` of each encoding (length-sorted batches)."""
    return _by_length(model, encs, batch_size, device,
                      lambda result, row, enc: result["logits"][row, : len(enc.input_ids)].float().cpu().numpy())


class QuestionAnsweringPipeline(_TaskPipeline):
    task = "question-answering"
    kinds = ("squad", "qa")

    def _run(self, items, max_answer_len: Optional[int] = None, doc_stride: Optional[int] = None, **_) -> list:
        task = self.task_obj
        if max_answer_len is not None:
            task.max_answer_len = int(max_answer_len)
        if doc_stride is not None:
            task.doc_stride = int(doc_stride)
        lines = []
        for item in items:
            if not isinstance(item, dict) or "question" not in item or "context" not in item:
                raise UserError("question-answering takes {'question': ..., 'context': ...} (or a list of them)")
            lines.append(json.dumps({"question": item["question"], "context": item["context"]}))
        rows = task.predict_lines(self.model, self.tokenizer, lines, self.batch_size, str(self.device))
        return [{"score": r["score"], "start": r["start"], "end": r["end"], "answer": r["answer"]} for r in rows]

    def __call__(self, inputs=None, question=None, context=None, **options):
        if inputs is None:  # transformers' keyword form: qa(question=..., context=...)
            if isinstance(question, list):
                inputs = [{"question": q, "context": c} for q, c in zip(question, context)]
            else:
                inputs = {"question": question, "context": context}
        return super().__call__(inputs, **options)


class _ModelPipeline(_Pipeline):
    with_heads = False

    def _load(self, model):
        self.model, self.tokenizer = get_model(str(model), device=str(self.device), with_heads=self.with_heads)
        self.model.eval()


def _by_length(model, encs: list, batch_size: int, device, run) -> list:
    """``run(model outputs, row, encoding)`` for every encoding, in batches of similar lengths
    (longest first, padded to the longest of the batch), answers in input order."""
    order = sorted(range(len(encs)), key=lambda i: -len(encs[i].input_ids))
    out: list = [None] * len(encs)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        batch = collate([{"input_ids": encs[i].input_ids, "token_type_ids": encs[i].token_type_ids,
                          "attention_mask": encs[i].attention_mask} for i in idx])
        batch = {k: v.to(device) for k, v in batch.items()}
        result = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        for row, i in enumerate(idx):
            out[i] = run(result, row, encs[i])
    return out


class FillMaskPipeline(_ModelPipeline):
    task = "fill-mask"
    with_heads = True  # BertForPreTraining, or BertForMaskedLM for a checkpoint without the NSP head

    @torch.inference_mode()
    def _run(self, items, top_k: int = 5, targets=None, **_) -> list:
        mask_id = self.tokenizer.token_to_id("[MASK]")
        encs = [self.tokenizer.encode(text) for text in items]
        for text, enc in zip(items, encs):
            found = sum(t == mask_id for t in enc.input_ids)
            if found != 1:
                raise UserError(f"fill-mask needs exactly one [MASK] in each text, found {found} in {text!r}")
        allowed = None if targets is None else torch.tensor(self._target_ids(targets))
        if allowed is not None:
            top_k = min(top_k, len(allowed))

        def fill(result, row, enc):
            where = enc.input_ids.index(mask_id)
            probs = result[0][row, where].float().softmax(-1)  # over the whole vocabulary, targets or not
            if allowed is not None:
                probs = probs[allowed.to(probs.device)]
            scores, picks = probs.topk(top_k)
            rows = []
            for score, pick in zip(scores.tolist(), picks.tolist()):
                token = int(allowed[pick]) if allowed is not None else pick
                filled = list(enc.input_ids)
                filled[where] = token
                rows.append({"score": score, "token": token, "token_str": self.tokenizer.decode([token], skip_special_tokens=False),
                             "sequence": self.tokenizer.decode(filled, skip_special_tokens=True)})
            return rows

        return _by_length(self.model, encs, self.batch_size, self.device, fill)

    def _target_ids(self, targets) -> list:
        """transformers' ``targets``: each word's vocabulary id, else its first word piece's
        (with a warning); each id once.

        Raises:
            UserError: no target left.
        """
        ids = []
        for target in [targets] if isinstance(targets, str) else list(targets):
            token = self.tokenizer.token_to_id(target)
            if token is None:
                pieces = self.tokenizer.encode(target, add_special_tokens=False).input_ids
                if not pieces:
                    logger.warning("fill-mask target %r is no token of the vocabulary; left out", target)
                    continue
                token = pieces[0]
                logger.warning("fill-mask target %r is not in the vocabulary; using its first piece %r", target,
                               self.tokenizer.id_to_token(token))
            if token not in ids:
                ids.append(token)
        if not ids:
            raise UserError("fill-mask targets: none of them is in the vocabulary")
        return ids


class FeatureExtractionPipeline(_ModelPipeline):
    task = "feature-extraction"

    @torch.inference_mode()
    def _run(self, items, **_) -> list:
        encs = [self.tokenizer.encode(text) for text in items]
        return _by_length(self.model, encs, self.batch_size, self.device,
                          lambda result, row, enc: result.last_hidden_state[row:row + 1, : len(enc.input_ids)].float().cpu().tolist())


class TextGenerationPipeline(_Pipeline):
    task = "text-generation"

    def _load(self, model):
        self.model, self.tokenizer = get_model(str(model), device=str(self.device))
        self.model.eval()

    def __call__(self, inputs, **options):
        if {**self.defaults, **options}.get("stream"):
            return self._stream(inputs, {**self.defaults, **options})
        return super().__call__(inputs, **options)

    @staticmethod
    def _config(max_new_tokens: int = 50, do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                **_) -> GenerationConfig:
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                                  top_p=top_p)
        config.check()  # before a streamer hears of a prompt
        return config

    def _run(self, items, seed: Optional[int] = None, return_full_text: bool = True, streamer=None, **options) -> list:
        config = self._config(**options)
        if seed is not None:
            torch.manual_seed(seed)
        out = []
        for text in items:
            prompt = self.tokenizer.encode_batch([text])[0]
            ids, mask = left_pad([list(prompt)])
            if streamer is not None:
                streamer.put(ids)  # transformers' order: the prompt first (skip_prompt=True drops it)
            # Without a streamer no hook runs: the plain path keeps its speed (no per-token copy to the CPU)
            tokens = generate(self.model, ids.to(self.device), mask.to(self.device), config,
                              on_tokens=streamer_hook(streamer) if streamer is not None else None)
            if streamer is not None:
                streamer.end()
            new = self.tokenizer.decode(tokens[0, ids.size(1):].tolist())
            out.append([{"generated_text": (text + new) if return_full_text else new}])
        return out

    def _stream(self, text, options: dict) -> Iterator[str]:
        """``stream=True``: the continuation of one prompt as text pieces, generated on a
        thread meanwhile (an error there is raised here, after the pieces so far)."""
        if not isinstance(text, str):
            raise UserError("stream=True streams one prompt (a str); pass streamer= to stream a list")
        options = {k: v for k, v in options.items() if k not in ("stream", "streamer")}
        self._config(**options)  # a bad setting is refused here, not on the thread
        pieces = TextIteratorStreamer(self.tokenizer, skip_prompt=True)
        failed: list = []

        def work():
            try:
                self._run([text], streamer=pieces, **options)
            except BaseException as err:  # handed to the reading thread
                failed.append(err)
                pieces.end()

        worker = threading.Thread(target=work, name="ctxkit-pipeline-stream", daemon=True)
        worker.start()

        def read():
            yield from pieces
            worker.join()
            if failed:
                raise failed[0]

        return read()


class TranslationPipeline(_Pipeline):
    """Sentences through a ``translate-train`` model with :func:`ctxkit.tasks.translation.translate`."""

    task = "translation"

    def _load(self, model):
        self.model, self.tokenizer = load_translator(model)  # a run folder (its best/) or a saved model folder
        self.model.to(self.device).eval()

    def _run(self, items, num_beams: int = 1, max_new_tokens: Optional[int] = None, **_) -> list:
        if not all(isinstance(t, str) for t in items):
            raise UserError("translation takes a text or a list of texts")
        texts = translate(self.model, self.tokenizer, items, num_beams=num_beams, batch_size=self.batch_size,
                          max_new_tokens=max_new_tokens, device=str(self.device))
        return [{"translation_text": t} for t in texts]

    def __call__(self, inputs, **options):
        # transformers: a single text gives a one-element list, a list of texts one dict each
        out = super().__call__(inputs, **options)
        return [out] if isinstance(inputs, str) else out
