"""Transformer-XL: a segment-recurrent Transformer language model (Dai et al. 2019).

A long text is read in segments of ``tgt_len`` tokens. Each layer keeps the last
``mem_len`` states it was fed (its memory) and the next segment's queries attend to
``[memory; segment]``; the memory is detached, so gradients stay within one segment
while the context reaches ``n_layers * mem_len`` tokens back. Positions are relative
(:class:`~ctxkit.layers.RelativeMultiHeadAttention`), which is what lets states computed
for one segment be reused unchanged by the next.

Large vocabularies use adaptive input embeddings (:class:`AdaptiveEmbedding`: smaller
vectors for rarer clusters, projected to ``d_model``) and an adaptive softmax. The
softmax is :class:`torch.nn.AdaptiveLogSoftmaxWithLoss` (Grave et al. 2017), untied from
the input embeddings: the reference implementation ties the two (sharing each cluster's
table and projection), which saves parameters on WikiText-103 but needs a custom
softmax; the untied one keeps this module small and uses PyTorch's tested kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...layers import AddNorm, PositionwiseFFN, causal_mask, sinusoidal_table
from ...layers.transformer import TransformerEncoder
from ...layers.relative_attention import RelativeMultiHeadAttention
from ...core.errors import UserError
from ..common import IndexableOutput, PaperNames

__all__ = ["TransformerXLConfig", "TRANSFO_XL_PRESETS", "AdaptiveEmbedding", "TransformerXLLayer", "TransformerXLModel",
           "TransformerXLLMHeadModel", "TransformerXLLMOutput", "VanillaBody", "VanillaTransformerLM", "build_transformer_xl_lm"]


@dataclass(frozen=True)
class TransformerXLConfig(PaperNames):
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



# One line per preset for `ctxkit list-models` (ctxkit.zoo.families).
TRANSFO_XL_DESCRIPTIONS: Dict[str, str] = {
    "transfo_xl_base_wt103": "LM with segment memory, the paper's WikiText-103 base: 16 layers, width 410, memory 150 (Dai et al. 2019)",
    "transfo_xl_wt2_small": "LM with segment memory, 4 layers, width 256, memory 128: WikiText-2 on one GPU in minutes",
}

TRANSFO_XL_PRESETS: Dict[str, TransformerXLConfig] = {
    # The paper's base WikiText-103 model (train: tgt_len 150, mem_len 150).
    "transfo_xl_base_wt103": TransformerXLConfig(),
    # Small enough to train on WikiText-2 on one GPU in minutes.
    "transfo_xl_wt2_small": TransformerXLConfig(vocab_size=33278, d_model=256, n_heads=8, d_inner=1024, n_layers=4, mem_len=128,
                                                tgt_len=128, dropout=0.1, dropatt=0.0, cutoffs=(2000, 10000), div_val=2),
}

Mems = Optional[List[Tensor]]


class AdaptiveEmbedding(nn.Module):
    """Adaptive input embeddings (Baevski & Auli 2019).

    The vocabulary (sorted by frequency) is cut into clusters ``[0, c1), [c1, c2), ...``;
    cluster ``i`` has vectors of size ``d_embed // div_val**i`` and its own projection to
    ``d_proj``, so rare words spend fewer parameters. The result is scaled by
    ``sqrt(d_proj)`` as in the Transformer.

    Args:
        vocab_size: number of words.
        d_embed: embedding size of the first (most frequent) cluster.
        d_proj: output size (the model width).
        cutoffs: increasing cluster boundaries, each in ``(0, vocab_size)``.
        div_val: size divisor per cluster; 1 gives one table of ``d_embed`` vectors.
    """

    def __init__(self, vocab_size: int, d_embed: int, d_proj: int, cutoffs: Sequence[int] = (), div_val: int = 1):
        super().__init__()
        cutoffs = list(cutoffs)
        if cutoffs != sorted(set(cutoffs)) or (cutoffs and (cutoffs[0] <= 0 or cutoffs[-1] >= vocab_size)):
            raise UserError(f"cutoffs must be increasing, unique and inside (0, {vocab_size}), got {cutoffs}")
        self.vocab_size, self.d_embed, self.d_proj, self.div_val = vocab_size, d_embed, d_proj, div_val
        self.cutoff_ends = [0] + cutoffs + [vocab_size]
        self.scale = d_proj ** 0.5
        self.emb_layers = nn.ModuleList()
        self.emb_projs = nn.ModuleList()
        if div_val == 1:  # one table: the clusters differ only in the softmax
            self.emb_layers.append(nn.Embedding(vocab_size, d_embed))
            self.emb_projs.append(nn.Linear(d_embed, d_proj, bias=False) if d_proj != d_embed else nn.Identity())
        else:
            for i, (lo, hi) in enumerate(zip(self.cutoff_ends[:-1], self.cutoff_ends[1:])):
                d_i = d_embed // div_val ** i
                if d_i < 1:
                    raise UserError(f"cluster {i} would have embeddings of size {d_embed} // {div_val}**{i} = 0")
                self.emb_layers.append(nn.Embedding(hi - lo, d_i))
                self.emb_projs.append(nn.Linear(d_i, d_proj, bias=False))

    def forward(self, input_ids: Tensor) -> Tensor:
        """Embed.

        Args:
            input_ids: ``(...)`` word ids.

        Returns:
            ``(..., d_proj)``.
        """
        if self.div_val == 1:
            return self.emb_projs[0](self.emb_layers[0](input_ids)) * self.scale
        flat = input_ids.reshape(-1)
        weight = self.emb_projs[0].weight
        out = torch.zeros(flat.numel(), self.d_proj, dtype=weight.dtype, device=weight.device)
        for i, (lo, hi) in enumerate(zip(self.cutoff_ends[:-1], self.cutoff_ends[1:])):
            index = ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)
            if index.numel() == 0:
                continue
            out.index_copy_(0, index, self.emb_projs[i](self.emb_layers[i](flat[index] - lo)).to(out.dtype))
        return out.view(*input_ids.shape, self.d_proj) * self.scale


class TransformerXLLayer(nn.Module):
    """Relative self-attention over ``[memory; segment]`` then the FFN, each in :class:`AddNorm`.

    Args:
        d_model: width.
        n_heads: heads.
        d_inner: FFN inner size.
        dropout: residual dropout and dropout after the FFN's ReLU.
        dropatt: dropout on attention weights.
        pre_lnorm: pre-norm (True) or the paper's post-norm (False).
        u, v: shared ``(n_heads, head_dim)`` biases, or None for this layer's own.
        eps: LayerNorm epsilon.
    """

    def __init__(self, d_model: int, n_heads: int, d_inner: int, dropout: float = 0.1, dropatt: float = 0.0,
                 pre_lnorm: bool = False, u: Optional[nn.Parameter] = None, v: Optional[nn.Parameter] = None, eps: float = 1e-5):
        super().__init__()
        self.self_attn = RelativeMultiHeadAttention(d_model, n_heads, dropout=dropatt, u=u, v=v)
        self.self_attn_res = AddNorm(d_model, dropout, pre_lnorm, eps)
        self.ffn = PositionwiseFFN(d_model, d_inner, "relu", dropout)
        self.ffn_res = AddNorm(d_model, dropout, pre_lnorm, eps)

    def forward(self, x: Tensor, pos_emb: Tensor, memory: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                need_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """One layer.

        Args:
            x: ``(batch, qlen, d_model)`` the segment.
            pos_emb: ``(klen, d_model)`` encodings of distances ``klen-1 .. 0``.
            memory: ``(batch, mlen, d_model)`` this layer's memory (its earlier inputs), or None.
            mask: bool ``(qlen, klen)`` or ``(batch, 1, qlen, klen)``; True = may attend.
            need_weights: also return the attention weights.

        Returns:
            ``(x (batch, qlen, d_model), weights (batch, heads, qlen, klen) or None)``.
        """
        weights = None
        if memory is not None and self.self_attn_res.norm_first:
            # Pre-norm: keys from the memory get the same normalisation as the segment's.
            memory = self.self_attn_res.norm(memory)

        def attend(h: Tensor) -> Tensor:
            nonlocal weights
            out, weights = self.self_attn(h, pos_emb, memory, mask, need_weights=need_weights)
            return out

        x = self.self_attn_res(x, attend)
        x = self.ffn_res(x, self.ffn)
        return x, weights


class TransformerXLModel(nn.Module):
    """The Transformer-XL body: adaptive embeddings, relative layers, memories.

    Args:
        config: the architecture; ``config.mem_len`` is the memory length, changeable
            afterwards through :attr:`mem_len` (e.g. longer at evaluation).
    """

    def __init__(self, config: TransformerXLConfig):
        super().__init__()
        self.config = config
        self.mem_len = config.mem_len
        self.clamp_len = config.clamp_len
        d = config.d_model
        self.word_emb = AdaptiveEmbedding(config.vocab_size, config.d_embed or d, d, config.cutoffs, config.div_val)
        self.drop = nn.Dropout(config.dropout)
        head_dim = d // config.n_heads
        if config.untie_r:
            self.u = self.v = None
        else:  # one pair for all layers, as the paper describes
            self.u = nn.Parameter(torch.zeros(config.n_heads, head_dim))
            self.v = nn.Parameter(torch.zeros(config.n_heads, head_dim))
        self.layers = nn.ModuleList(
            TransformerXLLayer(d, config.n_heads, config.d_inner, config.dropout, config.dropatt, config.pre_lnorm, self.u, self.v)
            for _ in range(config.n_layers)
        )
        # Pre-norm leaves the residual stream un-normalised; one last norm fixes its scale.
        self.final_norm = nn.LayerNorm(d) if config.pre_lnorm else None
        self.register_buffer("pos_table", sinusoidal_table(0, d), persistent=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # The reference code's init: N(0, 0.02) for weights and for u, v; zero biases.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if isinstance(module, RelativeMultiHeadAttention):
            nn.init.normal_(module.u, std=0.02)
            nn.init.normal_(module.v, std=0.02)

    def relative_positions(self, klen: int) -> Tensor:
        """Sinusoidal encodings of the distances ``klen-1, ..., 1, 0``.

        Returns:
            ``(klen, d_model)``; distances beyond ``clamp_len`` (when >= 0) reuse its encoding.
        """
        distance = torch.arange(klen - 1, -1, -1, device=self.pos_table.device)
        if self.clamp_len >= 0:
            distance = distance.clamp(max=self.clamp_len)
        needed = int(distance[0]) + 1 if klen else 0
        if self.pos_table.size(0) < needed:
            # Grown on demand (doubling) so that longer evaluation contexts need no setting.
            table = sinusoidal_table(max(needed, 2 * self.pos_table.size(0)), self.config.d_model)
            self.pos_table = table.to(self.pos_table.device)
        return self.pos_table[distance]

    def forward(self, input_ids: Tensor, mems: Mems = None, *, attention_mask: Optional[Tensor] = None,
                output_attentions: bool = False) -> Tuple[Tensor, Mems]:
        """Encode one segment given the memories of the earlier ones.

        The positional order is transformers' ``TransfoXLModel``'s: ``(input_ids, mems)``.

        Args:
            input_ids: ``(batch, qlen)`` the segment.
            mems: per layer ``(batch, mlen, d_model)``, the inputs that layer saw in the
                previous segments (from the last call), or None at the start of a text.
            attention_mask: bool ``(qlen, mlen + qlen)`` or ``(batch, 1, qlen, mlen + qlen)``
                replacing the causal mask; it must still hide future keys.
            output_attentions: also return each layer's weights (as a third element).

        Returns:
            ``(hidden (batch, qlen, d_model), new_mems)``: ``new_mems`` holds, per layer,
            the last ``mem_len`` of ``[mems; this segment's inputs]`` (the first layer's
            input being the embeddings), detached; None when ``mem_len`` is 0.
        """
        if mems is not None and len(mems) != len(self.layers):
            raise UserError(f"mems must have one tensor per layer ({len(self.layers)}), got {len(mems)}")
        batch, qlen = input_ids.shape
        mlen = mems[0].size(1) if mems is not None else 0
        klen = mlen + qlen
        mask = causal_mask(qlen, klen, device=input_ids.device) if attention_mask is None else attention_mask
        if attention_mask is None and self.config.same_length:
            # Query i then sees exactly keys i .. i + klen - qlen when the memory is full:
            # hide keys more than mem_len behind it (the reference's evaluation mode).
            mask_len = klen - self.mem_len
            shift = qlen - mask_len if mask_len > 0 else qlen
            mask = mask & ~torch.ones(qlen, klen, dtype=torch.bool, device=input_ids.device).tril(-shift)
        h = self.drop(self.word_emb(input_ids))
        pos_emb = self.drop(self.relative_positions(klen).to(h.dtype))
        inputs: List[Tensor] = []
        attentions: List[Optional[Tensor]] = []
        for i, layer in enumerate(self.layers):
            inputs.append(h)
            h, weights = layer(h, pos_emb, mems[i] if mems is not None else None, mask, need_weights=output_attentions)
            attentions.append(weights)
        if self.final_norm is not None:
            h = self.final_norm(h)
        h = self.drop(h)
        new_mems = self._update_mems(inputs, mems)
        if output_attentions:
            return h, new_mems, attentions  # type: ignore[return-value]
        return h, new_mems

    def _update_mems(self, inputs: List[Tensor], mems: Mems) -> Mems:
        if self.mem_len <= 0:
            return None
        # Stop-gradient: the next segment reads these as constants, so backward never
        # reaches into earlier segments' graphs (which may already be freed).
        with torch.no_grad():
            if mems is None:
                return [x[:, -self.mem_len:].detach() for x in inputs]
            return [torch.cat([m.to(x.dtype), x], dim=1)[:, -self.mem_len:].detach() for m, x in zip(mems, inputs)]


@dataclass
class TransformerXLLMOutput(IndexableOutput):
    """What :class:`TransformerXLLMHeadModel` returns. Indexed in field order, skipping None
    (:class:`~ctxkit.models.common.IndexableOutput`): with ``labels``, ``loss, nll, mems, hidden =
    out``; without, ``out[0]`` is ``log_probs``.

    Attributes:
        loss: mean negative log-likelihood over the segment's targets (with ``labels``).
        nll: ``(batch, qlen)`` per-token negative log-likelihood (with ``labels``).
        log_probs: ``(batch, qlen, vocab)`` log-probabilities (without ``labels``).
        mems: the memories to pass with the next segment.
        hidden: ``(batch, qlen, d_model)`` last-layer states.
    """

    loss: Optional[Tensor]
    nll: Optional[Tensor]
    log_probs: Optional[Tensor]
    mems: Mems
    hidden: Tensor


class TransformerXLLMHeadModel(nn.Module):
    """Transformer-XL with its (adaptive) softmax over the next word.

    Args:
        config: the architecture; with ``cutoffs`` the output layer is
            :class:`torch.nn.AdaptiveLogSoftmaxWithLoss` (``div_value=div_val``, head
            without bias), otherwise a full ``Linear`` + log-softmax.
    """

    def __init__(self, config: TransformerXLConfig):
        super().__init__()
        self.config = config
        self.transformer = TransformerXLModel(config)
        if config.cutoffs:
            self.crit = nn.AdaptiveLogSoftmaxWithLoss(config.d_model, config.vocab_size, list(config.cutoffs),
                                                      div_value=float(config.div_val), head_bias=False)
            self.out = None
        else:
            self.crit = None
            self.out = nn.Linear(config.d_model, config.vocab_size)
        # Small output weights start the model near the uniform distribution.
        for module in (self.crit, self.out):
            if module is not None:
                module.apply(TransformerXLModel._init_weights)

    def forward(self, input_ids: Tensor, mems: Mems = None, *, labels: Optional[Tensor] = None) -> TransformerXLLMOutput:
        """Score one segment.

        The positional order is transformers' ``TransfoXLLMHeadModel``'s: ``(input_ids, mems)``;
        ``labels`` by keyword.

        Args:
            input_ids: ``(batch, qlen)``.
            labels: ``(batch, qlen)`` the *next* word after each input position (already
                shifted, because the target of a segment's last word is the first word of
                the next segment); all in ``[0, vocab_size)``.
            mems: from the previous call, or None.

        Returns:
            :class:`TransformerXLLMOutput` with ``loss``/``nll`` when ``labels`` are given,
            else ``log_probs``.
        """
        hidden, new_mems = self.transformer(input_ids, mems=mems)
        # The (adaptive) softmax runs in fp32 outside autocast: AdaptiveLogSoftmaxWithLoss
        # fails on the mixed dtypes autocast would give it, and log-probs want fp32 anyway.
        flat = hidden.reshape(-1, hidden.size(-1)).float()
        loss = nll = log_probs = None
        if labels is not None:
            target = labels.reshape(-1)
            if self.crit is not None:
                with torch.autocast(flat.device.type, enabled=False):
                    nll = -self.crit(flat, target).output
            else:
                nll = F.cross_entropy(self.out(flat), target, reduction="none")
            loss = nll.mean()
            nll = nll.view_as(labels)
        else:
            with torch.autocast(flat.device.type, enabled=False):
                flat_lp = self.crit.log_prob(flat) if self.crit is not None else F.log_softmax(self.out(flat), dim=-1)
            log_probs = flat_lp.view(*hidden.shape[:2], -1)
        return TransformerXLLMOutput(loss=loss, nll=nll, log_probs=log_probs, mems=new_mems, hidden=hidden)


# ---------------------------------------------------------------------------- the vanilla baseline


class VanillaBody(nn.Module):
    """Adaptive embeddings + learned absolute positions + a causal Transformer; no memory."""

    def __init__(self, config: TransformerXLConfig, max_position: int):
        super().__init__()
        d = config.d_model
        self.config, self.max_position, self.mem_len, self.clamp_len = config, max_position, 0, -1
        self.word_emb = AdaptiveEmbedding(config.vocab_size, config.d_embed or d, d, config.cutoffs, config.div_val)
        self.pos_emb = nn.Embedding(max_position, d)
        self.drop = nn.Dropout(config.dropout)
        self.encoder = TransformerEncoder(config.n_layers, d, config.n_heads, config.d_inner, dropout=config.dropout,
                                          attention_dropout=config.dropatt, activation="relu", norm_first=config.pre_lnorm)
        self.apply(TransformerXLModel._init_weights)

    def forward(self, input_ids: Tensor, mems=None) -> Tuple[Tensor, None]:
        seq = input_ids.size(1)
        if seq > self.max_position:
            raise UserError(f"segment of {seq} tokens exceeds the {self.max_position} learned positions")
        h = self.drop(self.word_emb(input_ids) + self.pos_emb(torch.arange(seq, device=input_ids.device)))
        h = self.encoder(h, mask=causal_mask(seq, seq, device=input_ids.device)).last_hidden_state
        return self.drop(h), None


class VanillaTransformerLM(TransformerXLLMHeadModel):
    """The Transformer-XL LM with its body swapped for :class:`VanillaBody` (same head; ``mems`` ignored)."""

    def __init__(self, config: TransformerXLConfig, max_position: int):
        super().__init__(config)
        self.transformer = VanillaBody(config, max_position)


def build_transformer_xl_lm(kind: str, config: TransformerXLConfig, max_position: int = 0) -> TransformerXLLMHeadModel:
    """``"xl"``: :class:`TransformerXLLMHeadModel`; ``"vanilla"``: :class:`VanillaTransformerLM`."""
    if kind not in ("xl", "vanilla"):
        raise UserError(f"model must be 'xl' or 'vanilla', got {kind!r}")
    return TransformerXLLMHeadModel(config) if kind == "xl" else VanillaTransformerLM(config, max_position or config.tgt_len)
