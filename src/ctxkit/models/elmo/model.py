"""ELMo (Peters et al. 2018): a character-CNN token encoder under a 2-layer biLSTM LM.

* Token encoder: character embeddings, one 1-D convolution per filter width max-pooled
  over the characters, ReLU, highway layers, a linear projection to ``projection_dim``.
* Two stacks of LSTMs with a projected, clipped state (``LSTMP``: cell ``cell_size``,
  output ``projection_dim``), one reading left to right (the forward LM), one right to
  left (the backward LM), with a residual connection from the second layer on. The
  stacks share the token encoder and the output softmax but no states.
* Layers of the representation: 0 = the token encoding duplicated to ``2 * projection_dim``
  (so it can be mixed with the others), then per LSTM layer the forward and backward
  outputs concatenated. :class:`ScalarMix` collapses them to one vector per token.

Parameter layout follows AllenNLP's PyTorch port (gates ``i, f, g, o``; the TensorFlow
forget bias of 1.0 is part of the stored bias) so that the released bilm-tf weights
convert losslessly; see :mod:`.elmo_io`. Presets use the GluonNLP names; their sizes
are those of the released options files (13.6M / 28.0M / 93.6M parameters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common import Replaceable
from .chars import MAX_CHARS, N_CHARACTERS, batch_to_char_ids
from ..sampled_softmax import sampled_softmax_nll
from ...core.errors import UserError

__all__ = [
    "ElmoConfig",
    "ELMO_PRESETS",
    "CharCNN",
    "Highway",
    "LstmCellWithProjection",
    "lstm_step",
    "run_lstms",
    "ElmoBiLM",
    "ElmoLanguageModel",
    "ScalarMix",
    "ElmoEmbeddings",
    "elmo_embed",
    "reverse_padded",
    "sampled_softmax_nll",
]

LSTMState = Tuple[Tensor, Tensor]  # h (layers, 2, batch, projection_dim), c (layers, 2, batch, cell_size)

_FILTERS_2048 = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))


@dataclass(frozen=True)
class ElmoConfig(Replaceable):
    """Architecture of an ELMo biLM (the fields of bilm-tf's options JSON).

    Attributes:
        filters: ``(width, num_filters)`` per character convolution.
        n_highway: highway layers after the convolutions.
        char_embed_dim: character embedding size.
        n_characters: character vocabulary, including the padding id 0.
        max_chars: character ids per token.
        activation: after max-pooling, ``"relu"`` or ``"tanh"``.
        cell_size: LSTM memory cell size (``lstm.dim``).
        projection_dim: LSTM output (and token encoding) size.
        num_layers: LSTM layers per direction.
        cell_clip: clip of the memory cell (None: none).
        proj_clip: clip of the projected state (None: none).
        skip_connections: residual connection around every LSTM layer but the first.
        dropout: on LSTM inputs and on the softmax input while training.
    """

    filters: Tuple[Tuple[int, int], ...] = _FILTERS_2048
    n_highway: int = 1
    char_embed_dim: int = 16
    n_characters: int = N_CHARACTERS
    max_chars: int = MAX_CHARS
    activation: str = "relu"
    cell_size: int = 1024
    projection_dim: int = 128
    num_layers: int = 2
    cell_clip: Optional[float] = 3.0
    proj_clip: Optional[float] = 3.0
    skip_connections: bool = True
    dropout: float = 0.1

    def __post_init__(self):
        object.__setattr__(self, "filters", tuple((int(w), int(n)) for w, n in self.filters))
        if self.activation not in ("relu", "tanh"):
            raise UserError(f"activation must be 'relu' or 'tanh', got {self.activation!r}")
        if any(w > self.max_chars for w, _ in self.filters):
            raise UserError(f"a filter is wider than max_chars={self.max_chars}: {self.filters}")

    @property
    def n_filters(self) -> int:
        """Width of the concatenated convolution features (highway width)."""
        return sum(n for _, n in self.filters)

    @property
    def output_dim(self) -> int:
        """Size of every representation layer: forward and backward concatenated."""
        return 2 * self.projection_dim

    @property
    def hidden_size(self) -> int:
        """The common name (ctxkit.zoo.families) for the width of every layer: :attr:`output_dim`."""
        return self.output_dim


# One line per preset for `ctxkit list-models` (ctxkit.zoo.families).
ELMO_DESCRIPTIONS: Dict[str, str] = {
    "elmo_2x1024_128_2048cnn_1xhighway": "ELMo small: char CNN (2048 filters, 1 highway), 2 x LSTM 1024 -> 128 (Peters et al. 2018); ctxkit pretrain-elmo",
    "elmo_2x2048_256_2048cnn_1xhighway": "ELMo medium: char CNN (2048 filters, 1 highway), 2 x LSTM 2048 -> 256",
    "elmo_2x4096_512_2048cnn_2xhighway": "ELMo original: char CNN (2048 filters, 2 highway), 2 x LSTM 4096 -> 512",
}

ELMO_PRESETS: Dict[str, ElmoConfig] = {
    "elmo_2x1024_128_2048cnn_1xhighway": ElmoConfig(cell_size=1024, projection_dim=128, n_highway=1),
    "elmo_2x2048_256_2048cnn_1xhighway": ElmoConfig(cell_size=2048, projection_dim=256, n_highway=1),
    "elmo_2x4096_512_2048cnn_2xhighway": ElmoConfig(cell_size=4096, projection_dim=512, n_highway=2),
}


# ---------------------------------------------------------------------------- token encoder


class Highway(nn.Module):
    """One highway layer in bilm-tf's convention: ``g * relu(W_t x + b_t) + (1 - g) * x``
    with ``g = sigmoid(W_c x + b_c)`` (bilm-tf calls ``g`` the carry gate).

    Args:
        dim: input and output size.
    """

    def __init__(self, dim: int):
        super().__init__()
        self.transform = nn.Linear(dim, dim)
        self.carry = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        """``(..., dim) -> (..., dim)``."""
        gate = torch.sigmoid(self.carry(x))
        return gate * F.relu(self.transform(x)) + (1.0 - gate) * x


class CharCNN(nn.Module):
    """Context-independent token encoding from character ids.

    Args:
        config: the architecture.
    """

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.config = config
        self.char_embedding = nn.Embedding(config.n_characters, config.char_embed_dim, padding_idx=0)
        self.convolutions = nn.ModuleList(nn.Conv1d(config.char_embed_dim, num, width) for width, num in config.filters)
        self.highways = nn.ModuleList(Highway(config.n_filters) for _ in range(config.n_highway))
        # bilm-tf omits the projection when the filters already have the LSTM width.
        self.projection = nn.Linear(config.n_filters, config.projection_dim) if config.n_filters != config.projection_dim else None
        self._activation = torch.relu if config.activation == "relu" else torch.tanh
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        # bilm-tf's initialisation: its highway carry bias of -2 starts the layers close
        # to the identity, which is what lets deep char features train at all.
        nn.init.uniform_(self.char_embedding.weight, -1.0, 1.0)
        self.char_embedding.weight[0].zero_()
        for conv in self.convolutions:
            if self.config.activation == "relu":
                nn.init.uniform_(conv.weight, -0.05, 0.05)
            else:
                nn.init.normal_(conv.weight, std=math.sqrt(1.0 / (conv.kernel_size[0] * self.config.char_embed_dim)))
            nn.init.zeros_(conv.bias)
        for hw in self.highways:
            for lin in (hw.transform, hw.carry):
                nn.init.normal_(lin.weight, std=math.sqrt(1.0 / self.config.n_filters))
            nn.init.zeros_(hw.transform.bias)
            nn.init.constant_(hw.carry.bias, -2.0)
        if self.projection is not None:
            nn.init.normal_(self.projection.weight, std=math.sqrt(1.0 / self.config.n_filters))
            nn.init.zeros_(self.projection.bias)

    def forward(self, char_ids: Tensor) -> Tensor:
        """``(..., max_chars)`` long -> ``(..., projection_dim)``.

        Padded positions (all-zero ids) get a vector too; callers mask them.
        """
        lead = char_ids.shape[:-1]
        x = self.char_embedding(char_ids.reshape(-1, char_ids.shape[-1])).transpose(1, 2)  # (N, char_dim, chars)
        # Max-pool before the activation, as bilm-tf does (same result for monotone ones).
        h = torch.cat([self._activation(conv(x).amax(dim=-1)) for conv in self.convolutions], dim=-1)
        for hw in self.highways:
            h = hw(h)
        if self.projection is not None:
            h = self.projection(h)
        return h.reshape(*lead, h.shape[-1])


# ---------------------------------------------------------------------------- LSTMs


def lstm_step(x_gates: Tensor, h: Tensor, c: Tensor, w_state: Tensor, b_state: Tensor, w_proj: Tensor, cell_clip: float,
              proj_clip: float) -> Tuple[Tensor, Tensor]:
    """One time step of ``D`` independent LSTMs at once (the two LMs of a layer).

    Args:
        x_gates: ``(D, batch, 4 * cell)`` input part of the gates.
        h: ``(D, batch, proj)``; c: ``(D, batch, cell)`` float32.
        w_state: ``(D, proj, 4 * cell)``; b_state: ``(D, 1, 4 * cell)``; w_proj: ``(D, cell, proj)``.
        cell_clip, proj_clip: clip values, 0 for none.

    A free function so that it can be compiled once for every layer
    (:meth:`ElmoBiLM.compile_steps`): fused, its dozen elementwise kernels become a few.
    """
    # The cell update runs in float32 even under bf16 autocast: c accumulates over steps.
    gates = (torch.baddbmm(b_state, h, w_state) + x_gates).float()
    i, f, g, o = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    if cell_clip:
        c = c.clamp(-cell_clip, cell_clip)
    h = torch.bmm(torch.sigmoid(o) * torch.tanh(c), w_proj)
    if proj_clip:
        h = h.clamp(-proj_clip, proj_clip)
    return h, c


class LstmCellWithProjection(nn.Module):
    """One direction of one layer: an LSTM whose state is projected and clipped.

    Step: ``gates = W x_t + U h_{t-1} + b`` split as ``i, f, g, o``;
    ``c_t = clip(σ(f) c_{t-1} + σ(i) tanh(g), cell_clip)``;
    ``h_t = clip(P (σ(o) tanh(c_t)), proj_clip)``.

    Args:
        input_size: input width.
        cell_size: memory cell width.
        projection_dim: output (and recurrent state) width.
        cell_clip, proj_clip: clip values, or None.
    """

    def __init__(self, input_size: int, cell_size: int, projection_dim: int, cell_clip: Optional[float] = None,
                 proj_clip: Optional[float] = None):
        super().__init__()
        self.input_size, self.cell_size, self.projection_dim = input_size, cell_size, projection_dim
        self.cell_clip, self.proj_clip = cell_clip, proj_clip
        self.input_linearity = nn.Linear(input_size, 4 * cell_size, bias=False)
        self.state_linearity = nn.Linear(projection_dim, 4 * cell_size, bias=True)
        self.state_projection = nn.Linear(cell_size, projection_dim, bias=False)
        self.step_fn = lstm_step
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        # TF's LSTMCell defaults: Glorot-uniform over the stacked [W; U] kernel, zero bias
        # plus the forget bias of 1.0 (kept inside our bias, see the module docstring).
        bound = math.sqrt(6.0 / (self.input_size + self.projection_dim + 4 * self.cell_size))
        nn.init.uniform_(self.input_linearity.weight, -bound, bound)
        nn.init.uniform_(self.state_linearity.weight, -bound, bound)
        nn.init.zeros_(self.state_linearity.bias)
        self.state_linearity.bias[self.cell_size : 2 * self.cell_size] = 1.0
        bound = math.sqrt(6.0 / (self.cell_size + self.projection_dim))
        nn.init.uniform_(self.state_projection.weight, -bound, bound)

    def forward(self, x: Tensor, state: Optional[Tuple[Tensor, Tensor]] = None) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        """``(batch, seq, input_size)`` in its given order, from ``(h (batch, proj), c (batch, cell))``
        (zeros if None) -> outputs ``(batch, seq, proj)`` and the final ``(h, c)``."""
        out, (h, c) = run_lstms([self], x[None], None if state is None else (state[0][None], state[1][None]))
        return out[0], (h[0], c[0])


def run_lstms(cells: Sequence[LstmCellWithProjection], x: Tensor, state: Optional[Tuple[Tensor, Tensor]] = None
              ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
    """Run ``D`` same-sized LSTMs side by side, each over its own input sequence.

    Stacking their weights turns ``D`` small matrix products per step into one batched
    one: the recurrence is bound by kernel launches, so the two LMs of a layer cost
    little more than one.

    Args:
        cells: ``D`` cells of equal sizes and clips.
        x: ``(D, batch, seq, input_size)``.
        state: ``(h (D, batch, proj), c (D, batch, cell))``; zeros if None.

    Returns:
        ``(D, batch, seq, proj)`` outputs and the final ``(h, c)``.
    """
    first = cells[0]
    d, batch, seq, _ = x.shape
    w_in = torch.stack([c.input_linearity.weight for c in cells])  # (D, 4C, in)
    w_state = torch.stack([c.state_linearity.weight for c in cells]).transpose(1, 2)
    b_state = torch.stack([c.state_linearity.bias for c in cells])[:, None]
    w_proj = torch.stack([c.state_projection.weight for c in cells]).transpose(1, 2)
    # The input half of the gates does not depend on the recurrence: one big product.
    x_gates = torch.bmm(x.reshape(d, batch * seq, -1), w_in.transpose(1, 2)).view(d, batch, seq, -1)
    if state is None:
        h = x.new_zeros(d, batch, first.projection_dim, dtype=torch.float32)
        c = x.new_zeros(d, batch, first.cell_size, dtype=torch.float32)
    else:
        h, c = state[0], state[1].float()
    outputs = []
    for t in range(seq):
        h, c = first.step_fn(x_gates[:, :, t], h, c, w_state, b_state, w_proj, first.cell_clip or 0.0, first.proj_clip or 0.0)
        outputs.append(h)
    return torch.stack(outputs, dim=2), (h, c)


def reverse_padded(x: Tensor, lengths: Tensor) -> Tensor:
    """Reverse each row's first ``lengths[b]`` steps, leaving its padding in place.

    Args:
        x: ``(batch, seq, ...)``.
        lengths: ``(batch,)`` valid steps per row (right padding).

    Returns:
        a tensor like ``x``; applying it twice gives ``x`` back.
    """
    steps = torch.arange(x.shape[1], device=x.device)
    index = lengths.to(x.device)[:, None] - 1 - steps[None]
    index = torch.where(index >= 0, index, steps[None])
    index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)


class ElmoBiLM(nn.Module):
    """Token encoder plus forward and backward LSTM stacks (no softmax: what the released
    hdf5 weight files hold).

    Args:
        config: the architecture.
    """

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.config = config
        self.char_cnn = CharCNN(config)
        p = config.projection_dim

        def stack() -> nn.ModuleList:
            return nn.ModuleList(LstmCellWithProjection(p, config.cell_size, p, config.cell_clip, config.proj_clip)
                                 for _ in range(config.num_layers))

        self.forward_layers, self.backward_layers = stack(), stack()
        self.dropout = nn.Dropout(config.dropout)

    def compile_steps(self, **compile_kwargs) -> "ElmoBiLM":
        """Run every LSTM time step through one ``torch.compile``-d :func:`lstm_step`
        (worth it on GPUs, where the recurrence is bound by kernel launches)."""
        compiled = torch.compile(lstm_step, **compile_kwargs)
        for layer in [*self.forward_layers, *self.backward_layers]:
            layer.step_fn = compiled
        return self

    @property
    def num_representation_layers(self) -> int:
        """Token layer plus one per LSTM layer."""
        return self.config.num_layers + 1

    def run_lms(self, x: Tensor, state: Optional[LSTMState] = None) -> Tuple[List[Tensor], LSTMState]:
        """Both LMs' LSTM stacks, each over token encodings in its own reading order.

        Args:
            x: ``(2, batch, seq, projection_dim)``: ``x[0]`` for the forward LM, ``x[1]``
                for the backward LM, already reversed (the caller decides how).
            state: ``(h (layers, 2, batch, projection_dim), c (layers, 2, batch, cell_size))``
                carried from a previous chunk; zeros if None.

        Returns:
            per layer ``(2, batch, seq, projection_dim)`` outputs (same reading orders),
            and the final state.
        """
        outputs, hs, cs = [], [], []
        for index, cells in enumerate(zip(self.forward_layers, self.backward_layers)):
            inp = self.dropout(x)
            out, (h, c) = run_lstms(cells, inp, None if state is None else (state[0][index], state[1][index]))
            # bilm-tf wraps the residual cell in the dropout wrapper: the skip adds the dropped input.
            if self.config.skip_connections and index > 0:
                out = out + inp
            outputs.append(out)
            hs.append(h)
            cs.append(c)
            x = out
        return outputs, (torch.stack(hs), torch.stack(cs))

    def forward(self, char_ids: Tensor) -> Dict[str, object]:
        """Both LMs over the same right-padded sentences, from zero states.

        Args:
            char_ids: ``(batch, seq, max_chars)``; a padded position is all zeros.

        Returns:
            ``layers``: ``num_layers + 1`` tensors ``(batch, seq, 2 * projection_dim)``
            (zero at padding); ``mask`` ``(batch, seq)`` bool; ``token``
            ``(batch, seq, projection_dim)``; ``forward`` / ``backward``: per layer
            ``(batch, seq, projection_dim)``, the backward ones realigned to the input order.
        """
        mask = (char_ids > 0).any(dim=-1)
        lengths = mask.sum(dim=1)
        token = self.char_cnn(char_ids)
        outputs, _ = self.run_lms(torch.stack([token, reverse_padded(token, lengths)]))
        fwd = [o[0] for o in outputs]
        bwd = [reverse_padded(o[1], lengths) for o in outputs]
        keep = mask[..., None].to(token.dtype)
        layers = [torch.cat([token, token], dim=-1) * keep]
        layers += [torch.cat([f, b], dim=-1) * keep for f, b in zip(fwd, bwd)]
        return {"layers": layers, "mask": mask, "token": token, "forward": fwd, "backward": bwd}


# ---------------------------------------------------------------------------- language model


class ElmoLanguageModel(nn.Module):
    """The biLM with its softmax: forward and backward LMs share the token encoder and
    the output layer.

    Args:
        config: the architecture.
        vocab_size: output vocabulary (ids sorted by descending frequency for the
            sampled softmax's sampler).
        softmax: ``"sampled"`` (training; exact softmax when evaluating), ``"full"``, or
            ``"adaptive"`` (``nn.AdaptiveLogSoftmaxWithLoss``, exact in both).
        num_samples: expected distinct negatives per batch for ``"sampled"``.
        cutoffs: cluster boundaries for ``"adaptive"``.
    """

    def __init__(self, config: ElmoConfig, vocab_size: int, softmax: str = "sampled", num_samples: int = 8192,
                 cutoffs: Optional[Sequence[int]] = None):
        super().__init__()
        if softmax not in ("sampled", "full", "adaptive"):
            raise UserError(f"softmax must be 'sampled', 'full' or 'adaptive', got {softmax!r}")
        self.config, self.vocab_size, self.softmax_kind, self.num_samples = config, vocab_size, softmax, num_samples
        self.bilm = ElmoBiLM(config)
        self.output_dropout = nn.Dropout(config.dropout)
        if softmax == "adaptive":
            # WikiText-style defaults; a small vocabulary gets one cluster boundary at a quarter.
            cutoffs = [c for c in (cutoffs or (2000, 10000)) if 0 < c < vocab_size - 1] or [max(1, vocab_size // 4)]
            self.adaptive = nn.AdaptiveLogSoftmaxWithLoss(config.projection_dim, vocab_size, cutoffs, div_value=4.0)
        else:
            self.softmax = nn.Linear(config.projection_dim, vocab_size)
            nn.init.normal_(self.softmax.weight, std=1.0 / math.sqrt(config.projection_dim))
            nn.init.zeros_(self.softmax.bias)

    def token_nll(self, hidden: Tensor, targets: Tensor, exact: bool = False) -> Tensor:
        """Negative log-likelihood of each target whose id is >= 0.

        Args:
            hidden: ``(n, projection_dim)`` last-layer LSTM outputs.
            targets: ``(n,)`` ids; negative ids are skipped.
            exact: use the full softmax even when training with the sampled one.

        Returns:
            ``(n_kept,)`` float32.
        """
        keep = targets >= 0
        hidden, targets = hidden[keep], targets[keep]
        if self.softmax_kind == "adaptive":
            # Its internal log-softmax must not run in bf16.
            with torch.autocast(hidden.device.type, enabled=False):
                return -self.adaptive(hidden.float(), targets).output
        if exact or self.softmax_kind == "full" or self.num_samples >= self.vocab_size:
            # In blocks of rows: (rows, vocab) float32 logits of a whole batch can take gigabytes.
            return torch.cat([F.cross_entropy(self.softmax(h).float(), t, reduction="none")
                              for h, t in zip(hidden.split(4096), targets.split(4096))])
        return sampled_softmax_nll(hidden, targets, self.softmax.weight, self.softmax.bias, self.num_samples)

    def forward(self, forward_inputs: Tensor, forward_targets: Tensor, backward_inputs: Tensor, backward_targets: Tensor,
                char_table: Tensor, state: Optional[LSTMState] = None, exact: bool = False) -> Tuple[Dict[str, Tensor], LSTMState]:
        """One truncated-BPTT chunk of each LM.

        The backward LM reads the reversed corpus, so its inputs and targets come already
        in its reading order (next token = previous token of the text).

        Args:
            forward_inputs, forward_targets: ``(batch, seq)`` word ids; targets < 0 are ignored.
            backward_inputs, backward_targets: ``(batch, seq)``, reversed text.
            char_table: ``(vocab, max_chars)`` character ids of each word.
            state: carried from the previous chunk (see :meth:`ElmoBiLM.run_lms`), or None.
            exact: full softmax (evaluation).

        Returns:
            ``({"loss", "forward_nll", "backward_nll", "forward_tokens", "backward_tokens"}, new_state)``;
            ``loss`` is the mean of the two LMs' mean NLLs, the ``*_nll`` are sums.
        """
        # Encode each distinct word once: a batch repeats words many times over.
        ids = torch.stack([forward_inputs, backward_inputs])
        unique, inverse = torch.unique(ids, return_inverse=True)
        encoded = self.bilm.char_cnn(char_table[unique])[inverse]  # (2, batch, seq, proj)
        layers, new_state = self.bilm.run_lms(encoded, state)
        hidden = self.output_dropout(layers[-1])
        out: Dict[str, Tensor] = {}
        for index, (name, targets) in enumerate((("forward", forward_targets), ("backward", backward_targets))):
            nll = self.token_nll(hidden[index].reshape(-1, hidden.shape[-1]), targets.reshape(-1), exact=exact)
            out[f"{name}_nll"], out[f"{name}_tokens"] = nll.sum(), torch.tensor(nll.numel(), device=nll.device)
        means = [out[f"{d}_nll"] / out[f"{d}_tokens"].clamp(min=1) for d in ("forward", "backward")]
        out["loss"] = 0.5 * (means[0] + means[1])
        return out, new_state


# ---------------------------------------------------------------------------- mixing, embedding


class ScalarMix(nn.Module):
    """``E_t = gamma * sum_i softmax(s)_i * H_{i,t}`` over representation layers.

    With ``do_layer_norm`` each layer is first normalised as AllenNLP does: one mean and
    variance over all unmasked elements of the layer (batch, tokens and features together).

    Args:
        num_layers: how many tensors are mixed.
        do_layer_norm: normalise each layer first (needs the mask).
        initial_scalar_parameters: the ``s`` to start from (default zeros: equal weights).
        trainable: whether ``s`` and ``gamma`` get gradients.
    """

    def __init__(self, num_layers: int, do_layer_norm: bool = False, initial_scalar_parameters: Optional[Sequence[float]] = None,
                 trainable: bool = True):
        super().__init__()
        initial = list(initial_scalar_parameters) if initial_scalar_parameters is not None else [0.0] * num_layers
        if len(initial) != num_layers:
            raise UserError(f"{len(initial)} initial scalar parameters for {num_layers} layers")
        self.num_layers, self.do_layer_norm = num_layers, do_layer_norm
        self.scalar_parameters = nn.Parameter(torch.tensor(initial, dtype=torch.float32), requires_grad=trainable)
        self.gamma = nn.Parameter(torch.tensor([1.0]), requires_grad=trainable)

    def weights(self) -> Tensor:
        """``(num_layers,)`` normalised layer weights (they sum to one)."""
        return torch.softmax(self.scalar_parameters, dim=0)

    def forward(self, tensors: Sequence[Tensor], mask: Optional[Tensor] = None) -> Tensor:
        """Mix ``num_layers`` tensors of one shape ``(batch, seq, dim)``; ``mask`` is
        ``(batch, seq)`` and needed only with ``do_layer_norm``."""
        if len(tensors) != self.num_layers:
            raise UserError(f"{len(tensors)} tensors passed to a ScalarMix of {self.num_layers} layers")
        weights = self.weights()
        if self.do_layer_norm:
            if mask is None:
                raise UserError("do_layer_norm needs the mask")
            keep = mask[..., None].to(tensors[0].dtype)
            count = keep.sum() * tensors[0].shape[-1]
            normed = []
            for t in tensors:
                mean = (t * keep).sum() / count
                var = (((t - mean) * keep) ** 2).sum() / count
                normed.append((t - mean) / torch.sqrt(var + 1e-12))
            tensors = normed
        return self.gamma * sum(w * t for w, t in zip(weights, tensors))


@dataclass
class ElmoEmbeddings:
    """Word-aligned ELMo vectors for a list of sentences (sentence markers removed).

    Attributes:
        layers: ``(n_sentences, num_layers + 1, max_words, 2 * projection_dim)``; layer 0
            is the token encoding duplicated, layer i the i-th LSTM layer's forward and
            backward outputs concatenated. Zero past each sentence's end.
        mixed: ``(n_sentences, max_words, 2 * projection_dim)``, the :class:`ScalarMix` of the layers.
        mask: ``(n_sentences, max_words)`` bool, True at real words.
    """

    layers: Tensor
    mixed: Tensor
    mask: Tensor

    def sentence(self, i: int) -> Tuple[Tensor, Tensor]:
        """Sentence ``i``'s ``(layers (num_layers + 1, n_words, dim), mixed (n_words, dim))``."""
        n = int(self.mask[i].sum())
        return self.layers[i, :, :n], self.mixed[i, :n]


@torch.no_grad()
def elmo_embed(bilm: ElmoBiLM, sentences: Sequence[Sequence[str]], scalar_mix: Optional[ScalarMix] = None, batch_size: int = 32,
               device: Optional[torch.device] = None) -> ElmoEmbeddings:
    """ELMo vectors of each word of pre-tokenised sentences.

    Each sentence is wrapped in ``<S>`` ... ``</S>`` as in training and run from zero
    LSTM states (AllenNLP instead carries states across calls, which makes a sentence's
    vectors depend on the batches before it); the markers' vectors are dropped.

    Args:
        bilm: the biLM (put in eval mode here; an :class:`ElmoLanguageModel`'s ``.bilm``).
        sentences: lists of words.
        scalar_mix: how to mix layers; default equal weights and ``gamma = 1``.
        batch_size: sentences per forward pass.
        device: where to run (default: the model's device).

    Returns:
        :class:`ElmoEmbeddings` on the CPU, in float32.
    """
    was_training = bilm.training
    bilm.eval()
    device = device or next(bilm.parameters()).device
    mix = (scalar_mix or ScalarMix(bilm.num_representation_layers)).to(device)
    n_layers, dim = bilm.num_representation_layers, bilm.config.output_dim
    longest = max((len(s) for s in sentences), default=0)
    layers = torch.zeros(len(sentences), n_layers, longest, dim)
    mixed = torch.zeros(len(sentences), longest, dim)
    mask = torch.zeros(len(sentences), longest, dtype=torch.bool)
    for start in range(0, len(sentences), batch_size):
        chunk = sentences[start : start + batch_size]
        chars = batch_to_char_ids(chunk, add_boundaries=True, max_chars=bilm.config.max_chars).to(device)
        out = bilm(chars)
        mixed_chunk = mix(out["layers"], out["mask"])
        for row, sentence in enumerate(chunk):
            n = len(sentence)
            i = start + row
            layers[i, :, :n] = torch.stack([t[row, 1 : n + 1] for t in out["layers"]]).float().cpu()
            mixed[i, :n] = mixed_chunk[row, 1 : n + 1].float().cpu()
            mask[i, :n] = True
    bilm.train(was_training)
    return ElmoEmbeddings(layers, mixed, mask)
