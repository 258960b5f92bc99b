"""Named-entity recognition (CoNLL-2003): every token vector feeds a dense layer; the
label of a word sits on its first sub-word and is read back from there."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from torch import nn

from ..data.conll import (
    TaggedSentence,
    encode_tagged,
    label_list,
    read_conll,
    word_predictions,
)
from ..heads.classification import EncoderWithHead, TokenClassificationHead
from ..metrics import ner_f1
from ..training import predict
from .base import Task

__all__ = ["ConllNerTask"]

logger = logging.getLogger("ctxkit")

_FILES = {"train": "train.txt", "dev": "valid.txt", "valid": "valid.txt", "test": "test.txt"}


class ConllNerTask(Task):
    """CoNLL-2003 English NER, scored with entity-level micro F1 (conlleval semantics).

    Args:
        labels: BIO tag set (taken from the training file when None).
        max_length: sub-word tokens per sentence; words past it are predicted ``O`` and
            counted in the metrics as ``truncated_words``.
    """

    name = "conll2003"
    main_metric = "f1"
    eval_splits = ("dev", "test")
    # The loss is a mean over a batch's tokens; batches of only short sentences (headlines,
    # scores) then weigh each token heavily. Length grouping cost ~0.6 dev F1 here
    # (benchmarks/results/finetune_vs_hf.json), so batches are plainly shuffled.
    group_factor = 0

    def __init__(self, labels: Optional[Sequence[str]] = None, max_length: int = 256):
        self.labels = list(labels) if labels is not None else None
        self.max_length = max_length

    def options(self) -> dict:
        return {"labels": self.labels, "max_length": self.max_length}

    def load(self, data: os.PathLike, split: str) -> list:
        path = Path(data)
        if path.is_dir():
            path = path / _FILES.get(split, f"{split}.txt")
        return read_conll(path)

    def prepare(self, train_examples: list) -> None:
        if self.labels is None:
            self.labels = label_list(train_examples)

    def build_model(self, encoder: nn.Module) -> nn.Module:
        return EncoderWithHead(encoder, TokenClassificationHead(encoder.config.hidden_size, len(self.labels), encoder.config.dropout))

    def _encode(self, tokenizer, examples: list) -> List[dict]:
        label_to_id = {l: i for i, l in enumerate(self.labels)}
        # Unseen tags (e.g. in user data) must not crash evaluation; they score as errors.
        label_to_id.update({t: label_to_id["O"] for s in examples for t in s.tags if t not in label_to_id})
        encoded = [encode_tagged(tokenizer, sentence, label_to_id, self.max_length) for sentence in examples]
        cut = sum(e["num_truncated_words"] for e in encoded)
        if cut:
            logger.warning("%d words in %d sentences fell past max_length=%d; they are predicted 'O'",
                           cut, sum(1 for e in encoded if e["num_truncated_words"]), self.max_length)
        return encoded

    def featurize(self, tokenizer, examples: list, train: bool) -> List[dict]:
        keep = ("input_ids", "token_type_ids", "attention_mask", "labels")
        return [{k: e[k] for k in keep} for e in self._encode(tokenizer, examples)]

    def _tag(self, model, tokenizer, sentences: list, batch_size: int, device: str):
        feats = self._encode(tokenizer, sentences)
        logits = predict(model, [{k: f[k] for k in ("input_ids", "token_type_ids", "attention_mask")} for f in feats], batch_size, device)
        tags, truncated = [], 0
        outside = self.labels.index("O")
        for sentence, feat, lg in zip(sentences, feats, logits):
            # Words without a sub-word (cut by max_length) are predicted "O" and counted.
            per_word = word_predictions(feat["word_index"], lg.argmax(-1).tolist(), num_words=len(sentence.words), fill=outside)
            truncated += feat["num_truncated_words"]
            tags.append([self.labels[i] for i in per_word])
        return tags, truncated

    def evaluate(self, model, tokenizer, examples, batch_size=128, device="auto"):
        tags, truncated = self._tag(model, tokenizer, examples, batch_size, device)
        metrics = ner_f1([s.tags for s in examples], tags)
        metrics["truncated_words"] = truncated
        return metrics, tags

    def predict_lines(self, model, tokenizer, lines, batch_size=64, device="auto") -> List[dict]:
        # Words with character spans from BERT's own pre-tokenizer (punctuation split off),
        # which is close to CoNLL's tokenisation.
        pre = tokenizer.backend.pre_tokenizer
        words_spans = [pre.pre_tokenize_str(line) for line in lines]
        sentences = [TaggedSentence([w for w, _ in ws], ["O"] * len(ws), 0, f"<input>:{i + 1}") for i, ws in enumerate(words_spans)]
        tags, _ = self._tag(model, tokenizer, sentences, batch_size, device)
        rows = []
        for line, ws, sentence_tags in zip(lines, words_spans, tags):
            rows.append({"text": line, "entities": _entities(line, [span for _, span in ws], sentence_tags)})
        return rows


def _entities(text: str, spans: List[tuple], tags: List[str]) -> List[Dict]:
    """Group BIO tags into entities with character spans into ``text``."""
    entities: List[Dict] = []
    current = None
    for (start, end), tag in zip(spans, tags):
        kind = tag[2:] if tag != "O" else None
        if tag.startswith("B-") or (tag.startswith("I-") and (current is None or current["type"] != kind)):
            current = {"type": kind, "start": start, "end": end}
            entities.append(current)
        elif tag.startswith("I-"):
            current["end"] = end
        else:
            current = None
    for e in entities:
        e["text"] = text[e["start"] : e["end"]]
    return entities
