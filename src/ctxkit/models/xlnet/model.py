"""XLNet: permutation language modelling with two-stream relative attention (Yang et al. 2019).

The body is Transformer-XL's post-norm stack with three changes:

* **bidirectional relative positions** (``attn_type="bi"``): every query sees keys on
  both sides, so the sinusoidal encodings cover the distances ``klen-1 .. -(qlen-1)``;
* **relative segment encodings**: a per-head score ``(q_i + b_s)^T s_ij`` where ``s_ij``
  is one of two learned vectors, picked by whether tokens ``i`` and ``j`` share a segment;
* **two streams**: the *content* stream ``h`` is an ordinary (masked) self-attention
  stack; the *query* stream ``g`` starts from a learned ``mask_emb`` and, at the
  positions to predict, attends to the content stream without seeing its own token.
  Both streams share every weight of a layer.

Masks follow Hugging Face: ``perm_mask[b, i, j] = 1`` means ``i`` may not attend to ``j``
(the query stream uses it as is; the content stream always sees itself), and
``target_mapping[b, m, j] = 1`` places the ``m``-th prediction at position ``j``.
:func:`sample_permutation_masks` draws both for partial prediction.

Checkpoints use the Hugging Face layout (``XLNetLMHeadModel`` / ``XLNetModel``). HF stores
each projection as a ``(d_model, heads, head_dim)`` tensor used through ``einsum``; it is
converted to and from ``nn.Linear`` weights on load and save.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...core.checkpoint import (
    CheckpointError,
    KeyMap,
    check_config_against_weights,
    check_config_fields,
    check_config_types,
    check_heads_divide,
    count_layers,
    load_state_dict_strict,
    read_config,
    read_weights,
    require_config_fields,
    save_weights,
    weight_dim,
)
from ...layers import AddNorm, PositionwiseFFN, RelativeMultiHeadAttention, rel_shift
from ...layers.attention import masked_softmax
from ...core.errors import UserError
from ..common import IndexableOutput, PaperNames

__all__ = ["XLNetConfig", "XLNET_PRESETS", "XLNetOutput", "XLNetRelativeAttention", "XLNetLayer", "XLNetModel",
           "XLNetLMHeadModel", "PermutationMasks", "bidirectional_position_encoding", "sample_permutation_masks",
           "load_xlnet", "save_xlnet", "xlnet_config_from_hf"]


@dataclass(frozen=True)
class XLNetConfig(PaperNames):
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



# One line per preset for `ctxkit list-models` (ctxkit.zoo.families).
XLNET_DESCRIPTIONS: Dict[str, str] = {
    "xlnet_12_768_12": "XLNet-base (xlnet-base-cased), permutation LM with two-stream relative attention (Yang et al. 2019)",
    "xlnet_24_1024_16": "XLNet-large (xlnet-large-cased), 24 layers, width 1024",
    "xlnet_4_256_4": "XLNet at BERT-mini's size (4 layers, width 256), for from-scratch comparisons",
}

XLNET_PRESETS: Dict[str, XLNetConfig] = {
    "xlnet_12_768_12": XLNetConfig(),  # xlnet-base-cased
    "xlnet_24_1024_16": XLNetConfig(d_model=1024, n_heads=16, d_inner=4096, n_layers=24),  # xlnet-large-cased
    # The size of bert_4_256_4 (BERT-mini), for from-scratch comparisons at equal size.
    "xlnet_4_256_4": XLNetConfig(d_model=256, n_heads=4, d_inner=1024, n_layers=4),
}


def bidirectional_position_encoding(qlen: int, klen: int, dim: int, clamp_len: int = -1, device=None,
                                    dtype: torch.dtype = torch.float32) -> Tensor:
    """Sinusoidal encodings of the distances ``klen-1, klen-2, ..., -(qlen-1)`` (descending).

    Query ``i`` sits at absolute position ``mlen + i`` (``mlen = klen - qlen``); the
    distance to key ``j`` is ``mlen + i - j``, which spans exactly these values. Each row
    is ``[sin(d * w), cos(d * w)]`` with ``w_k = 10000^(-2k/dim)`` (XLNet's order).

    Args:
        clamp_len: distances beyond +-clamp_len reuse the clamped one (-1: no clamping).

    Returns:
        ``(klen + qlen - 1, dim)``.
    """
    inv_freq = 1.0 / torch.pow(10000, torch.arange(0, dim, 2, device=device).float() / dim)
    dist = torch.arange(klen - 1, -qlen, -1, device=device).float()
    if clamp_len > 0:
        dist = dist.clamp(-clamp_len, clamp_len)
    angles = dist[:, None] * inv_freq[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)


class XLNetRelativeAttention(RelativeMultiHeadAttention):
    """Relative attention with bidirectional distances and relative segment scores.

    Inherits ``q_proj/k_proj/v_proj/out_proj/r_proj`` and the biases ``u`` (content, HF
    ``r_w_bias``) and ``v`` (position, HF ``r_r_bias``); adds ``s_bias`` (HF
    ``r_s_bias``) and ``seg_embed`` ``(2, heads, head_dim)``: row 0 for a pair of tokens
    in the same segment, row 1 for different segments. No biases in the projections.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=False)
        self.s_bias = nn.Parameter(torch.zeros(num_heads, self.head_dim))
        self.seg_embed = nn.Parameter(torch.zeros(2, num_heads, self.head_dim))

    def attend(self, q: Tensor, k: Tensor, val: Tensor, r: Tensor, seg_diff: Optional[Tensor],
               mask: Optional[Tensor]) -> Tensor:
        """Scores, softmax and weighted values, before the output projection.

        Args:
            q: ``(batch, heads, qlen, head_dim)`` queries (one per position).
            k, val: ``(batch, heads, klen, head_dim)`` keys and values (memory then segment).
            r: ``(heads, klen + qlen - 1, head_dim)`` projected distance encodings
                (:func:`bidirectional_position_encoding` through ``r_proj``).
            seg_diff: bool ``(batch, qlen, klen)``, True where query and key lie in
                different segments; None: no segment term.
            mask: bool ``(batch, 1, qlen, klen)``, True = may attend; None = everything.

        Returns:
            ``(batch, qlen, embed_dim)`` concatenated heads.
        """
        batch, _, qlen, _ = q.shape
        klen = k.size(2)
        content = torch.matmul(q + self.u[:, None, :], k.transpose(-2, -1))
        # rel_shift maps column c (distance klen-1-c) of row i to key j = c + i - (qlen-1),
        # i.e. distance mlen + i - j: exact for every key, both sides of the query.
        position = rel_shift(torch.matmul(q + self.v[:, None, :], r.transpose(-2, -1)))[..., :klen]
        scores = content + position
        if seg_diff is not None:
            seg = torch.einsum("bhid,shd->bhis", q + self.s_bias[:, None, :], self.seg_embed)
            scores = scores + torch.where(seg_diff[:, None], seg[..., 1:2], seg[..., 0:1])
        weights = masked_softmax(scores * (1.0 / math.sqrt(self.head_dim)), mask)
        attn = F.dropout(weights, p=self.dropout, training=self.training) if self.dropout > 0 else weights
        return torch.matmul(attn, val).transpose(1, 2).reshape(batch, qlen, self.embed_dim)


