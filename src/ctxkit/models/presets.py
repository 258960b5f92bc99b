"""Named architectures as frozen data.

Names follow the GluonNLP convention ``<family>_<layers>_<hidden>_<heads>``. A preset
fixes the architecture; a checkpoint may still bring its own vocabulary size,
number of positions or segment vocabulary (see :meth:`BertConfig.with_checkpoint`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Tuple

from ..core.errors import UnknownNameError, UserError

__all__ = ["BertConfig", "Preset", "PRESETS", "get_preset", "GPT2Config", "GPT2_PRESETS", "Seq2SeqConfig", "SEQ2SEQ_PRESETS", "RNNSeq2SeqConfig",
           "RNN_SEQ2SEQ_PRESETS", "TransformerXLConfig", "TRANSFO_XL_PRESETS", "XLNetConfig", "XLNET_PRESETS"]


@dataclass(frozen=True)
class BertConfig:
    """Architecture of a BERT-family encoder.

    Attributes:
        num_layers: Transformer layers.
        hidden_size: model width.
        num_heads: attention heads.
        ffn_size: FFN inner size.
        vocab_size: WordPiece vocabulary size.
        max_position: number of learned positions (longest input).
        type_vocab_size: segment vocabulary (0: no segment embeddings, as in DistilBERT).
        dropout: residual and embedding dropout.
        attention_dropout: dropout on attention weights.
        activation: FFN activation name.
        layer_norm_eps: LayerNorm epsilon.
        pad_token_id: id of [PAD].
        pooler: has the tanh pooler over [CLS] (BERT) or not (DistilBERT).
        family: checkpoint key layout, ``"bert"`` or ``"distilbert"``.
    """

    num_layers: int = 12
    hidden_size: int = 768
    num_heads: int = 12
    ffn_size: int = 3072
    vocab_size: int = 30522
    max_position: int = 512
    type_vocab_size: int = 2
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu"
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    pooler: bool = True
    family: str = "bert"

    # Fields a checkpoint may legitimately change without changing the architecture.
    # (Task checkpoints such as HF's BertForTokenClassification carry no pooler.)
    CHECKPOINT_FIELDS = ("vocab_size", "max_position", "type_vocab_size", "dropout", "attention_dropout", "pad_token_id", "pooler")
    ARCHITECTURE_FIELDS = ("num_layers", "hidden_size", "num_heads", "ffn_size", "activation", "family")

    def replace(self, **changes) -> "BertConfig":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def with_checkpoint(self, other: "BertConfig", preset_name: str = "preset") -> "BertConfig":
        """This architecture with a checkpoint's vocabulary/position settings.

        Raises:
            ValueError: listing every architecture field where the checkpoint differs.
        """
        diffs = [
            f"{f}: {preset_name} has {getattr(self, f)!r}, checkpoint has {getattr(other, f)!r}"
            for f in self.ARCHITECTURE_FIELDS
            if getattr(self, f) != getattr(other, f)
        ]
        if diffs:
            raise UserError("checkpoint does not match the preset architecture:\n  " + "\n  ".join(diffs))
        return self.replace(**{f: getattr(other, f) for f in self.CHECKPOINT_FIELDS})


@dataclass(frozen=True)
class Preset:
    """A named architecture.

    Attributes:
        name: registry name.
        config: the architecture.
        description: one line for ``ctxkit list-models``.
    """

    name: str
    config: BertConfig
    description: str


def _bert(layers: int, hidden: int, heads: int, **extra) -> BertConfig:
    return BertConfig(num_layers=layers, hidden_size=hidden, num_heads=heads, ffn_size=4 * hidden, **extra)


PRESETS: Dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("bert_12_768_12", _bert(12, 768, 12), "BERT-base, 110M parameters (Devlin et al. 2019)"),
        Preset("bert_24_1024_16", _bert(24, 1024, 16), "BERT-large, 340M parameters"),
        Preset("bert_6_384_12", _bert(6, 384, 12), "MiniLM-L6-H384 (all-MiniLM-L6-v2's encoder), 22M parameters"),
        Preset("bert_4_256_4", _bert(4, 256, 4), "BERT-mini (Turc et al. 2019), 11M parameters"),
        Preset("bert_2_128_2", _bert(2, 128, 2), "BERT-tiny (Turc et al. 2019), 4.4M parameters"),
        Preset(
            "distilbert_6_768_12",
            _bert(6, 768, 12, type_vocab_size=0, pooler=False, family="distilbert"),
            "DistilBERT-base, 66M parameters: no segments, no pooler (Sanh et al. 2019)",
        ),
    )
}


def get_preset(name: str) -> Preset:
    """Look up a preset by name.

    Raises:
        KeyError: with the list of known names.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise UnknownNameError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}") from None


