"""BERT (and DistilBERT's architecture) from the shared layers.

Read top to bottom: embeddings -> encoder -> pooler, the two pretraining heads, then
loading and saving checkpoints in the Hugging Face layout.

DistilBERT is BERT without segment embeddings and without the pooler (its layers are
the same post-norm Transformer layers), so one :class:`BertModel` serves both; only the
checkpoint key names differ (:data:`HF_KEYS`).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from ...core.checkpoint import (
    CheckpointError,
    check_config_fields,
    KeyMap,
    load_state_dict_strict,
    read_config,
    read_weights,
    save_weights,
    write_json,
)
from ...layers import (
    PackedSequences,
    TransformerEmbeddings,
    TransformerEncoder,
    get_activation,
    padding_mask,
)
from ..common import IndexableOutput, Preset, PretrainedHabits, Replaceable
from ...core.errors import UnknownNameError, UserError, quote
from ...core.meta_build import meta_device

__all__ = [
    "BertConfig",
    "PRESETS",
    "get_preset",
    "BertOutput",
    "BertPooler",
    "BertModel",
    "BertMLMHead",
    "BertNSPHead",
    "BertForPreTraining",
    "config_from_hf",
    "config_to_hf",
    "load_bert",
    "save_bert",
]


@dataclass(frozen=True)
class BertConfig(Replaceable):
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

logger = logging.getLogger("ctxkit")


@dataclass
class BertOutput(IndexableOutput):
    """What :class:`BertModel` returns. It also reads like transformers' output
    (:class:`~ctxkit.models.common.IndexableOutput`): ``out[0]`` is ``last_hidden_state``,
    ``out[1]`` the next non-None field (``pooler_output`` if there is a pooler), and
    ``hidden, pooled = out`` or ``out["last_hidden_state"]`` work.

    Attributes:
        last_hidden_state: ``(batch, seq, hidden)``.
        pooler_output: ``(batch, hidden)``, or None without a pooler.
        hidden_states: ``num_layers + 1`` tensors ``(batch, seq, hidden)``; index 0 is the
            embedding output, index i the output of layer i. Only when requested.
        attentions: ``num_layers`` tensors ``(batch, heads, seq, seq)``. Only when requested.
    """

    last_hidden_state: Tensor
    pooler_output: Optional[Tensor] = None
    hidden_states: Optional[Tuple[Tensor, ...]] = None
    attentions: Optional[Tuple[Tensor, ...]] = None


class BertPooler(nn.Module):
    """``tanh(W h_[CLS] + b)``: the sentence vector NSP was trained on."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden: Tensor) -> Tensor:
        """Args: hidden ``(batch, seq, hidden)``. Returns ``(batch, hidden)``."""
        return torch.tanh(self.dense(hidden[:, 0]))


