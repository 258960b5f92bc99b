"""Task models on frozen word features: static word vectors or the layers of an ELMo biLM.

Peters et al. (2018) keep the biLM frozen and learn per task only the mix of its layers,
``E_t = gamma * sum_i softmax(s)_i H_{i,t}`` (:class:`~ctxkit.models.elmo.model.ScalarMix`), jointly
with the task model. So features are computed once, kept per sentence as ``(L, n_words, dim)``
(``L = 1`` for static vectors), and the mix sits inside :class:`FeatureTagger` /
:class:`FeatureSentenceClassifier`, before a BiLSTM. :func:`train_feature_tagger` (entity F1,
:func:`~ctxkit.tasks.metrics.ner_f1`) and :func:`train_feature_classifier` train them (Adam,
clipping, length-grouped batches, fixed seeds; cuDNN LSTMs are still not bit-reproducible).

The feature sources (:class:`StaticFeatures`, :class:`ElmoFeatures`) and :func:`load_bilm`
live in :mod:`ctxkit.tasks.feature_sources` and are re-exported here.
"""

from __future__ import annotations

import math
import time
from typing import Callable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence
from tqdm.auto import tqdm

from .metrics import ner_f1
from ..models.elmo.model import ScalarMix
from .feature_sources import CASING_DIM, ElmoFeatures, StaticFeatures, load_bilm
from ..core.errors import UserError

__all__ = ["StaticFeatures", "ElmoFeatures", "FeatureTagger", "FeatureSentenceClassifier", "collate_features",
           "length_batches", "predict_tags", "predict_classes", "train_feature_tagger", "train_feature_classifier",
           "load_bilm", "CASING_DIM"]

Device = Union[str, torch.device]
IGNORE = -100


# ---------------------------------------------------------------------------- models


def collate_features(features: Sequence[Tensor], device: Optional[Device] = None) -> Tuple[Tensor, Tensor]:
    """Pad per-sentence ``(L, n_i, dim)`` features into ``(B, T, L, dim)`` (zeros after each
    sentence, ``T >= 1``) on ``device``; also returns the ``(B,)`` lengths (on the CPU)."""
    lengths = torch.tensor([f.shape[1] for f in features], dtype=torch.long)
    first = features[0]
    out = first.new_zeros(len(features), max(1, int(lengths.max())), first.shape[0], first.shape[2])
    for i, f in enumerate(features):
        out[i, : f.shape[1]] = f.transpose(0, 1)
    return out.to(device or first.device, non_blocking=True), lengths