@dataclass(frozen=True)
class GPT2Config:
    """Architecture of a GPT-2 model.

    Attributes:
        num_layers, hidden_size, num_heads: depth, width and heads.
        vocab_size: byte-level BPE vocabulary size (50257 for the released models).
        max_position: learned positions (the context length).
        ffn_size: FFN inner size (4 x hidden).
        dropout: embedding and residual dropout.
        attention_dropout: dropout on attention weights.
        activation: FFN activation (``gelu_new``: the tanh approximation).
        layer_norm_eps: LayerNorm epsilon.
    """

    num_layers: int = 12
    hidden_size: int = 768
    num_heads: int = 12
    vocab_size: int = 50257
    max_position: int = 1024
    ffn_size: int = 3072
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu_new"
    layer_norm_eps: float = 1e-5

    def replace(self, **changes) -> "GPT2Config":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


def _gpt2(layers: int, hidden: int, heads: int) -> GPT2Config:
    return GPT2Config(num_layers=layers, hidden_size=hidden, num_heads=heads, ffn_size=4 * hidden)


# The four released GPT-2 sizes and three small ones. Kept apart from PRESETS (BERT-family encoders, which
# the zoo and `ctxkit list-models` build) until the zoo learns byte-level BPE checkpoints.
GPT2_PRESETS: Dict[str, GPT2Config] = {
    "gpt2_117m": _gpt2(12, 768, 12),
    "gpt2_345m": _gpt2(24, 1024, 16),
    "gpt2_774m": _gpt2(36, 1280, 20),
    "gpt2_1558m": _gpt2(48, 1600, 25),
    # Small ones for training from scratch on one GPU (or a CPU, for tests).
    "gpt2_6_512_8": _gpt2(6, 512, 8),
    "gpt2_4_256_4": _gpt2(4, 256, 4),
    "gpt2_2_128_2": _gpt2(2, 128, 2),
}


@dataclass(frozen=True)
class Seq2SeqConfig:
    """Architecture of a Transformer encoder-decoder (Vaswani et al. 2017).

    Attributes:
        num_encoder_layers, num_decoder_layers: stack depths.
        hidden_size, num_heads, ffn_size: width, heads and FFN inner size.
        vocab_size: the shared source/target vocabulary (joint BPE).
        max_position: longest sequence (sinusoidal table size).
        dropout, attention_dropout: residual/embedding and attention-weight dropout.
        activation: FFN activation (``relu`` in the original).
        norm_first: pre-norm layers (trains more stably without warmup tricks) or the
            original post-norm.
        tie_embeddings: one matrix for source embeddings, target embeddings and the
            output projection (possible because the vocabulary is shared).
        pad_id, bos_id, eos_id: special token ids.
    """

    num_encoder_layers: int = 3
    num_decoder_layers: int = 3
    hidden_size: int = 256
    num_heads: int = 8
    ffn_size: int = 1024
    vocab_size: int = 8000
    max_position: int = 256
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "relu"
    norm_first: bool = True
    tie_embeddings: bool = True
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def replace(self, **changes) -> "Seq2SeqConfig":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


SEQ2SEQ_PRESETS: Dict[str, Seq2SeqConfig] = {
    "transformer_base": Seq2SeqConfig(6, 6, 512, 8, 2048, vocab_size=37000, norm_first=False),  # the paper's base model
    "transformer_3_256_8": Seq2SeqConfig(3, 3, 256, 8, 1024),  # Multi30k-sized
    "transformer_3_512_8": Seq2SeqConfig(3, 3, 512, 8, 2048),  # wider, for Multi30k with more dropout
    "transformer_6_512_8": Seq2SeqConfig(6, 6, 512, 8, 2048),  # the base width with pre-norm
}


@dataclass(frozen=True)
class RNNSeq2SeqConfig:
    """Architecture of the RNN encoder-decoder with additive attention (Bahdanau et al. 2015).

    Attributes:
        embed_size: token embedding size (shared vocabulary, one embedding table).
        hidden_size: GRU state size (the encoder is bidirectional: 2x this per position).
        num_layers: GRU layers in the encoder and the decoder.
        attention_size: hidden size of the additive score MLP.
        vocab_size, max_position: as in :class:`Seq2SeqConfig` (``max_position`` bounds
            decoding only; an RNN has no position table).
        dropout: on embeddings and between layers.
        pad_id, bos_id, eos_id: special token ids.
    """

    embed_size: int = 256
    hidden_size: int = 512
    num_layers: int = 1
    attention_size: int = 512
    vocab_size: int = 8000
    max_position: int = 256
    dropout: float = 0.3
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def replace(self, **changes) -> "RNNSeq2SeqConfig":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