class XLNetLayer(nn.Module):
    """Two-stream relative attention then FFN, both post-norm; the streams share all weights."""

    def __init__(self, config: XLNetConfig):
        super().__init__()
        self.attn = XLNetRelativeAttention(config.d_model, config.n_heads, dropout=config.dropout)
        self.attn_res = AddNorm(config.d_model, config.dropout, norm_first=False, eps=config.layer_norm_eps)
        self.ffn = PositionwiseFFN(config.d_model, config.d_inner, config.activation, config.dropout)
        self.ffn_res = AddNorm(config.d_model, config.dropout, norm_first=False, eps=config.layer_norm_eps)

    def forward(self, h: Tensor, g: Optional[Tensor], pos_emb: Tensor, seg_diff: Optional[Tensor],
                mask_h: Optional[Tensor], mask_g: Optional[Tensor], memory: Optional[Tensor] = None,
                target_mapping: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
        """Args: ``h`` ``(batch, qlen, d)``, ``g`` ``(batch, num_predict, d)`` or None,
        ``memory`` ``(batch, mlen, d)``; masks and ``seg_diff`` as in
        :meth:`XLNetRelativeAttention.attend`. Returns the new ``(h, g)``."""
        attn = self.attn
        context = torch.cat([memory.to(h.dtype), h], dim=1) if memory is not None and memory.size(1) > 0 else h
        q, k, val = attn._project(h, context, context)
        r = attn.r_proj(pos_emb).view(-1, attn.num_heads, attn.head_dim).transpose(0, 1)
        h = self.attn_res(h, lambda _: attn.out_proj(attn.attend(q, k, val, r, seg_diff, mask_h)))
        if g is not None:
            q_g = attn._split_heads(attn.q_proj(g))  # (batch, heads, num_predict, head_dim)
            if target_mapping is not None:  # place the predictions at their positions
                q_g = torch.einsum("bhmd,bml->bhld", q_g, target_mapping.to(q_g.dtype))
            out_g = attn.attend(q_g, k, val, r, seg_diff, mask_g)
            if target_mapping is not None:
                out_g = torch.einsum("bld,bml->bmd", out_g, target_mapping.to(out_g.dtype))
            g = self.attn_res(g, lambda _: attn.out_proj(out_g))
            g = self.ffn_res(g, self.ffn)
        return self.ffn_res(h, self.ffn), g


@dataclass
class XLNetOutput(IndexableOutput):
    """``content``: ``(batch, seq, d)``; ``query``: ``(batch, num_predict, d)`` when a
    ``target_mapping`` was given, else None; ``mems``: per layer, the states to pass as
    ``mems`` with the next segment ``(batch, mlen, d)``.

    Indexed as transformers' ``XLNetModelOutput`` (:class:`~ctxkit.models.common.IndexableOutput`):
    ``out[0]`` is :attr:`last_hidden_state`, ``out[1]`` ``mems``; ``content`` and ``query``
    are attributes only."""

    _tuple_names = ("last_hidden_state", "mems")

    content: Tensor
    query: Optional[Tensor]
    mems: List[Tensor]

    @property
    def last_hidden_state(self) -> Tensor:
        """The query stream if there is one, else the content stream (HF's output)."""
        return self.query if self.query is not None else self.content


class XLNetModel(nn.Module):
    """The XLNet body: word embeddings, ``mask_emb`` (the query stream's start), layers."""

    def __init__(self, config: XLNetConfig):
        super().__init__()
        if config.d_model % config.n_heads:
            raise UserError(f"d_model={config.d_model} is not divisible by n_heads={config.n_heads}")
        self.config = config
        self.word_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.mask_emb = nn.Parameter(torch.zeros(1, 1, config.d_model))
        self.layers = nn.ModuleList([XLNetLayer(config) for _ in range(config.n_layers)])
        self.drop = nn.Dropout(config.dropout)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module, std: float = 0.02) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, XLNetRelativeAttention):
            for p in (module.u, module.v, module.s_bias, module.seg_embed):
                nn.init.normal_(p, std=std)
        elif isinstance(module, XLNetModel):
            nn.init.normal_(module.mask_emb, std=std)

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                mems: Optional[Sequence[Tensor]] = None, perm_mask: Optional[Tensor] = None,
                target_mapping: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None) -> XLNetOutput:
        """Run both streams.

        The positional order is transformers': ``(input_ids, attention_mask, mems,
        perm_mask, target_mapping, token_type_ids)``.

        Args:
            input_ids: ``(batch, seq)``.
            attention_mask: ``(batch, seq)``, 1 for real tokens, 0 for padding (as keys).
            mems: per layer ``(batch, mlen, d)`` states of earlier segments (always
                visible, segment 0).
            perm_mask: ``(batch, seq, seq)``, 1 where query ``i`` may not see ``j``.
            target_mapping: ``(batch, num_predict, seq)`` one-hot rows; enables the query
                stream.
            token_type_ids: ``(batch, seq)`` segment ids (only equality matters); None: no
                segment term.

        Returns:
            :class:`XLNetOutput`.
        """
        batch, qlen = input_ids.shape
        device = input_ids.device
        mlen = mems[0].size(1) if mems is not None and mems[0] is not None else 0
        klen = mlen + qlen
        blocked = None  # (batch, qlen, qlen) True = query stream may not attend
        if attention_mask is not None:
            blocked = (attention_mask == 0)[:, None, :].expand(batch, qlen, qlen)
        if perm_mask is not None:
            blocked = perm_mask > 0 if blocked is None else blocked | (perm_mask > 0)
        mask_h = mask_g = None
        if blocked is not None:
            pos = torch.arange(qlen, device=device)
            own = pos[:, None] == pos[None, :]  # not torch.eye: ONNX Runtime has no boolean EyeLike
            mem_cols = torch.ones(batch, qlen, mlen, dtype=torch.bool, device=device)
            mask_g = torch.cat([mem_cols, ~blocked], dim=-1)[:, None]
            mask_h = torch.cat([mem_cols, ~blocked | own], dim=-1)[:, None]  # the content stream sees itself
        seg_diff = None
        if token_type_ids is not None:
            keys = F.pad(token_type_ids, (mlen, 0), value=0)
            seg_diff = token_type_ids[:, :, None] != keys[:, None, :]

        h = self.drop(self.word_embedding(input_ids))
        g = None
        if target_mapping is not None:
            g = self.drop(self.mask_emb.expand(batch, target_mapping.size(1), -1).to(h.dtype))
        pos_emb = self.drop(bidirectional_position_encoding(qlen, klen, self.config.d_model, self.config.clamp_len,
                                                            device=device, dtype=h.dtype))
        new_mems: List[Tensor] = []
        for i, layer in enumerate(self.layers):
            memory = mems[i] if mems is not None else None
            new_mems.append(self._cache(h, memory))
            h, g = layer(h, g, pos_emb, seg_diff, mask_h, mask_g, memory, target_mapping)
        return XLNetOutput(self.drop(h), self.drop(g) if g is not None else None, new_mems)

    def _cache(self, h: Tensor, memory: Optional[Tensor]) -> Tensor:
        states = h if memory is None else torch.cat([memory.to(h.dtype), h], dim=1)
        if self.config.mem_len > 0:
            states = states[:, -self.config.mem_len:]
        return states.detach()


