"""Where the word features of :mod:`ctxkit.tasks.feature_models` come from.

* :class:`StaticFeatures`: a :class:`~ctxkit.models.static.vectors.WordVectors` lookup, ``(1, n_words, dim)`` per sentence.
* :class:`ElmoFeatures`: every layer of a frozen biLM via :func:`~ctxkit.models.elmo.model.elmo_embed`,
  ``(L, n_words, dim)`` per sentence, computed in chunks.
* :func:`load_bilm`: a biLM from what :func:`~ctxkit.pretraining.bilm.train_bilm` writes (run
  folder, ``final/``, ``checkpoint/``, an earlier version's ``checkpoint.pt``) or from a bilm-tf options + hdf5 pair.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..models.elmo.model import ElmoBiLM, elmo_embed
from ..models.elmo.io import load_bilm
from ..models.static.vectors import WordVectors

__all__ = ["StaticFeatures", "ElmoFeatures", "load_bilm", "CASING_DIM"]

Device = Union[str, torch.device]
CASING_DIM = 4


# ---------------------------------------------------------------------------- feature sources


def _casing(word: str) -> List[float]:
    """``[all lower, all upper, capitalised, has a digit]``: what lowercased vectors lose."""
    return [float(word.islower()), float(word.isupper()), float(word[:1].isupper() and not word.isupper()),
            float(any(c.isdigit() for c in word))]


class StaticFeatures:
    """Context-free features: each word's vector, ``(1, n_words, dim)`` per sentence.

    A word is looked up as written, then lowercased; vocabulary hits beat fastText sub-word
    vectors. A word with no vector gets zeros, which the task model learns to read as
    "unknown". ``found`` / ``missing`` count the words looked up.

    Args:
        vectors: the word vectors. dtype: of the returned tensors.
        lowercase: try the lowercased form first (vectors trained on lowercased text).
        casing: append :data:`CASING_DIM` casing indicators (see :func:`_casing`) to every vector.
    """

    num_layers = 1

    def __init__(self, vectors: WordVectors, lowercase: bool = False, casing: bool = False, dtype: torch.dtype = torch.float32):
        self.vectors, self.lowercase, self.casing, self.dtype = vectors, lowercase, casing, dtype
        self.dim = vectors.dim + (CASING_DIM if casing else 0)
        self.found = self.missing = 0
        self._cache: Dict[str, Optional[np.ndarray]] = {}

    def lookup(self, word: str) -> Optional[np.ndarray]:
        """The ``(vectors.dim,)`` vector used for ``word``, or None."""
        if word not in self._cache:
            forms = [word.lower(), word] if self.lowercase else [word, word.lower()]
            hit = next((f for f in forms if f in self.vectors), None)
            if hit is None and self.vectors.ngram_vectors is not None:
                hit = next((f for f in forms if self.vectors.has_vector(f)), None)
            self._cache[word] = None if hit is None else self.vectors[hit]
        return self._cache[word]

    @property
    def coverage(self) -> float:
        """Share of the words looked up so far that had a vector."""
        return self.found / max(1, self.found + self.missing)

    def __call__(self, sentences: Sequence[Sequence[str]]) -> List[Tensor]:
        """Lists of words -> one ``(1, n_words, dim)`` tensor per sentence."""
        out = []
        for words in sentences:
            rows = np.zeros((len(words), self.dim), np.float32)
            for j, word in enumerate(words):
                vec = self.lookup(word)
                self.found, self.missing = self.found + (vec is not None), self.missing + (vec is None)
                if vec is not None:
                    rows[j, : self.vectors.dim] = vec
                if self.casing:
                    rows[j, self.vectors.dim :] = _casing(word)
            out.append(torch.from_numpy(rows).to(self.dtype)[None])
        return out


class ElmoFeatures:
    """All representation layers of a frozen biLM: ``(L, n_words, 2 * projection_dim)`` per sentence.

    :func:`elmo_embed` runs on chunks of sentences, longest first (so one padded
    ``(chunk, L, max_words, dim)`` float32 tensor exists at a time, never one for the corpus);
    it starts every sentence from zero LSTM states, so vectors do not depend on the batching.

    Args:
        bilm: the biLM, moved to ``device`` (default: left where it is). progress: a tqdm bar.
        batch_size, chunk_size: sentences per biLM forward pass, per :func:`elmo_embed` call.
        dtype: of the returned tensors (float16 halves a corpus' memory).
    """

    def __init__(self, bilm: ElmoBiLM, device: Optional[Device] = None, batch_size: int = 64, chunk_size: int = 512,
                 dtype: torch.dtype = torch.float16, progress: bool = True):
        self.bilm = bilm if device is None else bilm.to(device)
        self.device = next(self.bilm.parameters()).device
        self.batch_size, self.chunk_size, self.dtype, self.progress = batch_size, chunk_size, dtype, progress
        self.num_layers, self.dim = bilm.num_representation_layers, bilm.config.output_dim

    def __call__(self, sentences: Sequence[Sequence[str]], desc: str = "ELMo") -> List[Tensor]:
        """Lists of words -> one ``(L, n_words, dim)`` tensor per sentence, in input order."""
        # Longest first: similar lengths share a padded batch, and the largest chunk comes first.
        order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
        out: List[Optional[Tensor]] = [None] * len(sentences)
        with tqdm(total=len(sentences), desc=desc, unit="sent", disable=not self.progress, mininterval=1.0) as bar:
            for start in range(0, len(order), self.chunk_size):
                index = order[start : start + self.chunk_size]
                emb = elmo_embed(self.bilm, [list(sentences[i]) for i in index], batch_size=self.batch_size, device=self.device)
                for row, i in enumerate(index):
                    # A copy: a view would keep the whole padded chunk alive.
                    out[i] = emb.layers[row, :, : len(sentences[i])].to(self.dtype, copy=True)
                bar.update(len(index))
        return out
