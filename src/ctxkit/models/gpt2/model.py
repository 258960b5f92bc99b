"""GPT-2: a decoder-only, pre-norm Transformer language model (Radford et al. 2019).

Token + learned position embeddings, a stack of pre-norm layers with causal
self-attention (the shared :class:`~ctxkit.layers.TransformerEncoderLayer` with
``norm_first=True`` and a causal mask), a final LayerNorm, and an output layer tied to the
token embeddings.

Checkpoints use the Hugging Face layout (``GPT2LMHeadModel``). Two differences from our
modules are converted on load and save: HF's ``Conv1D`` stores weights as ``(in, out)``
where ``nn.Linear`` stores ``(out, in)``, and HF packs the query, key and value
projections into one ``c_attn`` matrix.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

import torch
from torch import Tensor, nn

from ...core.checkpoint import (CheckpointError, KeyMap, check_config_against_weights, check_config_fields, check_config_types,
                               check_heads_divide, count_layers, load_state_dict_strict, read_config, read_weights,
                               require_config_fields, save_weights, weight_dim)
from ...layers import KVCache, TransformerEncoder, causal_mask, padding_mask
from ..common import PretrainedHabits, Replaceable
from ...core.errors import UserError
from ...core.meta_build import meta_device

__all__ = ["GPT2Config", "GPT2_PRESETS", "GPT2Model", "GPT2LMHeadModel", "load_gpt2", "save_gpt2", "gpt2_config_from_hf"]


@dataclass(frozen=True)
class GPT2Config(Replaceable):
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


def _gpt2(layers: int, hidden: int, heads: int) -> GPT2Config:
    return GPT2Config(num_layers=layers, hidden_size=hidden, num_heads=heads, ffn_size=4 * hidden)


# The four released GPT-2 sizes and three small ones (descriptions: GPT2_DESCRIPTIONS).
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

# One line per preset for `ctxkit list-models` (ctxkit.zoo.families).
GPT2_DESCRIPTIONS: Dict[str, str] = {
    "gpt2_117m": "GPT-2 small, 124M parameters (Radford et al. 2019)",
    "gpt2_345m": "GPT-2 medium, 355M parameters",
    "gpt2_774m": "GPT-2 large, 774M parameters",
    "gpt2_1558m": "GPT-2 XL, 1.5B parameters",
    "gpt2_6_512_8": "decoder-only LM, 6 layers, width 512: trains from scratch on one GPU",
    "gpt2_4_256_4": "decoder-only LM, 4 layers, width 256",
    "gpt2_2_128_2": "decoder-only LM, 2 layers, width 128: for tests on a CPU",
}


class GPT2Model(nn.Module):
    """The GPT-2 body: embeddings, pre-norm causal layers, final LayerNorm.

    Args:
        config: the architecture.
    """

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position, config.hidden_size)
        self.drop = nn.Dropout(config.dropout)
        self.encoder = TransformerEncoder(config.num_layers, config.hidden_size, config.num_heads, config.ffn_size,
                                          dropout=config.dropout, attention_dropout=config.attention_dropout,
                                          activation=config.activation, norm_first=True, eps=config.layer_norm_eps)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # GPT-2's initialisation: N(0, 0.02), and residual output projections scaled by
        # 1/sqrt(2 * layers) so the residual stream's variance does not grow with depth.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for layer in getattr(module, "layers", []):
            for proj in (layer.self_attn.out_proj, layer.ffn.fc2):
                nn.init.normal_(proj.weight, std=0.02 / (2 * self.config.num_layers) ** 0.5)

    def forward(self, input_ids: Tensor, cache: Optional[KVCache] = None, attention_mask: Optional[Tensor] = None,
                token_type_ids: Optional[Tensor] = None, position_ids: Optional[Tensor] = None) -> Tensor:
        """Hidden states of the last layer.

        The positional order is transformers': ``(input_ids, cache, attention_mask,
        token_type_ids, position_ids)``.

        Args:
            input_ids: ``(batch, seq)``; with a ``cache``, only the new tokens.
            cache: a :class:`~ctxkit.layers.KVCache` from :meth:`new_cache`; the new
                tokens attend to everything cached, and the cache advances by ``seq``.
            attention_mask: 1 for real tokens, 0 for padding (keys only): ``(batch, seq)``,
                or ``(batch, past + seq)`` with a cache.
            token_type_ids: ``(batch, seq)``, embedded with the token embeddings (GPT-2 has
                no segment table; transformers does the same).
            position_ids: ``(batch, seq)``; ``past..past+seq-1`` when None (pass explicit
                ones for left-padded batches).

        Returns:
            ``(batch, seq, hidden)``.

        Raises:
            ValueError: when the sequence exceeds the model's context length.
        """
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache is a {type(cache).__name__}, not a KVCache: GPT-2's positional order is "
                            "transformers' (input_ids, cache, attention_mask, ...); pass the mask as attention_mask=")
        seq = input_ids.size(1)
        if cache is not None and cache.is_static:
            return self._static_step(input_ids, attention_mask, position_ids, cache, token_type_ids)
        past = cache.length if cache is not None else 0
        total = past + seq
        if total > self.config.max_position and position_ids is None:
            raise UserError(f"input has {total} tokens but the context length is {self.config.max_position}; "
                             "truncate it or evaluate with a sliding window")
        if position_ids is None:
            position_ids = torch.arange(past, total, device=input_ids.device)
        x = self.drop(self._embed(input_ids, token_type_ids, position_ids))
        # One new query after a cache sees every key: no mask to build or apply.
        mask = None if seq == 1 and attention_mask is None else causal_mask(seq, total, device=input_ids.device)
        if attention_mask is not None:
            # A padded query (e.g. at the start of a left-padded row) would see no key at
            # all and turn NaN; letting every query see itself keeps it finite. Real
            # queries are unaffected: their own position is real and already allowed.
            own = torch.arange(total, device=input_ids.device)[None, :] == torch.arange(past, total, device=input_ids.device)[:, None]
            mask = (mask & padding_mask(attention_mask)) | own
        return self.encoder(x, mask=mask, cache=cache).last_hidden_state

    def _embed(self, input_ids: Tensor, token_type_ids: Optional[Tensor], position_ids: Tensor) -> Tensor:
        x = self.wte(input_ids) + self.wpe(position_ids)
        return x if token_type_ids is None else x + self.wte(token_type_ids)

    def _static_step(self, input_ids: Tensor, attention_mask: Optional[Tensor], position_ids: Optional[Tensor],
                     cache: KVCache, token_type_ids: Optional[Tensor] = None) -> Tensor:
        """One new token over a static cache (fixed shapes, so a CUDA graph can replay it):
        ``attention_mask (batch, max_len)`` marks the filled slots, this token's included."""
        if input_ids.size(1) != 1 or attention_mask is None or position_ids is None:
            raise UserError("a static cache takes one token per row with explicit position_ids and an "
                             "attention_mask over all of the cache's slots")
        if attention_mask.size(1) != cache.max_len:
            raise UserError(f"attention_mask spans {attention_mask.size(1)} keys; the static cache has {cache.max_len} slots")
        x = self.drop(self._embed(input_ids, token_type_ids, position_ids))
        return self.encoder(x, mask=padding_mask(attention_mask), cache=cache).last_hidden_state

    def new_cache(self, batch: int, max_len: int, dtype: Optional[torch.dtype] = None, device=None) -> KVCache:
        """An empty :class:`~ctxkit.layers.KVCache` for ``batch`` sequences of up to ``max_len`` tokens."""
        c = self.config
        weight = self.wte.weight
        return KVCache(c.num_layers, batch, c.num_heads, c.hidden_size // c.num_heads, min(max_len, c.max_position),
                       dtype=dtype or weight.dtype, device=device or weight.device)