class XLNetLMHeadModel(nn.Module):
    """XLNet with its LM head: the word embeddings (tied) plus a vocabulary bias."""

    def __init__(self, config: XLNetConfig, transformer: Optional[XLNetModel] = None):
        super().__init__()
        self.config = config
        self.transformer = transformer if transformer is not None else XLNetModel(config)
        self.lm_bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                mems: Optional[Sequence[Tensor]] = None, perm_mask: Optional[Tensor] = None,
                target_mapping: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None) -> Tensor:
        """Logits ``(batch, num_predict, vocab)`` of the query stream with a
        ``target_mapping``, else ``(batch, seq, vocab)`` of the content stream; see
        :meth:`XLNetModel.forward`."""
        out = self.transformer(input_ids, attention_mask, token_type_ids=token_type_ids, perm_mask=perm_mask,
                               target_mapping=target_mapping, mems=mems)
        return F.linear(out.last_hidden_state, self.transformer.word_embedding.weight, self.lm_bias)


# ---------------------------------------------------------------------------------
# Permutation masks for partial prediction
# ---------------------------------------------------------------------------------


class PermutationMasks(NamedTuple):
    """``perm_mask`` ``(batch, seq, seq)`` float (1 = may not attend), ``target_mapping``
    ``(batch, num_predict, seq)`` float, ``target_positions`` ``(batch, num_predict)``
    long (in factorisation order) and ``rank`` ``(batch, seq)`` long (each position's
    place in the sampled factorisation order)."""

    perm_mask: Tensor
    target_mapping: Tensor
    target_positions: Tensor
    rank: Tensor


