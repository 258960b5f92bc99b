"""Character-level LMs: deep causal self-attention (Al-Rfou et al.) and the LSTM baseline (``model``).
"""

from .model import (
    CharTransformerConfig, CharLSTMConfig, CharTransformerLM, CharLSTMLM, CHAR_PRESETS, CHAR_DESCRIPTIONS,
    save_char_lm, load_char_lm, build_char_lm, CHAR_MODEL_TYPES,
)

__all__ = [
    'CharTransformerConfig', 'CharLSTMConfig', 'CharTransformerLM', 'CharLSTMLM', 'CHAR_PRESETS',
    'CHAR_DESCRIPTIONS', 'save_char_lm', 'load_char_lm', 'build_char_lm', 'CHAR_MODEL_TYPES',
]