class BertModel(PretrainedHabits, nn.Module):
    """The BERT encoder: embeddings, post-norm Transformer stack, optional pooler.

    Args:
        config: the architecture (see :mod:`ctxkit.zoo.presets`).
    """

    # forward(output_positions=...) runs the last layer's queries at those positions only; a
    # sentence head asks for [CLS] alone (ctxkit.heads.EncoderWithHead checks this flag, so
    # the heads need not know the family).
    supports_output_positions = True

    @classmethod
    def _load_folder(cls, folder):
        return load_bert(folder)

    def _save_folder(self, folder, tokenizer):
        return save_bert(self, folder, tokenizer)

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = TransformerEmbeddings(
            config.vocab_size,
            config.hidden_size,
            config.max_position,
            num_segments=config.type_vocab_size,
            eps=config.layer_norm_eps,
            dropout=config.dropout,
            pad_id=config.pad_token_id,
        )
        self.encoder = TransformerEncoder(
            config.num_layers,
            config.hidden_size,
            config.num_heads,
            config.ffn_size,
            dropout=config.dropout,
            attention_dropout=config.attention_dropout,
            activation=config.activation,
            norm_first=False,
            eps=config.layer_norm_eps,
        )
        self.pooler = BertPooler(config.hidden_size) if config.pooler else None
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # BERT's truncated-normal(0.02) initialisation; LayerNorm starts as identity.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(module.weight, std=0.02, a=-0.04, b=0.04)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Optional[Tensor] = None,
        token_type_ids: Optional[Tensor] = None,
        position_ids: Optional[Tensor] = None,
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        output_positions: Optional[Tensor] = None,
    ) -> BertOutput:
        """Encode a batch.

        The positional order is transformers': ``model(input_ids, attention_mask,
        token_type_ids, position_ids)`` (DistilBERT's ``model(input_ids, attention_mask)``
        too); the rest by keyword.

        Args:
            input_ids: ``(batch, seq)`` token ids.
            attention_mask: ``(batch, seq)``, 1 for real tokens, 0 for padding; or a
                :class:`~ctxkit.layers.attention.PackedSequences` of it, which runs the
                layers on the real tokens only (no compute on padding; outputs are still
                ``(batch, seq, hidden)``, zero on padding).
            token_type_ids: ``(batch, seq)`` segment ids (ignored by DistilBERT).
            position_ids: ``(batch, seq)``; ``0..seq-1`` when None.
            output_hidden_states: return every layer's output.
            output_attentions: return attention weights (eager attention; slower).
            output_positions: ``(batch, n)``; run the last layer only at these positions, so
                ``last_hidden_state`` is ``(batch, n, hidden)`` and the pooler reads the
                first of them (put 0 first for the usual [CLS] pooling).

        Raises:
            ValueError: when ``seq`` exceeds ``config.max_position`` (truncate or window first).
        """
        if input_ids.dim() != 2:
            raise UserError(f"input_ids must be (batch, seq), got shape {tuple(input_ids.shape)}")
        if input_ids.size(1) > self.config.max_position and position_ids is None:
            raise UserError(
                f"input has {input_ids.size(1)} tokens but this model has {self.config.max_position} positions; "
                "truncate it (tokenizer max_length) or window it (ctxkit.embed long_inputs='window')"
            )
        if isinstance(attention_mask, PackedSequences):
            return self._forward_packed(input_ids, token_type_ids, attention_mask, position_ids, output_hidden_states,
                                        output_attentions, output_positions)
        _check_mask_is_a_mask(attention_mask)
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        mask = padding_mask(attention_mask) if attention_mask is not None else None
        enc = self.encoder(x, mask=mask, output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                           output_positions=output_positions)
        pooled = self.pooler(enc.last_hidden_state) if self.pooler is not None else None
        return BertOutput(enc.last_hidden_state, pooled, enc.hidden_states, enc.attentions)

    def _forward_packed(self, input_ids, token_type_ids, packed: PackedSequences, position_ids, output_hidden_states,
                        output_attentions, output_positions) -> BertOutput:
        """The forward pass on the real tokens only; outputs come back padded (zeros on padding)."""
        if output_attentions or output_positions is not None:
            raise UserError("packed sequences do not support output_attentions or output_positions")
        ids = packed.pack(input_ids)
        types = packed.pack(token_type_ids) if token_type_ids is not None else None
        positions = packed.pack(position_ids) if position_ids is not None else packed.positions()
        x = self.embeddings(ids, types, positions)
        enc = self.encoder(x, mask=packed, output_hidden_states=output_hidden_states)
        last = packed.unpack(enc.last_hidden_state)
        hidden = tuple(packed.unpack(h) for h in enc.hidden_states) if output_hidden_states else None
        pooled = self.pooler(last) if self.pooler is not None else None
        return BertOutput(last, pooled, hidden, None)