def sample_permutation_masks(input_ids: Tensor, num_predict: int, attention_mask: Optional[Tensor] = None,
                             generator: Optional[torch.Generator] = None, shuffle: bool = True) -> PermutationMasks:
    """Draw a factorisation order per row and predict its last ``num_predict`` tokens.

    Non-target tokens form the context: they see each other (in both directions) and no
    target. A target sees the context and the targets earlier in the order; the query
    stream hides its own token, the content stream (in the model) adds it back. Padding
    is never a target.

    Args:
        input_ids: ``(batch, seq)`` (only the shape and device are used).
        num_predict: targets per row (``seq // K`` for XLNet's ``K``); at most the number
            of real tokens of every row.
        attention_mask: ``(batch, seq)``, 1 for real tokens.
        generator: for reproducible draws.
        shuffle: False gives the identity (left-to-right, causal) order.

    Raises:
        ValueError: when a row has fewer real tokens than ``num_predict``.
    """
    batch, seq = input_ids.shape
    device = input_ids.device
    real = torch.ones(batch, seq, dtype=torch.bool, device=device) if attention_mask is None else attention_mask > 0
    if not 0 < num_predict or (real.sum(dim=1) < num_predict).any():
        raise UserError(f"num_predict={num_predict} must be positive and at most the number of real tokens of every row")
    keys = torch.rand(batch, seq, generator=generator, device=device) if shuffle else \
        torch.arange(seq, device=device, dtype=torch.float32).expand(batch, seq) / seq
    keys = keys.masked_fill(~real, -1.0)  # padding first in the order: never among the last num_predict
    order = keys.argsort(dim=1, stable=True)  # order[b, r] = the position at rank r
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(seq, device=device).expand(batch, seq))
    is_target = rank >= seq - num_predict
    # i may not see j when j is a target not earlier than i (itself included).
    perm_mask = is_target[:, None, :] & (rank[:, None, :] >= rank[:, :, None])
    targets = order[:, seq - num_predict:]
    target_mapping = F.one_hot(targets, seq).float()
    return PermutationMasks(perm_mask.float(), target_mapping, targets, rank)


