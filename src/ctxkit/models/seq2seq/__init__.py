"""The encoder-decoder translators: the Transformer (Vaswani et al.) and the RNN with additive
attention (Bahdanau et al.), their configs, presets and folders (``model``).
"""

from .model import (
    Seq2SeqConfig, SEQ2SEQ_PRESETS, RNNSeq2SeqConfig, RNN_SEQ2SEQ_PRESETS, TransformerSeq2Seq, RNNSeq2Seq,
    RNNState, BoundDecoder, save_seq2seq, load_seq2seq,
)

__all__ = [
    'Seq2SeqConfig', 'SEQ2SEQ_PRESETS', 'RNNSeq2SeqConfig', 'RNN_SEQ2SEQ_PRESETS', 'TransformerSeq2Seq',
    'RNNSeq2Seq', 'RNNState', 'BoundDecoder', 'save_seq2seq', 'load_seq2seq',
]
