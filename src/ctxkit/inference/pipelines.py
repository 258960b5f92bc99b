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
                                            ``aggregation_strategy="simple"``:
                                            ``[{"entity_group", "score", "word", "start", "end"}]``
``question-answering``                      ``{"score", "start", "end", "answer"}`` (long
                                            contexts in windows of ``doc_stride``)
``fill-mask``                               ``[{"score", "token", "token_str", "sequence"}]``,
                                            ``top_k`` (5) best fillers of the ``[MASK]``
``feature-extraction``                      ``[[hidden vector per token]]`` (``(1, seq, hidden)``)
``text-generation``                         ``[{"generated_text"}]`` (prompt + continuation)
==========================================  ===================================================

A list of inputs gives a list of those. ``model`` is any name ctxkit loads: a run folder, a
transformers task checkpoint (folder or Hub id) for the three task pipelines; a zoo name, Hub
id or folder for the others. Inputs are batched by length; the model runs its fast plan
(``fast``, default ``auto``). ``score`` is a probability (softmax) everywhere except question
answering, where it is ctxkit's span score (see :class:`~ctxkit.tasks.qa.SquadTask`).
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

import numpy as np
import torch

from ..core.errors import UserError
from ..core.run_state import resolve_device
from ..data.batching import collate
from ..data.glue import TextExample
from ..decoding import GenerationConfig, generate, left_pad
from ..tasks import load_run
from ..zoo import get_model

__all__ = ["pipeline", "PIPELINE_TASKS"]

#: task name -> aliases transformers accepts too
PIPELINE_TASKS = {
    "text-classification": ("sentiment-analysis",),
    "token-classification": ("ner",),
    "question-answering": (),
    "fill-mask": (),
    "feature-extraction": (),
    "text-generation": (),
}
_ALIASES = {alias: name for name, aliases in PIPELINE_TASKS.items() for alias in (name, *aliases)}


def pipeline(task: str, model: Any = None, device: str = "auto", fast: str = "auto", batch_size: int = 32, **defaults):
    """A callable for ``task`` (see the module docstring) over ``model``.

    Args:
        task: a pipeline name or alias (``sentiment-analysis``, ``ner``).
        model: what to load (a name, Hub id, folder or run folder); required.
        device: ``auto``, ``cpu``, ``cuda``...
        fast: the fast plan the model runs (``auto``: the fastest exact one here).
        batch_size: inputs per forward pass.
        defaults: call options every call gets (``top_k``, ``aggregation_strategy``, ...).

    Raises:
        UserError: an unknown task (with the known ones), or no model.
    """
    name = _ALIASES.get(str(task).lower())
    if name is None:
        raise UserError(f"unknown pipeline task {task!r}; known: {', '.join(sorted(_ALIASES))}")
    if model is None:
        raise UserError(f"pipeline({task!r}) needs model=: a run folder, a transformers task checkpoint, a zoo name or a Hub id")
    cls = {"text-classification": TextClassificationPipeline, "token-classification": TokenClassificationPipeline,
           "question-answering": QuestionAnsweringPipeline, "fill-mask": FillMaskPipeline,
           "feature-extraction": FeatureExtractionPipeline, "text-generation": TextGenerationPipeline}[name]
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
        if aggregation_strategy not in ("none", "simple"):
            raise UserError(f"aggregation_strategy {aggregation_strategy!r}: ctxkit has 'none' and 'simple'")
        limit = getattr(self.task_obj, "max_length", 512)
        encs = self.tokenizer.encode_batch(list(items), max_length=limit, padding=None)
        logits = _token_logits(self.model, encs, self.batch_size, self.device)
        labels = self.task_obj.labels
        out = []
        for text, enc, lg in zip(items, encs, logits):
            z = lg - lg.max(-1, keepdims=True)
            probs = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
            tokens = []
            for i, (tok, (start, end), seq) in enumerate(zip(enc.tokens, enc.offsets, enc.sequence_ids)):
                if seq is None:
                    continue  # [CLS], [SEP]
                best = int(probs[i].argmax())
                tokens.append({"entity": labels[best], "score": float(probs[i, best]), "index": i, "word": tok,
                               "start": start, "end": end})
            if aggregation_strategy == "simple":
                out.append([g for g in _group(tokens, text, self.tokenizer) if g["entity_group"] not in ignore_labels])
            else:
                out.append([t for t in tokens if t["entity"] not in ignore_labels])
        return out


@torch.inference_mode()
def _token_logits(model, encs: list, batch_size: int, device) -> list:
    """Per-token logits ``(len, labels)`` of each encoding (length-sorted batches)."""
    return _by_length(model, encs, batch_size, device,
                      lambda result, row, enc: result["logits"][row, : len(enc.input_ids)].float().cpu().numpy())


def _group(tokens: list, text: str, tokenizer) -> list:
    """transformers' ``simple`` aggregation: consecutive tokens of one entity type (a ``B-``
    starts a new entity), the mean of their scores, the words decoded, the characters spanned."""
    groups, current = [], []

    def close():
        if current:
            tag = current[0]["entity"]
            groups.append({"entity_group": tag.split("-", 1)[-1] if tag[:2] in ("B-", "I-") else tag,
                           "score": float(np.mean([t["score"] for t in current])),
                           "word": tokenizer.backend.decoder.decode([t["word"] for t in current])
                           if tokenizer.backend.decoder is not None else " ".join(t["word"] for t in current),
                           "start": current[0]["start"], "end": current[-1]["end"]})

    for t in tokens:
        bi, kind = (t["entity"][0], t["entity"][2:]) if t["entity"][:2] in ("B-", "I-") else ("I", t["entity"])
        prev = current[-1]["entity"] if current else None
        prev_kind = (prev[2:] if prev[:2] in ("B-", "I-") else prev) if prev else None
        if current and (bi == "B" or kind != prev_kind):
            close()
            current = []
        current.append(t)
    close()
    return groups


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
    with_heads = True

    @torch.inference_mode()
    def _run(self, items, top_k: int = 5, **_) -> list:
        mask_id = self.tokenizer.token_to_id("[MASK]")
        encs = [self.tokenizer.encode(text) for text in items]
        for text, enc in zip(items, encs):
            found = sum(t == mask_id for t in enc.input_ids)
            if found != 1:
                raise UserError(f"fill-mask needs exactly one [MASK] in each text, found {found} in {text!r}")

        def fill(result, row, enc):
            where = enc.input_ids.index(mask_id)
            scores, tokens = result[0][row, where].float().softmax(-1).topk(top_k)
            rows = []
            for score, token in zip(scores.tolist(), tokens.tolist()):
                filled = list(enc.input_ids)
                filled[where] = token
                rows.append({"score": score, "token": token, "token_str": self.tokenizer.decode([token], skip_special_tokens=False),
                             "sequence": self.tokenizer.decode(filled, skip_special_tokens=True)})
            return rows

        return _by_length(self.model, encs, self.batch_size, self.device, fill)


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

    def _run(self, items, max_new_tokens: int = 50, do_sample: bool = False, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, seed: Optional[int] = None, return_full_text: bool = True, **_) -> list:
        if seed is not None:
            torch.manual_seed(seed)
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                                  top_p=top_p)
        out = []
        for text in items:
            prompt = self.tokenizer.encode_batch([text])[0]
            ids, mask = left_pad([list(prompt)])
            tokens = generate(self.model, ids.to(self.device), mask.to(self.device), config)
            new = self.tokenizer.decode(tokens[0, ids.size(1):].tolist())
            out.append([{"generated_text": (text + new) if return_full_text else new}])
        return out