# ---------------------------------------------------------------------------------
# Hugging Face checkpoint layout
# ---------------------------------------------------------------------------------

_RENAMES = KeyMap([
    ("word_embedding.weight", "word_embedding.weight"),
    ("mask_emb", "mask_emb"),
    ("layers.{i}.attn.u", "layer.{i}.rel_attn.r_w_bias"),
    ("layers.{i}.attn.v", "layer.{i}.rel_attn.r_r_bias"),
    ("layers.{i}.attn.s_bias", "layer.{i}.rel_attn.r_s_bias"),
    ("layers.{i}.attn.seg_embed", "layer.{i}.rel_attn.seg_embed"),
    ("layers.{i}.attn_res.norm.{p}", "layer.{i}.rel_attn.layer_norm.{p}"),
    ("layers.{i}.ffn_res.norm.{p}", "layer.{i}.ff.layer_norm.{p}"),
    ("layers.{i}.ffn.fc1.{p}", "layer.{i}.ff.layer_1.{p}"),
    ("layers.{i}.ffn.fc2.{p}", "layer.{i}.ff.layer_2.{p}"),
])
# HF (d_model, heads, head_dim) projections; q/k/v/r act as x @ W, o as attn @ W^T.
_PROJ = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "r": "r_proj", "o": "out_proj"}


