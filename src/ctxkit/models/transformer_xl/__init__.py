"""Transformer-XL: the segment-recurrent LM with relative positions (``model``), HF checkpoints and
ctxkit's own folders (``io``).
"""

from .model import (
    TransformerXLConfig, TRANSFO_XL_PRESETS, AdaptiveEmbedding, TransformerXLLayer, TransformerXLModel,
    TransformerXLLMHeadModel, TransformerXLLMOutput, VanillaBody, VanillaTransformerLM,
    build_transformer_xl_lm,
)
from .io import (
    transformer_xl_config_from_hf, load_transformer_xl, save_transformer_xl_lm, load_transformer_xl_lm,
    is_ctxkit_transformer_xl, CTXKIT_MODEL_TYPE,
)

__all__ = [
    'TransformerXLConfig', 'TRANSFO_XL_PRESETS', 'AdaptiveEmbedding', 'TransformerXLLayer',
    'TransformerXLModel', 'TransformerXLLMHeadModel', 'TransformerXLLMOutput', 'VanillaBody',
    'VanillaTransformerLM', 'build_transformer_xl_lm', 'transformer_xl_config_from_hf', 'load_transformer_xl',
    'save_transformer_xl_lm', 'load_transformer_xl_lm', 'is_ctxkit_transformer_xl', 'CTXKIT_MODEL_TYPE',
]
