"""Contextual feature extraction: word or text vectors from any layer of a BERT model.

This is the "feature-based" use of BERT from the paper's CoNLL-2003 table: run the
frozen network once and take hidden states from one or several layers as features.

Example:
    >>> from ctxkit.features.embed import embed
    >>> out = embed(["The bank approved my loan."], layers="sum_last_four")
    >>> out[0].words[:2], out[0].vectors.shape
    (['The', 'bank'], (6, 384))
    >>> embed(["a text", "another"], pooling="mean").shape
    (2, 384)
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Generator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from tqdm.auto import tqdm

from ..core.errors import UserError
from ..fast import apply, resolve
from .windows import Plan, WindowPooled, assign_windows, plan_text, token_features, window_batches, window_starts
from ctxkit.zoo import get_model
from ctxkit.models.elmo.model import elmo_embed
from ctxkit.models.elmo.io import load_bilm, load_elmo_lm
from ..zoo.families import find_family

logger = logging.getLogger("ctxkit")

LAYER_CHOICES = (
    "first",
    "last",
    "second_to_last",
    "sum_last_four",
    "concat_last_four",
    "sum_all",
)
POOLING_CHOICES = ("cls", "mean")
SUBWORD_POOLING_CHOICES = ("mean", "first")
LONG_INPUT_CHOICES = ("window", "truncate", "error")

LayerSpec = Union[str, int, Sequence[int]]


@dataclass
class ContextualWordVectors:
    """Word-aligned contextual vectors for one text.

    Attributes:
        words: The pre-tokenized words, as they appear in the original text.
        spans: ``(start, end)`` character span of each word in the original text.
        vectors: float32 array ``(n_words, dim)``; sub-word vectors pooled per word.
        num_windows: How many model passes (windows) the text needed; 1 if it fit.
        truncated_words: Words dropped because ``long_inputs="truncate"`` cut the
            text (0 otherwise).
    """

    words: List[str]
    spans: List[Tuple[int, int]]
    vectors: np.ndarray
    num_windows: int = 1
    truncated_words: int = 0


class PooledEmbeddings(np.ndarray):
    """``(n_texts, dim)`` float32 array that also records how long texts were handled.

    It behaves as a plain ``np.ndarray``; the extra attributes exist only on the array
    returned by :func:`embed` (views and slices do not carry them).

    Attributes:
        num_windows: list[int], model passes per text (1 if the text fit).
        truncated_words: list[int], words cut off per text by ``long_inputs="truncate"``.
    """

    num_windows: Optional[List[int]]
    truncated_words: Optional[List[int]]

    def __array_finalize__(self, obj: Any) -> None:
        # Slices would otherwise inherit per-text lists that no longer line up.
        self.num_windows = None
        self.truncated_words = None


def resolve_layers(layers: LayerSpec, num_layers: int) -> Tuple[List[int], str]:
    """Turns a layer choice into indices into ``hidden_states`` and a combine mode.

    Args:
        layers: A name from :data:`LAYER_CHOICES`, an int, or a list of ints indexing
            ``hidden_states`` (0 = embedding output, i = output of layer i, negatives
            count from the last layer).
        num_layers: Number of Transformer layers of the model.

    Returns:
        ``(indices, mode)`` with non-negative indices and mode ``"sum"`` or ``"concat"``.
        ``concat_last_four`` concatenates in ascending layer order (layer N-3 first).

    Raises:
        ValueError: For an unknown name or an index out of range.
    """
    n_states = num_layers + 1
    valid = (
        f"valid choices: {', '.join(LAYER_CHOICES)}, or a list of ints in "
        f"[{-n_states}, {n_states - 1}] indexing hidden_states (0 = embeddings)"
    )
    if isinstance(layers, str):
        top = num_layers
        if layers in ("sum_last_four", "concat_last_four") and num_layers < 4:
            raise UserError(f"layers={layers!r} needs at least 4 layers; the model has {num_layers}")
        table = {
            "first": ([0], "concat"),
            "last": ([top], "concat"),
            "second_to_last": ([top - 1], "concat"),
            "sum_last_four": (list(range(top - 3, top + 1)), "sum"),
            "concat_last_four": (list(range(top - 3, top + 1)), "concat"),
            "sum_all": (list(range(1, top + 1)), "sum"),
        }
        if layers not in table:
            raise UserError(f"unknown layers={layers!r}; {valid}")
        return table[layers]
    if isinstance(layers, (int, np.integer)) and not isinstance(layers, bool):
        layers = [int(layers)]
    try:
        idx = list(layers)  # type: ignore[arg-type]
    except TypeError:
        raise UserError(f"invalid layers={layers!r}; {valid}") from None
    if not idx or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in idx):
        raise UserError(f"invalid layers={layers!r}; {valid}")
    out = []
    for i in idx:
        if not -n_states <= i < n_states:
            raise UserError(f"layer index {i} out of range; {valid}")
        out.append(int(i) % n_states)
    return out, "concat"


def _resolve_model(model: Any, device: str, fast: str = "auto") -> Tuple[torch.nn.Module, Any]:
    if isinstance(model, str):
        net, tokenizer = get_model(model, device=device)
        if tokenizer is None:
            raise UserError(
                f"model {model!r} is an untrained preset without a vocabulary; name a checkpoint "
                "(e.g. 'all_minilm_l6_v2') or pass a (model, tokenizer) tuple"
            )
        # Loaded here for inference only: the plan's swaps, e.g. one q/k/v GEMM (a caller's own
        # model is left as it is).
        apply(net, resolve(fast, use="infer", device=next(net.parameters()).device))
        return net, tokenizer
    if isinstance(model, (tuple, list)) and len(model) == 2:
        return model[0], model[1]
    raise TypeError(f"model must be a checkpoint/preset name or a (model, tokenizer) tuple, got {type(model).__name__}")


def _check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise UserError(f"invalid {name}={value!r}; valid choices: {', '.join(map(str, choices))}")


def _word_vectors(text: str, plan: Plan, subword_pooling: str) -> ContextualWordVectors:
    tok = token_features(plan)
    dim = plan.features[0].shape[1]
    groups: List[List[int]] = []
    last = None
    for t in range(plan.n_keep):
        wid = plan.word_ids[t]
        if wid is None:
            continue
        if wid != last:
            groups.append([])
            last = wid
        groups[-1].append(t)
    vectors = np.empty((len(groups), dim), dtype=np.float32)
    words, spans = [], []
    for g, rows in enumerate(groups):
        start = min(plan.offsets[t][0] for t in rows)
        end = max(plan.offsets[t][1] for t in rows)
        words.append(text[start:end])
        spans.append((int(start), int(end)))
        vectors[g] = tok[rows[0]] if subword_pooling == "first" else tok[rows].mean(axis=0)
    return ContextualWordVectors(words, spans, vectors, len(plan.windows), plan.truncated_words)


def embed(
    texts: Sequence[str],
    model: Any = "all_minilm_l6_v2",
    layers: LayerSpec = "last",
    pooling: Optional[str] = None,
    subword_pooling: str = "mean",
    max_length: Optional[int] = None,
    stride: int = 128,
    long_inputs: str = "window",
    batch_size: int = 32,
    device: str = "cpu",
    progress: bool = False,
    fast: str = "auto",
) -> Union[List[ContextualWordVectors], PooledEmbeddings]:
    """Embeds texts with a frozen BERT, as word vectors or one vector per text.

    Args:
        texts: Sequence of strings.
        model: Checkpoint name (or folder) for :func:`ctxkit.zoo.get_model`, or a
            ``(model, tokenizer)`` tuple (the model is used on its own device, in eval
            mode; its train/eval mode is restored afterwards). A bare preset name has
            no vocabulary and raises ValueError. ``"elmo:DIR"`` (or an ELMo folder:
            ``ctxkit pretrain-elmo``'s run or ``final/``, or bilm-tf ``options.json`` +
            ``weights.hdf5``) embeds with an ELMo biLM instead: the same words and spans
            (BERT's whitespace/punctuation pre-tokenizer), ``hidden_states`` = the token
            layer and the two biLSTM layers, plus ``layers="mix"`` (their mean, ELMo's
            default task feature before a task learns its own weights). Its LSTMs have
            no length limit, so nothing is windowed; ``pooling="mean"`` averages words.
        layers: Which hidden states make the features (``hidden_states`` has
            num_layers + 1 entries ``(batch, seq, hidden)``; 0 is the embedding output):
            ``"first"`` (hidden_states[0]), ``"last"``, ``"second_to_last"``,
            ``"sum_last_four"``, ``"concat_last_four"`` (layers N-3..N in ascending order,
            dim = 4 * hidden), ``"sum_all"`` (sum of hidden_states[1:]), or a list of int
            indices (negatives allowed) concatenated in the given order.
        pooling: None for word vectors; ``"cls"`` (the [CLS] vector) or ``"mean"``
            (mean over real sub-word tokens, excluding [CLS], [SEP] and padding).
        subword_pooling: How a word's sub-word vectors become one: ``"mean"`` or
            ``"first"`` (first sub-word, as in the BERT paper's NER setup).
        max_length: Tokens per model pass including [CLS] and [SEP]; defaults to
            ``model.config.max_position``. Texts with more than ``max_length - 2``
            sub-words are long inputs.
        stride: Overlap in sub-words between consecutive windows (capped at half a
            window).
        long_inputs: ``"window"``: overlapping windows; each token's vector comes from
            the window where it is farthest from an edge. For pooling, ``"cls"`` is the
            mean of the windows' [CLS] vectors and ``"mean"`` averages every token once.
            ``"truncate"``: keep the first ``max_length`` tokens; words past the cut (or
            split by it) are dropped. ``"error"``: raise ValueError. Windowing and
            truncation log a warning on the ``"ctxkit"`` logger and are recorded in the
            result (``num_windows``, ``truncated_words``).
        batch_size: Windows per forward pass; windows are sorted by length and padded
            per batch.
        device: Device to load a named model on.
        progress: Show a tqdm progress bar (stderr).
        fast: The fast plan's module swaps for a named model (:class:`~ctxkit.fast.FastPlan`
            string; ``auto``: one q/k/v GEMM, and the GELU GEMM on a Hopper GPU;
            ``reference``: the plain modules). A ``(model, tokenizer)`` tuple is used as it is.

    Returns:
        Without pooling, a list (input order) of :class:`ContextualWordVectors`; an empty or
        whitespace-only text gives 0 words and vectors of shape ``(0, dim)``. With
        pooling, a float32 :class:`PooledEmbeddings` array ``(n_texts, dim)``; an empty
        text gets the vector of the input ``"[CLS] [SEP]"`` (its [CLS] vector for "cls",
        the mean of the [CLS] and [SEP] vectors for "mean").

    Raises:
        TypeError: If an item of ``texts`` is not a str (the message names its index).
        ValueError: For an invalid option, or a long text with ``long_inputs="error"``.
    """
    steps = embed_steps(texts, model, layers, pooling, subword_pooling, max_length, stride, long_inputs, batch_size, device,
                        progress, fast)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def embed_steps(
    texts: Sequence[str],
    model: Any = "all_minilm_l6_v2",
    layers: LayerSpec = "last",
    pooling: Optional[str] = None,
    subword_pooling: str = "mean",
    max_length: Optional[int] = None,
    stride: int = 128,
    long_inputs: str = "window",
    batch_size: int = 32,
    device: str = "cpu",
    progress: bool = False,
    fast: str = "auto",
    plans: Optional[List[Plan]] = None,
) -> Generator[int, None, Union[List[ContextualWordVectors], PooledEmbeddings]]:
    """:func:`embed` one forward pass at a time: a generator that runs a pass of up to
    ``batch_size`` windows per ``next()`` and yields how many windows it ran; its return value
    (``StopIteration.value``) is what :func:`embed` returns, for the same arguments.

    The caller decides what happens between passes: ``ctxkit serve`` runs each pass as its
    own job on the model thread, so other requests' batches run between a long request's
    passes. Pooled vectors are kept per window as it comes out of the model
    (:class:`~ctxkit.features.windows.WindowPooled`), never every window's features at once.
    Tokenizing and laying out the windows happens at the first ``next()``. The arguments
    are :func:`embed`'s, and ``plans``.

    Args:
        plans: the texts already tokenized and laid out, one per text
            (:func:`~ctxkit.features.windows.plan_text` with this tokenizer, ``max_length - 2``,
            ``stride`` and ``long_inputs``): ``ctxkit serve`` does it off its model thread, to
            count a request's windows before any of them runs. None: done here.
    """
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of strings, not a single str; wrap it in a list")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is {type(t).__name__}, expected str")
    if pooling is not None:
        _check_choice("pooling", pooling, POOLING_CHOICES)
    _check_choice("subword_pooling", subword_pooling, SUBWORD_POOLING_CHOICES)
    _check_choice("long_inputs", long_inputs, LONG_INPUT_CHOICES)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch_size must be a positive int, got {batch_size!r}")
    if not isinstance(stride, int) or stride < 0:
        raise UserError(f"stride must be a non-negative int, got {stride!r}")

    elmo_dir = _elmo_folder(model)
    if elmo_dir is not None:
        return _embed_elmo(texts, elmo_dir, layers, pooling, batch_size, device, progress)
    net, tokenizer = _resolve_model(model, device, fast)
    cfg = net.config
    indices, mode = resolve_layers(layers, cfg.num_layers)
    limit = cfg.max_position
    if max_length is None:
        max_length = limit
    if not isinstance(max_length, int) or not 3 <= max_length <= limit:
        raise UserError(f"max_length must be an int in [3, {limit}] (the model's max_position), got {max_length!r}")

    if plans is None:
        plans = [plan_text(i, t, tokenizer, max_length - 2, stride, long_inputs) for i, t in enumerate(texts)]
    elif len(plans) != len(texts):
        raise UserError(f"{len(plans)} plans for {len(texts)} texts")
    pooled = WindowPooled(plans, pooling) if pooling is not None else None
    keep = pooled.keep if pooled is not None else _store_features(plans)
    # Features must not depend on dropout; a caller's model in train mode is restored after.
    was_training = net.training
    net.eval()
    try:
        yield from window_batches(net, tokenizer, plans, indices, mode, batch_size, keep, progress)
    finally:
        net.train(was_training)

    if pooled is None:
        return [_word_vectors(t, p, subword_pooling) for t, p in zip(texts, plans)]
    mat = pooled.result() if plans else np.zeros((0, _feature_dim(cfg.hidden_size, indices, mode)), dtype=np.float32)
    out = mat.view(PooledEmbeddings)
    out.num_windows = [len(p.windows) for p in plans]
    out.truncated_words = [p.truncated_words for p in plans]
    return out


def _store_features(plans: List[Plan]):
    """A :func:`~ctxkit.features.windows.window_batches` ``keep`` that holds every window's
    features in its plan (word vectors need them all)."""
    for plan in plans:
        plan.features = [None] * len(plan.windows)

    def keep(p: int, w: int, feats: np.ndarray) -> None:
        plans[p].features[w] = feats

    return keep


def _elmo_folder(model: Any) -> Optional[str]:
    """The ELMo folder ``model`` names ("elmo:DIR", or a folder holding an ELMo biLM), else None."""
    if not isinstance(model, (str, os.PathLike)):
        return None
    text = os.fspath(model)
    if text.startswith("elmo:"):
        return text[len("elmo:"):]
    family = find_family(text)  # the family registry decides (ctxkit.zoo.families)
    return text if family is not None and family.name == "elmo" else None


def _embed_elmo(texts: List[str], folder: str, layers: LayerSpec, pooling: Optional[str], batch_size: int, device: str,
                progress: bool) -> Union[List[ContextualWordVectors], PooledEmbeddings]:
    """:func:`embed` with an ELMo biLM (see its ``model`` argument)."""
    from tokenizers.pre_tokenizers import BertPreTokenizer

    if pooling not in (None, "mean"):
        raise UserError(f"ELMo has no [CLS] vector: pooling must be None or 'mean', got {pooling!r}")
    bilm, _ = load_bilm(folder)
    bilm.to(device)
    n_states = bilm.num_representation_layers  # token layer + LSTM layers
    if layers == "mix":
        indices, mode = list(range(n_states)), "mean"
    else:
        indices, mode = resolve_layers(layers, n_states - 1)
    pre = BertPreTokenizer()
    split = [pre.pre_tokenize_str(t) for t in texts]
    words = [[w for w, _ in s] for s in split]
    results: List[ContextualWordVectors] = []
    iterator = range(0, len(texts), 512)
    if progress:
        iterator = tqdm(iterator, desc="ELMo", unit="chunk")
    for start in iterator:
        chunk = words[start:start + 512]
        nonempty = [i for i, w in enumerate(chunk) if w]
        out = elmo_embed(bilm, [chunk[i] for i in nonempty], batch_size=batch_size) if nonempty else None
        dim = bilm.config.output_dim * (len(indices) if mode == "concat" else 1)
        for i, ws in enumerate(chunk):
            vecs = np.zeros((0, dim), dtype=np.float32)
            if ws:
                states = out.sentence(nonempty.index(i))[0]  # (n_states, n_words, dim)
                picked = states[indices]
                if mode == "concat":
                    feats = torch.cat(list(picked), dim=-1)
                else:
                    feats = picked.sum(0) / (len(indices) if mode == "mean" else 1)
                vecs = feats.numpy().astype(np.float32)
            results.append(ContextualWordVectors(ws, [span for _, span in split[start + i]], vecs))
    if pooling is None:
        return results
    dim = results[0].vectors.shape[1] if results else bilm.config.output_dim
    mat = np.stack([r.vectors.mean(0) if len(r.vectors) else np.zeros(dim, np.float32) for r in results]) if results \
        else np.zeros((0, dim), np.float32)
    pooled = mat.astype(np.float32).view(PooledEmbeddings)
    pooled.num_windows = [1] * len(results)
    pooled.truncated_words = [0] * len(results)
    return pooled


def _feature_dim(hidden: int, indices: List[int], mode: str) -> int:
    return hidden if mode == "sum" else hidden * len(indices)


def feature_dim(model: torch.nn.Module, layers: LayerSpec = "last") -> int:
    """Width of the features :func:`embed` returns for ``layers`` on ``model``."""
    indices, mode = resolve_layers(layers, model.config.num_layers)
    return _feature_dim(model.config.hidden_size, indices, mode)


__all__ = [
    "embed",
    "embed_steps",
    "ContextualWordVectors",
    "PooledEmbeddings",
    "resolve_layers",
    "window_starts",
    "assign_windows",
    "feature_dim",
    "LAYER_CHOICES",
    "POOLING_CHOICES",
    "SUBWORD_POOLING_CHOICES",
    "LONG_INPUT_CHOICES",
]


def elmo_lm_vectors(folder: Union[str, os.PathLike], sentences: Sequence[Sequence[str]]) -> List[np.ndarray]:
    """Per sentence ``(n_words, dim)`` ELMo vectors (the equal-weight mix of all layers) from the
    biLM of a ``ctxkit pretrain-elmo`` run's language model folder (``final/``).

    Args:
        folder: the folder ``pretrain-elmo`` wrote (an ELMo LM and its word list).
        sentences: words per sentence.
    """
    lm, _ = load_elmo_lm(folder)
    out = elmo_embed(lm.bilm, sentences)
    return [out.sentence(i)[1].numpy() for i in range(len(sentences))]