class BertMLMHead(nn.Module):
    """Masked-LM head: dense + activation + LayerNorm, then logits over the vocabulary.

    The output projection is tied to the input word embeddings (one matrix for both), with
    its own bias; the caller passes that matrix in, so the head holds no second copy.

    Args:
        config: the architecture.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = get_activation(config.activation)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: Tensor, embedding_weight: Tensor) -> Tensor:
        """Project to vocabulary logits.

        Args:
            hidden: ``(..., hidden)``; gather the masked positions first to save work.
            embedding_weight: the tied input embedding ``(vocab, hidden)``.

        Returns:
            Logits ``(..., vocab)``.
        """
        h = self.norm(self.activation(self.transform(hidden)))
        vocab = embedding_weight.size(0)
        if h.is_cuda and vocab % 64:
            # GPU matmuls with an output width like 30522 (not a multiple of 8) fall back
            # to slow unaligned kernels; pad the vocabulary axis and drop the extra logits.
            extra = -vocab % 64
            weight = nn.functional.pad(embedding_weight, (0, 0, 0, extra))
            return nn.functional.linear(h, weight, nn.functional.pad(self.bias, (0, extra)))[..., :vocab]
        return nn.functional.linear(h, embedding_weight, self.bias)


class BertNSPHead(nn.Module):
    """Next-sentence prediction: 2-way classifier on the pooled [CLS] vector."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.classifier = nn.Linear(hidden_size, 2)

    def forward(self, pooled: Tensor) -> Tensor:
        """Args: pooled ``(batch, hidden)``. Returns logits ``(batch, 2)`` (0 = is next)."""
        return self.classifier(pooled)


def _check_mask_is_a_mask(attention_mask: Optional[Tensor]) -> None:
    """Catch token types passed where the mask goes (ctxkit's order before it became
    transformers'): every row of a real mask has a real token in its first column ([CLS], or
    the longest row of a left-padded batch), token types never do (they start at 0). Checked on
    host tensors only, where reading them costs no device sync."""
    if (attention_mask is None or attention_mask.device.type != "cpu" or attention_mask.dim() != 2
            or attention_mask.numel() == 0 or torch.compiler.is_compiling() or torch.jit.is_tracing()):
        return
    if not bool(attention_mask[:, 0].any()):
        raise UserError("attention_mask is 0 in the first column of every row, so it masks every [CLS]: is it "
                        "token_type_ids? The positional order is transformers' (input_ids, attention_mask, "
                        "token_type_ids); pass token types by keyword (token_type_ids=...) to be explicit")


