"""Compile segments: an encoder stack that ``torch.compile`` splits into several graphs.

One compiled graph for the whole model is fastest alone, but its backward is a single
autograd node that hands every gradient over at the end. With graph breaks between equal
runs of layers each segment's backward is its own node, so the upper layers' gradients
are complete (and can be all-reduced, see
:class:`~ctxkit.training.reducer.OverlappedGradReducer`) while autograd still runs the
lower ones. Without ``torch.compile`` the breaks do nothing.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor, nn

from ..layers.transformer import TransformerEncoder
from ._swap import set_swapped

__all__ = ["SegmentedEncoder", "segment_encoders"]


class SegmentedEncoder(TransformerEncoder):
    """:class:`~ctxkit.layers.transformer.TransformerEncoder` with a graph break after each
    layer index in ``compile_breaks``. Swap it in with :func:`segment_encoders`."""

    compile_breaks: frozenset = frozenset()  # set by segment_encoders

    def _run_layers(self, x: Tensor, start: int, stop: int, mask, hidden: List[Tensor], attentions: List[Tensor],
                    output_attentions: bool, output_positions: Optional[Tensor], cache) -> Tensor:
        """Run the layers up to the next break, then recurse past it. The break sits outside
        any loop, which is what lets torch.compile resume after it (a graph break inside a
        loop makes it give up on the whole frame)."""
        cut = min([b + 1 for b in self.compile_breaks if start <= b < stop - 1] + [stop])
        x = super()._run_layers(x, start, cut, mask, hidden, attentions, output_attentions, output_positions, cache)
        if cut == stop:
            return x
        torch._dynamo.graph_break()
        return self._run_layers(x, cut, stop, mask, hidden, attentions, output_attentions, output_positions, cache)


def segment_encoders(model: nn.Module, segments: int) -> int:
    """Split every :class:`~ctxkit.layers.transformer.TransformerEncoder` in ``model`` into
    ``segments`` equal runs of layers for ``torch.compile`` (in place; 1 restores the plain
    encoder). Returns how many encoders were set. Call before compiling."""
    if segments < 1:
        raise ValueError(f"segments must be >= 1, got {segments}")
    encoders = [m for m in model.modules() if isinstance(m, TransformerEncoder)]
    for encoder in encoders:
        n = len(encoder.layers)
        breaks = frozenset(round(k * n / segments) - 1 for k in range(1, min(segments, n)))
        # No breaks (one segment, or one layer) means the plain encoder.
        set_swapped(encoder, SegmentedEncoder, "compile_breaks", breaks or None)
    return len(encoders)