def xlnet_config_from_hf(hf: dict, source: str = "config.json") -> XLNetConfig:
    """Our config from an HF ``config.json`` dict (``source``: its path, for messages).

    Raises:
        CheckpointError: another model type, a variant we do not implement, or a value of the
            wrong type or range (naming the field).
    """
    if hf.get("model_type") != "xlnet":
        raise CheckpointError(f"{source} has model_type {hf.get('model_type')!r}; this loader reads 'xlnet'")
    require_config_fields(hf, source, ("vocab_size", "d_model", "n_head", "d_inner", "n_layer"))
    check_config_fields(hf, source, positive=("vocab_size", "d_model", "n_head", "d_inner", "n_layer", "d_head"),
                        fractions=("dropout",), positive_floats=("layer_norm_eps",), strings=("ff_activation", "attn_type"))
    if hf.get("mem_len") is not None:  # null: no memory
        check_config_fields(hf, source, non_negative=("mem_len",))
    check_config_types(hf, source, integers=("clamp_len",), booleans=("bi_data", "same_length"), nullable=("bi_data", "same_length"))
    check_heads_divide(hf, source, "d_model", "n_head", "d_head")
    if hf.get("attn_type", "bi") != "bi" or hf.get("bi_data") or hf.get("same_length"):
        raise CheckpointError(f"{source} asks for attn_type='uni', bi_data or same_length, which ctxkit's XLNet does not implement")
    if hf.get("ff_activation", "gelu") != "gelu":
        raise CheckpointError(f"{source} sets ff_activation={hf.get('ff_activation')!r}; ctxkit's XLNet uses 'gelu'")
    return XLNetConfig(vocab_size=hf["vocab_size"], d_model=hf["d_model"], n_heads=hf["n_head"], d_inner=hf["d_inner"],
                       n_layers=hf["n_layer"], dropout=hf.get("dropout", 0.1), layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
                       clamp_len=hf.get("clamp_len", -1), mem_len=hf.get("mem_len") or 0)


_LAYER_KEY = re.compile(r"(?:^|\.)layer\.(\d+)\.")


def _check_sizes(hf: dict, source: str, hf_state: Dict[str, Tensor]) -> None:
    """config.json's sizes against the weights, before the model is built (``q`` of HF's
    attention is ``(d_model, n_head, d_head)``)."""
    state = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in hf_state.items()}
    held = {"vocab_size": weight_dim(state, "word_embedding.weight", 0), "d_model": weight_dim(state, "word_embedding.weight", 1),
            "n_head": weight_dim(state, "layer.{i}.rel_attn.q", 1), "d_head": weight_dim(state, "layer.{i}.rel_attn.q", 2),
            "d_inner": weight_dim(state, "layer.{i}.ff.layer_1.weight", 0)}
    check_config_against_weights(hf, source, held, layers=("n_layer", count_layers(state, _LAYER_KEY)))


def _xlnet_config_to_hf(config: XLNetConfig) -> dict:
    return {"model_type": "xlnet", "architectures": ["XLNetLMHeadModel"], "vocab_size": config.vocab_size,
            "d_model": config.d_model, "n_layer": config.n_layers, "n_head": config.n_heads,
            "d_head": config.d_model // config.n_heads, "d_inner": config.d_inner, "ff_activation": config.activation,
            "attn_type": "bi", "dropout": config.dropout, "layer_norm_eps": config.layer_norm_eps,
            "clamp_len": config.clamp_len, "mem_len": config.mem_len or None, "bi_data": False, "same_length": False,
            "initializer_range": 0.02, "tie_word_embeddings": True, "pad_token_id": 5, "bos_token_id": 1, "eos_token_id": 2}