class BertForPreTraining(PretrainedHabits, nn.Module):
    """Encoder plus MLM and NSP heads (the BERT pretraining model)."""

    @classmethod
    def _load_folder(cls, folder):
        return load_bert(folder, with_heads=True)

    def _save_folder(self, folder, tokenizer):
        return save_bert(self, folder, tokenizer)

    def __init__(self, config: BertConfig):
        super().__init__()
        if not config.pooler:
            raise UserError("NSP needs the pooler; this architecture has none")
        self.config = config
        self.bert = BertModel(config)
        self.mlm = BertMLMHead(config)
        self.nsp = BertNSPHead(config.hidden_size)

    def forward(self, input_ids: Tensor, attention_mask=None, token_type_ids=None, *, masked_positions: Optional[Tensor] = None):
        """Return ``(mlm_logits, nsp_logits)``.

        Args:
            masked_positions: optional ``(batch, n_masked)`` indices; when given, the
                vocabulary projection runs only there and logits are ``(batch, n_masked, vocab)``.
        """
        if masked_positions is None:
            out = self.bert(input_ids, attention_mask, token_type_ids=token_type_ids)
            hidden = out.last_hidden_state
        else:
            # The losses read [CLS] and the masked positions only, so the last layer runs
            # just there (same values; about 8 % less work for BERT-base at seq 128).
            positions = torch.cat([masked_positions.new_zeros(masked_positions.size(0), 1), masked_positions], dim=1)
            out = self.bert(input_ids, attention_mask, token_type_ids=token_type_ids, output_positions=positions)
            hidden = out.last_hidden_state[:, 1:]
        return self.mlm(hidden, self.bert.embeddings.word_embeddings.weight), self.nsp(out.pooler_output)

    def forward_packed(self, input_ids: Tensor, token_type_ids: Tensor, position_ids: Tensor, cu_seqlens: Tensor, max_len: int,
                       seq_starts: Tensor, query_positions: Tensor, cu_seqlens_q: Tensor, masked_rows: Tensor):
        """``(mlm_logits, nsp_logits)`` of sequences packed one after another in one row (no
        padding between them: a packed pretraining batch, see
        :class:`~ctxkit.pretraining.masking.MLMCollator`).

        Args:
            input_ids, token_type_ids, position_ids: ``(1, width)``; positions restart at 0
                with each sequence.
            cu_seqlens: ``(segments + 1,)`` int32 offsets of the sequences, then of the
                padding at the row's end (:meth:`PackedSequences.from_offsets`).
            max_len: a bound on every segment's length.
            seq_starts: ``(batch,)`` where each sequence begins (its [CLS]).
            query_positions: ``(1, queries)`` where the last layer runs: per sequence its
                [CLS] first, then its masked tokens (and unused slots), sequence after sequence.
            cu_seqlens_q: ``(segments + 1,)`` int32 offsets of each segment's queries.
            masked_rows: ``(slots,)`` the queries the MLM head reads.

        Returns:
            ``(1, slots, vocab)`` and ``(batch, 2)``: what :meth:`forward` returns for the same
            sequences padded, within rounding (attention never crosses a sequence), the masked
            tokens one after another.
        """
        batch, slots = seq_starts.size(0), masked_rows.size(0)
        # The last layer runs at each sequence's [CLS] and masked tokens only, as in forward.
        # A sequence's own queries are distinct positions of it, so at most max_len; the
        # unused slots add at most their share (sizes are shapes: no read from the device).
        packed = PackedSequences.from_offsets(cu_seqlens, max_len, cu_seqlens_q, max_len + -(-slots // max(batch, 1)))
        x = self.bert.embeddings(input_ids, token_type_ids, position_ids)
        hidden = self.bert.encoder(x, mask=packed, output_positions=query_positions).last_hidden_state  # (1, queries, hidden)
        pooled = self.bert.pooler(hidden[0, cu_seqlens_q[:batch].long()][:, None])  # each sequence's [CLS] comes first
        return self.mlm(hidden[:, masked_rows], self.bert.embeddings.word_embeddings.weight), self.nsp(pooled)


# ---------------------------------------------------------------------------------
# Hugging Face checkpoint layout
# ---------------------------------------------------------------------------------

_BERT_RULES = [
    ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ("embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"),
    ("embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.weight"),
    ("embeddings.norm.{p}", "embeddings.LayerNorm.{p}"),
    ("encoder.layers.{i}.self_attn.q_proj.{p}", "encoder.layer.{i}.attention.self.query.{p}"),
    ("encoder.layers.{i}.self_attn.k_proj.{p}", "encoder.layer.{i}.attention.self.key.{p}"),
    ("encoder.layers.{i}.self_attn.v_proj.{p}", "encoder.layer.{i}.attention.self.value.{p}"),
    ("encoder.layers.{i}.self_attn.out_proj.{p}", "encoder.layer.{i}.attention.output.dense.{p}"),
    ("encoder.layers.{i}.self_attn_res.norm.{p}", "encoder.layer.{i}.attention.output.LayerNorm.{p}"),
    ("encoder.layers.{i}.ffn.fc1.{p}", "encoder.layer.{i}.intermediate.dense.{p}"),
    ("encoder.layers.{i}.ffn.fc2.{p}", "encoder.layer.{i}.output.dense.{p}"),
    ("encoder.layers.{i}.ffn_res.norm.{p}", "encoder.layer.{i}.output.LayerNorm.{p}"),
    ("pooler.dense.{p}", "pooler.dense.{p}"),
]
_DISTILBERT_RULES = [
    ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ("embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"),
    ("embeddings.norm.{p}", "embeddings.LayerNorm.{p}"),
    ("encoder.layers.{i}.self_attn.q_proj.{p}", "transformer.layer.{i}.attention.q_lin.{p}"),
    ("encoder.layers.{i}.self_attn.k_proj.{p}", "transformer.layer.{i}.attention.k_lin.{p}"),
    ("encoder.layers.{i}.self_attn.v_proj.{p}", "transformer.layer.{i}.attention.v_lin.{p}"),
    ("encoder.layers.{i}.self_attn.out_proj.{p}", "transformer.layer.{i}.attention.out_lin.{p}"),
    ("encoder.layers.{i}.self_attn_res.norm.{p}", "transformer.layer.{i}.sa_layer_norm.{p}"),
    ("encoder.layers.{i}.ffn.fc1.{p}", "transformer.layer.{i}.ffn.lin1.{p}"),
    ("encoder.layers.{i}.ffn.fc2.{p}", "transformer.layer.{i}.ffn.lin2.{p}"),
    ("encoder.layers.{i}.ffn_res.norm.{p}", "transformer.layer.{i}.output_layer_norm.{p}"),
]
# Pretraining heads (BertForPreTraining layout); the decoder weight is the tied embedding.
_BERT_HEAD_RULES = [
    ("mlm.transform.{p}", "cls.predictions.transform.dense.{p}"),
    ("mlm.norm.{p}", "cls.predictions.transform.LayerNorm.{p}"),
    ("mlm.bias", "cls.predictions.bias"),
    ("nsp.classifier.{p}", "cls.seq_relationship.{p}"),
]
HF_KEYS = {"bert": KeyMap(_BERT_RULES), "distilbert": KeyMap(_DISTILBERT_RULES)}
_HF_HEAD_KEYS = KeyMap(_BERT_HEAD_RULES)
# Buffers and duplicates that HF files may carry but that hold no learned state of ours.
_HF_REDUNDANT = ("embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
# Weights of task heads in HF task checkpoints; an encoder-only load reports and skips them.
_HF_HEAD_PREFIXES = ("cls.", "vocab_transform.", "vocab_layer_norm.", "vocab_projector.", "classifier.", "pre_classifier.", "qa_outputs.")


_LAYER_KEY = re.compile(r"(?:^|\.)(?:encoder|transformer)\.layer\.(\d+)\.")


def config_from_hf(hf: dict) -> BertConfig:
    """Build a :class:`BertConfig` from an HF ``config.json`` dict (bert or distilbert).

    Raises:
        CheckpointError: for model types other than bert/distilbert, or missing fields.
    """
    model_type = hf.get("model_type", "bert")
    source = "config.json"
    if model_type == "distilbert":
        check_config_fields(hf, source, positive=("n_layers", "dim", "n_heads", "hidden_dim", "vocab_size", "max_position_embeddings"),
                            non_negative=("pad_token_id",), fractions=("dropout", "attention_dropout"), strings=("activation",))
    elif model_type == "bert":
        check_config_fields(hf, source, positive=("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                                                  "vocab_size", "max_position_embeddings"),
                            non_negative=("type_vocab_size",), fractions=("hidden_dropout_prob", "attention_probs_dropout_prob"),
                            positive_floats=("layer_norm_eps",), strings=("hidden_act",))
        if hf.get("pad_token_id") is not None:
            check_config_fields(hf, source, non_negative=("pad_token_id",))
    heads = hf.get("n_heads" if model_type == "distilbert" else "num_attention_heads")
    width = hf.get("dim" if model_type == "distilbert" else "hidden_size")
    if isinstance(heads, int) and isinstance(width, int) and heads > 0 and width % heads:
        raise CheckpointError(f"{source}: hidden size {width} is not a multiple of the {heads} attention heads")
    pad, vocab = hf.get("pad_token_id"), hf.get("vocab_size")
    if isinstance(pad, int) and isinstance(vocab, int) and pad >= vocab:
        raise CheckpointError(f"{source}: pad_token_id {pad} is outside the vocabulary of {vocab}")
    try:
        if model_type == "distilbert":
            return BertConfig(
                num_layers=hf["n_layers"],
                hidden_size=hf["dim"],
                num_heads=hf["n_heads"],
                ffn_size=hf["hidden_dim"],
                vocab_size=hf["vocab_size"],
                max_position=hf.get("max_position_embeddings", 512),
                type_vocab_size=0,
                dropout=hf.get("dropout", 0.1),
                attention_dropout=hf.get("attention_dropout", 0.1),
                activation=hf.get("activation", "gelu"),
                layer_norm_eps=1e-12,
                pad_token_id=hf.get("pad_token_id", 0),
                pooler=False,
                family="distilbert",
            )
        if model_type == "bert":
            if hf.get("position_embedding_type", "absolute") != "absolute":
                raise CheckpointError(f"position_embedding_type {quote(hf['position_embedding_type'], 100)} is not supported (only 'absolute')")
            return BertConfig(
                num_layers=hf["num_hidden_layers"],
                hidden_size=hf["hidden_size"],
                num_heads=hf["num_attention_heads"],
                ffn_size=hf["intermediate_size"],
                vocab_size=hf["vocab_size"],
                max_position=hf.get("max_position_embeddings", 512),
                type_vocab_size=hf.get("type_vocab_size", 2),
                dropout=hf.get("hidden_dropout_prob", 0.1),
                attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
                activation=hf.get("hidden_act", "gelu"),
                layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
                pad_token_id=hf.get("pad_token_id", 0) or 0,
                pooler=True,
                family="bert",
            )
    except KeyError as err:
        raise CheckpointError(f"config.json lacks the field {err.args[0]!r} needed for model_type {quote(model_type, 100)}") from None
    raise CheckpointError(f"config.json has model_type {quote(model_type, 100)}; this loader reads 'bert' and 'distilbert'")


def config_to_hf(config: BertConfig, architecture: Optional[str] = None) -> dict:
    """The HF ``config.json`` dict for a :class:`BertConfig`."""
    if config.family == "distilbert":
        return {
            "model_type": "distilbert",
            "architectures": [architecture or "DistilBertModel"],
            "n_layers": config.num_layers,
            "dim": config.hidden_size,
            "n_heads": config.num_heads,
            "hidden_dim": config.ffn_size,
            "vocab_size": config.vocab_size,
            "max_position_embeddings": config.max_position,
            "dropout": config.dropout,
            "attention_dropout": config.attention_dropout,
            "activation": config.activation,
            "pad_token_id": config.pad_token_id,
            "sinusoidal_pos_embds": False,
            "initializer_range": 0.02,
        }
    return {
        "model_type": "bert",
        "architectures": [architecture or "BertModel"],
        "num_hidden_layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.ffn_size,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position,
        "type_vocab_size": config.type_vocab_size,
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "hidden_act": config.activation,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_token_id,
        "position_embedding_type": "absolute",
        "initializer_range": 0.02,
    }


def _from_hf_state(hf_state: Dict[str, Tensor], config: BertConfig, with_heads: bool, source: str,
                   heads_used: bool = False) -> Tuple[Dict[str, Tensor], list]:
    """Rename an HF state dict to ours; returns ``(state, unknown_keys)``."""
    family_prefix = "bert." if config.family == "bert" else "distilbert."
    encoder_map = HF_KEYS[config.family]
    state: Dict[str, Tensor] = {}
    unknown, skipped_heads = [], []
    for key, value in hf_state.items():
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        body = key[len(family_prefix):] if key.startswith(family_prefix) else key
        if body in _HF_REDUNDANT or key in _HF_REDUNDANT:
            continue
        ours = encoder_map.to_ours(body)
        if ours is not None:
            state[("bert." + ours) if with_heads else ours] = value
            continue
        head = _HF_HEAD_KEYS.to_ours(key) if config.family == "bert" else None
        if head is not None and with_heads:
            state[head] = value
        elif key.startswith(_HF_HEAD_PREFIXES):
            skipped_heads.append(key)
        else:
            unknown.append(key)
    if skipped_heads and not heads_used:
        logger.warning("%s: %d task-head tensors are not used by the encoder: %s", source, len(skipped_heads), ", ".join(skipped_heads))
    return state, unknown


def load_bert(directory: os.PathLike, config: Optional[BertConfig] = None, with_heads: bool = False,
              heads_used: bool = False) -> nn.Module:
    """Load an HF-format BERT or DistilBERT checkpoint folder.

    Args:
        directory: folder with ``config.json`` and ``model.safetensors`` or ``pytorch_model.bin``.
        config: architecture to load into; by default the checkpoint's own. When given, the
            checkpoint must match its architecture fields.
        with_heads: return :class:`BertForPreTraining` (MLM + NSP heads) instead of the encoder.
        heads_used: the caller reads the task-head tensors itself (an HF task checkpoint
            loaded as a run): they are not reported as unused.

    Returns:
        The model in eval mode.

    Raises:
        CheckpointError: unreadable files, or (as :class:`~ctxkit.core.checkpoint.CheckpointMismatchError`)
            every missing, unexpected and misshaped key.
    """
    directory = Path(directory)
    ckpt_config = config_from_hf(read_config(directory))
    hf_state = read_weights(directory)
    if ckpt_config.pooler and not any(k.endswith("pooler.dense.weight") for k in hf_state):
        # HF builds token-classification and QA models without the pooler.
        logger.info("%s: no pooler weights; building the encoder without a pooler", directory)
        ckpt_config = ckpt_config.replace(pooler=False)
    present = {int(m.group(1)) for k in hf_state for m in [_LAYER_KEY.search(k)] if m}
    if ckpt_config.num_layers > len(present):
        # Checked before anything is built: a config can name more layers than memory holds.
        raise CheckpointError(f"{directory / 'config.json'}: {ckpt_config.num_layers} layers, but the weights hold "
                              f"{len(present)}")
    config = ckpt_config if config is None else config.with_checkpoint(ckpt_config)
    # Built on the meta device: random initialisation would be overwritten anyway and
    # costs seconds for large vocabularies.
    with meta_device():
        model: nn.Module = BertForPreTraining(config) if with_heads else BertModel(config)
    state, unknown = _from_hf_state(hf_state, config, with_heads, str(directory), heads_used)
    if unknown:
        # Route through the strict loader so unknown keys are reported with everything else.
        state.update({f"<unmapped> {k}": torch.empty(0) for k in unknown})
    load_state_dict_strict(model, state, source=str(directory), assign=True)
    return model.eval()


def save_bert(model: nn.Module, directory: os.PathLike, tokenizer=None) -> Path:
    """Save a :class:`BertModel` or :class:`BertForPreTraining` in the HF layout.

    Writes ``config.json`` and ``model.safetensors`` (each atomically), plus the tokenizer's
    files when one is given, so ``transformers`` can load the folder directly.
    """
    directory = Path(directory)
    with_heads = isinstance(model, BertForPreTraining)
    encoder: BertModel = model.bert if with_heads else model  # type: ignore[assignment]
    config = encoder.config
    keymap = HF_KEYS[config.family]
    prefix = ("bert." if config.family == "bert" else "distilbert.") if with_heads else ""
    hf_state: Dict[str, Tensor] = {}
    for key, value in encoder.state_dict().items():
        theirs = keymap.to_theirs(key)
        if theirs is None:
            raise CheckpointError(f"no HF name for parameter {key!r}")
        hf_state[prefix + theirs] = value
    if with_heads:
        for key, value in model.state_dict().items():
            if key.startswith("bert."):
                continue  # encoder done above; the tied decoder is the word embedding itself
            hf_state[_HF_HEAD_KEYS.to_theirs(key)] = value
    arch = ("BertForPreTraining" if with_heads else None)
    write_json(config_to_hf(config, arch), directory / "config.json")
    save_weights(hf_state, directory / "model.safetensors")
    if tokenizer is not None:
        tokenizer.save(directory)
    return directory
