"""BERT pretraining from raw text: corpus reading, NSP instances, on-disk shards,
dynamic (whole-word) masking."""

from .corpus import Instance, create_instances, read_documents, split_sentences, truncate_seq_pair
from .masking import MaskedBatch, MaskingConfig, MaskingIds, MLMCollator, mask_tokens
from .shards import PretrainDataset, ShardError, build_shards, train_vocab

__all__ = [
    "MaskedBatch",
    "MaskingConfig",
    "MaskingIds",
    "MLMCollator",
    "mask_tokens",
    "Instance",
    "PretrainDataset",
    "ShardError",
    "build_shards",
    "create_instances",
    "read_documents",
    "split_sentences",
    "train_vocab",
    "truncate_seq_pair",
]