class GPT2LMHeadModel(PretrainedHabits, nn.Module):
    """GPT-2 with its language-model head (tied to the token embeddings, no bias)."""

    supports_static_cache = True  # forward() takes one token over a static KVCache (CUDA-graph decoding)

    @classmethod
    def _load_folder(cls, folder):
        return load_gpt2(folder)

    def _save_folder(self, folder, tokenizer):
        out = save_gpt2(self, folder)
        if tokenizer is not None:
            tokenizer.save(out)
        return out

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.config = config
        self.transformer = GPT2Model(config)

    def forward(self, input_ids: Tensor, cache: Optional[KVCache] = None, attention_mask: Optional[Tensor] = None,
                token_type_ids: Optional[Tensor] = None, position_ids: Optional[Tensor] = None) -> Tensor:
        """Next-token logits ``(batch, seq, vocab)``; see :meth:`GPT2Model.forward`."""
        hidden = self.transformer(input_ids, cache=cache, attention_mask=attention_mask, token_type_ids=token_type_ids,
                                  position_ids=position_ids)
        return nn.functional.linear(hidden, self.transformer.wte.weight)

    def new_cache(self, batch: int, max_len: int, dtype: Optional[torch.dtype] = None, device=None) -> KVCache:
        """See :meth:`GPT2Model.new_cache`."""
        return self.transformer.new_cache(batch, max_len, dtype, device)


