"""Word senses in context: the lectures' "retail bank or river bank?" comparison and the
attention maps behind it, as numbers (``ctxkit demo`` prints and plots them, ``ctxkit ui``
draws them in the browser).

A static embedding (the input word-embedding row) gives "bank" the same vector in every
sentence; a contextual one (a Transformer layer's output) moves it towards the sense the
sentence uses. :func:`word_similarities` gives both cosine matrices over the occurrences of
a word; :func:`attention_maps` the attention weights of every layer and head over one text.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..core.errors import UserError
from .embed import LayerSpec, embed

__all__ = ["DEMO_WORDS", "SENTENCES", "attention_maps", "cosine_matrix", "mean_sims", "static_vector", "word_similarities"]

# word -> sense -> sentences; each sentence holds the word once.
DEMO_WORDS: Dict[str, Dict[str, List[str]]] = {
    "bank": {
        "river": [
            "He sat on the river bank and watched the water.",
            "The fisherman walked along the bank of the stream.",
            "The boat drifted toward the grassy bank of the river.",
            "We had a picnic on the bank of the river.",
        ],
        "money": [
            "She deposited the check at the bank.",
            "The bank approved my loan application.",
            "The bank raised its interest rates again.",
            "I withdrew cash from the bank this morning.",
        ],
    },
    "bat": {
        "animal": [
            "A bat flew out of the cave at dusk.",
            "The bat hung upside down from the branch.",
        ],
        "baseball": [
            "He swung the bat and hit a home run.",
            "The player dropped his bat and ran to first base.",
        ],
    },
    "crane": {
        "bird": [
            "A crane waded through the marsh looking for fish.",
            "The crane spread its wings and flew over the lake.",
        ],
        "machine": [
            "The crane lifted the steel beam onto the roof.",
            "Workers used a crane to load containers onto the ship.",
        ],
    },
}

# (word, sense, sentence) in a fixed order; ``ctxkit demo --sentence`` indexes this list.
SENTENCES: List[Tuple[str, str, str]] = [
    (word, sense, s) for word, senses in DEMO_WORDS.items() for sense, ss in senses.items() for s in ss
]


def cosine_matrix(vectors: np.ndarray) -> np.ndarray:
    """``(n, dim)`` -> ``(n, n)`` cosine similarities (float64, clipped to [-1, 1])."""
    v = vectors.astype(np.float64)
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    return np.clip(v @ v.T, -1.0, 1.0)


def mean_sims(sim: np.ndarray, senses: Sequence[str]) -> Dict[str, float]:
    """Mean similarity within each sense (off-diagonal pairs) and across each sense pair,
    keyed ``"river-vs-money"``; a sense with one occurrence has no within-sense pair (NaN)."""
    labels = np.array(list(senses))
    order = list(dict.fromkeys(senses))
    off_diag = ~np.eye(len(labels), dtype=bool)
    out = {}
    for i, a in enumerate(order):
        for b in order[i:]:
            mask = (labels[:, None] == a) & (labels[None, :] == b) & off_diag
            out[f"{a}-vs-{b}"] = float(sim[mask].mean()) if mask.any() else float("nan")
    return out


def input_embedding_table(net: torch.nn.Module) -> torch.Tensor:
    """The input word-embedding matrix ``(vocab, hidden)`` of a BERT-family encoder."""
    embeddings = getattr(net, "embeddings", None)
    table = getattr(getattr(embeddings, "word_embeddings", None), "weight", None)
    if table is None:
        raise UserError(f"a {type(net).__name__} has no input word-embedding table (embeddings.word_embeddings)")
    return table.detach()


def static_vector(word: str, tokenizer: Any, table: torch.Tensor) -> np.ndarray:
    """Mean input-embedding row of the word's sub-words: ``(hidden,)``."""
    ids = tokenizer.encode(word, add_special_tokens=False).input_ids
    return table[torch.tensor(ids, dtype=torch.long)].mean(dim=0).float().cpu().numpy()


