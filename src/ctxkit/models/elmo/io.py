"""ELMo weights on disk: bilm-tf / AllenNLP options JSON and hdf5 files, and our own folders.

The released ELMo models are an options JSON plus an hdf5 file written by bilm-tf's
``dump_weights`` (softmax excluded). Its datasets, with ``D = n_filters``,
``P = projection_dim``, ``C = cell_size``, TF's ``x @ W`` convention (so dense kernels
are the transpose of ``nn.Linear.weight``):

=========================================================  ===============================
``char_embed``                                             ``(n_characters - 1, char_dim)``
``CNN/W_cnn_{i}``, ``CNN/b_cnn_{i}``                       ``(1, width, char_dim, num)``, ``(num,)``
``CNN_high_{k}/W_carry``, ``b_carry``                      ``(D, D)``, ``(D,)``
``CNN_high_{k}/W_transform``, ``b_transform``              ``(D, D)``, ``(D,)``
``CNN_proj/W_proj``, ``b_proj``                            ``(D, P)``, ``(P,)``
``RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0``          ``(P + P, 4C)``, rows ``[input; h]``
``RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/B``            ``(4C,)``
``RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_P_0``        ``(C, P)``
=========================================================  ===============================

``d`` is 0 for the forward LM and 1 for the backward one. Conversions, as AllenNLP's:
the character table gains a zero row for the padding id 0; TF orders the gates
``i, j, f, o`` where we use ``i, f, j, o``; TF adds its forget bias of 1.0 at run time,
we keep it in the bias, so loading adds 1.0 to the forget slice and writing subtracts it
(in float64, so a round trip is exact up to one float32 rounding of that slice).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ...core.checkpoint import (WEIGHT_FILES, CheckpointError, CheckpointMismatchError, atomic_write, load_state_dict_strict,
                               read_pickled_state, read_weights, save_weights)
from .model import ElmoBiLM, ElmoConfig, ElmoLanguageModel
from ...core.build_guard import bounded_build, check_layers_held, held_values
from ...core.deps import require
from ...core.durable import verify_manifest
from ...core.errors import MissingFileError, UserError

__all__ = [
    "config_to_options",
    "config_from_options",
    "read_options",
    "write_options",
    "bilm_tf_shapes",
    "bilm_tf_arrays",
    "bilm_state_from_arrays",
    "load_bilm_tf",
    "write_bilm_tf",
    "save_elmo_lm",
    "load_elmo_lm",
    "load_bilm",
]

_DIRECTIONS = ("forward", "backward")
TF_FORGET_BIAS = 1.0


# ---------------------------------------------------------------------------- options JSON


def config_to_options(config: ElmoConfig, **extra) -> dict:
    """The bilm-tf options dict of ``config`` (plus top-level ``extra`` fields)."""
    return {
        "lstm": {"dim": config.cell_size, "projection_dim": config.projection_dim, "n_layers": config.num_layers,
                 "cell_clip": config.cell_clip, "proj_clip": config.proj_clip, "use_skip_connections": config.skip_connections},
        "char_cnn": {"activation": config.activation, "embedding": {"dim": config.char_embed_dim},
                     "filters": [list(f) for f in config.filters], "max_characters_per_token": config.max_chars,
                     "n_characters": config.n_characters, "n_highway": config.n_highway},
        "dropout": config.dropout,
        **extra,
    }


def config_from_options(options: dict, source: str = "options") -> ElmoConfig:
    """Parse a bilm-tf options dict.

    bilm-tf trains with ``n_characters = 261`` and publishes 262 (the padding row added
    at load time); both mean the 262-entry table here.

    Raises:
        CheckpointError: naming ``source`` and the missing or invalid field.
    """
    def get(*path, default=KeyError):
        node = options
        for key in path:
            if not isinstance(node, dict) or key not in node:
                if default is KeyError:
                    raise CheckpointError(f"{source}: options field {'.'.join(path)} is missing")
                return default
            node = node[key]
        return node

    try:
        cnn = ("char_cnn",)
        return ElmoConfig(
            filters=tuple(tuple(f) for f in get(*cnn, "filters")),
            n_highway=int(get(*cnn, "n_highway", default=0) or 0),
            char_embed_dim=int(get(*cnn, "embedding", "dim")),
            n_characters=max(int(get(*cnn, "n_characters")), 262),
            max_chars=int(get(*cnn, "max_characters_per_token")),
            activation=str(get(*cnn, "activation")),
            cell_size=int(get("lstm", "dim")),
            projection_dim=int(get("lstm", "projection_dim")),
            num_layers=int(get("lstm", "n_layers")),
            cell_clip=get("lstm", "cell_clip", default=None),
            proj_clip=get("lstm", "proj_clip", default=None),
            skip_connections=bool(get("lstm", "use_skip_connections", default=False)),
            dropout=float(get("dropout", default=0.1)),
        )
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{source}: invalid options ({err})") from None


def read_options(path: os.PathLike) -> ElmoConfig:
    """Read an options JSON file.

    Raises:
        CheckpointError: unreadable file, malformed JSON (with line and column) or a
            missing/invalid field, always naming the file.
    """
    path = Path(path)
    try:
        options = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read options ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}:{err.lineno}:{err.colno}: malformed options JSON: {err.msg}") from None
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{path}: options are not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not isinstance(options, dict):
        raise CheckpointError(f"{path}: options JSON must be an object, got {type(options).__name__}")
    return config_from_options(options, str(path))


def write_options(config: ElmoConfig, path: os.PathLike, **extra) -> Path:
    """Write ``config`` as a bilm-tf options JSON file, atomically."""
    text = json.dumps(config_to_options(config, **extra), indent=2) + "\n"
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


# ---------------------------------------------------------------------------- bilm-tf hdf5


def _lstm_root(direction: int, layer: int) -> str:
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


def bilm_tf_shapes(config: ElmoConfig) -> Dict[str, Tuple[int, ...]]:
    """Every dataset of a bilm-tf weight file for ``config``, with its shape."""
    d, p, c = config.n_filters, config.projection_dim, config.cell_size
    shapes: Dict[str, Tuple[int, ...]] = {"char_embed": (config.n_characters - 1, config.char_embed_dim)}
    for i, (width, num) in enumerate(config.filters):
        shapes[f"CNN/W_cnn_{i}"] = (1, width, config.char_embed_dim, num)
        shapes[f"CNN/b_cnn_{i}"] = (num,)
    for k in range(config.n_highway):
        for name in ("carry", "transform"):
            shapes[f"CNN_high_{k}/W_{name}"] = (d, d)
            shapes[f"CNN_high_{k}/b_{name}"] = (d,)
    if d != p:
        shapes["CNN_proj/W_proj"], shapes["CNN_proj/b_proj"] = (d, p), (p,)
    for direction in range(2):
        for layer in range(config.num_layers):
            root = _lstm_root(direction, layer)
            shapes[f"{root}/W_0"], shapes[f"{root}/B"], shapes[f"{root}/W_P_0"] = (p + p, 4 * c), (4 * c,), (c, p)
    return shapes


def _swap_if(x: np.ndarray, c: int) -> np.ndarray:
    """Swap gate blocks 1 and 2 along axis 0: ``i, f, g, o`` <-> TF's ``i, j, f, o`` (self-inverse)."""
    return np.concatenate([x[:c], x[2 * c : 3 * c], x[c : 2 * c], x[3 * c :]], axis=0)