# ---------------------------------------------------------------------------------
# Hugging Face checkpoint layout
# ---------------------------------------------------------------------------------

_RENAMES = KeyMap([
    ("wte.weight", "wte.weight"),
    ("wpe.weight", "wpe.weight"),
    ("encoder.layers.{i}.self_attn_res.norm.{p}", "h.{i}.ln_1.{p}"),
    ("encoder.layers.{i}.self_attn.out_proj.{p}", "h.{i}.attn.c_proj.{p}"),
    ("encoder.layers.{i}.ffn_res.norm.{p}", "h.{i}.ln_2.{p}"),
    ("encoder.layers.{i}.ffn.fc1.{p}", "h.{i}.mlp.c_fc.{p}"),
    ("encoder.layers.{i}.ffn.fc2.{p}", "h.{i}.mlp.c_proj.{p}"),
    ("encoder.final_norm.{p}", "ln_f.{p}"),
])
_QKV = ("q_proj", "k_proj", "v_proj")
# Conv1D weights, stored (in, out) by HF.
_CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
# Buffers and the tied output matrix that HF files may carry.
_REDUNDANT = (".attn.bias", ".attn.masked_bias")


# Switches of HF's GPT-2 that ctxkit's does not implement: a config that turns one on is refused.
_UNSUPPORTED_FLAGS = ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention")


def gpt2_config_from_hf(hf: dict, source: str = "config.json") -> GPT2Config:
    """Our config from an HF ``config.json`` dict (``source``: its path, for messages).

    Raises:
        CheckpointError: for another model type, a variant we do not implement, or a value
            of the wrong type or range (naming the field).
    """
    if hf.get("model_type") != "gpt2":
        raise CheckpointError(f"{source} has model_type {hf.get('model_type')!r}; this loader reads 'gpt2'")
    require_config_fields(hf, source, ("n_layer", "n_embd", "n_head", "vocab_size", "n_positions"))
    check_config_fields(hf, source, positive=("n_layer", "n_embd", "n_head", "vocab_size", "n_positions"),
                        fractions=("resid_pdrop", "embd_pdrop", "attn_pdrop"), positive_floats=("layer_norm_epsilon",),
                        strings=("activation_function",))
    if hf.get("n_inner") is not None:  # null: 4 x n_embd
        check_config_fields(hf, source, positive=("n_inner",))
    check_config_types(hf, source, booleans=_UNSUPPORTED_FLAGS, nullable=_UNSUPPORTED_FLAGS)
    check_heads_divide(hf, source, "n_embd", "n_head")
    for flag in _UNSUPPORTED_FLAGS:
        if hf.get(flag):
            raise CheckpointError(f"{source} sets {flag}, which ctxkit's GPT-2 does not implement")
    hidden = hf["n_embd"]
    return GPT2Config(num_layers=hf["n_layer"], hidden_size=hidden, num_heads=hf["n_head"], vocab_size=hf["vocab_size"],
                      max_position=hf["n_positions"], ffn_size=hf.get("n_inner") or 4 * hidden, dropout=hf.get("resid_pdrop", 0.1),
                      attention_dropout=hf.get("attn_pdrop", 0.1), activation=hf.get("activation_function", "gelu_new"),
                      layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5))


_LAYER_KEY = re.compile(r"(?:^|\.)h\.(\d+)\.")


def _check_sizes(hf: dict, source: str, hf_state: Dict[str, Tensor]) -> None:
    """config.json's sizes against the weights, before the model is built (the names with
    or without the ``transformer.`` of GPT2LMHeadModel files)."""
    state = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in hf_state.items()}
    held = {"vocab_size": weight_dim(state, "wte.weight", 0), "n_embd": weight_dim(state, "wte.weight", 1),
            "n_positions": weight_dim(state, "wpe.weight", 0)}
    if hf.get("n_inner") is not None:  # Conv1D weights are (in, out)
        held["n_inner"] = weight_dim(state, "h.{i}.mlp.c_fc.weight", 1)
    check_config_against_weights(hf, source, held, layers=("n_layer", count_layers(state, _LAYER_KEY)))