def word_similarities(net: torch.nn.Module, tokenizer: Any, sentences: Sequence[str], word: str,
                      senses: Optional[Sequence[str]] = None, layers: LayerSpec = "last") -> Dict[str, Any]:
    """Contextual and static cosine similarities between the occurrences of ``word``.

    Args:
        net: a BERT-family encoder (``output_hidden_states``, ``embeddings.word_embeddings``).
        tokenizer: its tokenizer.
        sentences: the texts; every occurrence of ``word`` (a whole word, any case) counts.
        word: the word compared across the sentences.
        senses: one sense name per sentence (e.g. "river", "money"), or None.
        layers: the contextual layer(s), as :func:`~ctxkit.features.embed.embed` takes them.

    Returns:
        Dict with ``labels`` (one per occurrence: the sense, or ``#i`` the sentence's
        number, and the occurrence's number), ``sentence`` (the sentence index of each
        occurrence), ``senses`` (or None), ``contextual`` and ``static`` ``(n, n)``
        matrices, and with senses ``mean_contextual`` / ``mean_static`` (:func:`mean_sims`).

    Raises:
        UserError: ``senses`` of another length, or fewer than two occurrences of ``word``.
    """
    sentences = list(sentences)
    if senses is not None and len(senses) != len(sentences):
        raise UserError(f"{len(senses)} senses for {len(sentences)} sentences: give one per sentence, or none")
    target = word.strip().lower()
    table = input_embedding_table(net)
    labels, rows, ctx_rows, static_rows, found_senses = [], [], [], [], []
    counts: Dict[str, int] = {}
    for i, wv in enumerate(embed(sentences, model=(net, tokenizer), layers=layers)):
        for j, surface in enumerate(wv.words):
            if surface.lower() != target:
                continue
            key = senses[i] if senses is not None else f"#{i + 1}"
            counts[key] = counts.get(key, 0) + 1
            labels.append(f"{key}#{counts[key]}" if senses is not None else (key if counts[key] == 1 else f"{key}.{counts[key]}"))
            rows.append(i)
            ctx_rows.append(wv.vectors[j])
            static_rows.append(static_vector(surface, tokenizer, table))
            if senses is not None:
                found_senses.append(senses[i])
    if len(rows) < 2:
        raise UserError(f"{word!r} occurs {len(rows)} time(s) in the sentences (as a whole word); "
                        "the comparison needs at least two occurrences")
    ctx, static = cosine_matrix(np.stack(ctx_rows)), cosine_matrix(np.stack(static_rows))
    out: Dict[str, Any] = {"labels": labels, "sentence": rows, "senses": found_senses if senses is not None else None,
                           "contextual": ctx, "static": static}
    if senses is not None:
        out.update(mean_contextual=mean_sims(ctx, found_senses), mean_static=mean_sims(static, found_senses))
    return out


@torch.inference_mode()
def attention_maps(net: torch.nn.Module, tokenizer: Any, text: str, max_tokens: int = 512) -> Tuple[List[str], np.ndarray]:
    """The attention weights of every layer and head over one text.

    Args:
        net: an encoder whose forward takes ``output_attentions=True`` (BERT family).
        tokenizer: its tokenizer (``encode`` gives ``input_ids``, ``token_type_ids``,
            ``attention_mask`` and ``tokens``).
        text: the text, with the special tokens the tokenizer adds.
        max_tokens: refuse longer texts (the answer grows with the square of the length).

    Returns:
        ``(tokens, weights)``: the tokens and float32 ``(layers, heads, seq, seq)``, row
        ``q`` of a head being how query token ``q`` spreads its attention over the tokens.

    Raises:
        UserError: a text longer than ``max_tokens`` tokens, or a model that returns no
            attention weights.
    """
    enc = tokenizer.encode(text)
    if len(enc.input_ids) > max_tokens:
        raise UserError(f"the text has {len(enc.input_ids)} tokens; attention maps are drawn for {max_tokens} at most")
    dev = next(net.parameters()).device
    try:
        out = net(torch.tensor([enc.input_ids], device=dev), token_type_ids=torch.tensor([enc.token_type_ids], device=dev),
                  attention_mask=torch.tensor([enc.attention_mask], device=dev), output_attentions=True)
    except TypeError:  # a forward without the keyword: not a model that can show its attention
        raise UserError(f"a {type(net).__name__} does not return its attention weights (output_attentions)") from None
    attentions = getattr(out, "attentions", None)
    if not attentions:
        raise UserError(f"a {type(net).__name__} returned no attention weights")
    weights = torch.stack([a[0] for a in attentions]).float().cpu().numpy()  # (layers, heads, seq, seq)
    return list(enc.tokens), weights
