"""Feature extraction without fine-tuning: a frozen encoder gives one vector per text
([CLS] or mean of the tokens), and scikit-learn's logistic regression learns the task on
top -- the lectures' DistilBERT-on-SST-2 demo.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from ..core.deps import require
from .embed import embed

__all__ = ["LinearProbeResult", "linear_probe"]


@dataclass
class LinearProbeResult:
    """Outcome of :func:`linear_probe`.

    Attributes:
        accuracy: dev accuracy in percent.
        train_accuracy: training accuracy in percent.
        embed_seconds: time spent encoding train + dev texts.
        fit_seconds: time spent fitting the classifier.
        classifier: the fitted ``sklearn.linear_model.LogisticRegression``.
    """

    accuracy: float
    train_accuracy: float
    embed_seconds: float
    fit_seconds: float
    classifier: object


def linear_probe(
    train_texts: Sequence[str],
    train_labels: Sequence[int],
    dev_texts: Sequence[str],
    dev_labels: Sequence[int],
    model="all_minilm_l6_v2",
    pooling: str = "cls",
    layers="last",
    C: float = 1.0,
    batch_size: int = 128,
    device: str = "cpu",
    max_length: Optional[int] = 128,
    progress: bool = False,
) -> LinearProbeResult:
    """Fit logistic regression on frozen sentence vectors and score it on dev.

    Args:
        train_texts, train_labels: training data.
        dev_texts, dev_labels: evaluation data.
        model: checkpoint name or ``(model, tokenizer)``, as for :func:`ctxkit.embed`.
        pooling: ``"cls"`` or ``"mean"``.
        layers: layer choice, as for :func:`ctxkit.embed`.
        C: inverse L2 regularisation strength.
        batch_size, device, max_length, progress: passed to :func:`ctxkit.embed`
            (texts longer than ``max_length`` are windowed, and said so in the log).
    """

    LogisticRegression = require("sklearn.linear_model", "the linear-probe baseline").LogisticRegression

    t0 = time.time()
    kwargs = dict(model=model, layers=layers, pooling=pooling, batch_size=batch_size, device=device, max_length=max_length, progress=progress)
    x_train = np.asarray(embed(list(train_texts), **kwargs))
    x_dev = np.asarray(embed(list(dev_texts), **kwargs))
    t1 = time.time()
    clf = LogisticRegression(C=C, max_iter=2000)
    clf.fit(x_train, np.asarray(train_labels))
    t2 = time.time()
    return LinearProbeResult(
        accuracy=100.0 * float((clf.predict(x_dev) == np.asarray(dev_labels)).mean()),
        train_accuracy=100.0 * float((clf.predict(x_train) == np.asarray(train_labels)).mean()),
        embed_seconds=t1 - t0,
        fit_seconds=t2 - t1,
        classifier=clf,
    )
