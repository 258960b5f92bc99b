"""Sentence and sentence-pair classification/regression: GLUE tasks and the user's own
CSV/TSV/JSONL files. The [CLS] vector feeds a dense layer."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from torch import nn

from ..data.glue import get_glue_task, read_glue, read_table
from ..heads.classification import EncoderWithHead, SequenceClassificationHead
from .metrics import glue_metrics
from ..tokenizers import WordPieceTokenizer
from ..training import featurized_ahead, predict
from ..core.collector import collector_paused
from ..core.errors import MissingFileError, UserError
from ..core.run_state import resolve_device
from .base import Task
from .metrics import GLUE_MAIN_METRIC
from ..data.glue import TextExample

__all__ = ["GlueClassificationTask", "TableClassificationTask"]

logger = logging.getLogger("ctxkit")


class _TextTask(Task):
    """Shared featurisation, evaluation and prediction for text (pair) tasks."""

    labels: Optional[List[str]] = None
    metrics: Tuple[str, ...] = ("accuracy",)

    def requires(self) -> Tuple[str, ...]:
        names = set()
        for m in self.metrics:
            names.update(GLUE_MAIN_METRIC.get(m, (m,)))
        return tuple(sorted({"f1": "sklearn", "mcc": "sklearn", "pearson": "scipy", "spearman": "scipy"}[n]
                            for n in names if n in ("f1", "mcc", "pearson", "spearman")))
    max_length: int = 128

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    def build_model(self, encoder: nn.Module) -> nn.Module:
        num = 1 if self.is_regression else len(self.labels)
        return EncoderWithHead(encoder, SequenceClassificationHead(encoder.config.hidden_size, num, encoder.config.dropout),
                               cls_only=True)

    def featurize(self, tokenizer, examples: list, train: bool) -> List[dict]:
        with collector_paused():  # a dict and lists per text, all kept: collector passes would free nothing
            return self._featurize(tokenizer, examples)

    def _featurize(self, tokenizer, examples: list) -> List[dict]:
        texts = [e.text for e in examples]
        pairs = [e.text_pair for e in examples] if examples and examples[0].text_pair is not None else None
        if pairs is None and isinstance(tokenizer, WordPieceTokenizer) and tokenizer.single_segment_is_zero():
            # Single texts: the ids alone, in bulk; the mask is all ones and the segment ids all
            # zeros. Writing them costs less than reading them from each encoding (predict and
            # serve are bound by this per-text Python work on a GPU host).
            rows = []
            for ids, ex in zip(tokenizer.encode_ids(texts, self.max_length), examples):
                rows.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids), "labels": ex.label})
            return rows
        encs = tokenizer.encode_batch(texts, pairs, max_length=self.max_length, truncation="longest_first", padding=None)
        return [
            {"input_ids": enc.input_ids, "token_type_ids": enc.token_type_ids, "attention_mask": enc.attention_mask, "labels": ex.label}
            for enc, ex in zip(encs, examples)
        ]

    def _outputs(self, model, tokenizer, examples, batch_size, device) -> np.ndarray:
        chunk = 32 * batch_size
        singles = (bool(examples) and examples[0].text_pair is None and isinstance(tokenizer, WordPieceTokenizer)
                   and tokenizer.single_segment_is_zero())
        many_on_gpu = resolve_device(device).type == "cuda" and len(examples) > 2 * chunk
        cut = [0]
        if singles:
            # Single texts: one id array per chunk (a TokenBlock), no per-text objects; only the
            # text that can survive truncation is tokenized (ctxkit.tokenizers.bulk).
            def featurize(part):
                block = tokenizer.encode_block([e.text for e in part], self.max_length)
                cut[0] += block.truncated
                return block
        else:
            def featurize(part):
                return self.featurize(tokenizer, part, train=False)
        if many_on_gpu:  # the next chunk is tokenized by a helper thread while this one runs
            out = np.stack(predict(model, featurized_ahead(featurize, examples, chunk), batch_size, device, total=len(examples)))
        else:
            out = np.stack(predict(model, featurize(examples), batch_size, device))
        if cut[0]:  # one line for the whole input, not one per chunk
            logger.warning("truncated %d of %d inputs to max_length=%d (longest_first)", cut[0], len(examples), self.max_length)
        return out

    def evaluate(self, model, tokenizer, examples, batch_size=128, device="auto"):
        out = self._outputs(model, tokenizer, examples, batch_size, device)
        preds = out if self.is_regression else out.argmax(-1)
        gold = np.array([e.label for e in examples])
        return glue_metrics(self.metrics, preds, gold), preds

    # Whether examples are sentence pairs (None: unknown, a run folder from before this was recorded).
    pair: Optional[bool] = None

    def input_format(self) -> str:
        if self.pair is None:
            return "a text, or a pair as 'text<TAB>pair'"
        return "a pair as 'text<TAB>pair' (two tab-separated columns)" if self.pair else "one text (a single column; no tabs)"

    def clean_input(self, lines, source, extra_columns="error") -> List[str]:
        if self.pair is None:
            return [text for _, text in lines]
        want = 2 if self.pair else 1
        out, dropped = [], 0
        for number, text in lines:
            columns = text.split("\t")
            if len(columns) < want:
                raise UserError(f"{source}:{number}: one column, but {self.name} classifies sentence pairs: write 'text<TAB>pair'")
            if len(columns) > want:
                if extra_columns != "drop":
                    raise UserError(f"{source}:{number}: {len(columns)} tab-separated columns, but {self.name} reads "
                                    f"{self.input_format()}; a label column must not be given to predict "
                                    "(remove it, or pass --extra-columns drop)")
                columns, dropped = columns[:want], dropped + 1
            out.append("\t".join(columns))
        if dropped:
            logger.warning("%s: dropped the columns after column %d on %d line(s) (--extra-columns drop)", source, want, dropped)
        return out

    def predict_lines(self, model, tokenizer, lines, batch_size=64, device="auto") -> List[dict]:
        examples = []
        for line in lines:
            text, _, pair = line.partition("\t")
            examples.append(TextExample(text, pair if pair else None, None, ""))
        rows = []
        # Pairs and singles need separate batches (segment ids differ); keep input order.
        groups: Dict[bool, List[int]] = {}
        for i, e in enumerate(examples):
            groups.setdefault(e.text_pair is not None, []).append(i)
        outs: Dict[int, np.ndarray] = {}
        for idx in groups.values():
            for i, o in zip(idx, self._outputs(model, tokenizer, [examples[i] for i in idx], batch_size, device)):
                outs[i] = o
        if not examples:
            return rows
        out = np.stack([outs[i] for i in range(len(examples))])
        if self.is_regression:
            return [{"score": float(s)} for s in out.reshape(len(examples), -1)[:, 0].tolist()]
        # All rows at once: a server's model thread formats 256 answers per batch, and per-row
        # numpy calls cost as much as the rest of its Python work.
        probs = np.exp(out - out.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        for best, row in zip(out.argmax(-1).tolist(), probs.tolist()):
            rows.append({"label": self.labels[best], "probs": {l: round(p, 4) for l, p in zip(self.labels, row)}})
        return rows


class GlueClassificationTask(_TextTask):
    """A GLUE task read from the GLUE distribution files (``train.tsv``, ``dev.tsv``).

    Args:
        glue_task: GLUE name (``SST-2``, ``CoLA``, ``MRPC``, ``STS-B``, ``QQP``, ``MNLI``,
            ``QNLI``, ``RTE``, ``WNLI``).
        max_length: tokens per example after truncation (longest-first for pairs).
    """

    def __init__(self, glue_task: str, max_length: int = 128):
        spec = get_glue_task(glue_task)
        self.spec = spec
        self.name = spec.name.lower()
        self.labels = list(spec.labels) if spec.labels is not None else None
        self.metrics = tuple(spec.metrics)
        # The GLUE leaderboard's headline number per task.
        self.main_metric = {"mcc": "mcc", "pearson": "corr", "f1": "f1"}.get(spec.metrics[0], spec.metrics[0])
        self.eval_splits = spec.dev_splits
        self.max_length = max_length
        self.pair = spec.pair_column is not None

    def describe_split(self, data: os.PathLike, split: str) -> str:
        files = self.spec.files
        return str(Path(data) / files[split]) if split in files and Path(data).is_dir() else f"{data} ({split} split)"

    def options(self) -> dict:
        return {"max_length": self.max_length}

    def load(self, data: os.PathLike, split: str) -> list:
        return read_glue(self.spec, data, split=split)


class TableClassificationTask(_TextTask):
    """Your own data: ``train`` and ``dev`` files (``.csv``, ``.tsv`` or ``.jsonl``) in one
    folder, with columns ``text``, optional ``text_pair`` and ``label``. The label set is
    taken from the training file (floats mean regression).

    Args:
        labels: label strings (set from the training data when None).
        regression: force regression (None: inferred).
        max_length: tokens per example after truncation.
    """

    name = "table"

    def __init__(self, labels: Optional[Sequence[str]] = None, regression: Optional[bool] = None, max_length: int = 128,
                 pair: Optional[bool] = None):
        self.labels = list(labels) if labels is not None else None
        self.regression = regression
        self.max_length = max_length
        self.pair = pair

    @property
    def metrics(self) -> Tuple[str, ...]:  # type: ignore[override]
        return ("pearson", "spearman") if self.is_regression else ("accuracy",)

    @property
    def main_metric(self) -> str:  # type: ignore[override]
        return "corr" if self.is_regression else "accuracy"

    def options(self) -> dict:
        return {"labels": self.labels, "regression": self.is_regression, "max_length": self.max_length, "pair": self.pair}

    def describe_split(self, data: os.PathLike, split: str) -> str:
        try:
            return str(self._file(data, split))
        except FileNotFoundError:
            return f"{data} ({split} split)"

    def _file(self, data: os.PathLike, split: str) -> Path:
        data = Path(data)
        for ext in (".csv", ".tsv", ".jsonl"):
            if (data / f"{split}{ext}").is_file():
                return data / f"{split}{ext}"
        raise MissingFileError(f"{data}: no {split}.csv, {split}.tsv or {split}.jsonl")

    def load(self, data: os.PathLike, split: str) -> list:
        result = read_table(self._file(data, split), labels=self.labels)
        if self.labels is None and self.regression is None:
            self.labels = result.labels
            self.regression = result.is_regression
        if self.pair is None and len(result):
            self.pair = result[0].text_pair is not None
        return result
