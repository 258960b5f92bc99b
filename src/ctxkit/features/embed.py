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
import math
import sys
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from tqdm.auto import tqdm

from ..core.errors import UserError
from ..fast import apply, resolve
from ctxkit.zoo import get_model
from ctxkit.models.elmo import elmo_embed
from ctxkit.models.elmo_io import load_bilm
from ctxkit.models.families import find_family

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


@dataclass
class _Plan:
    """Tokenization and window layout of one text."""

    ids: List[int]
    word_ids: List[Optional[int]]
    offsets: List[Tuple[int, int]]
    windows: List[Tuple[int, int]]  # token ranges [start, end) fed to the model
    n_keep: int  # tokens kept (less than len(ids) only when truncating)
    truncated_words: int = 0
    features: List[Optional[np.ndarray]] = field(default_factory=list)


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


def window_starts(n_tokens: int, window: int, stride: int) -> List[int]:
    """Start offsets of overlapping windows covering ``n_tokens`` sub-words.

    Args:
        n_tokens: Sub-words in the text (without [CLS]/[SEP]).
        window: Sub-words per window.
        stride: Overlap between consecutive windows, capped at ``window // 2`` so
            each window moves forward by at least half its length.

    Returns:
        Increasing starts; the last window ends exactly at ``n_tokens``.
    """
    if n_tokens <= window:
        return [0]
    overlap = max(0, min(stride, window // 2))
    step = window - overlap
    starts = list(range(0, n_tokens - window, step))
    starts.append(n_tokens - window)
    return starts


def assign_windows(n_tokens: int, windows: Sequence[Tuple[int, int]]) -> np.ndarray:
    """Picks, for each token, the window where it sits farthest from an edge.

    A window edge that is also the text's own start or end is not an edge (the token
    has all the context there is on that side). Ties go to the earlier window.

    Returns:
        int array ``(n_tokens,)`` of window indices.
    """
    best = np.full(n_tokens, -1.0)
    owner = np.zeros(n_tokens, dtype=np.int64)
    for w, (s, e) in enumerate(windows):
        pos = np.arange(s, e)
        left = (pos - s).astype(float) if s > 0 else np.full(len(pos), math.inf)
        right = (e - 1 - pos).astype(float) if e < n_tokens else np.full(len(pos), math.inf)
        score = np.minimum(left, right)
        better = score > best[s:e]
        best[s:e][better] = score[better]
        owner[s:e][better] = w
    return owner


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


def _plan_text(index: int, text: str, tokenizer: Any, window: int, stride: int, long_inputs: str) -> _Plan:
    # Every sub-word covers at least one character, so len(text) bounds the count:
    # this asks the tokenizer for the whole text, never a silently truncated one.
    try:
        enc = tokenizer.encode(text, max_length=len(text) + 2, truncation="error", add_special_tokens=False)
    except ValueError as exc:
        raise UserError(f"text {index}: {exc}") from None
    ids, word_ids, offsets = list(enc.input_ids), list(enc.word_ids), [tuple(o) for o in enc.offsets]
    n = len(ids)
    if n <= window:
        return _Plan(ids, word_ids, offsets, [(0, n)], n)
    if long_inputs == "error":
        raise UserError(
            f"text {index} has {n} sub-word tokens, more than the limit of {window} "
            f"(max_length {window + 2} minus [CLS] and [SEP]); use long_inputs='window' or 'truncate'"
        )
    if long_inputs == "truncate":
        # A word split by the cut is dropped whole: half a word's sub-words would give
        # a vector unlike any the model makes for the full word.
        cut_word = word_ids[window]
        n_keep = window
        while n_keep > 0 and word_ids[n_keep - 1] == cut_word:
            n_keep -= 1
        dropped = len({w for w in word_ids[n_keep:] if w is not None})
        logger.warning(
            "text %d: %d sub-word tokens exceed the limit of %d; truncated, dropping %d words",
            index, n, window, dropped,
        )
        return _Plan(ids, word_ids, offsets, [(0, window)], n_keep, dropped)
    starts = window_starts(n, window, stride)
    logger.warning(
        "text %d: %d sub-word tokens exceed the limit of %d; split into %d overlapping windows",
        index, n, window, len(starts),
    )
    return _Plan(ids, word_ids, offsets, [(s, s + window) for s in starts], n)


def _combine(hidden_states: Sequence[torch.Tensor], indices: List[int], mode: str) -> torch.Tensor:
    """``(batch, seq, hidden)`` states -> ``(batch, seq, dim)`` features."""
    picked = [hidden_states[i] for i in indices]
    if len(picked) == 1:
        return picked[0]
    if mode == "sum":
        return torch.stack(picked, dim=0).sum(dim=0)
    return torch.cat(picked, dim=-1)


def _run_windows(
    net: torch.nn.Module,
    tokenizer: Any,
    plans: List[_Plan],
    indices: List[int],
    mode: str,
    batch_size: int,
    progress: bool,
) -> None:
    """Runs every window through the model, filling ``plan.features``.

    Each feature array is ``(window_len + 2, dim)``, row 0 = [CLS], last row = [SEP].
    """
    jobs = [(p, w) for p, plan in enumerate(plans) for w in range(len(plan.windows))]
    for plan in plans:
        plan.features = [None] * len(plan.windows)
    # Longest first, so each batch pads to a similar length and memory peaks early.
    jobs.sort(key=lambda j: plans[j[0]].windows[j[1]][1] - plans[j[0]].windows[j[1]][0], reverse=True)
    try:
        dev = next(net.parameters()).device
    except StopIteration:
        dev = torch.device("cpu")
    cls_id, sep_id, pad_id = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
    batches = [jobs[i : i + batch_size] for i in range(0, len(jobs), batch_size)]
    bar = tqdm(batches, desc="embed", unit="batch", disable=not progress, file=sys.stderr)
    with torch.inference_mode():
        for batch in bar:
            seqs = []
            for p, w in batch:
                s, e = plans[p].windows[w]
                seqs.append([cls_id] + plans[p].ids[s:e] + [sep_id])
            width = max(len(q) for q in seqs)
            input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(seqs), width), dtype=torch.long)
            for r, q in enumerate(seqs):
                input_ids[r, : len(q)] = torch.tensor(q, dtype=torch.long)
                mask[r, : len(q)] = 1
            out = net(
                input_ids.to(dev),
                token_type_ids=torch.zeros_like(input_ids).to(dev),
                attention_mask=mask.to(dev),
                output_hidden_states=True,
            )
            feats = _combine(out.hidden_states, indices, mode).float().cpu().numpy()
            for r, (p, w) in enumerate(batch):
                plans[p].features[w] = np.ascontiguousarray(feats[r, : len(seqs[r])])


