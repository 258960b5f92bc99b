"""Shared building blocks: attention, positions, FFN, Transformer layers, embeddings."""

from .attention import (
    AdditiveAttention,
    DotProductAttention,
    MultiHeadAttention,
    PackedSequences,
    causal_mask,
    masked_softmax,
    padding_mask,
    scaled_dot_product_attention,
    varlen_attention,
)
from .embeddings import TransformerEmbeddings
from .ffn import PositionwiseFFN, get_activation
from .kv_cache import KVCache, LayerKVCache
from .position import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)
from .quaternion import QUATERNION_TARGETS, QuaternionLinear, hamilton_product, quaternionize
from .relative_attention import RelativeMultiHeadAttention, rel_shift, relative_distance_index
from .sparse_attention import LayoutPart, SparseLayout, SparsePattern, flex_attention_available
from .transformer import (
    AddNorm,
    EncoderOutput,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ = [
    "AdditiveAttention",
    "DotProductAttention",
    "MultiHeadAttention",
    "causal_mask",
    "masked_softmax",
    "padding_mask",
    "scaled_dot_product_attention",
    "PackedSequences",
    "varlen_attention",
    "TransformerEmbeddings",
    "KVCache",
    "LayerKVCache",
    "PositionwiseFFN",
    "get_activation",
    "LearnedPositionalEmbedding",
    "SinusoidalPositionalEncoding",
    "sinusoidal_table",
    "QUATERNION_TARGETS",
    "QuaternionLinear",
    "hamilton_product",
    "quaternionize",
    "RelativeMultiHeadAttention",
    "rel_shift",
    "relative_distance_index",
    "SparsePattern",
    "SparseLayout",
    "LayoutPart",
    "flex_attention_available",
    "AddNorm",
    "EncoderOutput",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
]
