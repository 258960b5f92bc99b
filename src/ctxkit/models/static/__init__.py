"""Static word vectors: ``WordVectors`` and fastText sub-words (``vectors``), the GloVe / word2vec /
fastText files (``io``) and the bag-of-embeddings sentence classifier (``bag``). Training them:
:mod:`ctxkit.pretraining.word2vec` and :mod:`ctxkit.tasks.bag_classifier`.
"""

from .vectors import (
    WordVectors, char_ngrams, fasttext_hash, ngram_buckets,
)
from .io import (
    StaticVectorsConfig, STATIC_PRESETS, FORMATS, guess_format, open_file, read_corpus, read_vectors,
    write_vectors,
)
from .bag import (
    BagOfEmbeddingsClassifier,
)

__all__ = [
    'WordVectors', 'char_ngrams', 'fasttext_hash', 'ngram_buckets', 'StaticVectorsConfig', 'STATIC_PRESETS',
    'FORMATS', 'guess_format', 'open_file', 'read_corpus', 'read_vectors', 'write_vectors',
    'BagOfEmbeddingsClassifier',
]
