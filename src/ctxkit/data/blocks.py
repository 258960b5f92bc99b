"""Token blocks: many single texts' token ids in one array, for inference without per-text objects.

A text task's features are one dict of three lists per text, which training needs (labels,
masks, segment ids of pairs). Inference over single texts needs only the ids: a
:class:`TokenBlock` holds them as one padded ``(texts, width)`` array and the lengths, so
batching is array slicing and a tokenizing process can hand thousands of texts over as two
arrays (:mod:`ctxkit.tokenizers.bulk`). Its batches equal :func:`ctxkit.data.batching.collate`
of the same features exactly (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

import numpy as np

# As in ctxkit.data.batching (not imported: a tokenizing process needs no torch).
_PAD_ID = 0

__all__ = ["TokenBlock"]


@dataclass(frozen=True)
class TokenBlock:
    """Single texts' token ids, right-padded into one array.

    Attributes:
        ids: ``(texts, width)`` int32 token ids, each row padded with ``input_ids``' pad (0)
            after its own length.
        lengths: ``(texts,)`` int64 lengths (special tokens included).
        truncated: how many of the texts were cut to fit (for the caller's one warning).

    The segment ids are all 0 and the attention mask is 1 up to each length (a single
    text under BERT's template), so neither is stored.
    """

    ids: np.ndarray
    lengths: np.ndarray
    truncated: int = 0

    def __post_init__(self):
        if self.ids.ndim != 2 or self.lengths.shape != (self.ids.shape[0],):
            raise ValueError(f"TokenBlock: ids must be (texts, width) and lengths (texts,), got {self.ids.shape} and {self.lengths.shape}")

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    @classmethod
    def from_ids(cls, rows: Sequence[Sequence[int]], width: int = 0, truncated: int = 0) -> "TokenBlock":
        """A block of ``rows`` (lists of ids), at least ``width`` columns wide."""
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        width = max(width, int(lengths.max()) if len(rows) else 0)
        ids = np.full((len(rows), width), _PAD_ID, dtype=np.int32)
        if len(rows):
            flat = np.fromiter((t for r in rows for t in r), dtype=np.int32, count=int(lengths.sum()))
            # Row-major order of the filled cells is exactly the rows' concatenation.
            ids[np.arange(width) < lengths[:, None]] = flat
        return cls(ids, lengths, truncated)

    def rows(self) -> List[List[int]]:
        """Each text's ids as a list (the features' ``input_ids``)."""
        return [row[:n].tolist() for row, n in zip(self.ids, self.lengths.tolist())]

    def batch(self, idx: Sequence[int]) -> Dict[str, np.ndarray]:
        """The batch of texts ``idx`` as int64 arrays: what :func:`~ctxkit.data.batching.collate`
        gives for their feature dicts (``input_ids``, ``token_type_ids``, ``attention_mask``,
        padded to the longest of them), before it becomes tensors."""
        idx = np.asarray(idx, dtype=np.int64)
        lengths = self.lengths[idx]
        longest = int(lengths.max()) if len(idx) else 0
        input_ids = self.ids[idx, :longest].astype(np.int64)
        mask = (np.arange(longest) < lengths[:, None]).astype(np.int64)
        return {"input_ids": input_ids, "token_type_ids": np.zeros_like(input_ids), "attention_mask": mask}
