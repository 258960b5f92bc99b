"""The Transformer encoder-decoder for translation (Vaswani et al. 2017).

Source and target share one vocabulary (a joint BPE), so one embedding matrix can serve
the encoder input, the decoder input and the output projection (``tie_embeddings``).
Embeddings are scaled by sqrt(d) and added to sinusoidal positions; the stacks are the
shared :class:`~ctxkit.layers.TransformerEncoder` / :class:`~ctxkit.layers.TransformerDecoder`.
Training uses teacher forcing and label-smoothed cross-entropy; decoding goes through
:func:`ctxkit.decoding.generate` (greedy, beam, sampling) via :meth:`bind`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...core.build_guard import bounded_build, check_layers_held, held_values, weights_file
from ...core.checkpoint import CheckpointError, load_state_dict_strict, read_config, read_weights, save_weights
from ...layers import (AdditiveAttention, KVCache, SinusoidalPositionalEncoding, TransformerDecoder, TransformerEncoder, padding_mask,
                      quaternionize)
from ..common import Replaceable

__all__ = ["Seq2SeqConfig", "SEQ2SEQ_PRESETS", "RNNSeq2SeqConfig", "RNN_SEQ2SEQ_PRESETS", "TransformerSeq2Seq", "RNNSeq2Seq", "RNNState", "BoundDecoder", "save_seq2seq", "load_seq2seq"]


@dataclass(frozen=True)
class Seq2SeqConfig(Replaceable):
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
        quaternion: every attention and FFN projection of both stacks as a
            :class:`~ctxkit.layers.QuaternionLinear` (Tay et al. 2019: a quarter of their
            weights; ``hidden_size`` and ``ffn_size`` divisible by 4). Embeddings and the
            output projection stay real.
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
    quaternion: bool = False  # last, and defaulted: config.json files written before it still load


SEQ2SEQ_PRESETS: Dict[str, Seq2SeqConfig] = {
    "transformer_base": Seq2SeqConfig(6, 6, 512, 8, 2048, vocab_size=37000, norm_first=False),  # the paper's base model
    "transformer_3_256_8": Seq2SeqConfig(3, 3, 256, 8, 1024),  # Multi30k-sized
    "transformer_3_512_8": Seq2SeqConfig(3, 3, 512, 8, 2048),  # wider, for Multi30k with more dropout
    "transformer_6_512_8": Seq2SeqConfig(6, 6, 512, 8, 2048),  # the base width with pre-norm
    # Quaternion Transformers (Tay et al. 2019) beside the Multi30k presets. Parameters with the
    # 8000-token joint BPE (embedding + projection weights + biases and norms):
    # transformer_3_256_8 7.58M (2.05M + 5.51M + 0.03M), quaternion_3_256_8 3.45M (2.05 + 1.38 + 0.03),
    # quaternion_3_448_8 7.84M (3.58 + 4.21 + 0.04), quaternion_3_512_8 9.65M (4.10 + 5.51 + 0.05),
    # transformer_3_512_8 26.17M (4.10 + 22.02 + 0.05). The embedding stays real, so at twice the
    # width the projections match (5.51M) but the total does not; 448 matches the total.
    "quaternion_3_256_8": Seq2SeqConfig(3, 3, 256, 8, 1024, quaternion=True),  # transformer_3_256_8's shape, 1/4 of its projections
    "quaternion_3_448_8": Seq2SeqConfig(3, 3, 448, 8, 1792, quaternion=True),  # about transformer_3_256_8's total count
    "quaternion_3_512_8": Seq2SeqConfig(3, 3, 512, 8, 2048, quaternion=True),  # transformer_3_512_8's shape; transformer_3_256_8's projection count
}


@dataclass(frozen=True)
class RNNSeq2SeqConfig(Replaceable):
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


RNN_SEQ2SEQ_PRESETS: Dict[str, RNNSeq2SeqConfig] = {
    "rnn_attention_256_512": RNNSeq2SeqConfig(),  # the lectures' recap baseline on Multi30k
}

# One line per preset for `ctxkit list-models` (ctxkit.zoo.families).
SEQ2SEQ_DESCRIPTIONS: Dict[str, str] = {
    "transformer_base": "Transformer translator, the paper's base model: 6+6 post-norm layers, width 512 (Vaswani et al. 2017)",
    "transformer_3_256_8": "Transformer translator, 3+3 pre-norm layers, width 256: Multi30k-sized",
    "transformer_3_512_8": "Transformer translator, 3+3 pre-norm layers, width 512: Multi30k with more dropout",
    "transformer_6_512_8": "Transformer translator, 6+6 pre-norm layers, width 512: the base width with pre-norm",
    "quaternion_3_256_8": "Quaternion Transformer translator (Tay et al. 2019), 3+3 layers, width 256: transformer_3_256_8 with 1/4 of its projection weights",
    "quaternion_3_448_8": "Quaternion Transformer translator, 3+3 layers, width 448: about as many parameters as transformer_3_256_8",
    "quaternion_3_512_8": "Quaternion Transformer translator, 3+3 layers, width 512: transformer_3_256_8's projection weights at twice the width",
}
RNN_SEQ2SEQ_DESCRIPTIONS: Dict[str, str] = {
    "rnn_attention_256_512": "RNN translator: bidirectional GRU 512 + additive attention (Bahdanau et al. 2015), Multi30k baseline",
}


class TransformerSeq2Seq(nn.Module):
    """Encoder-decoder Transformer.

    Args:
        config: the architecture.
    """

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.embed = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_id)
        # Registered only when untied: one module under two names would put one tensor
        # twice in the state dict (and safetensors refuses shared tensors).
        self.untied_target_embed = None if config.tie_embeddings else nn.Embedding(config.vocab_size, d, padding_idx=config.pad_id)
        self.positions = SinusoidalPositionalEncoding(d, config.max_position)
        self.drop = nn.Dropout(config.dropout)
        common = dict(dropout=config.dropout, attention_dropout=config.attention_dropout, activation=config.activation,
                      norm_first=config.norm_first)
        self.encoder = TransformerEncoder(config.num_encoder_layers, d, config.num_heads, config.ffn_size, **common)
        self.decoder = TransformerDecoder(config.num_decoder_layers, d, config.num_heads, config.ffn_size, **common)
        self.output = None if config.tie_embeddings else nn.Linear(d, config.vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
        nn.init.normal_(self.embed.weight, std=d ** -0.5)  # unit-variance inputs after the sqrt(d) scale
        with torch.no_grad():
            self.embed.weight[config.pad_id].zero_()
        if config.quaternion:  # the stacks' projections only (their own quaternion init)
            quaternionize(self.encoder)
            quaternionize(self.decoder)

    @property
    def target_embed(self) -> nn.Embedding:
        """The target-side embedding (the source one when tied)."""
        return self.embed if self.untied_target_embed is None else self.untied_target_embed

    def _embed(self, table: nn.Embedding, ids: Tensor, positions: Optional[Tensor] = None) -> Tensor:
        pos = self.positions.table[positions] if positions is not None else self.positions(ids.size(1))
        return self.drop(table(ids) * math.sqrt(self.config.hidden_size) + pos)

    def encode(self, src_ids: Tensor, src_mask: Optional[Tensor] = None) -> Tensor:
        """Encoder states ``(batch, src_len, hidden)`` of ``src_ids (batch, src_len)``
        (``src_mask`` 1 for real tokens)."""
        mask = padding_mask(src_mask) if src_mask is not None else None
        return self.encoder(self._embed(self.embed, src_ids), mask=mask).last_hidden_state

    def decode(self, tgt_ids: Tensor, memory: Tensor, src_mask: Optional[Tensor] = None, position_ids: Optional[Tensor] = None,
               cache: Optional[KVCache] = None, need_weights: bool = False, memory_kv=None):
        """Next-token logits ``(batch, tgt_len, vocab)`` given the encoder ``memory``.

        With ``cache``, ``tgt_ids`` are only the new positions (one at a time); with
        ``need_weights`` also returns the cross-attention weights of every layer;
        ``memory_kv`` (from ``self.decoder.project_memory(memory)``) skips re-projecting
        the memory at every step.
        """
        if position_ids is None and cache is not None:
            position_ids = torch.arange(cache.length, cache.length + tgt_ids.size(1), device=tgt_ids.device)
        x = self._embed(self.target_embed, tgt_ids, position_ids)
        memory_mask = padding_mask(src_mask) if src_mask is not None else None
        x, cross = self.decoder(x, memory, memory_mask=memory_mask, cache=cache, need_weights=need_weights, memory_kv=memory_kv)
        logits = F.linear(x, self.target_embed.weight) if self.output is None else self.output(x)
        return (logits, cross) if need_weights else logits

    def forward(self, input_ids: Tensor, tgt_ids: Tensor, attention_mask: Optional[Tensor] = None, label_smoothing: float = 0.1,
                **_) -> dict:
        """Teacher-forced loss.

        Args:
            input_ids: source ids ``(batch, src_len)``, padded with ``pad_id``.
            tgt_ids: ``(batch, tgt_len)``: ``[BOS] y_1 .. y_n [EOS]`` padded with ``pad_id``;
                the decoder reads all but the last position and predicts all but the first.
            attention_mask: source mask ``(batch, src_len)``; default ``input_ids != pad_id``.
            label_smoothing: mass spread over the vocabulary (0.1 in the paper).

        Returns:
            ``loss`` (mean over target tokens) and ``token_acc``.
        """
        return _teacher_forced_loss(self, input_ids, tgt_ids, attention_mask, label_smoothing)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """An empty self-attention cache for the decoder."""
        c = self.config
        w = self.embed.weight
        return KVCache(c.num_decoder_layers, batch, c.num_heads, c.hidden_size // c.num_heads, min(max_len, c.max_position),
                       dtype=w.dtype, device=w.device)

    def bind(self, src_ids: Tensor, src_mask: Optional[Tensor] = None) -> "BoundDecoder":
        """Encode a source batch once and return a decoder-only view for ``generate``."""
        if src_mask is None:
            src_mask = (src_ids != self.config.pad_id).long()
        return BoundDecoder(self, self.encode(src_ids, src_mask), src_mask)


class RNNState:
    """The decoder's recurrent state during decoding (what a KV cache is to a Transformer):
    GRU hidden states ``(layers, batch, hidden)`` plus the tokens consumed so far."""

    def __init__(self, hidden: Optional[Tensor] = None):
        self.hidden = hidden
        self.length = 0

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` of the batch (beam search)."""
        if self.hidden is not None:
            self.hidden = self.hidden.index_select(1, index)