def _gpt2_config_to_hf(config: GPT2Config) -> dict:
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": config.num_layers, "n_embd": config.hidden_size,
            "n_head": config.num_heads, "vocab_size": config.vocab_size, "n_positions": config.max_position,
            "n_inner": config.ffn_size, "resid_pdrop": config.dropout, "embd_pdrop": config.dropout,
            "attn_pdrop": config.attention_dropout, "activation_function": config.activation,
            "layer_norm_epsilon": config.layer_norm_eps, "initializer_range": 0.02, "tie_word_embeddings": True,
            "bos_token_id": 50256, "eos_token_id": 50256}


def _from_hf_state(hf_state: Dict[str, Tensor]) -> Dict[str, Tensor]:
    state: Dict[str, Tensor] = {}
    for key, value in hf_state.items():
        body = key[len("transformer."):] if key.startswith("transformer.") else key
        if body.endswith(_REDUNDANT) or key == "lm_head.weight":
            continue  # causal-mask buffers; the output layer is the tied embedding
        if body.endswith(_CONV1D):
            value = value.t()
        if ".attn.c_attn." in body:
            layer = body.split(".")[1]
            for role, part in zip(_QKV, value.chunk(3, dim=0)):
                state[f"transformer.encoder.layers.{layer}.self_attn.{role}.{body.rsplit('.', 1)[1]}"] = part.contiguous()
            continue
        ours = _RENAMES.to_ours(body)
        state[f"transformer.{ours}" if ours else f"<unmapped> {key}"] = value.contiguous() if ours else torch.empty(0)
    return state


def load_gpt2(directory: os.PathLike) -> GPT2LMHeadModel:
    """Load an HF-format GPT-2 checkpoint folder (``config.json`` + safetensors or .bin).

    Returns:
        :class:`GPT2LMHeadModel` in eval mode.

    Raises:
        CheckpointError: unreadable files, another model type, or (as
            :class:`~ctxkit.core.checkpoint.CheckpointMismatchError`) every missing, unexpected
            and misshaped key.
    """
    directory = Path(directory)
    hf, source = read_config(directory), str(directory / "config.json")
    config = gpt2_config_from_hf(hf, source)
    hf_state = read_weights(directory)
    _check_sizes(hf, source, hf_state)
    if "lm_head.weight" in hf_state and "transformer.wte.weight" in hf_state:
        if not torch.equal(hf_state["lm_head.weight"], hf_state["transformer.wte.weight"]):
            raise CheckpointError(f"{directory}: lm_head.weight differs from the token embeddings; ctxkit's GPT-2 ties them")
    with meta_device():
        model = GPT2LMHeadModel(config)
    load_state_dict_strict(model, _from_hf_state(hf_state), source=str(directory), assign=True)
    return model.eval()


def save_gpt2(model: GPT2LMHeadModel, directory: os.PathLike) -> Path:
    """Save in the HF ``GPT2LMHeadModel`` layout (``config.json`` + ``model.safetensors``),
    loadable by ``transformers``; both files are written atomically."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf: Dict[str, Tensor] = {}
    qkv: Dict[str, Dict[str, Tensor]] = {}
    for key, value in model.state_dict().items():
        body = key[len("transformer."):]
        if ".self_attn." in body and body.split(".")[4] in _QKV:
            layer, role, p = body.split(".")[2], body.split(".")[4], body.split(".")[5]
            qkv.setdefault(f"h.{layer}.attn.c_attn.{p}", {})[role] = value
            continue
        theirs = _RENAMES.to_theirs(body)
        if theirs is None:
            raise CheckpointError(f"no HF name for parameter {key!r}")
        hf["transformer." + theirs] = value.t().contiguous() if theirs.endswith(_CONV1D) else value.contiguous()
    for name, parts in qkv.items():
        packed = torch.cat([parts[r] for r in _QKV], dim=0)
        hf["transformer." + name] = packed.t().contiguous() if name.endswith("weight") else packed
    save_weights(hf, directory / "model.safetensors")
    tmp = directory / ".config.json.tmp"
    tmp.write_text(json.dumps(_gpt2_config_to_hf(model.config), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, directory / "config.json")
    return directory