def _token_features(plan: _Plan) -> np.ndarray:
    """Stitches window features into one ``(n_keep, dim)`` array of content tokens."""
    if len(plan.windows) == 1:
        return plan.features[0][1 : 1 + plan.n_keep]
    n = len(plan.ids)
    owner = assign_windows(n, plan.windows)
    dim = plan.features[0].shape[1]
    out = np.empty((n, dim), dtype=np.float32)
    for w, (s, _e) in enumerate(plan.windows):
        rows = np.nonzero(owner == w)[0]
        out[rows] = plan.features[w][1 + rows - s]
    return out


def _word_vectors(text: str, plan: _Plan, subword_pooling: str) -> ContextualWordVectors:
    tok = _token_features(plan)
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


def _pooled_vector(plan: _Plan, pooling: str) -> np.ndarray:
    if pooling == "cls":
        return np.mean([f[0] for f in plan.features], axis=0).astype(np.float32)
    if plan.n_keep == 0:
        # No real tokens: the documented fallback is the mean of [CLS] and [SEP].
        return plan.features[0].mean(axis=0).astype(np.float32)
    return _token_features(plan).mean(axis=0).astype(np.float32)


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

    plans = [_plan_text(i, t, tokenizer, max_length - 2, stride, long_inputs) for i, t in enumerate(texts)]
    # Features must not depend on dropout; a caller's model in train mode is restored after.
    was_training = net.training
    net.eval()
    try:
        _run_windows(net, tokenizer, plans, indices, mode, batch_size, progress)
    finally:
        net.train(was_training)

    if pooling is None:
        return [_word_vectors(t, p, subword_pooling) for t, p in zip(texts, plans)]
    dim = plans[0].features[0].shape[1] if plans else _feature_dim(cfg.hidden_size, indices, mode)
    mat = np.zeros((len(plans), dim), dtype=np.float32)
    for i, p in enumerate(plans):
        mat[i] = _pooled_vector(p, pooling)
    out = mat.view(PooledEmbeddings)
    out.num_windows = [len(p.windows) for p in plans]
    out.truncated_words = [p.truncated_words for p in plans]
    return out


def _elmo_folder(model: Any) -> Optional[str]:
    """The ELMo folder ``model`` names ("elmo:DIR", or a folder holding an ELMo biLM), else None."""
    if not isinstance(model, (str, os.PathLike)):
        return None
    text = os.fspath(model)
    if text.startswith("elmo:"):
        return text[len("elmo:"):]
    family = find_family(text)  # the family registry decides (ctxkit.models.families)
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
