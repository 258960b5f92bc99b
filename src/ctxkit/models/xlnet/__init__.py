"""XLNet: two-stream relative attention and the permutation LM (``model``), and XLNet as an
encoder for the task heads (``encoder``).
"""

from .model import (
    XLNetConfig, XLNET_PRESETS, XLNetOutput, XLNetRelativeAttention, XLNetLayer, XLNetModel, XLNetLMHeadModel,
    PermutationMasks, bidirectional_position_encoding, sample_permutation_masks, load_xlnet, save_xlnet,
    xlnet_config_from_hf,
)
from .encoder import (
    XLNetEncoder, XLNetEncoderConfig,
)

__all__ = [
    'XLNetConfig', 'XLNET_PRESETS', 'XLNetOutput', 'XLNetRelativeAttention', 'XLNetLayer', 'XLNetModel',
    'XLNetLMHeadModel', 'PermutationMasks', 'bidirectional_position_encoding', 'sample_permutation_masks',
    'load_xlnet', 'save_xlnet', 'xlnet_config_from_hf', 'XLNetEncoder', 'XLNetEncoderConfig',
]
