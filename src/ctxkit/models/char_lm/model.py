"""Character-level language models: deep causal self-attention (Al-Rfou et al., 2018) and
the character LSTM it is compared with.

**CharTransformerLM** ("Character-Level Language Modeling with Deeper Self-Attention"): a
stack of causal Transformer layers over characters, each layer adding its own learned
positional embedding to its input (the paper found a single input embedding fades in a deep
stack). One classifier, applied after a final LayerNorm, predicts the next character from
any layer, which is what the paper's auxiliary losses need (:mod:`ctxkit.pretraining.char_lm`
holds them: every position, intermediate layers, and the character after next through a
second classifier, :attr:`CharTransformerConfig.second_target`).

The attention pattern is a config choice: ``"dense"`` causal attention, or the Sparse
Transformer's factorised ``"strided"`` / ``"fixed"`` patterns (Child et al., 2019) executed
by a block-sparse kernel (:mod:`ctxkit.layers.sparse_attention`). ``quaternion=True`` swaps
the attention projections and the FFN for Hamilton-product layers (Tay et al., 2019;
:mod:`ctxkit.layers.quaternion`) with a quarter of the weights.

**CharLSTMLM**: embedding, a multi-layer LSTM and a classifier -- the recurrent baseline,
stateful across segments when evaluating.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from ...core.build_guard import bounded_build, check_layers_held, held_values, weights_file
from ...core.checkpoint import CheckpointError, load_state_dict_strict, read_config, read_weights, save_weights
from ...core.errors import UserError
from ...layers import TransformerEncoderLayer, causal_mask
from ...layers.quaternion import quaternionize
from ...layers.sparse_attention import SparsePattern
from ..common import Replaceable

__all__ = ["CharTransformerConfig", "CharLSTMConfig", "CharTransformerLM", "CharLSTMLM", "CHAR_PRESETS",
           "CHAR_DESCRIPTIONS", "save_char_lm", "load_char_lm", "build_char_lm", "CHAR_MODEL_TYPES"]

ATTENTION_KINDS = ("dense", "strided", "fixed")


@dataclass(frozen=True)
class CharTransformerConfig(Replaceable):
    """Architecture of a :class:`CharTransformerLM`.

    Attributes:
        vocab_size: symbols (27 for text8, 256 for bytes).
        num_layers, hidden_size, num_heads, ffn_size: the stack (the paper's T12 is
            12 x 512, 8 heads, FFN 2048; T64 is 64 layers).
        context: segment length (the paper trains on 512 characters).
        dropout: residual and embedding dropout (none on the attention weights).
        attention: ``"dense"``, ``"strided"`` or ``"fixed"``.
        sparse_stride: the block length ``l`` of the sparse patterns (about sqrt(context)).
        sparse_summary: the fixed pattern's ``c``: summary positions at the end of each block.
        quaternion: attention projections and FFN as quaternion layers.
        second_target: a second classifier that predicts the character after next (the
            paper's "multiple targets" loss).
    """

    vocab_size: int = 27
    num_layers: int = 12
    hidden_size: int = 512
    num_heads: int = 8
    ffn_size: int = 2048
    context: int = 512
    dropout: float = 0.1
    attention: str = "dense"
    sparse_stride: int = 32
    sparse_summary: int = 4
    quaternion: bool = False
    second_target: bool = True

    @property
    def max_position(self) -> int:
        """The context, under the name :func:`ctxkit.pretraining.lm.perplexity` reads."""
        return self.context

    def __post_init__(self):
        if self.attention not in ATTENTION_KINDS:
            raise UserError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, got {self.attention!r}")
        if self.hidden_size % self.num_heads:
            raise UserError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")


@dataclass(frozen=True)
class CharLSTMConfig(Replaceable):
    """Architecture of a :class:`CharLSTMLM`.

    Attributes:
        vocab_size: symbols.
        embedding_size: input vector size.
        hidden_size: LSTM state size.
        num_layers: stacked LSTM layers.
        dropout: between layers and before the classifier.
        context: training segment length (truncated backpropagation through time).
    """

    vocab_size: int = 27
    embedding_size: int = 128
    hidden_size: int = 1024
    num_layers: int = 2
    dropout: float = 0.1
    context: int = 512

    @property
    def max_position(self) -> int:
        """The training segment length (no limit applies when evaluating statefully)."""
        return self.context


class CharTransformerLM(nn.Module):
    """Deep causal self-attention over characters (Al-Rfou et al., 2018).

    Args:
        config: a :class:`CharTransformerConfig`.
    """

    def __init__(self, config: CharTransformerConfig):
        super().__init__()
        self.config = config
        c = config
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size)
        # One learned positional table per layer, added to that layer's input.
        self.positions = nn.Parameter(torch.zeros(c.num_layers, c.context, c.hidden_size))
        nn.init.normal_(self.positions, std=0.02)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(
            # No dropout on the attention weights: the sparse kernels have none, and dense and
            # sparse models should differ only in the pattern.
            TransformerEncoderLayer(c.hidden_size, c.num_heads, c.ffn_size, c.dropout, 0.0, "relu", norm_first=True)
            for _ in range(c.num_layers))
        self.final_norm = nn.LayerNorm(c.hidden_size)
        self.head = nn.Linear(c.hidden_size, c.vocab_size)
        self.second_head = nn.Linear(c.hidden_size, c.vocab_size) if c.second_target else None
        if c.quaternion:
            quaternionize(self.layers)
        self.pattern = (None if c.attention == "dense" else SparsePattern(
            c.attention, c.sparse_stride, summary=c.sparse_summary if c.attention == "fixed" else None))
        # The sparse kernels build their block masks on first use of a length (host work):
        # training steps are not replayed as CUDA graphs then (see ctxkit.training.graphs).
        self.cuda_graph_safe = self.pattern is None

    def mask(self, seq: int, device) -> object:
        """The attention mask of a ``seq``-long segment: a bool causal ``(seq, seq)`` matrix
        for dense attention, the sparse pattern object otherwise."""
        return self.pattern if self.pattern is not None else causal_mask(seq, device=device)

    def hidden_states(self, input_ids: Tensor, layers: Optional[List[int]] = None) -> Dict[int, Tensor]:
        """Normalised outputs of the chosen layers.

        Args:
            input_ids: ``(batch, seq)`` with ``seq <= context``.
            layers: 0-based layer indices wanted (default: only the last).

        Returns:
            ``{layer: (batch, seq, hidden)}``, each after the final LayerNorm (the shared
            classifier reads any of them).
        """
        batch, seq = input_ids.shape
        if seq > self.config.context:
            raise UserError(f"a segment of {seq} characters is longer than the model's context {self.config.context}")
        wanted = {self.config.num_layers - 1} if layers is None else set(layers)
        mask = self.mask(seq, input_ids.device)
        x = self.dropout(self.embed(input_ids))
        out: Dict[int, Tensor] = {}
        for i, layer in enumerate(self.layers):
            x, _ = layer(x + self.positions[i, :seq], mask=mask)
            if i in wanted:
                out[i] = self.final_norm(x)
            if len(out) == len(wanted):
                break  # layers above the last wanted one cannot change the answer
        return out

    def forward(self, input_ids: Tensor) -> Tensor:
        """Next-character logits ``(batch, seq, vocab)`` of the last layer."""
        return self.head(self.hidden_states(input_ids)[self.config.num_layers - 1])


class CharLSTMLM(nn.Module):
    """A character LSTM language model (the recurrent baseline).

    Args:
        config: a :class:`CharLSTMConfig`.
    """

    def __init__(self, config: CharLSTMConfig):
        super().__init__()
        self.config = config
        c = config
        self.embed = nn.Embedding(c.vocab_size, c.embedding_size)
        self.lstm = nn.LSTM(c.embedding_size, c.hidden_size, c.num_layers, batch_first=True,
                            dropout=c.dropout if c.num_layers > 1 else 0.0)
        self.dropout = nn.Dropout(c.dropout)
        self.head = nn.Linear(c.hidden_size, c.vocab_size)
        self.cuda_graph_safe = False  # cuDNN's LSTM keeps host-side workspace state

    def forward(self, input_ids: Tensor, state: Optional[Tuple[Tensor, Tensor]] = None,
                return_state: bool = False) -> Union[Tensor, Tuple[Tensor, Tuple[Tensor, Tensor]]]:
        """Next-character logits ``(batch, seq, vocab)``.

        Args:
            input_ids: ``(batch, seq)``.
            state: ``(h, c)``, each ``(layers, batch, hidden)``, carried from the previous
                segment (None: zeros).
            return_state: also return the final state (detach it before the next segment).
        """
        out, new_state = self.lstm(self.dropout(self.embed(input_ids)), state)
        logits = self.head(self.dropout(out))
        return (logits, new_state) if return_state else logits


CHAR_MODEL_TYPES = {"ctxkit-char-transformer": (CharTransformerLM, CharTransformerConfig),
                    "ctxkit-char-lstm": (CharLSTMLM, CharLSTMConfig)}

CHAR_PRESETS: Dict[str, Union[CharTransformerConfig, CharLSTMConfig]] = {
    # The paper's T12: 12 layers x 512, 8 heads, FFN 2048, 512-character segments.
    "char_t12_512": CharTransformerConfig(),
    "char_t6_256": CharTransformerConfig(num_layers=6, hidden_size=256, num_heads=4, ffn_size=1024, context=256),
    "char_t12_512_strided": CharTransformerConfig(attention="strided"),
    "char_t12_512_fixed": CharTransformerConfig(attention="fixed"),
    "char_t12_512_quaternion": CharTransformerConfig(quaternion=True),
    "char_lstm_2_1024": CharLSTMConfig(),
    "char_t_tiny": CharTransformerConfig(num_layers=2, hidden_size=32, num_heads=2, ffn_size=64, context=64),
    "char_lstm_tiny": CharLSTMConfig(embedding_size=16, hidden_size=32, num_layers=1, context=64),
}
CHAR_DESCRIPTIONS = {
    "char_t12_512": "Al-Rfou et al.'s T12: 12 causal layers x 512, 8 heads, per-layer positions, context 512",
    "char_t6_256": "a 6 x 256 character Transformer, context 256 (laptop size)",
    "char_t12_512_strided": "T12 with the Sparse Transformer's strided attention (stride 32)",
    "char_t12_512_fixed": "T12 with the Sparse Transformer's fixed attention (blocks of 32, 4 summary positions)",
    "char_t12_512_quaternion": "T12 with quaternion attention projections and FFN (Tay et al. 2019)",
    "char_lstm_2_1024": "a 2-layer character LSTM of 1024 units (the recurrent baseline)",
    "char_t_tiny": "a 2 x 32 character Transformer for tests",
    "char_lstm_tiny": "a 1 x 32 character LSTM for tests",
}


def build_char_lm(config: Union[CharTransformerConfig, CharLSTMConfig]) -> nn.Module:
    """A randomly initialised model of ``config``'s kind."""
    return CharLSTMLM(config) if isinstance(config, CharLSTMConfig) else CharTransformerLM(config)


def save_char_lm(model: nn.Module, directory: os.PathLike) -> Path:
    """Write ``config.json`` (model type + fields) and ``model.safetensors``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model_type = next(name for name, (cls, _) in CHAR_MODEL_TYPES.items() if isinstance(model, cls))
    save_weights(model.state_dict(), directory / "model.safetensors")
    tmp = directory / ".config.json.tmp"
    tmp.write_text(json.dumps({"model_type": model_type, **dataclasses.asdict(model.config)}, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, directory / "config.json")
    return directory


def load_char_lm(directory: os.PathLike) -> nn.Module:
    """Load :func:`save_char_lm` output, strictly (every key and shape checked), in eval mode.

    Raises:
        CheckpointError: unreadable files, another model type, or mismatched keys.
    """
    config = read_config(directory)
    model_type = config.pop("model_type", None)
    if model_type not in CHAR_MODEL_TYPES:
        raise CheckpointError(f"{directory}: config.json model_type {model_type!r} is not a character LM "
                              f"({', '.join(CHAR_MODEL_TYPES)})")
    cls, config_cls = CHAR_MODEL_TYPES[model_type]
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise CheckpointError(f"{directory}: config.json has fields this ctxkit does not know: {', '.join(unknown)}")
    # The weights first: the config's sizes are checked against them before anything is built.
    state = read_weights(directory)
    source = str(Path(directory) / "config.json")
    layers = r"^lstm\.weight_ih_l(\d+)$" if cls is CharLSTMLM else r"^layers\.(\d+)\."
    check_layers_held(config, source, state, {"num_layers": layers})
    with bounded_build(config, source, weights_file(directory), held_values(state), state):
        model = cls(config_cls(**config))
    load_state_dict_strict(model, state, source=str(directory))
    return model.eval()
