"""Training the bag-of-embeddings sentence classifier (the context-free baseline row of the
lectures' GLUE table) on static word vectors: :func:`train_bag_classifier`. The model is
:class:`~ctxkit.models.static.bag.BagOfEmbeddingsClassifier`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..models.static.bag import BagOfEmbeddingsClassifier
from ..models.static.vectors import WordVectors

__all__ = ["BagClassifierResult", "train_bag_classifier"]


@dataclass
class BagClassifierResult:
    """What :func:`train_bag_classifier` returns.

    Attributes:
        dev_accuracy: Accuracy on the dev texts after the last epoch (no epoch selection on dev).
        history: Per epoch: ``epoch``, ``train_loss``, ``train_accuracy``, ``dev_accuracy``.
        model: The trained classifier (in eval mode).
        vocab: Word -> row of ``model.embedding`` (row 0 = padding / unknown).
        coverage: Share of dev tokens that had a vector.
    """

    dev_accuracy: float
    history: List[dict] = field(default_factory=list)
    model: Optional[BagOfEmbeddingsClassifier] = None
    vocab: Dict[str, int] = field(default_factory=dict)
    coverage: float = 0.0


def _batches(encoded: List[List[int]], labels: torch.Tensor, batch_size: int, order: Sequence[int]):
    for b in range(0, len(order), batch_size):
        sel = order[b:b + batch_size]
        width = max(1, max(len(encoded[i]) for i in sel))
        ids = torch.zeros(len(sel), width, dtype=torch.long)
        for r, i in enumerate(sel):
            ids[r, :len(encoded[i])] = torch.tensor(encoded[i], dtype=torch.long)
        yield ids, labels[list(sel)]


def train_bag_classifier(vectors: WordVectors, train_texts: Sequence[str], train_labels: Sequence[int],
                         dev_texts: Sequence[str], dev_labels: Sequence[int], epochs: int = 5, lr: float = 1e-3,
                         batch_size: int = 64, hidden: Optional[int] = None, freeze: bool = True,
                         dropout: float = 0.1, weight_decay: float = 0.0, lowercase: bool = False, seed: int = 0,
                         device: Union[str, torch.device] = "cpu", progress: bool = True) -> BagClassifierResult:
    """Trains the bag-of-embeddings baseline on whitespace-tokenised texts and scores the dev set.

    The embedding table holds the vectors of every train or dev word that has one (in the
    vocabulary, or via sub-words); looking up dev words this way uses no dev labels. When
    ``freeze`` is False, train words without a vector get small random rows to learn.

    Args:
        vectors: Pre-trained word vectors.
        train_texts, train_labels: Training sentences and integer labels ``0..C-1``.
        dev_texts, dev_labels: Evaluation sentences and labels.
        epochs, lr, batch_size, weight_decay: Adam training settings.
        hidden, freeze, dropout: See :class:`BagOfEmbeddingsClassifier`.
        lowercase: Lowercase texts before lookup (for vectors trained on lowercased text).
        seed: Seeds initialisation and shuffling.
        device: Torch device.
        progress: Show a tqdm bar per epoch.

    Returns:
        :class:`BagClassifierResult`; ``dev_accuracy`` is that of the final epoch.
    """
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)

    def tokens(text):
        return (text.lower() if lowercase else text).split()

    train_tok, dev_tok = [tokens(t) for t in train_texts], [tokens(t) for t in dev_texts]
    vocab: Dict[str, int] = {}
    rows = [np.zeros(vectors.dim, np.float32)]
    scale = float(vectors.vectors.std()) or 0.1
    for is_train, sentences in ((True, train_tok), (False, dev_tok)):
        for word in (w for s in sentences for w in s):
            if word in vocab:
                continue
            vec = vectors.get(word)
            if vec is None and (freeze or not is_train):
                continue
            vocab[word] = len(rows)
            rows.append(vec if vec is not None else rng.normal(0, scale, vectors.dim).astype(np.float32))
    dev_tokens = sum(len(s) for s in dev_tok)
    coverage = sum(vectors.has_vector(w) for s in dev_tok for w in s) / max(1, dev_tokens)
    train_ids = [[vocab.get(w, 0) for w in s] for s in train_tok]
    dev_ids = [[vocab.get(w, 0) for w in s] for s in dev_tok]
    y_train = torch.as_tensor(list(train_labels), dtype=torch.long)
    y_dev = torch.as_tensor(list(dev_labels), dtype=torch.long)
    num_classes = int(max(y_train.max(), y_dev.max())) + 1
    model = BagOfEmbeddingsClassifier(np.stack(rows), num_classes, freeze=freeze, dropout=dropout,
                                      hidden=hidden).to(device)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)

    def accuracy(encoded, labels):
        model.eval()
        correct = 0
        with torch.no_grad():
            for ids, y in _batches(encoded, labels, 512, range(len(encoded))):
                correct += int((model(ids.to(device)).argmax(-1).cpu() == y).sum())
        return correct / max(1, len(encoded))

    history = []
    for epoch in range(1, epochs + 1):
        model.train()
        total_loss, correct = 0.0, 0
        order = rng.permutation(len(train_ids)).tolist()
        for ids, y in tqdm(_batches(train_ids, y_train, batch_size, order), total=math.ceil(len(order) / batch_size),
                           desc=f"epoch {epoch}", disable=not progress, leave=False, mininterval=1.0):
            logits = model(ids.to(device))
            loss = F.cross_entropy(logits, y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total_loss += loss.item() * len(y)
            correct += int((logits.argmax(-1).cpu() == y).sum())
        history.append(dict(epoch=epoch, train_loss=total_loss / len(order), train_accuracy=correct / len(order),
                            dev_accuracy=accuracy(dev_ids, y_dev)))
    model.eval()
    return BagClassifierResult(history[-1]["dev_accuracy"] if history else accuracy(dev_ids, y_dev), history,
                               model, vocab, coverage)
