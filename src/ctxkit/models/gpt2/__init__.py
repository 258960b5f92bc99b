"""GPT-2: the config and presets, the decoder-only pre-norm LM and its HF checkpoint layout (``model``).
"""

from .model import (
    GPT2Config, GPT2_PRESETS, GPT2Model, GPT2LMHeadModel, load_gpt2, save_gpt2, gpt2_config_from_hf,
)

__all__ = [
    'GPT2Config', 'GPT2_PRESETS', 'GPT2Model', 'GPT2LMHeadModel', 'load_gpt2', 'save_gpt2',
    'gpt2_config_from_hf',
]