class _FeatureBiLSTM(nn.Module):
    """ScalarMix over the layers (if ``L > 1``), dropout, a padding-aware BiLSTM; the
    subclasses add dropout and ``classifier`` over ``head_in * 2 * hidden`` inputs."""

    def __init__(self, num_input_layers: int, input_dim: int, num_outputs: int, hidden: int, lstm_layers: int, dropout: float,
                 layer_norm: bool, head_in: int):
        super().__init__()
        self.scalar_mix = ScalarMix(num_input_layers, do_layer_norm=layer_norm) if num_input_layers > 1 else None
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(input_dim, hidden, num_layers=lstm_layers, batch_first=True, bidirectional=True,
                            dropout=dropout if lstm_layers > 1 else 0.0)
        self.classifier = nn.Linear(head_in * 2 * hidden, num_outputs)

    def encode(self, features: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """``(B, T, L, dim)``, ``(B,)`` -> BiLSTM outputs ``(B, T, 2 * hidden)`` (zero at padding),
        mask ``(B, T)`` and lengths on the features' device; an empty sentence is one zero word."""
        lengths = lengths.cpu().clamp(min=1)
        mask = (torch.arange(features.shape[1])[None] < lengths[:, None]).to(features.device)
        x = features.float()
        x = self.scalar_mix(x.unbind(2), mask) if self.scalar_mix is not None else x[:, :, 0]
        packed = pack_padded_sequence(self.dropout(x), lengths, batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=features.shape[1])
        return out, mask, lengths.to(features.device)


class FeatureTagger(_FeatureBiLSTM):
    """Word features -> ScalarMix (if ``L > 1``) -> dropout -> BiLSTM -> dropout -> linear over tags.

    Args:
        num_input_layers, input_dim: ``L`` layers per word (1 for static vectors: no mix) of ``input_dim``.
        num_tags: output labels. hidden: LSTM size per direction.
        lstm_layers: stacked BiLSTM layers. dropout: on the (mixed) input, between and after the LSTMs.
        layer_norm: normalise each layer before mixing (AllenNLP's ``do_layer_norm``; its
            statistics span the batch, so predictions then depend on batch-mates).
    """

    def __init__(self, num_input_layers: int, input_dim: int, num_tags: int, hidden: int = 200, lstm_layers: int = 2,
                 dropout: float = 0.5, layer_norm: bool = False):
        super().__init__(num_input_layers, input_dim, num_tags, hidden, lstm_layers, dropout, layer_norm, head_in=1)

    def forward(self, features: Tensor, lengths: Tensor) -> Tensor:
        """``(B, T, L, dim)`` features, ``(B,)`` lengths -> ``(B, T, num_tags)`` logits."""
        return self.classifier(self.dropout(self.encode(features, lengths)[0]))


class FeatureSentenceClassifier(_FeatureBiLSTM):
    """Word features -> ScalarMix -> dropout -> BiLSTM -> [max; mean] over real words -> dropout -> linear.

    Args: as :class:`FeatureTagger`, with ``num_classes`` outputs and one BiLSTM layer by default.
    """

    def __init__(self, num_input_layers: int, input_dim: int, num_classes: int, hidden: int = 200, lstm_layers: int = 1,
                 dropout: float = 0.5, layer_norm: bool = False):
        super().__init__(num_input_layers, input_dim, num_classes, hidden, lstm_layers, dropout, layer_norm, head_in=2)

    def forward(self, features: Tensor, lengths: Tensor) -> Tensor:
        """``(B, T, L, dim)`` features, ``(B,)`` lengths -> ``(B, num_classes)`` logits."""
        out, mask, lengths = self.encode(features, lengths)
        keep = mask[..., None]
        pooled = [out.masked_fill(~keep, -math.inf).amax(dim=1), (out * keep).sum(dim=1) / lengths[:, None].to(out.dtype)]
        return self.classifier(self.dropout(torch.cat(pooled, dim=-1)))


# ---------------------------------------------------------------------------- training


def length_batches(lengths: Sequence[int], batch_size: int, rng: Optional[np.random.Generator] = None) -> List[List[int]]:
    """Indices in batches of similar length (little padding, few LSTM steps). With ``rng``
    (training) lengths are jittered, so batches change between epochs, and batches shuffled."""
    keys = np.asarray(lengths, dtype=np.float64)
    if rng is not None:
        keys = keys + rng.uniform(-2.0, 2.0, len(keys))
    order = np.argsort(keys, kind="stable").tolist()
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if rng is not None:
        rng.shuffle(batches)
    return batches


@torch.no_grad()
def _predict(model: nn.Module, features: Sequence[Tensor], batch_size: int, device: Device) -> List[Tensor]:
    model.eval()
    out: List[Optional[Tensor]] = [None] * len(features)
    for batch in length_batches([f.shape[1] for f in features], batch_size):
        pred = model(*collate_features([features[i] for i in batch], device)).argmax(-1).cpu()
        for row, i in enumerate(batch):
            out[i] = pred[row]
    return out


def predict_tags(model: FeatureTagger, features: Sequence[Tensor], batch_size: int = 256, device: Device = "cpu") -> List[List[int]]:
    """Argmax tag ids, one list per sentence (as long as the sentence)."""
    return [p[: f.shape[1]].tolist() for p, f in zip(_predict(model, features, batch_size, device), features)]


def predict_classes(model: FeatureSentenceClassifier, features: Sequence[Tensor], batch_size: int = 256,
                    device: Device = "cpu") -> List[int]:
    """Argmax class id per sentence."""
    return [int(p) for p in _predict(model, features, batch_size, device)]


def _to_device(features: Sequence[Tensor], device: torch.device) -> List[Tensor]:
    # On a GPU the whole (float16) feature set lives there: collating a batch then copies nothing over PCIe.
    return [f.to(device) for f in features] if device.type == "cuda" else list(features)


def _fit(model: nn.Module, features: Sequence[Tensor], loss_fn: Callable[[Tensor, List[int]], Tensor],
         evaluate: Callable[[], Tuple[float, dict]], epochs: int, lr: float, batch_size: int, clip_norm: float,
         weight_decay: float, seed: int, device: torch.device, progress: bool, desc: str) -> dict:
    """Adam over length-grouped batches, ``evaluate() -> (score, metrics)`` after each epoch;
    keeps (on the CPU) the weights of the best-scoring epoch."""
    if epochs < 1:
        raise UserError(f"epochs must be >= 1, got {epochs}")
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    lengths = [f.shape[1] for f in features]
    run = {"history": [], "best_score": -math.inf, "train_seconds": 0.0, "eval_seconds": 0.0}
    for epoch in range(1, epochs + 1):
        model.train()
        start, total = time.perf_counter(), torch.zeros((), device=device)
        for batch in tqdm(length_batches(lengths, batch_size, rng), desc=f"{desc} epoch {epoch}", disable=not progress,
                          leave=False, mininterval=1.0):
            loss = loss_fn(model(*collate_features([features[i] for i in batch], device)), batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if clip_norm:
                nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            opt.step()
            total += loss.detach() * len(batch)
        train_loss = total.item() / max(1, len(features))  # .item() waits for the GPU, so the time is honest
        trained = time.perf_counter()
        score, metrics = evaluate()
        run["train_seconds"] += trained - start
        run["eval_seconds"] += time.perf_counter() - trained
        run["history"].append({"epoch": epoch, "train_loss": round(train_loss, 5), **metrics,
                               "epoch_train_seconds": round(trained - start, 2)})
        if score > run["best_score"]:
            run["best_score"], run["best_epoch"] = score, epoch
            run["best_state"] = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    return run


def _common(run: dict, model: nn.Module, selection: str) -> dict:
    mix = model.scalar_mix
    return {"history": run["history"], "selection": selection, "train_seconds": round(run["train_seconds"], 1),
            "eval_seconds": round(run["eval_seconds"], 1), "parameters": sum(p.numel() for p in model.parameters()),
            "scalar_mix": None if mix is None else {"weights": [round(w, 4) for w in mix.weights().detach().tolist()],
                                                    "gamma": round(float(mix.gamma.detach()), 4)},
            "model": model.eval()}


def _check(split: str, features: Sequence[Tensor], targets: Sequence, per_word: bool) -> None:
    if len(features) != len(targets):
        raise UserError(f"{split}: {len(features)} feature tensors for {len(targets)} targets")
    bad = next((i for i, (f, t) in enumerate(zip(features, targets)) if per_word and f.shape[1] != len(t)), None)
    if bad is not None:
        raise UserError(f"{split}: sentence {bad} has {features[bad].shape[1]} feature rows for {len(targets[bad])} tags")


def train_feature_tagger(features_train: Sequence[Tensor], tags_train: Sequence[Sequence[str]], features_dev: Sequence[Tensor],
                         tags_dev: Sequence[Sequence[str]], features_test: Sequence[Tensor], tags_test: Sequence[Sequence[str]],
                         label_list: Sequence[str], epochs: int = 10, lr: float = 1e-3, batch_size: int = 32,
                         device: Device = "cpu", seed: int = 0, hidden: int = 200, lstm_layers: int = 2, dropout: float = 0.5,
                         layer_norm: bool = False, clip_norm: float = 5.0, weight_decay: float = 0.0, progress: bool = True) -> dict:
    """Train a :class:`FeatureTagger`; score entity-level F1 (seqeval / conlleval semantics).

    The epoch is chosen by dev F1 and the test set scored with that epoch's weights (the
    last epoch's test F1 rides along for reference only). The loss is summed over a
    sentence's words and averaged over sentences: length grouping makes batches of short
    sentences common, and a per-token mean would weigh each of their words more.

    Args:
        features_train, features_dev, features_test: per sentence ``(L, n_words, dim)``.
        tags_train, tags_dev, tags_test: BIO tags per sentence. label_list: tag names (index = id).
        epochs, lr, batch_size, clip_norm, weight_decay: Adam settings; progress: a bar per epoch.
        device, seed: where to train; the seed fixes initialisation, dropout and batch order.
        hidden, lstm_layers, dropout, layer_norm: see :class:`FeatureTagger`.

    Returns:
        dict (F1 in percent): ``best_epoch``; ``dev_*`` and ``test_*`` (``f1``, ``precision``,
        ``recall``; test also ``per_type_f1``) at the best epoch; ``test_f1_last_epoch``,
        ``dev_f1_curve``, ``history``, ``scalar_mix`` (learned weights and gamma, or None),
        ``train_seconds``, ``eval_seconds``, ``parameters``, ``model`` (best epoch, eval mode).
    """
    device = torch.device(device)
    for split, f, t in (("train", features_train, tags_train), ("dev", features_dev, tags_dev), ("test", features_test, tags_test)):
        _check(split, f, t, per_word=True)
    label_to_id = {label: i for i, label in enumerate(label_list)}
    unknown = sorted({t for s in tags_train for t in s if t not in label_to_id})
    if unknown:
        raise UserError(f"training tags not in label_list: {unknown}")
    torch.manual_seed(seed)
    model = FeatureTagger(features_train[0].shape[0], features_train[0].shape[2], len(label_list), hidden, lstm_layers,
                          dropout, layer_norm).to(device)
    y_train = [torch.tensor([label_to_id[t] for t in s], dtype=torch.long, device=device) for s in tags_train]
    train, dev, test = (_to_device(f, device) for f in (features_train, features_dev, features_test))

    def loss_fn(logits: Tensor, batch: List[int]) -> Tensor:
        y = pad_sequence([y_train[i] for i in batch], batch_first=True, padding_value=IGNORE)
        logits = logits[:, : y.shape[1]]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE, reduction="sum") / len(batch)

    def score(features: List[Tensor], gold: Sequence[Sequence[str]]) -> dict:
        m = ner_f1(gold, [[label_list[i] for i in p] for p in predict_tags(model, features, device=device)])
        return {k: ({t: round(v, 2) for t, v in m[k].items()} if k == "per_type_f1" else round(m[k], 2)) for k in m}

    def evaluate() -> Tuple[float, dict]:
        m = score(dev, tags_dev)
        return m["f1"], {"dev_f1": m["f1"], "dev_precision": m["precision"], "dev_recall": m["recall"]}

    run = _fit(model, train, loss_fn, evaluate, epochs, lr, batch_size, clip_norm, weight_decay, seed, device, progress, "tagger")
    last_test = score(test, tags_test)["f1"]
    model.load_state_dict(run["best_state"])
    best = run["history"][run["best_epoch"] - 1]
    return {"best_epoch": run["best_epoch"], **{k: best[k] for k in ("dev_f1", "dev_precision", "dev_recall")},
            **{f"test_{k}": v for k, v in score(test, tags_test).items()}, "test_f1_last_epoch": last_test,
            "dev_f1_curve": [h["dev_f1"] for h in run["history"]],
            **_common(run, model, "epoch with the best dev F1; test scored with its weights")}


def train_feature_classifier(features_train: Sequence[Tensor], labels_train: Sequence[int], features_dev: Sequence[Tensor],
                             labels_dev: Sequence[int], num_classes: Optional[int] = None, epochs: int = 5, lr: float = 1e-3,
                             batch_size: int = 64, device: Device = "cpu", seed: int = 0, hidden: int = 200,
                             lstm_layers: int = 1, dropout: float = 0.5, layer_norm: bool = False, clip_norm: float = 5.0,
                             weight_decay: float = 0.0, progress: bool = True) -> dict:
    """Train a :class:`FeatureSentenceClassifier`; score dev accuracy after every epoch.

    With no labelled test split (SST-2's is hidden) two numbers are reported:
    ``last_dev_accuracy`` (final epoch, nothing chosen on dev) and ``best_dev_accuracy``
    (the epoch chosen *on dev itself*, so optimistic).

    Args:
        features_train, features_dev: per sentence ``(L, n_words, dim)``.
        labels_train, labels_dev: class ids ``0 .. num_classes - 1`` (default: largest label + 1).
        others: as in :func:`train_feature_tagger`.

    Returns:
        dict (accuracy in percent): ``last_dev_accuracy``, ``best_dev_accuracy``, ``best_epoch``,
        ``dev_accuracy_curve``, ``history``, ``scalar_mix``, ``train_seconds``,
        ``eval_seconds``, ``parameters``, ``model`` (last epoch's weights).
    """
    device = torch.device(device)
    _check("train", features_train, labels_train, per_word=False)
    _check("dev", features_dev, labels_dev, per_word=False)
    num_classes = num_classes or int(max(max(labels_train), max(labels_dev))) + 1
    torch.manual_seed(seed)
    model = FeatureSentenceClassifier(features_train[0].shape[0], features_train[0].shape[2], num_classes, hidden,
                                      lstm_layers, dropout, layer_norm).to(device)
    y_train = torch.tensor(list(labels_train), dtype=torch.long, device=device)
    train, dev = _to_device(features_train, device), _to_device(features_dev, device)

    def loss_fn(logits: Tensor, batch: List[int]) -> Tensor:
        return F.cross_entropy(logits, y_train[torch.tensor(batch, device=device)])

    def evaluate() -> Tuple[float, dict]:
        pred = predict_classes(model, dev, device=device)
        acc = round(100.0 * sum(p == y for p, y in zip(pred, labels_dev)) / max(1, len(pred)), 2)
        return acc, {"dev_accuracy": acc}

    run = _fit(model, train, loss_fn, evaluate, epochs, lr, batch_size, clip_norm, weight_decay, seed, device, progress, "classifier")
    curve = [h["dev_accuracy"] for h in run["history"]]
    return {"last_dev_accuracy": curve[-1], "best_dev_accuracy": max(curve), "best_epoch": run["best_epoch"],
            "dev_accuracy_curve": curve,
            **_common(run, model, "last_dev_accuracy: final epoch; best_dev_accuracy: epoch picked on dev itself")}
