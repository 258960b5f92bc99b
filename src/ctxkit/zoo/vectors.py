"""Static word vectors through the zoo: the files commands read and write.

:class:`~ctxkit.models.static.vectors.WordVectors` reads and writes GloVe text, word2vec text and
binary and fastText ``.vec`` files (:data:`FORMATS`; :func:`guess_format` tells one from
its suffix and first line); the static family of :mod:`ctxkit.zoo.families` loads folders
of them. Training them is :func:`ctxkit.pretraining.word2vec.train_word2vec`.
"""

from __future__ import annotations

from ..models.static.vectors import WordVectors
from ..models.static.io import FORMATS, guess_format

__all__ = ["FORMATS", "WordVectors", "guess_format"]