RNN_SEQ2SEQ_PRESETS: Dict[str, RNNSeq2SeqConfig] = {
    "rnn_attention_256_512": RNNSeq2SeqConfig(),  # the lectures' recap baseline on Multi30k
}


@dataclass(frozen=True)
class TransformerXLConfig:
    """Architecture and segment lengths of a Transformer-XL language model (Dai et al. 2019).

    Attributes:
        vocab_size: word vocabulary size (267735 for WikiText-103, 33278 for WikiText-2).
        d_model: model width (also the embedding projection size).
        n_heads: attention heads; must divide ``d_model``.
        d_inner: FFN inner size.
        n_layers: depth.
        mem_len: hidden states kept per layer from earlier segments (training).
        tgt_len: segment length (training).
        dropout: embedding, residual, FFN and output dropout.
        dropatt: dropout on attention weights.
        cutoffs: adaptive input/softmax cluster boundaries (empty: plain embedding and softmax).
        div_val: embedding size divisor per cluster (``d_model // div_val**i``); 1 keeps
            full-size embeddings in every cluster.
        pre_lnorm: pre-norm layers (False in the paper: post-norm).
        untie_r: every layer has its own ``u``/``v`` (the released WT103 models) instead
            of one pair shared by all layers (the paper's description).
        clamp_len: longest relative distance encoded (-1: no limit); longer ones reuse it.
        d_embed: largest embedding size (0: ``d_model``).
        same_length: every query sees the same number of keys (the oldest memory keys are
            hidden from the later queries), as the released models were evaluated.
    """

    vocab_size: int = 267735
    d_model: int = 410
    n_heads: int = 10
    d_inner: int = 2100
    n_layers: int = 16
    mem_len: int = 150
    tgt_len: int = 150
    dropout: float = 0.1
    dropatt: float = 0.0
    cutoffs: Tuple[int, ...] = (20000, 40000, 200000)
    div_val: int = 1
    pre_lnorm: bool = False
    untie_r: bool = True
    clamp_len: int = -1
    d_embed: int = 0
    same_length: bool = False

    def replace(self, **changes) -> "TransformerXLConfig":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


TRANSFO_XL_PRESETS: Dict[str, TransformerXLConfig] = {
    # The paper's base WikiText-103 model (train: tgt_len 150, mem_len 150).
    "transfo_xl_base_wt103": TransformerXLConfig(),
    # Small enough to train on WikiText-2 on one GPU in minutes.
    "transfo_xl_wt2_small": TransformerXLConfig(vocab_size=33278, d_model=256, n_heads=8, d_inner=1024, n_layers=4, mem_len=128,
                                                tgt_len=128, dropout=0.1, dropatt=0.0, cutoffs=(2000, 10000), div_val=2),
}


@dataclass(frozen=True)
class XLNetConfig:
    """Architecture of an XLNet model (Yang et al. 2019): a post-norm Transformer-XL body
    with bidirectional relative positions, relative segment encodings and two-stream attention.

    Attributes:
        vocab_size: SentencePiece vocabulary size (32000 for the released models).
        d_model: model width.
        n_heads: attention heads; must divide ``d_model``.
        d_inner: FFN inner size.
        n_layers: depth.
        activation: FFN activation (``gelu``: the exact erf form).
        dropout: embedding, attention-weight, residual and FFN dropout (one rate, as in HF).
        layer_norm_eps: LayerNorm epsilon.
        clamp_len: longest relative distance encoded (-1: no limit); longer ones reuse it.
        mem_len: hidden states kept per layer as memory for the next segment (0: keep all
            that are passed back).
    """

    vocab_size: int = 32000
    d_model: int = 768
    n_heads: int = 12
    d_inner: int = 3072
    n_layers: int = 12
    activation: str = "gelu"
    dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    clamp_len: int = -1
    mem_len: int = 0

    def replace(self, **changes) -> "XLNetConfig":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


XLNET_PRESETS: Dict[str, XLNetConfig] = {
    "xlnet_12_768_12": XLNetConfig(),  # xlnet-base-cased
    "xlnet_24_1024_16": XLNetConfig(d_model=1024, n_heads=16, d_inner=4096, n_layers=24),  # xlnet-large-cased
    # The size of bert_4_256_4 (BERT-mini), for from-scratch comparisons at equal size.
    "xlnet_4_256_4": XLNetConfig(d_model=256, n_heads=4, d_inner=1024, n_layers=4),
}
