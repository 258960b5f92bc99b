"""One shape-keyed cache of captured CUDA graphs, shared by training, inference and decoding.

A CUDA graph replays a fixed sequence of kernels on fixed buffers, so each input shape
needs a graph of its own. The three runners that capture -- the whole training step
(:class:`ctxkit.training.graphs.GraphedTrainStep`), the encoder forward
(:class:`ctxkit.inference.gpu.GPUEncoder`) and the decoding step and prompt pass
(:class:`ctxkit.decoding.static_decode.StaticDecoder`) -- keep them here: a key made of
the shapes, an entry holding the graph with its static inputs and outputs, the oldest
entries dropped past a bound (each holds its activations), and counters that say how
many captures a run made (a capture after warm-up is a new shape: the trainer logs it).

:func:`capture_graph` is the one recipe: a few warm-up calls on a side stream (cuBLAS
workspaces, autotuning and compilation happen there, not in the graph), then the capture
with ``capture_error_mode="thread_local"`` (a server's event loop or a DataLoader's
pin-memory thread may touch CUDA meanwhile).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterator, Optional, Tuple

import torch

__all__ = ["GraphCache", "capture_graph"]


class GraphCache:
    """Entries (a graph with its buffers, or anything a runner keeps per shape) by key.

    Args:
        max_entries: keep at most this many; the least recently used goes first
            (None: no bound, e.g. a training step's few padded shapes).

    Attributes:
        captures: entries added so far (each a capture).
        hits: lookups that found their entry.
    """

    def __init__(self, max_entries: Optional[int] = 8):
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be >= 1 or None, got {max_entries}")
        self.max_entries = max_entries
        self._entries: "OrderedDict[Hashable, Any]" = OrderedDict()
        self.captures = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._entries)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The entry of ``key`` (marked recently used), or ``default``."""
        if key not in self._entries:
            return default
        self._entries.move_to_end(key)
        self.hits += 1
        return self._entries[key]

    def put(self, key: Hashable, entry: Any) -> Any:
        """Store ``entry`` under ``key``, dropping the least recently used past the bound."""
        if key in self._entries:
            self._entries.move_to_end(key)
        elif self.max_entries is not None:
            while len(self._entries) >= self.max_entries:
                self._entries.popitem(last=False)
        self._entries[key] = entry
        self.captures += 1
        return entry

    def get_or_capture(self, key: Hashable, capture: Callable[[], Any]) -> Any:
        """The entry of ``key``, captured by ``capture()`` the first time."""
        if key in self._entries:
            return self.get(key)
        return self.put(key, capture())

    def clear(self) -> None:
        """Drop every entry (the counters stay)."""
        self._entries.clear()


def capture_graph(run: Callable[[], Any], *, warmup: int = 3, pool: Any = None,
                  generator: Optional[torch.Generator] = None,
                  device: Optional[torch.device] = None) -> Tuple["torch.cuda.CUDAGraph", Any]:
    """Warm ``run`` up on a side stream ``warmup`` times, then capture one call of it.

    Args:
        run: the work to capture; it reads and writes only buffers that outlive the graph.
        warmup: calls before the capture (0 when the caller already ran this shape).
        pool: a memory pool shared with other graphs (``torch.cuda.graph_pool_handle()``).
        generator: a CUDA generator the graph draws from (registered with the graph).
        device: the CUDA device (default: the current one).

    Returns:
        ``(graph, outputs)``: replay ``graph`` to recompute ``outputs`` in place.
    """
    if warmup:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                run()
        torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    if generator is not None and generator.device.type == "cuda":
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        outputs = run()
    return graph, outputs