def bilm_tf_arrays(bilm: ElmoBiLM) -> Dict[str, np.ndarray]:
    """The model's weights in the bilm-tf hdf5 layout (float32 arrays by dataset name)."""
    cfg, c = bilm.config, bilm.config.cell_size
    sd = {k: v.detach().cpu().double().numpy() for k, v in bilm.state_dict().items()}
    out: Dict[str, np.ndarray] = {"char_embed": sd["char_cnn.char_embedding.weight"][1:]}
    for i in range(len(cfg.filters)):
        out[f"CNN/W_cnn_{i}"] = sd[f"char_cnn.convolutions.{i}.weight"].transpose(2, 1, 0)[None]
        out[f"CNN/b_cnn_{i}"] = sd[f"char_cnn.convolutions.{i}.bias"]
    for k in range(cfg.n_highway):
        for name in ("carry", "transform"):
            out[f"CNN_high_{k}/W_{name}"] = sd[f"char_cnn.highways.{k}.{name}.weight"].T
            out[f"CNN_high_{k}/b_{name}"] = sd[f"char_cnn.highways.{k}.{name}.bias"]
    if "char_cnn.projection.weight" in sd:
        out["CNN_proj/W_proj"], out["CNN_proj/b_proj"] = sd["char_cnn.projection.weight"].T, sd["char_cnn.projection.bias"]
    for d, direction in enumerate(_DIRECTIONS):
        for layer in range(cfg.num_layers):
            prefix, root = f"{direction}_layers.{layer}", _lstm_root(d, layer)
            kernel = np.concatenate([sd[f"{prefix}.input_linearity.weight"], sd[f"{prefix}.state_linearity.weight"]], axis=1)
            out[f"{root}/W_0"] = _swap_if(kernel, c).T
            bias = _swap_if(sd[f"{prefix}.state_linearity.bias"], c).copy()
            bias[2 * c : 3 * c] -= TF_FORGET_BIAS
            out[f"{root}/B"] = bias
            out[f"{root}/W_P_0"] = sd[f"{prefix}.state_projection.weight"].T
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def bilm_state_from_arrays(arrays: Dict[str, np.ndarray], config: ElmoConfig) -> Dict[str, Tensor]:
    """Inverse of :func:`bilm_tf_arrays`: a state dict for :class:`ElmoBiLM` (float32)."""
    c, p = config.cell_size, config.projection_dim
    a = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}
    sd: Dict[str, np.ndarray] = {}
    chars = a["char_embed"]
    sd["char_cnn.char_embedding.weight"] = np.concatenate([np.zeros((1, chars.shape[1])), chars], axis=0)
    for i in range(len(config.filters)):
        sd[f"char_cnn.convolutions.{i}.weight"] = a[f"CNN/W_cnn_{i}"][0].transpose(2, 1, 0)
        sd[f"char_cnn.convolutions.{i}.bias"] = a[f"CNN/b_cnn_{i}"]
    for k in range(config.n_highway):
        for name in ("carry", "transform"):
            sd[f"char_cnn.highways.{k}.{name}.weight"] = a[f"CNN_high_{k}/W_{name}"].T
            sd[f"char_cnn.highways.{k}.{name}.bias"] = a[f"CNN_high_{k}/b_{name}"]
    if config.n_filters != p:
        sd["char_cnn.projection.weight"], sd["char_cnn.projection.bias"] = a["CNN_proj/W_proj"].T, a["CNN_proj/b_proj"]
    for d, direction in enumerate(_DIRECTIONS):
        for layer in range(config.num_layers):
            prefix, root = f"{direction}_layers.{layer}", _lstm_root(d, layer)
            kernel = _swap_if(a[f"{root}/W_0"].T, c)
            sd[f"{prefix}.input_linearity.weight"] = kernel[:, :p]
            sd[f"{prefix}.state_linearity.weight"] = kernel[:, p:]
            bias = a[f"{root}/B"].copy()
            bias[2 * c : 3 * c] += TF_FORGET_BIAS
            sd[f"{prefix}.state_linearity.bias"] = _swap_if(bias, c)
            sd[f"{prefix}.state_projection.weight"] = a[f"{root}/W_P_0"].T
    return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in sd.items()}


