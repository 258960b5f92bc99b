"""Load Hugging Face Transformer-XL checkpoints (``TransfoXLLMHeadModel`` / ``TransfoXLModel``).

The layouts differ in four places, each converted here:

* HF keeps q, k and v in one ``qkv_net`` matrix (rows q | k | v); ctxkit has three.
* HF's relative encodings are ``[sin(d w_0..), cos(d w_0..)]`` (halves); ctxkit's table
  interleaves ``sin, cos`` per frequency, so ``r_net``'s input columns are reordered.
* HF's projected adaptive softmax applies a projection then a biased ``Linear`` per
  cluster (the cluster logits follow the shortlist in its head, in order); ctxkit uses
  :class:`torch.nn.AdaptiveLogSoftmaxWithLoss` (no biases, clusters in order): the head
  projection is folded into the head matrix and each tail becomes ``proj^T`` then the
  cluster's matrix. Non-zero softmax biases have no place there and are refused.
* ``clamp_len <= 0`` means "no clamping" in HF and ``-1`` in ctxkit.
* ``save_pretrained`` leaves out softmax tensors tied to the input embeddings; they are
  restored from the embeddings (``tie_word_embeddings``, ``tie_projs``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from safetensors.torch import save_model
from torch import Tensor

from ...core.checkpoint import (CheckpointError, check_config_against_weights, check_config_fields, check_config_types, count_layers,
                               load_state_dict_strict, read_config, read_weights, require_config_fields, weight_dim)
from ...core.build_guard import bounded_build, check_layers_held, held_values
from ...core.durable import atomic_write
from ...core.errors import quote
from .model import TransformerXLConfig, TransformerXLLMHeadModel, TransformerXLModel, build_transformer_xl_lm

__all__ = ["transformer_xl_config_from_hf", "load_transformer_xl", "save_transformer_xl_lm", "load_transformer_xl_lm",
           "is_ctxkit_transformer_xl", "CTXKIT_MODEL_TYPE"]

# config.json's model_type of ctxkit's own Transformer-XL (and vanilla baseline) folders.
CTXKIT_MODEL_TYPE = "ctxkit-transformer-xl"


def _check_values(hf: dict, source: str) -> None:
    """Types and ranges of the fields :func:`transformer_xl_config_from_hf` reads, before any
    arithmetic on them."""
    require_config_fields(hf, source, ("vocab_size", "d_model", "n_head", "d_inner", "n_layer"))
    check_config_fields(hf, source, positive=("vocab_size", "d_model", "n_head", "d_inner", "n_layer", "d_head", "d_embed", "div_val",
                                              "tgt_len"),
                        fractions=("dropout", "dropatt"), positive_floats=("layer_norm_epsilon",))
    if hf.get("mem_len") is not None:  # null: no memory
        check_config_fields(hf, source, non_negative=("mem_len",))
    switches = ("untie_r", "pre_lnorm", "same_length", "tie_word_embeddings")
    check_config_types(hf, source, integers=("clamp_len", "attn_type", "sample_softmax"), booleans=switches,
                       int_lists=("cutoffs",), bool_lists=("tie_projs",), nullable=("cutoffs", "tie_projs"))
    cutoffs, vocab = hf.get("cutoffs") or [], hf["vocab_size"]
    # AdaptiveLogSoftmaxWithLoss takes clusters between 0 and the vocabulary, in order.
    if any(not 0 < c < vocab for c in cutoffs) or any(a >= b for a, b in zip(cutoffs, cutoffs[1:])):
        raise CheckpointError(f"{source}: field 'cutoffs' is {quote(cutoffs)}; expected increasing integers between 0 and "
                              f"vocab_size {vocab}")


def transformer_xl_config_from_hf(hf: dict, source: str = "config.json") -> TransformerXLConfig:
    """Our config from an HF ``config.json`` dict (``source``: its path, for messages).

    Raises:
        CheckpointError: another model type, a variant ctxkit does not implement, or a value
            of the wrong type or range (naming the field).
    """
    if hf.get("model_type") != "transfo-xl":
        raise CheckpointError(f"{source} has model_type {quote(hf.get('model_type'), 100)}; this loader reads 'transfo-xl'")
    _check_values(hf, source)
    d, heads = hf["d_model"], hf["n_head"]
    unsupported = []
    if hf.get("d_head", d // heads) * heads != d:
        unsupported.append(f"d_head * n_head = {hf.get('d_head')} * {heads} != d_model {d}")
    if hf.get("pre_lnorm"):
        unsupported.append("pre_lnorm=True (HF has no final norm; ctxkit's pre-norm stack does)")
    if hf.get("attn_type", 0) != 0 or hf.get("sample_softmax", -1) > 0:
        unsupported.append("attn_type != 0 or sample_softmax")
    if abs(hf.get("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12:
        unsupported.append(f"layer_norm_epsilon={hf.get('layer_norm_epsilon')} (ctxkit uses 1e-5)")
    cutoffs = tuple(hf.get("cutoffs") or ())
    d_embed = hf.get("d_embed", d)
    if cutoffs and d_embed != d:
        unsupported.append(f"d_embed={d_embed} != d_model={d} with an adaptive softmax")
    if unsupported:
        raise CheckpointError(f"{source} asks for what ctxkit's Transformer-XL does not implement: " + "; ".join(unsupported))
    clamp = hf.get("clamp_len", 1000)
    return TransformerXLConfig(vocab_size=hf["vocab_size"], d_model=d, n_heads=heads, d_inner=hf["d_inner"], n_layers=hf["n_layer"],
                               mem_len=hf.get("mem_len") or 0, tgt_len=hf.get("tgt_len", 128), dropout=hf.get("dropout", 0.1),
                               dropatt=hf.get("dropatt", 0.0), cutoffs=cutoffs, div_val=hf.get("div_val", 1), pre_lnorm=False,
                               untie_r=hf.get("untie_r", True), clamp_len=clamp if clamp > 0 else -1, d_embed=d_embed,
                               same_length=bool(hf.get("same_length", True)))


_LAYER_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _check_sizes(hf: dict, source: str, hf_state: Dict[str, Tensor]) -> None:
    """config.json's sizes against the weights before the model is built: it is built on the
    device, so a size the weights do not back would be allocated first (a vocabulary of
    10**9 words, ten million layers) and refused only by the strict load after."""
    state = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in hf_state.items()}
    embeddings = [v for k, v in state.items() if re.fullmatch(r"word_emb\.emb_layers\.\d+\.weight", k) and v.dim() == 2]
    biases = "layers.{i}.dec_attn.r_w_bias" if hf.get("untie_r", True) else "r_w_bias"  # (n_head, d_head)
    held = {"vocab_size": (sum(int(v.shape[0]) for v in embeddings) or None, "the rows of word_emb.emb_layers"),
            "d_embed": weight_dim(state, "word_emb.emb_layers.0.weight", 1),
            "d_model": weight_dim(state, "layers.{i}.dec_attn.o_net.weight", 0),
            "d_inner": weight_dim(state, "layers.{i}.pos_ff.CoreNet.0.weight", 0),
            "n_head": weight_dim(state, biases, 0), "d_head": weight_dim(state, biases, 1)}
    check_config_against_weights(hf, source, held, layers=("n_layer", count_layers(state, _LAYER_KEY)))


_LAYER_RENAMES = {"dec_attn.o_net.weight": "self_attn.out_proj.weight", "dec_attn.r_w_bias": "self_attn.u",
                  "dec_attn.r_r_bias": "self_attn.v", "dec_attn.layer_norm.weight": "self_attn_res.norm.weight",
                  "dec_attn.layer_norm.bias": "self_attn_res.norm.bias", "pos_ff.CoreNet.0.weight": "ffn.fc1.weight",
                  "pos_ff.CoreNet.0.bias": "ffn.fc1.bias", "pos_ff.CoreNet.3.weight": "ffn.fc2.weight",
                  "pos_ff.CoreNet.3.bias": "ffn.fc2.bias", "pos_ff.layer_norm.weight": "ffn_res.norm.weight",
                  "pos_ff.layer_norm.bias": "ffn_res.norm.bias"}


def _halves_to_interleaved(w: Tensor) -> Tensor:
    """``r_net`` weight for inputs ``[sin..., cos...]`` -> for inputs ``[sin, cos, sin, cos, ...]``."""
    half = w.size(1) // 2
    return torch.stack([w[:, :half], w[:, half:]], dim=-1).reshape(w.size(0), -1)


def _body_state(hf_state: Dict[str, Tensor], config: TransformerXLConfig) -> Dict[str, Tensor]:
    state: Dict[str, Tensor] = {}
    d = config.d_model
    for key, value in hf_state.items():
        body = key[len("transformer."):] if key.startswith("transformer.") else key
        if key.startswith("crit.") or body == "pos_emb.inv_freq":
            continue  # the softmax is converted apart; inv_freq is recomputed
        parts = body.split(".")
        if parts[0] == "word_emb":
            # HF projections are bare Parameters (d_proj, d_i): ours are Linear weights.
            state[f"transformer.{body}.weight" if parts[1] == "emb_projs" else f"transformer.{body}"] = value
        elif body in ("r_w_bias", "r_r_bias"):  # untie_r=False: one pair for all layers
            state[f"transformer.{'u' if body == 'r_w_bias' else 'v'}"] = value
        elif parts[0] == "layers" and len(parts) > 2:
            prefix, rest = f"transformer.layers.{parts[1]}", ".".join(parts[2:])
            if rest == "dec_attn.qkv_net.weight" and value.shape == (3 * d, d):
                for name, chunk in zip("qkv", value.chunk(3, dim=0)):
                    state[f"{prefix}.self_attn.{name}_proj.weight"] = chunk.contiguous()
            elif rest == "dec_attn.r_net.weight" and value.dim() == 2 and value.size(1) == d:
                state[f"{prefix}.self_attn.r_proj.weight"] = _halves_to_interleaved(value)
            else:
                state[f"{prefix}.{_LAYER_RENAMES.get(rest, '<unmapped> ' + rest)}"] = value
        else:
            state[f"<unmapped> {key}"] = value
    return state


def _untie(hf_state: Dict[str, Tensor], hf: dict) -> Dict[str, Tensor]:
    """Restore the softmax tensors that ``save_pretrained`` left out because they are tied
    to the input embeddings (``tie_word_embeddings``, ``tie_projs``)."""
    state = dict(hf_state)
    emb = "transformer.word_emb"
    if hf.get("tie_word_embeddings", True):
        i = 0
        while f"{emb}.emb_layers.{i}.weight" in state and f"crit.out_layers.{i}.bias" in state:
            state.setdefault(f"crit.out_layers.{i}.weight", state[f"{emb}.emb_layers.{i}.weight"])
            i += 1
    for i, tied in enumerate(hf.get("tie_projs") or []):
        if not tied:
            continue
        if hf.get("div_val", 1) == 1 and hf["d_model"] != hf.get("d_embed", hf["d_model"]):
            source = f"{emb}.emb_projs.0"
        elif hf.get("div_val", 1) != 1:
            source = f"{emb}.emb_projs.{i}"
        else:
            continue  # no projection at all
        if source in state:
            state.setdefault(f"crit.out_projs.{i}", state[source])
    return state


def _softmax_state(hf_state: Dict[str, Tensor], config: TransformerXLConfig, source: str) -> Dict[str, Tensor]:
    """``crit.*`` of HF's ProjectedAdaptiveLogSoftmax -> AdaptiveLogSoftmaxWithLoss weights."""
    crit = {k[len("crit."):]: v for k, v in hf_state.items() if k.startswith("crit.")}
    biased = [f"crit.{k}" for k, v in crit.items() if k.endswith(("bias", "cluster_bias")) and bool(v.abs().max() > 0)]
    if biased:
        raise CheckpointError(f"{source}: non-zero adaptive-softmax biases ({', '.join(sorted(biased))}); ctxkit's softmax "
                              "(torch.nn.AdaptiveLogSoftmaxWithLoss) has none, so this head cannot be loaded exactly")
    ends = [0, *config.cutoffs, config.vocab_size]

    def proj(i: int) -> Optional[Tensor]:
        return crit.get(f"out_projs.{i}")

    def weight(i: int) -> Tensor:
        if config.div_val == 1:
            return crit["out_layers.0.weight"][ends[i]:ends[i + 1]]
        return crit[f"out_layers.{i}.weight"]

    try:
        head = torch.cat([weight(0), crit["cluster_weight"]])
        p0 = proj(0)
        state = {"crit.head.weight": head if p0 is None else head @ p0.t()}
        for i in range(1, len(ends) - 1):
            p = proj(0 if config.div_val == 1 else i)
            state[f"crit.tail.{i - 1}.0.weight"] = torch.eye(config.d_model) if p is None else p.t().contiguous()
            state[f"crit.tail.{i - 1}.1.weight"] = weight(i)
    except KeyError as err:
        raise CheckpointError(f"{source}: the adaptive softmax lacks {err.args[0]!r}") from None
    return state