class RNNSeq2Seq(nn.Module):
    """Bidirectional GRU encoder, GRU decoder with additive attention over the encoder
    states (Bahdanau et al. 2015): at step t the previous decoder state queries the source,
    the context joins the previous token's embedding as GRU input, and the new state with
    the context predicts the next token.

    Args:
        config: the architecture.
    """

    cuda_graph_safe = False  # packing needs the source lengths on the host

    def __init__(self, config: RNNSeq2SeqConfig):
        super().__init__()
        self.config = config
        c = config
        self.embed = nn.Embedding(c.vocab_size, c.embed_size, padding_idx=c.pad_id)
        self.drop = nn.Dropout(c.dropout)
        between = c.dropout if c.num_layers > 1 else 0.0
        self.encoder = nn.GRU(c.embed_size, c.hidden_size, c.num_layers, batch_first=True, bidirectional=True, dropout=between)
        self.bridge = nn.Linear(2 * c.hidden_size, c.hidden_size)  # final encoder states -> first decoder state
        self.attention = AdditiveAttention(c.hidden_size, 2 * c.hidden_size, c.attention_size)
        self.decoder = nn.GRU(c.embed_size + 2 * c.hidden_size, c.hidden_size, c.num_layers, batch_first=True, dropout=between)
        self.output = nn.Linear(c.hidden_size + 2 * c.hidden_size, c.vocab_size)

    def encode(self, src_ids: Tensor, src_mask: Optional[Tensor] = None) -> Tensor:
        """Encoder states ``(batch, src_len, 2 * hidden)``; padding does not enter the GRU."""
        if src_mask is None:
            src_mask = (src_ids != self.config.pad_id).long()
        lengths = src_mask.sum(1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(self.drop(self.embed(src_ids)), lengths, batch_first=True, enforce_sorted=False)
        states, _ = self.encoder(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=src_ids.size(1))
        return states

    def _initial(self, memory: Tensor, src_mask: Tensor) -> Tensor:
        # Mean of the real encoder states, through the bridge, for every decoder layer.
        mean = (memory * src_mask[..., None]).sum(1) / src_mask.sum(1, keepdim=True).clamp(min=1)
        return torch.tanh(self.bridge(mean)).unsqueeze(0).repeat(self.config.num_layers, 1, 1).contiguous()

    def decode(self, tgt_ids: Tensor, memory: Tensor, src_mask: Optional[Tensor] = None, position_ids=None,
               cache: Optional[RNNState] = None, need_weights: bool = False):
        """Next-token logits ``(batch, tgt_len, vocab)``, one step per target token.

        With ``cache`` (an :class:`RNNState`), decoding continues from its state and
        updates it; with ``need_weights`` also returns ``[weights (batch, tgt, src)]``.
        """
        if src_mask is None:
            src_mask = torch.ones(memory.shape[:2], dtype=torch.long, device=memory.device)
        hidden = cache.hidden if cache is not None and cache.hidden is not None else self._initial(memory, src_mask)
        mask = src_mask.bool()[:, None, :]
        logits, weights = [], []
        for t in range(tgt_ids.size(1)):
            emb = self.drop(self.embed(tgt_ids[:, t : t + 1]))
            context, w = self.attention(hidden[-1][:, None], memory, memory, mask)  # (batch, 1, 2h)
            out, hidden = self.decoder(torch.cat([emb, context], -1), hidden)
            logits.append(self.output(self.drop(torch.cat([out, context], -1))))
            weights.append(w)
        if cache is not None:
            cache.hidden = hidden
            cache.length += tgt_ids.size(1)
        logits = torch.cat(logits, 1)
        return (logits, [torch.cat(weights, 1)]) if need_weights else logits

    def forward(self, input_ids: Tensor, tgt_ids: Tensor, attention_mask: Optional[Tensor] = None, label_smoothing: float = 0.1,
                **_) -> dict:
        """Teacher-forced loss; arguments as :meth:`TransformerSeq2Seq.forward`."""
        return _teacher_forced_loss(self, input_ids, tgt_ids, attention_mask, label_smoothing)

    def new_cache(self, batch: int, max_len: int) -> RNNState:
        """A fresh decoder state (the first step starts from the encoder summary)."""
        return RNNState()

    def bind(self, src_ids: Tensor, src_mask: Optional[Tensor] = None) -> "BoundDecoder":
        """Encode a source batch once and return a decoder-only view for ``generate``."""
        if src_mask is None:
            src_mask = (src_ids != self.config.pad_id).long()
        return BoundDecoder(self, self.encode(src_ids, src_mask), src_mask)


def _teacher_forced_loss(model, input_ids: Tensor, tgt_ids: Tensor, attention_mask: Optional[Tensor], label_smoothing: float) -> dict:
    """Label-smoothed cross-entropy of predicting ``tgt_ids[:, 1:]`` from ``tgt_ids[:, :-1]``."""
    pad = model.config.pad_id
    src_mask = (input_ids != pad).long() if attention_mask is None else attention_mask
    logits = model.decode(tgt_ids[:, :-1], model.encode(input_ids, src_mask), src_mask)
    gold = tgt_ids[:, 1:]
    loss = F.cross_entropy(logits.float().flatten(0, 1), gold.flatten(), ignore_index=pad, label_smoothing=label_smoothing)
    real = gold != pad
    acc = ((logits.argmax(-1) == gold) & real).sum() / real.sum().clamp(min=1)
    return {"loss": loss, "token_acc": acc.detach()}


class BoundDecoder:
    """The decoder of a :class:`TransformerSeq2Seq` with its encoder output fixed, shaped
    like a decoder-only language model (what :func:`ctxkit.decoding.generate` drives).

    Beam search runs ``beams`` rows per source; the memory is repeated to match.
    """

    def __init__(self, model: nn.Module, memory: Tensor, src_mask: Tensor):
        self.model, self.memory, self.src_mask = model, memory, src_mask
        # A Transformer's cross-attention keys/values of the memory, projected once.
        self.memory_kv = model.decoder.project_memory(memory) if isinstance(model, TransformerSeq2Seq) else None

    def _memory_for(self, rows: int):
        if rows != self.memory.size(0):
            k = rows // self.memory.size(0)
            self.memory, self.src_mask = self.memory.repeat_interleave(k, 0), self.src_mask.repeat_interleave(k, 0)
            if self.memory_kv is not None:
                self.memory_kv = [(a.repeat_interleave(k, 0), b.repeat_interleave(k, 0)) for a, b in self.memory_kv]
        return self.memory, self.src_mask

    def __call__(self, input_ids: Tensor, cache=None, attention_mask=None, position_ids=None) -> Tensor:
        memory, src_mask = self._memory_for(input_ids.size(0))
        extra = {"memory_kv": self.memory_kv} if self.memory_kv is not None else {}
        return self.model.decode(input_ids, memory, src_mask, position_ids=position_ids, cache=cache, **extra)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return self.model.new_cache(batch, max_len)


_TYPES = {"ctxkit-seq2seq": (TransformerSeq2Seq, Seq2SeqConfig), "ctxkit-rnn-seq2seq": (RNNSeq2Seq, RNNSeq2SeqConfig)}
# Depth fields and the weight names that number their layers (the GRUs' ``weight_ih_l{k}``).
_LAYER_KEYS = {"ctxkit-seq2seq": {"num_encoder_layers": r"^encoder\.layers\.(\d+)\.",
                                  "num_decoder_layers": r"^decoder\.layers\.(\d+)\."},
               "ctxkit-rnn-seq2seq": {"num_layers": r"^encoder\.weight_ih_l(\d+)$"}}


def save_seq2seq(model: nn.Module, directory) -> Path:
    """Write ``config.json`` (model type + config fields) and ``model.safetensors`` for a
    :class:`TransformerSeq2Seq` or :class:`RNNSeq2Seq`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model_type = next(name for name, (cls, _) in _TYPES.items() if isinstance(model, cls))
    save_weights(model.state_dict(), directory / "model.safetensors")
    tmp = directory / ".config.json.tmp"
    tmp.write_text(json.dumps({"model_type": model_type, **dataclasses.asdict(model.config)}, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, directory / "config.json")
    return directory


def load_seq2seq(directory) -> nn.Module:
    """Load :func:`save_seq2seq` output (strict: every key and shape is checked).

    Raises:
        CheckpointError: unreadable files, another model type, or mismatched keys.
    """
    config = read_config(directory)
    model_type = config.pop("model_type", None)
    if model_type not in _TYPES:
        raise CheckpointError(f"{directory}: config.json model_type {model_type!r} is not a ctxkit translation model ({', '.join(_TYPES)})")
    cls, config_cls = _TYPES[model_type]
    # The weights first: the config's sizes are checked against them before anything is built.
    state = read_weights(directory)
    source = str(Path(directory) / "config.json")
    check_layers_held(config, source, state, _LAYER_KEYS[model_type])
    with bounded_build(config, source, weights_file(directory), held_values(state), state):
        model = cls(config_cls(**config))
    load_state_dict_strict(model, state, source=str(directory))
    return model.eval()
