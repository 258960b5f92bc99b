"""Named-entity recognition (CoNLL-2003): every token vector feeds a dense layer; the
label of a word sits on its first sub-word and is read back from there."""

from __future__ import annotations

import difflib
import logging
import os
from pathlib import Path
from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

from torch import nn

from ..data.conll import (
    TaggedSentence,
    encode_tagged,
    label_list,
    read_conll,
    word_predictions,
)
from ..heads.classification import EncoderWithHead, TokenClassificationHead
from .metrics import ner_f1
from ..training import predict
from ..core.errors import UserError
from .base import Task

__all__ = ["ConllNerTask"]

logger = logging.getLogger("ctxkit")

_FILES = {"train": "train.txt", "dev": "valid.txt", "valid": "valid.txt", "test": "test.txt"}
UNKNOWN_TAGS = ("error", "score")


class ConllNerTask(Task):
    """CoNLL-2003 English NER, scored with entity-level micro F1 (conlleval semantics).

    Args:
        labels: BIO tag set (taken from the training file when None).
        max_length: sub-word tokens per sentence; words past it are predicted ``O`` and
            counted in the metrics as ``truncated_words``.
        unknown_tags: what evaluation does with a gold tag outside the label set: "error"
            (a :class:`UserError` naming ``file:line`` before any work) or "score" (counted
            as an entity no prediction can match).
    """

    name = "conll2003"
    main_metric = "f1"

    def requires(self) -> Tuple[str, ...]:
        return ("seqeval",)
    eval_splits = ("dev", "test")
    # The loss is a mean over a batch's tokens; batches of only short sentences (headlines,
    # scores) then weigh each token heavily. Length grouping cost ~0.6 dev F1 here
    # (benchmarks/results/finetune_vs_hf.json), so batches are plainly shuffled.
    group_factor = 0

    def __init__(self, labels: Optional[Sequence[str]] = None, max_length: int = 256, unknown_tags: str = "error"):
        if unknown_tags not in UNKNOWN_TAGS:
            raise UserError(f"unknown_tags must be one of {', '.join(UNKNOWN_TAGS)}, got {unknown_tags!r}")
        self.labels = list(labels) if labels is not None else None
        self.fixed_labels = labels is not None  # given by the user: the training file must keep to them
        self.max_length = max_length
        self.unknown_tags = unknown_tags

    def options(self) -> dict:
        return {"labels": self.labels, "max_length": self.max_length}

    def describe_split(self, data: os.PathLike, split: str) -> str:
        path = Path(data)
        return str(path / _FILES.get(split, f"{split}.txt")) if path.is_dir() else str(path)

    def load(self, data: os.PathLike, split: str) -> list:
        return read_conll(self.describe_split(data, split))

    def prepare(self, train_examples: list) -> None:
        if self.labels is None:
            self.labels = label_list(train_examples)

    def check(self, examples: list, source: str, training: bool) -> None:
        """Entity types the label set does not hold, before any training.

        Training data: with a label set given by the user, a tag outside it is an error;
        otherwise rare types and types that look like a variant of another (``ORGANISATION``
        beside ``ORG``) are warned about with ``file:line`` and counts, since each becomes a
        class of its own. Evaluation data: a tag the model cannot predict is an error unless
        ``unknown_tags="score"`` (it then counts as a gold entity no prediction can match).
        """
        stats = _type_stats(examples, source)
        if training and not self.fixed_labels:
            for kind, message in _suspicious_types(stats):
                logger.warning("%s: entity type %r: %s; it becomes a class of its own (fix the file, or pass the tag set "
                               "with --labels to refuse it)", stats[kind][1], kind, message)
            return
        known = set(self.labels or ())
        tags = _tag_stats(examples, source)
        unknown = sorted(t for t in tags if t not in known)
        if not unknown or self.unknown_tags == "score":
            if unknown:
                logger.warning("%s: %d tag(s) the model cannot predict, scored as missed entities: %s", source, len(unknown),
                               ", ".join(unknown))
            return
        listed = "; ".join(f"{t} x{tags[t][0]} (first at {tags[t][1]})" for t in unknown[:10])
        what = "the label set given with --labels" if training else "the model's label set"
        hint = "fix the file or --labels" if training else "fix the file, or pass --allow-unknown-tags to score them as missed entities"
        raise UserError(f"{tags[unknown[0]][1]}: {len(unknown)} tag(s) outside {what} ({', '.join(self.labels or [])}): "
                        f"{listed}; {hint}")

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

    def input_format(self) -> str:
        return "one sentence of raw text per line (split into words like CoNLL; tabs count as spaces)"

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


def _word_line(sentence: TaggedSentence, j: int, source: str) -> str:
    """``file:line`` of word ``j`` (CoNLL sentences are runs of consecutive token lines;
    the sentence's guid holds its first line)."""
    _, _, line = sentence.guid.rpartition(":")
    return f"{source}:{int(line) + j}" if line.isdigit() else f"{source} ({sentence.guid})"


def _tag_stats(examples: Sequence[TaggedSentence], source: str) -> Dict[str, Tuple[int, str]]:
    """tag -> (count, file:line of its first occurrence)."""
    counts: Counter = Counter()
    first: Dict[str, str] = {}
    for sentence in examples:
        for j, tag in enumerate(sentence.tags):
            counts[tag] += 1
            if tag not in first:
                first[tag] = _word_line(sentence, j, source)
    return {t: (counts[t], first[t]) for t in counts}


def _type_stats(examples: Sequence[TaggedSentence], source: str) -> Dict[str, Tuple[int, str]]:
    """entity type -> (number of entities, file:line of the first), counted at ``B-`` tags."""
    counts: Counter = Counter()
    first: Dict[str, str] = {}
    for sentence in examples:
        for j, tag in enumerate(sentence.tags):
            if tag.startswith("B-"):
                counts[tag[2:]] += 1
                first.setdefault(tag[2:], _word_line(sentence, j, source))
    return {t: (counts[t], first[t]) for t in counts}


# A type this rare next to the others (share of all entities) is more likely a typo than a class.
RARE_SHARE = 0.001
RARE_COUNT = 3


def _suspicious_types(stats: Dict[str, Tuple[int, str]]) -> List[Tuple[str, str]]:
    """(type, why) for types that look like mistakes: rare ones, and near-copies of a more frequent type."""

    total = sum(c for c, _ in stats.values())
    out = []
    for kind, (count, _) in sorted(stats.items()):
        others = [k for k in stats if k != kind and stats[k][0] > count]
        similar = [k for k in others if k.startswith(kind) or kind.startswith(k)] or difflib.get_close_matches(kind, others, n=1, cutoff=0.6)
        if similar:
            near = similar[0]
            out.append((kind, f"{count} entit{'y' if count == 1 else 'ies'}, close to {near!r} ({stats[near][0]}): a typo?"))
        elif total >= 100 and (count <= RARE_COUNT or count < RARE_SHARE * total):
            out.append((kind, f"only {count} of {total} entities"))
    return out


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