def _h5py():
    return require("h5py", "reading or writing ELMo hdf5 weights")


def _read_hdf5(path: Path) -> Dict[str, np.ndarray]:
    h5py = _h5py()
    arrays: Dict[str, np.ndarray] = {}
    try:
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, obj: arrays.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
    except OSError as err:
        raise CheckpointError(f"{path}: not a readable hdf5 weight file ({err})") from None
    return arrays


def _option_sizes(config: ElmoConfig) -> Dict[str, int]:
    """The options' size fields by their names in options.json (for messages)."""
    return {"lstm.n_layers": config.num_layers, "char_cnn.n_highway": config.n_highway, "lstm.dim": config.cell_size,
            "lstm.projection_dim": config.projection_dim, "char_cnn.embedding.dim": config.char_embed_dim,
            "char_cnn.n_characters": config.n_characters, "char_cnn.max_characters_per_token": config.max_chars}


def _check_depths(config: ElmoConfig, source: str, keys, layer: str, highway: str) -> None:
    """Options' LSTM layers and highways against the weight names, before anything is built
    (or listed: ten million layers would be forty million expected names)."""
    check_layers_held(_option_sizes(config), source, keys, {"lstm.n_layers": layer, "char_cnn.n_highway": highway})


def load_bilm_tf(options_file: os.PathLike, weight_file: os.PathLike) -> ElmoBiLM:
    """Build an :class:`ElmoBiLM` from a released (or :func:`write_bilm_tf`) options + hdf5 pair.

    Returns:
        the model in eval mode.

    Raises:
        CheckpointError: bad options file (named) or unreadable hdf5.
        CheckpointMismatchError: listing every missing, unexpected and misshaped dataset.
    """
    config = read_options(options_file)
    arrays = _read_hdf5(Path(weight_file))
    _check_depths(config, str(options_file), arrays, r"^RNN_0/RNN/MultiRNNCell/Cell(\d+)/", r"^CNN_high_(\d+)/")
    expected = bilm_tf_shapes(config)
    missing = [k for k in expected if k not in arrays]
    unexpected = [k for k in arrays if k not in expected]
    misshaped = [(k, arrays[k].shape, shape) for k, shape in expected.items() if k in arrays and tuple(arrays[k].shape) != shape]
    if missing or unexpected or misshaped:
        raise CheckpointMismatchError(f"{weight_file} (options {options_file})", missing, unexpected, misshaped)
    with bounded_build(_option_sizes(config), str(options_file), str(weight_file), sum(a.size for a in arrays.values()), arrays):
        model = ElmoBiLM(config)
    load_state_dict_strict(model, bilm_state_from_arrays(arrays, config), source=str(weight_file))
    return model.eval()


