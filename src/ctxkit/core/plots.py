"""Figures: the lectures' attention heatmaps and sinusoidal position table, and training curves.

Everything renders into PNG files through matplotlib's object API (``Figure``, no pyplot):
it works on machines without a display and never changes the process's backend, so a
notebook that trains a model keeps showing its own inline figures.
"""

from __future__ import annotations

import textwrap

import os
from pathlib import Path
from typing import Sequence, Union

from .deps import require
from .errors import UserError

require("matplotlib", "drawing figures (ctxkit demo, curve.png, heatmaps)")
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

PathLike = Union[str, "os.PathLike[str]"]


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch here
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _prepare(path: PathLike) -> Path:
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    return path


def plot_attention(weights, tokens: Sequence[str], path: PathLike, title: str = "Attention") -> Path:
    """Draws one head's attention matrix as a heatmap with tokens on both axes.

    Args:
        weights: Array or tensor ``(seq, seq)``; row i = how token i (query) attends
            to each token j (key). Rows of a softmax sum to 1.
        tokens: ``seq`` token strings, used as tick labels.
        path: Output PNG path (parent folders are created).
        title: Figure title.

    Returns:
        ``path`` as a :class:`pathlib.Path`.

    Raises:
        ValueError: If ``weights`` is not square or does not match ``tokens``.
    """
    w = _to_numpy(weights)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise UserError(f"weights must be a (seq, seq) matrix, got shape {w.shape}")
    if len(tokens) != w.shape[0]:
        raise UserError(f"got {len(tokens)} tokens for a {w.shape[0]}x{w.shape[1]} attention matrix")
    # Grow with the sentence so labels stay legible, within sane bounds.
    side = min(max(4.0, 0.38 * w.shape[0] + 2.0), 24.0)
    return _heatmap(w, tokens, tokens, "key (attended to)", "query (attending)", title, path, (side + 1.2, side), "equal")


def _heatmap(w: np.ndarray, x_labels, y_labels, x_title: str, y_title: str, title: str, path: PathLike, size, aspect: str) -> Path:
    """Draw a non-negative matrix with labelled rows and columns and a colour bar."""
    path = _prepare(path)
    fig = Figure(figsize=size)
    ax = fig.subplots()
    im = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=max(float(w.max()), 1e-12), aspect=aspect)
    ax.set_xticks(range(w.shape[1]))
    ax.set_yticks(range(w.shape[0]))
    ax.set_xticklabels(x_labels, rotation=90, fontsize=8)
    ax.set_yticklabels(y_labels, fontsize=8)
    ax.set_xlabel(x_title)
    ax.set_ylabel(y_title)
    ax.set_title(textwrap.fill(title, 60), fontsize=10)  # long sentence pairs wrap instead of running off the figure
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="weight")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def plot_positional_encoding(
    table,
    path: PathLike = "positional_encoding.png",
    dims_to_plot: Sequence[int] = (4, 5, 12, 20, 40),
) -> Path:
    """Shows a sinusoidal position table as an image and a few columns as curves.

    ``P[i, 2j] = sin(i / 10000^(2j/d))``, ``P[i, 2j+1] = cos(...)``: low dimensions
    oscillate fast, high ones slowly, which is what the image makes visible. The caller
    passes the table (for example ``ctxkit.layers.position.sinusoidal_table(100, 64)``), so
    this drawing module needs no model code.

    Args:
        table: The position table, ``(max_len, dim)`` (a tensor or an array).
        path: Output PNG path (parent folders are created).
        dims_to_plot: Columns drawn as curves; those ``>= dim`` are skipped.

    Returns:
        ``path`` as a :class:`pathlib.Path`.
    """
    table = _to_numpy(table)  # (max_len, dim)
    if table.ndim != 2:
        raise ValueError(f"table must be (max_len, dim), got shape {table.shape}")
    max_len, dim = table.shape
    path = _prepare(path)
    fig = Figure(figsize=(13, 4.8))
    ax_img, ax_curve = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1]})
    im = ax_img.imshow(table, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax_img.set_xlabel("encoding dimension")
    ax_img.set_ylabel("position")
    ax_img.set_title(f"Sinusoidal positional encoding ({max_len} x {dim})")
    fig.colorbar(im, ax=ax_img, fraction=0.046, pad=0.04)
    positions = np.arange(max_len)
    for d in dims_to_plot:
        if d < dim:
            kind = "sin" if d % 2 == 0 else "cos"
            ax_curve.plot(positions, table[:, d], label=f"dim {d} ({kind})")
    ax_curve.set_xlabel("position")
    ax_curve.set_ylabel("value")
    ax_curve.set_ylim(-1.1, 1.1)
    ax_curve.set_title("Selected dimensions")
    ax_curve.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


__all__ = ["plot_attention", "plot_positional_encoding"]


def plot_alignment(weights, source_tokens: Sequence[str], target_tokens: Sequence[str], path: PathLike,
                   title: str = "Encoder-decoder attention") -> Path:
    """Draw a translation's encoder-decoder attention: one row per target token, one
    column per source token (the lectures' alignment figure).

    Args:
        weights: ``(target_len, source_len)``; row i = where target token i looked.
        source_tokens, target_tokens: tick labels.
        path: PNG file to write.

    Raises:
        ValueError: when the shape does not match the token lists.
    """
    w = _to_numpy(weights)
    if w.ndim != 2 or w.shape != (len(target_tokens), len(source_tokens)):
        raise UserError(f"weights of shape {w.shape} do not match {len(target_tokens)} target x {len(source_tokens)} source tokens")
    size = (min(max(4.0, 0.4 * w.shape[1] + 2.0), 24.0), min(max(3.0, 0.4 * w.shape[0] + 1.5), 24.0))
    return _heatmap(w, source_tokens, target_tokens, "source", "translation", title, path, size, "auto")


def plot_training_curve(losses: Sequence[tuple], history: Sequence[dict], metric, path: PathLike, title: str = "") -> Path:
    """Training loss per optimiser step, with a dev metric per evaluation on a second axis.

    Args:
        losses: ``(step, loss)`` pairs.
        history: evaluation records with ``step`` and ``metric`` keys (may be empty).
        metric: name of the dev metric to draw from ``history`` (None: loss only).
        path: PNG file to write.
        title: figure title.
    """
    path = _prepare(path)
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    if losses:
        ax.plot([s for s, _ in losses], [v for _, v in losses], label="train loss", color="tab:blue")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss")
    if history and metric:
        ax2 = ax.twinx()
        ax2.plot([h["step"] for h in history], [h[metric] for h in history], "o-", color="tab:red", label=f"dev {metric}")
        ax2.set_ylabel(f"dev {metric}")
        ax2.legend(loc="upper right")
    ax.legend(loc="upper left")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
