"""Extractive question answering (SQuAD v1.1 and 2.0): a start vector and an end vector
score every passage token; long passages are read in overlapping windows.

No SQuAD training set is available offline, so the data protocol (``../shared/data``
README) splits a dev file by article in file order: the first ``train_articles``
articles train, the rest evaluate. This is an article split, not the official dev set.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import List, Optional

import numpy as np
from torch import nn

from ..data.qa import make_features, postprocess
from ..data.squad import QAExample, read_squad
from ..heads.span import SpanQAModel
from .metrics import squad_v1, squad_v2
from ..training import predict
from .base import Task
from ..core.errors import MissingFileError, UserError

__all__ = ["SquadTask", "split_articles_in_order"]

_FILES = {1: ("dev-v1.1.json", "dev-v1.1.json.zip"), 2: ("dev-v2.0.json",)}


@functools.lru_cache(maxsize=2)
def _read_once(path: str, mtime_ns: int, size: int) -> tuple:
    """The file's examples, parsed once per version of the file: a run reads its training and
    evaluation articles from one file (SQuAD's dev set is ~0.5 s of parsing each time)."""
    return tuple(read_squad(path))
_TRAIN_ARTICLES = {1: 38, 2: 12}


def split_articles_in_order(examples: List, train_articles: int):
    """First ``train_articles`` article titles (in file order) vs the rest."""
    titles: List[str] = []
    for e in examples:
        if not titles or titles[-1] != e.title:
            if e.title in titles:
                raise UserError(f"article {e.title!r} is not contiguous in the file")
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
        train_articles: articles (in file order) used for training (default: the data
            protocol's 38 of SQuAD v1.1 dev, 12 of the v2.0 file).
        eval_articles: instead, the last N articles evaluate and all before them train
            (for your own file); a separate evaluation file is ``finetune(eval_data=...)``.
    """

    main_metric = "f1"
    eval_splits = ("dev",)
    splits_one_file = True

    def __init__(self, version: int = 1, max_seq_len: int = 384, doc_stride: int = 128, max_query_len: int = 64,
                 n_best: int = 20, max_answer_len: int = 30, null_threshold: float = 0.0, train_articles: Optional[int] = None,
                 eval_articles: Optional[int] = None):
        if version not in (1, 2):
            raise UserError(f"SQuAD version must be 1 or 2, got {version}")
        self.version = version
        self.name = "squad" if version == 1 else "squad2"
        self.max_seq_len, self.doc_stride, self.max_query_len = max_seq_len, doc_stride, max_query_len
        self.n_best, self.max_answer_len, self.null_threshold = n_best, max_answer_len, null_threshold
        if train_articles is not None and eval_articles is not None:
            raise UserError("give train_articles or eval_articles, not both")
        for name, value in (("train_articles", train_articles), ("eval_articles", eval_articles)):
            if value is not None and value < 1:
                raise UserError(f"{name} must be >= 1, got {value}")
        self.eval_articles = eval_articles
        self.train_articles = _TRAIN_ARTICLES[version] if train_articles is None and eval_articles is None else train_articles

    def options(self) -> dict:
        keys = ("version", "max_seq_len", "doc_stride", "max_query_len", "n_best", "max_answer_len", "null_threshold",
                "train_articles", "eval_articles")
        return {k: getattr(self, k) for k in keys}

    def describe_split(self, data: os.PathLike, split: str) -> str:
        try:
            path = self._file(data)
        except FileNotFoundError:
            return f"{data} ({split})"
        if split == "all":
            return str(path)
        if self.eval_articles is not None:
            return f"{path} ({split}: {'all but ' if split == 'train' else ''}the last {self.eval_articles} articles)"
        return f"{path} ({split}: {'the first' if split == 'train' else 'the articles after the first'} {self.train_articles} articles)"

    def _file(self, data: os.PathLike) -> Path:
        data = Path(data)
        if data.is_file():
            return data
        for name in _FILES[self.version]:
            if (data / name).is_file():
                return data / name
        raise MissingFileError(f"{data}: none of {', '.join(_FILES[self.version])}")

    def load(self, data: os.PathLike, split: str) -> list:
        path = self._file(data)
        stat = os.stat(path)
        examples = list(_read_once(str(path), stat.st_mtime_ns, stat.st_size))
        if split == "all":
            return list(examples)
        if split not in ("train", "dev"):
            raise UserError(f"unknown split {split!r} for {self.name}: use train, dev or all")
        n_articles = len(dict.fromkeys(e.title for e in examples))
        n_train = n_articles - self.eval_articles if self.eval_articles is not None else self.train_articles
        train, dev = split_articles_in_order(examples, max(n_train, 0))
        chosen = train if split == "train" else dev
        if not chosen and examples:
            how = (f"--eval-articles {self.eval_articles} leaves none to train on" if self.eval_articles is not None and split == "train"
                   else f"the article split trains on the first {n_train} and leaves none to evaluate" if split == "dev"
                   else f"the article split trains on the first {n_train}")
            raise UserError(f"{self._file(data)}: {n_articles} articles; {how}: pass --eval-articles N (the last N articles "
                            "evaluate) or --eval-data FILE (a separate evaluation file)")
        return chosen

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

    def input_format(self) -> str:
        return 'JSON {"question": ..., "context": ...}, or \'question<TAB>context\''

    def clean_input(self, lines, source, extra_columns="error") -> List[str]:
        for number, text in lines:
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                record = None
            if isinstance(record, dict):
                if not all(isinstance(record.get(k), str) for k in ("question", "context")):
                    raise UserError(f"{source}:{number}: a JSON input needs string fields \"question\" and \"context\"")
            elif "\t" not in text:
                raise UserError(f"{source}:{number}: expected {self.input_format()}")
        return [text for _, text in lines]

    def predict_lines(self, model, tokenizer, lines, batch_size=64, device="auto") -> List[dict]:
        examples = []
        for i, line in enumerate(lines):
            try:
                record = json.loads(line)
                question, context = record["question"], record["context"]
            except (json.JSONDecodeError, KeyError, TypeError):
                question, sep, context = line.partition("\t")
                if not sep:
                    raise UserError(f"input line {i + 1}: expected JSON {{\"question\", \"context\"}} or 'question<TAB>context'") from None
            examples.append(QAExample(f"q{i}", "", question, context, [], False))
        preds = self._answer(model, tokenizer, examples, batch_size, device)
        return [
            {"question": e.question, "answer": preds[e.qid].text, "score": round(float(preds[e.qid].score), 4),
             "start": preds[e.qid].start_char, "end": preds[e.qid].end_char}
            for e in examples
        ]
