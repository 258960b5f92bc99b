"""Readers for benchmark and user data; every one checks its input and reports problems.

* :mod:`.glue`: GLUE tasks (:data:`GLUE_TASKS`, :func:`read_glue`) and the user's own
  ``.csv`` / ``.tsv`` / ``.jsonl`` tables (:func:`read_table`).
* :mod:`.conll`: CoNLL-2003 NER (:func:`read_conll`), IOB1 -> BIO, sub-word label alignment.
* :mod:`.squad`: SQuAD v1.1 / v2.0 (:func:`read_squad`), article-level splitting.
* :mod:`.errors`: :class:`DataError`, :class:`ReadResult` and the ``on_error`` policy.

Batching utilities live in :mod:`ctxkit.data.batching` (imported on its own; it needs torch).
"""

from .conll import (
    ConllReadResult,
    TaggedSentence,
    align_labels,
    encode_tagged,
    iob1_to_bio,
    label_list,
    read_conll,
    word_predictions,
)
from .errors import DataError, ReadResult, summarize
from .glue import (
    GLUE_TASKS,
    GlueTask,
    TextExample,
    TextReadResult,
    get_glue_task,
    read_glue,
    read_table,
)
from .squad import Answer, QAExample, read_squad, split_by_article

__all__ = [
    "DataError", "ReadResult", "summarize",
    "TextExample", "TextReadResult", "GlueTask", "GLUE_TASKS", "get_glue_task", "read_glue", "read_table",
    "TaggedSentence", "ConllReadResult", "read_conll", "iob1_to_bio", "label_list", "align_labels",
    "word_predictions", "encode_tagged",
    "Answer", "QAExample", "read_squad", "split_by_article",
]
