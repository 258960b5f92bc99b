"""The lectures' "retail bank or river bank?" demo, offline on the packaged MiniLM checkpoint.

A static embedding (the input word-embedding row) gives "bank" the same vector in
every sentence; a contextual one (the last Transformer layer) moves it towards the
sense the sentence uses. The demo prints both cosine-similarity matrices side by side,
a verdict per ambiguous word, and saves an attention heatmap and the sinusoidal
position table as PNGs. The sentences and the similarities come from
:mod:`ctxkit.features.senses`, which ``ctxkit ui`` draws in the browser.

Run it with ``ctxkit demo`` or ``python -m ctxkit demo``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, TextIO, Tuple

import numpy as np
import torch

from ctxkit.core.errors import UserError
from ctxkit.features.embed import elmo_lm_vectors, embed
from .. import zoo
from ..features.senses import DEMO_WORDS, SENTENCES
from ..features.senses import cosine_matrix as _cosine_matrix
from ..features.senses import mean_sims as _mean_sims
from ..features.senses import static_vector as _static_vector
from ..layers.position import sinusoidal_table

INSTALL_HINT = "ctxkit download all_minilm_l6_v2"


class CheckpointNotInstalledError(UserError, RuntimeError):
    """The demo's pretrained checkpoint package is missing."""

def _load(checkpoint: str) -> Tuple[torch.nn.Module, Any]:
    rows = {r["name"]: r for r in zoo.list_models() if r["kind"] == "checkpoint"}  # ctxkit's own (PyPI) checkpoints
    row = rows.get(checkpoint)
    if row is not None and not row.get("available", True):
        raise CheckpointNotInstalledError(
            f"the checkpoint {checkpoint!r} is not installed; fetch it with: ctxkit download {checkpoint}"
        )
    try:
        return zoo.get_model(checkpoint)
    except (ImportError, FileNotFoundError) as exc:
        raise CheckpointNotInstalledError(
            f"could not load the checkpoint {checkpoint!r} ({exc}); fetch it with: ctxkit download {checkpoint}"
        ) from None


def _format_pair(word: str, labels: List[str], ctx: np.ndarray, static: np.ndarray) -> str:
    """Two similarity matrices side by side with fixed-width columns."""
    short = [lab.split("/", 1)[1][:3] + lab.rsplit("#", 1)[1] for lab in labels]  # "river#1" -> "riv1"
    row_w = max(len(lab) for lab in labels) + 2
    cell = 5

    titles = ("contextual (last layer)", "static (input embedding)")
    width = max(cell * len(labels), *(len(t) + 1 for t in titles))

    def block(cells: List[str]) -> str:
        return "".join(f"{c:>{cell}}" for c in cells).ljust(width)

    def row(left: str, a: List[str], b: List[str]) -> str:
        return (f"{left:<{row_w}}" + block(a) + " | " + block(b)).rstrip()

    lines = [
        f"{word}: cosine similarity of the {len(labels)} occurrences",
        (" " * row_w + " " + titles[0].ljust(width - 1) + " |  " + titles[1]).rstrip(),
        row("", short, short),
    ]
    for r, lab in enumerate(labels):
        lines.append(row(lab, [f"{v:.2f}" for v in ctx[r]], [f"{v:.2f}" for v in static[r]]))
    return "\n".join(lines)


def _verdict(word: str, senses: List[str], ctx_means: Dict[str, float], static: Optional[np.ndarray],
             kind: str = "contextual") -> Tuple[str, bool]:
    a, b = senses[0], senses[1]
    across = ctx_means[f"{a}-vs-{b}"]
    within_a, within_b = ctx_means[f"{a}-vs-{a}"], ctx_means[f"{b}-vs-{b}"]
    separated = across < min(within_a, within_b)
    static_txt = ""
    if static is not None:
        off = static[~np.eye(len(static), dtype=bool)]
        if np.allclose(off, 1.0, atol=5e-3):
            static_txt = "; static sim is 1.00 for every pair."
        else:
            static_txt = f"; static sim ranges {off.min():.2f}..{off.max():.2f}."
    rel = "<" if separated else ">="
    outcome = "the senses separate" if separated else "the senses do not separate here"
    line = (
        f"{word}: {kind} sim {a}-vs-{b} {across:.3f} {rel} {a}-vs-{a} {within_a:.3f}, "
        f"{b}-vs-{b} {within_b:.3f} -> {outcome}{static_txt}"
    )
    return line, separated