def load_transformer_xl(directory: os.PathLike) -> TransformerXLLMHeadModel:
    """Load an HF-format Transformer-XL folder (``config.json`` + weights) into ctxkit.

    A bare ``TransfoXLModel`` (no ``crit.*``) loads the body; the softmax then keeps its
    fresh initialisation (a warning says so in the returned model's ``load_note``).

    Returns:
        :class:`~ctxkit.models.transformer_xl.model.TransformerXLLMHeadModel` in eval mode.

    Raises:
        CheckpointError: unreadable files, another model type, an unsupported variant,
            non-zero softmax biases, or (as :class:`~ctxkit.core.checkpoint.CheckpointMismatchError`)
            every missing, unexpected and misshaped key.
    """
    directory = Path(directory)
    hf, source = read_config(directory), str(directory / "config.json")
    config = transformer_xl_config_from_hf(hf, source)
    if not config.cutoffs:
        raise CheckpointError(f"{directory}: a Transformer-XL without cutoffs (plain softmax) is not in HF's layout")
    weights = read_weights(directory)
    _check_sizes(hf, source, weights)
    hf_state = _untie(weights, hf)
    state = _body_state(hf_state, config)
    model = TransformerXLLMHeadModel(config)
    model.load_note = None
    if any(k.startswith("crit.") for k in hf_state):
        state.update(_softmax_state(hf_state, config, str(directory)))
    else:
        state.update({f"crit.{k}": v for k, v in model.crit.state_dict().items()})
        model.load_note = "no adaptive softmax in the checkpoint (a bare TransfoXLModel): the output layer is untrained"
    load_state_dict_strict(model, state, source=str(directory))
    return model.eval()