def _from_hf_state(hf_state: Dict[str, Tensor], config: XLNetConfig) -> Dict[str, Tensor]:
    state: Dict[str, Tensor] = {}
    d = config.d_model
    for key, value in hf_state.items():
        if key == "lm_loss.weight":
            continue  # tied to the word embeddings (checked by the caller)
        if key == "lm_loss.bias":
            state["lm_bias"] = value
            continue
        body = key[len("transformer."):] if key.startswith("transformer.") else key
        parts = body.split(".")
        if len(parts) == 4 and parts[0] == "layer" and parts[2] == "rel_attn" and parts[3] in _PROJ:
            if value.dim() != 3 or value.size(0) != d:  # misshaped: reported by the strict check
                state[f"transformer.layers.{parts[1]}.attn.{_PROJ[parts[3]]}.weight"] = value
                continue
            w = value.reshape(d, -1)
            ours = f"layers.{parts[1]}.attn.{_PROJ[parts[3]]}.weight"
            state[f"transformer.{ours}"] = (w if parts[3] == "o" else w.t()).contiguous()
            continue
        ours = _RENAMES.to_ours(body)
        state[f"transformer.{ours}" if ours else f"<unmapped> {key}"] = value if ours else torch.empty(0)
    return state


def load_xlnet(directory: os.PathLike) -> XLNetLMHeadModel:
    """Load an HF-format XLNet folder (``XLNetLMHeadModel`` or a bare ``XLNetModel``).

    A bare body has no ``lm_loss.bias``: the LM bias then starts at zero.

    Returns:
        :class:`XLNetLMHeadModel` in eval mode.

    Raises:
        CheckpointError: unreadable files, another model type, or (as
            :class:`~ctxkit.core.checkpoint.CheckpointMismatchError`) every missing, unexpected
            and misshaped key.
    """
    directory = Path(directory)
    hf, source = read_config(directory), str(directory / "config.json")
    config = xlnet_config_from_hf(hf, source)
    hf_state = read_weights(directory)
    _check_sizes(hf, source, hf_state)
    emb = hf_state.get("transformer.word_embedding.weight")
    if "lm_loss.weight" in hf_state and emb is not None and not torch.equal(hf_state["lm_loss.weight"], emb):
        raise CheckpointError(f"{directory}: lm_loss.weight differs from the word embeddings; ctxkit's XLNet ties them")
    state = _from_hf_state(hf_state, config)
    if not any(k.startswith(("lm_", "transformer.")) for k in hf_state):  # bare XLNetModel
        state.setdefault("lm_bias", torch.zeros(config.vocab_size))
    with torch.device("meta"):
        model = XLNetLMHeadModel(config)
    load_state_dict_strict(model, state, source=str(directory), assign=True)
    return model.eval()


def save_xlnet(model: XLNetLMHeadModel, directory: os.PathLike) -> Path:
    """Save in the HF ``XLNetLMHeadModel`` layout (``config.json`` + ``model.safetensors``),
    loadable by ``transformers``; both files are written atomically."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    c = model.config
    heads, head_dim = c.n_heads, c.d_model // c.n_heads
    hf: Dict[str, Tensor] = {}
    for key, value in model.state_dict().items():
        if key == "lm_bias":
            hf["lm_loss.bias"] = value.contiguous()
            continue
        body = key[len("transformer."):]
        parts = body.split(".")
        if len(parts) == 5 and parts[2] == "attn" and parts[3] in _PROJ.values():
            name = next(k for k, v in _PROJ.items() if v == parts[3])
            w = value if name == "o" else value.t()
            hf[f"transformer.layer.{parts[1]}.rel_attn.{name}"] = w.reshape(c.d_model, heads, head_dim).contiguous()
            continue
        theirs = _RENAMES.to_theirs(body)
        if theirs is None:
            raise CheckpointError(f"no HF name for parameter {key!r}")
        hf["transformer." + theirs] = value.contiguous()
    save_weights(hf, directory / "model.safetensors")
    tmp = directory / ".config.json.tmp"
    tmp.write_text(json.dumps(_xlnet_config_to_hf(c), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, directory / "config.json")
    return directory