def _elmo_vectors(folder: str, sentences: List[List[str]]) -> List[np.ndarray]:
    """Per sentence ``(n_words, dim)`` ELMo vectors (equal-weight mix of all layers) from a
    ``ctxkit pretrain-elmo`` folder, for the words the BERT embedder split the text into."""

    return elmo_lm_vectors(folder, sentences)


def run_demo(
    out_dir: str = "ctxkit_demo",
    layer: int = -1,
    head: int = 0,
    checkpoint: str = "all_minilm_l6_v2",
    sentence_index: int = 0,
    stream: Optional[TextIO] = None,
    elmo: Optional[str] = None,
) -> Dict[str, Any]:
    """Runs the bank/bat/crane demo, printing matrices and verdicts and saving two PNGs.

    Args:
        out_dir: Folder for ``attention_L{layer}_H{head}.png`` and
            ``positional_encoding.png`` (created if missing).
        layer: Attention layer to plot, 0-based index into the model's layers
            (negatives count from the end). The file name uses the non-negative index.
        head: Attention head to plot (negatives allowed).
        checkpoint: Model name for :func:`ctxkit.zoo.get_model`.
        sentence_index: Which demo sentence (see :data:`SENTENCES`) to plot.
        stream: Where to print; defaults to ``sys.stdout``.
        elmo: An ELMo language-model folder (``ctxkit pretrain-elmo``'s ``final/``): adds
            an ELMo column (equal-weight mix of its layers) to the comparison.

    Returns:
        Dict with ``"words"``: per target word a dict of ``labels`` (e.g. "bank/river#1"),
        ``senses``, ``contextual`` and ``static`` cosine matrices ``(n, n)``,
        ``mean_contextual`` / ``mean_static`` (keys like "river-vs-money"),
        ``separated`` (bool) and ``verdict`` (the printed line), and with ``elmo``
        also ``elmo`` (matrix), ``mean_elmo`` and ``elmo_separated``; plus
        ``attention_png``, ``positional_png`` (paths), ``sentence``, ``tokens`` and
        ``attention`` ``(seq, seq)`` of the plotted head.

    Raises:
        CheckpointNotInstalledError: The checkpoint package is missing.
        ValueError: ``layer``, ``head`` or ``sentence_index`` out of range.
    """
    from ..core.plots import plot_attention, plot_positional_encoding  # lazy: matplotlib (the plots extra)

    stream = sys.stdout if stream is None else stream
    if not -len(SENTENCES) <= sentence_index < len(SENTENCES):
        raise UserError(f"sentence_index must be in [0, {len(SENTENCES) - 1}], got {sentence_index}")
    net, tokenizer = _load(checkpoint)
    cfg = net.config
    if not -cfg.num_layers <= layer < cfg.num_layers:
        raise UserError(f"layer must be in [{-cfg.num_layers}, {cfg.num_layers - 1}], got {layer}")
    if not -cfg.num_heads <= head < cfg.num_heads:
        raise UserError(f"head must be in [{-cfg.num_heads}, {cfg.num_heads - 1}], got {head}")
    layer, head = layer % cfg.num_layers, head % cfg.num_heads
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    p = print
    p(f"Retail bank or river bank? Contextual vs static vectors ({checkpoint}, "
      f"{cfg.num_layers} layers, hidden {cfg.hidden_size})", file=stream)
    p("", file=stream)
    for i, (_, _, s) in enumerate(SENTENCES):
        p(f"  [{i:2d}] {s}", file=stream)
    p("", file=stream)

    word_vecs = embed([s for _, _, s in SENTENCES], model=(net, tokenizer), layers="last")
    table = net.embeddings.word_embeddings.weight.detach()
    elmo_vecs = _elmo_vectors(elmo, [wv.words for wv in word_vecs]) if elmo else None
    results: Dict[str, Any] = {}
    verdicts = []
    for word, senses_map in DEMO_WORDS.items():
        labels, senses, ctx_rows, static_rows, elmo_rows = [], [], [], [], []
        counts: Dict[str, int] = {}
        for i, ((w, sense, _), wv) in enumerate(zip(SENTENCES, word_vecs)):
            if w != word:
                continue
            for j, surface in enumerate(wv.words):
                if surface.lower() == word:
                    counts[sense] = counts.get(sense, 0) + 1
                    labels.append(f"{word}/{sense}#{counts[sense]}")
                    senses.append(sense)
                    ctx_rows.append(wv.vectors[j])
                    static_rows.append(_static_vector(surface, tokenizer, table))
                    if elmo_vecs is not None:
                        elmo_rows.append(elmo_vecs[i][j])
        ctx = _cosine_matrix(np.stack(ctx_rows))
        static = _cosine_matrix(np.stack(static_rows))
        ctx_means, static_means = _mean_sims(ctx, senses), _mean_sims(static, senses)
        verdict, separated = _verdict(word, list(senses_map), ctx_means, static)
        verdicts.append(verdict)
        p(_format_pair(word, labels, ctx, static), file=stream)
        p("", file=stream)
        results[word] = {
            "labels": labels, "senses": senses, "contextual": ctx, "static": static,
            "mean_contextual": ctx_means, "mean_static": static_means,
            "separated": separated, "verdict": verdict,
        }
        if elmo_rows:
            elmo_sim = _cosine_matrix(np.stack(elmo_rows))
            elmo_means = _mean_sims(elmo_sim, senses)
            line, elmo_separated = _verdict(word, list(senses_map), elmo_means, None, kind="ELMo")
            results[word].update(elmo=elmo_sim, mean_elmo=elmo_means, elmo_separated=elmo_separated)
            verdicts.append(line)
    p("Verdict (mean cosine similarity; within-sense pairs exclude self-pairs):", file=stream)
    for v in verdicts:
        p("  " + v, file=stream)
    p("", file=stream)

    sentence = SENTENCES[sentence_index][2]
    enc = tokenizer.encode(sentence)
    with torch.inference_mode():
        dev = next(net.parameters()).device
        att_out = net(
            torch.tensor([enc.input_ids], device=dev),
            token_type_ids=torch.tensor([enc.token_type_ids], device=dev),
            attention_mask=torch.tensor([enc.attention_mask], device=dev),
            output_attentions=True,
        )
    att = att_out.attentions[layer][0, head].float().cpu().numpy()  # (seq, seq)
    tokens = list(enc.tokens)
    att_png = plot_attention(
        att, tokens, out / f"attention_L{layer}_H{head}.png",
        title=f"{checkpoint}: layer {layer}, head {head}\n{sentence}",
    )
    target = SENTENCES[sentence_index][0]
    if target in tokens:
        q = tokens.index(target)
        top = np.argsort(-att[q])[:3]
        desc = ", ".join(f"{tokens[k]!r} {att[q, k]:.2f}" for k in top)
        p(f"Layer {layer}, head {head}: {target!r} in sentence [{sentence_index}] attends most to {desc}", file=stream)
    pe_png = plot_positional_encoding(sinusoidal_table(100, 64), path=out / "positional_encoding.png")
    p(f"Saved attention heatmap: {att_png}", file=stream)
    p(f"Saved positional encoding: {pe_png}", file=stream)
    return {
        "words": results,
        "attention_png": str(att_png),
        "positional_png": str(pe_png),
        "sentence": sentence,
        "tokens": tokens,
        "attention": att,
    }


__all__ = ["run_demo", "DEMO_WORDS", "SENTENCES", "CheckpointNotInstalledError"]