# ---------------------------------------------------------------------------- ctxkit's own format


def _write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def is_ctxkit_transformer_xl(folder: os.PathLike) -> bool:
    """A folder written by :func:`save_transformer_xl_lm` (or by ``train-transformer-xl``'s
    ``final/`` of earlier versions, whose config.json has ``kind`` and ``config`` only)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return False
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(meta, dict):
        return False
    return meta.get("model_type") == CTXKIT_MODEL_TYPE or ("model_type" not in meta and meta.get("kind") in ("xl", "vanilla")
                                                          and isinstance(meta.get("config"), dict))


def save_transformer_xl_lm(model: TransformerXLLMHeadModel, directory: os.PathLike, vocab: Sequence[str]) -> Path:
    """``model.safetensors`` + ``config.json`` (model_type, kind, architecture) + ``vocab.txt``,
    each written atomically (a crash leaves the previous file whole).

    Args:
        model: A Transformer-XL LM or its vanilla baseline (:class:`VanillaTransformerLM`).
        directory: Output folder (created).
        vocab: The word list, id order (word-level models: the vocabulary is part of the model).
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    body = model.transformer
    kind = "xl" if isinstance(body, TransformerXLModel) else "vanilla"
    meta = {"model_type": CTXKIT_MODEL_TYPE, "kind": kind, "config": dataclasses.asdict(model.config),
            "max_position": getattr(body, "max_position", 0)}
    atomic_write(out / "model.safetensors", lambda tmp: save_model(model, tmp))
    _write_text(out / "config.json", json.dumps(meta, indent=2) + "\n")
    _write_text(out / "vocab.txt", "".join(w + "\n" for w in vocab))
    return out


