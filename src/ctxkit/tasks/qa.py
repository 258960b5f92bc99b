"""Extractive question answering (SQuAD v1.1 and 2.0): a start vector and an end vector
score every passage token; long passages are read in overlapping windows.

No SQuAD training set is available offline, so the data protocol (``../shared/data``
README) splits a dev file by article in file order: the first ``train_articles``
articles train, the rest evaluate. This is an article split, not the official dev set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

import numpy as np
from torch import nn

from ..data.qa import make_features, postprocess
from ..data.squad import QAExample, read_squad
from ..heads.span import SpanQAModel
from ..metrics import squad_v1, squad_v2
from ..training import predict
from .base import Task

__all__ = ["SquadTask", "split_articles_in_order"]

_FILES = {1: ("dev-v1.1.json", "dev-v1.1.json.zip"), 2: ("dev-v2.0.json",)}
_TRAIN_ARTICLES = {1: 38, 2: 12}


def split_articles_in_order(examples: List, train_articles: int):
    """First ``train_articles`` article titles (in file order) vs the rest."""
    titles: List[str] = []
    for e in examples:
        if not titles or titles[-1] != e.title:
            if e.title in titles:
                raise ValueError(f"article {e.title!r} is not contiguous in the file")
            titles.append(e.title)
    train_titles = set(titles[:train_articles])
    return [e for e in examples if e.title in train_titles], [e for e in examples if e.title not in train_titles]


class SquadTask(Task):
    """SQuAD-style extractive QA.

    Args:
        version: 1 (every question answerable) or 2 (unanswerable questions too).
        max_seq_len: tokens per window.
        doc_stride: step between window starts, in context tokens.
        max_query_len: question tokens kept.
        n_best: candidate starts/ends per window.
        max_answer_len: longest answer in tokens.
        null_threshold: SQuAD 2.0: answer "" when null score - best span score exceeds it.
        train_articles: articles (in file order) used for training.
    """

    main_metric = "f1"
    eval_splits = ("dev",)

    def __init__(self, version: int = 1, max_seq_len: int = 384, doc_stride: int = 128, max_query_len: int = 64,
                 n_best: int = 20, max_answer_len: int = 30, null_threshold: float = 0.0, train_articles: Optional[int] = None):
        if version not in (1, 2):
            raise ValueError(f"SQuAD version must be 1 or 2, got {version}")
        self.version = version
        self.name = "squad" if version == 1 else "squad2"
        self.max_seq_len, self.doc_stride, self.max_query_len = max_seq_len, doc_stride, max_query_len
        self.n_best, self.max_answer_len, self.null_threshold = n_best, max_answer_len, null_threshold
        self.train_articles = _TRAIN_ARTICLES[version] if train_articles is None else train_articles

    def options(self) -> dict:
        return {k: getattr(self, k) for k in ("version", "max_seq_len", "doc_stride", "max_query_len", "n_best", "max_answer_len", "null_threshold", "train_articles")}

    def _file(self, data: os.PathLike) -> Path:
        data = Path(data)
        if data.is_file():
            return data
        for name in _FILES[self.version]:
            if (data / name).is_file():
                return data / name
        raise FileNotFoundError(f"{data}: none of {', '.join(_FILES[self.version])}")

    def load(self, data: os.PathLike, split: str) -> list:
        examples = read_squad(self._file(data))
        if split == "all":
            return list(examples)
        train, dev = split_articles_in_order(examples, self.train_articles)
        if split == "train":
            return train
        if split == "dev":
            return dev
        raise ValueError(f"unknown split {split!r} for {self.name}: use train, dev or all")

    def build_model(self, encoder: nn.Module) -> nn.Module:
        return SpanQAModel(encoder)

    def featurize(self, tokenizer, examples: list, train: bool) -> List[dict]:
        feats = make_features(tokenizer, examples, self.max_seq_len, self.doc_stride, self.max_query_len, train=train)
        if train:
            return [f.as_inputs() for f in feats]
        return feats  # QAFeature objects: postprocess needs their offsets

    def _answer(self, model, tokenizer, examples, batch_size, device):
        feats = self.featurize(tokenizer, examples, train=False)
        logits = predict(model, [f.as_inputs() for f in feats], batch_size, device)
        return postprocess(examples, feats, logits, n_best=self.n_best, max_answer_len=self.max_answer_len,
                           null_threshold=self.null_threshold, version_2=self.version == 2)

    def evaluate(self, model, tokenizer, examples, batch_size=128, device="auto"):
        preds = self._answer(model, tokenizer, examples, batch_size, device)
        texts = {q: p.text for q, p in preds.items()}
        if self.version == 1:
            return squad_v1(texts, examples), preds
        na = {q: float(np.clip(p.null_score_diff, -1e9, 1e9)) for q, p in preds.items()}
        # An infinite threshold scores the predictions as made; na_probs (the null-score
        # margins) only feed the official best-threshold search.
        return squad_v2(texts, examples, na_probs=na, na_prob_thresh=float("inf")), preds

    def predict_lines(self, model, tokenizer, lines, batch_size=64, device="auto") -> List[dict]:
        examples = []
        for i, line in enumerate(lines):
            try:
                record = json.loads(line)
                question, context = record["question"], record["context"]
            except (json.JSONDecodeError, KeyError, TypeError):
                question, sep, context = line.partition("\t")
                if not sep:
                    raise ValueError(f"input line {i + 1}: expected JSON {{\"question\", \"context\"}} or 'question<TAB>context'") from None
            examples.append(QAExample(f"q{i}", "", question, context, [], False))
        preds = self._answer(model, tokenizer, examples, batch_size, device)
        return [
            {"question": e.question, "answer": preds[e.qid].text, "score": round(float(preds[e.qid].score), 4),
             "start": preds[e.qid].start_char, "end": preds[e.qid].end_char}
            for e in examples
        ]