def write_bilm_tf(bilm: ElmoBiLM, weight_file: os.PathLike, options_file: Optional[os.PathLike] = None, **extra_options) -> Path:
    """Write the model in the bilm-tf hdf5 layout (atomically), and its options JSON if asked.

    The files load in AllenNLP's ``Elmo`` and in :func:`load_bilm_tf`.
    """
    h5py = _h5py()
    arrays = bilm_tf_arrays(bilm)

    def write(tmp: str) -> None:
        with h5py.File(tmp, "w") as f:
            for name, value in arrays.items():
                f.create_dataset(name, data=value, dtype="float32")

    if options_file is not None:
        write_options(bilm.config, options_file, **extra_options)
    return atomic_write(weight_file, write)


# ---------------------------------------------------------------------------- our folders


def save_elmo_lm(lm: ElmoLanguageModel, folder: os.PathLike, vocab: Sequence[str]) -> Path:
    """Save a trained LM (with its softmax) as ``model.safetensors``, ``options.json``
    (bilm-tf fields plus ``n_tokens_vocab`` and the softmax settings) and ``vocab.txt``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if len(vocab) != lm.vocab_size:
        raise UserError(f"vocabulary of {len(vocab)} words for a softmax of {lm.vocab_size}")
    save_weights(lm.state_dict(), folder / "model.safetensors")
    write_options(lm.config, folder / "options.json", n_tokens_vocab=lm.vocab_size, softmax=lm.softmax_kind,
                  n_negative_samples_batch=lm.num_samples,
                  cutoffs=list(lm.adaptive.cutoffs[:-1]) if lm.softmax_kind == "adaptive" else None)
    text = "".join(w + "\n" for w in vocab)
    atomic_write(folder / "vocab.txt", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return folder


def load_elmo_lm(folder: os.PathLike) -> Tuple[ElmoLanguageModel, List[str]]:
    """Load a folder written by :func:`save_elmo_lm`; returns ``(model in eval mode, vocab)``."""
    folder = Path(folder)
    config = read_options(folder / "options.json")
    options = json.loads((folder / "options.json").read_text(encoding="utf-8"))
    vocab = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    if options.get("n_tokens_vocab") != len(vocab):
        raise CheckpointError(f"{folder}: vocab.txt has {len(vocab)} words, options.json says {options.get('n_tokens_vocab')}")
    state = read_weights(folder)
    source = str(folder / "options.json")
    _check_depths(config, source, state, r"^bilm\.forward_layers\.(\d+)\.", r"^bilm\.char_cnn\.highways\.(\d+)\.")
    with bounded_build(_option_sizes(config), source, str(folder), held_values(state), state):
        lm = ElmoLanguageModel(config, len(vocab), softmax=options.get("softmax", "sampled"),
                               num_samples=int(options.get("n_negative_samples_batch", 8192)), cutoffs=options.get("cutoffs"))
    load_state_dict_strict(lm, state, source=str(folder))
    return lm.eval(), vocab


def load_bilm(path: os.PathLike) -> Tuple[ElmoBiLM, dict]:
    """A frozen :class:`ElmoBiLM` (eval mode) and ``{"source", "format"}``, from a
    :func:`~ctxkit.pretraining.bilm.train_bilm` run folder (its ``final/``, else its
    ``checkpoint/`` or, from earlier versions, ``checkpoint.pt``), that ``checkpoint/`` folder,
    a :func:`~ctxkit.models.elmo.io.save_elmo_lm` folder, a folder with bilm-tf
    ``options.json`` + ``weights.hdf5`` (or that hdf5 file), or a ``checkpoint.pt`` file.

    Raises:
        FileNotFoundError: nothing loadable at ``path`` (the message says what was looked for).
    """
    p = Path(path)
    p = p.parent if p.is_file() and p.suffix in (".hdf5", ".h5") else p
    if p.is_dir():
        p = p / "final" if (p / "final" / "options.json").is_file() else p
        if (p / "options.json").is_file() and (p / "vocab.txt").is_file() and any((p / w).is_file() for w in WEIGHT_FILES):
            return load_elmo_lm(p)[0].bilm.eval(), {"source": str(p), "format": "save_elmo_lm folder"}
        if (p / "options.json").is_file() and (p / "weights.hdf5").is_file():
            return load_bilm_tf(p / "options.json", p / "weights.hdf5"), {"source": str(p), "format": "bilm-tf options + hdf5"}
        folder = p / "checkpoint" if (p / "checkpoint" / "trainer_state.json").is_file() else p
        if (folder / "trainer_state.json").is_file():  # ctxkit.core.run_state.save_checkpoint
            verify_manifest(folder)
            state = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))
            if "model_config" not in state:
                raise UserError(f"{folder}: not a train_bilm checkpoint (no 'model_config')")
            return _bilm_from_lm_state(read_weights(folder), state["model_config"], folder, state.get("run", {}).get("step"))
        if not (p / "checkpoint.pt").is_file():
            raise MissingFileError(f"{p}: no biLM here (looked for final/, options.json + vocab.txt + weights, "
                                    "options.json + weights.hdf5, checkpoint/, checkpoint.pt)")
        p = p / "checkpoint.pt"
    if not p.is_file():
        raise MissingFileError(f"{p}: no such biLM folder or checkpoint file")
    blob = read_pickled_state(p, what="a biLM checkpoint")
    if not isinstance(blob, dict) or "model" not in blob or "model_config" not in blob:
        raise UserError(f"{p}: not a train_bilm checkpoint (no 'model' and 'model_config')")
    return _bilm_from_lm_state(blob["model"], blob["model_config"], p, blob.get("run", {}).get("step"))


def _bilm_from_lm_state(state: Dict[str, Tensor], options: dict, source: Path, step) -> Tuple[ElmoBiLM, dict]:
    config = config_from_options(options, str(source))
    # The checkpoint holds the whole LM; the softmax plays no part in the features.
    state = {k[5:]: v for k, v in state.items() if k.startswith("bilm.")}
    _check_depths(config, str(source), state, r"^forward_layers\.(\d+)\.", r"^char_cnn\.highways\.(\d+)\.")
    with bounded_build(_option_sizes(config), str(source), str(source), held_values(state), state):
        bilm = ElmoBiLM(config)
    load_state_dict_strict(bilm, state, source=str(source))
    return bilm.eval(), {"source": str(source), "format": f"train_bilm checkpoint (step {step})"}