def load_transformer_xl_lm(directory: os.PathLike) -> Tuple[TransformerXLLMHeadModel, List[str]]:
    """Inverse of :func:`save_transformer_xl_lm`: ``(model, vocab)``.

    Raises:
        CheckpointError: not such a folder, or weights that do not fit the config (keys listed).
    """
    folder = Path(directory)
    if not is_ctxkit_transformer_xl(folder):
        raise CheckpointError(f"{folder}: no ctxkit Transformer-XL folder (config.json with model_type {CTXKIT_MODEL_TYPE!r})")
    meta = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    weights = folder / "model.safetensors"
    # The weights first: the config's sizes are checked against them before anything is built.
    state = read_weights(folder)
    fields = meta["config"] if isinstance(meta.get("config"), dict) else {}
    check_layers_held(fields, str(folder / "config.json"), state, {"n_layers": r"(?:^|\.)layers\.(\d+)\."})
    config = TransformerXLConfig(**{**meta["config"], "cutoffs": tuple(meta["config"]["cutoffs"])})
    with bounded_build({**fields, "max_position": meta.get("max_position")}, str(folder / "config.json"), str(weights),
                       held_values(state), state):
        model = build_transformer_xl_lm(meta["kind"], config, meta["max_position"])
    load_state_dict_strict(model, state, source=str(weights))
    return model, (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
