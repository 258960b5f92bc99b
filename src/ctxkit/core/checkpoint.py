"""Reading and writing weights safely, and renaming keys between layouts.

* Weights are read from ``model.safetensors`` (preferred) or ``pytorch_model.bin`` with
  ``torch.load(weights_only=True)``, so an untrusted file cannot run code.
* Loading is strict: every missing, unexpected or misshaped key is listed in one
  :class:`CheckpointMismatchError`.
* Writes go to a temporary file in the same folder, are flushed to disk and renamed into
  place, so a crash mid-save leaves the previous file intact (:mod:`ctxkit.core.durable`,
  which also replaces whole folders such as ``best/`` as a unit).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
from pathlib import Path, PurePath
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .diskspace import tensor_bytes
from .durable import atomic_write
from .errors import LIST_LIMIT, UserError, capped_list, quote

__all__ = [
    "CheckpointError",
    "CheckpointMismatchError",
    "KeyMap",
    "read_config",
    "read_weights",
    "load_state_dict_strict",
    "read_pickled_state",
    "atomic_write",
    "save_weights",
    "write_json",
    "sha256_file",
    "verify_sha256",
    "model_folder_of_run",
]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint could not be read or does not match (a user error: the files are wrong)."""


class CheckpointMismatchError(CheckpointError):
    """State dict and model disagree; lists every offending key.

    Attributes:
        missing: keys the model needs that the checkpoint lacks.
        unexpected: keys in the checkpoint the model does not have.
        misshaped: ``(key, checkpoint_shape, model_shape)`` triples.
    """

    def __init__(self, source: str, missing: Sequence[str], unexpected: Sequence[str], misshaped: Sequence[Tuple[str, tuple, tuple]]):
        self.missing, self.unexpected, self.misshaped = list(missing), list(unexpected), list(misshaped)
        groups = [[f"missing key {k}" for k in self.missing], [f"unexpected key {k}" for k in self.unexpected],
                  [f"misshaped key {k}: checkpoint {tuple(have)} vs model {tuple(want)}" for k, have, want in self.misshaped]]
        counts = ", ".join(f"{what} keys ({len(g)})" for what, g in zip(("missing", "unexpected", "misshaped"), groups) if g)
        # One line, then a few keys of each kind: a checkpoint of another architecture misses
        # hundreds of keys, and its unexpected ones are what tell why (a prefix, another layout).
        shown = _fair_share(groups, LIST_LIMIT)
        super().__init__(f"checkpoint {source} does not match the model: {counts}"
                         + capped_list(shown, limit=len(shown), total=sum(map(len, groups))))


def _fair_share(groups: Sequence[Sequence[str]], limit: int) -> List[str]:
    """At most ``limit`` entries of ``groups``, taken in turn from each group that has more,
    kept in group order."""
    take = [0] * len(groups)
    left = limit
    while left > 0 and any(t < len(g) for t, g in zip(take, groups)):
        for i, group in enumerate(groups):
            if left > 0 and take[i] < len(group):
                take[i] += 1
                left -= 1
    return [entry for group, t in zip(groups, take) for entry in group[:t]]


class KeyMap:
    """Bidirectional renaming between our parameter names and another layout's.

    Rules are pairs of templates; ``{i}`` matches a layer number and ``{p}`` a parameter
    suffix (``weight`` or ``bias``), e.g.
    ``("encoder.layers.{i}.ffn.fc1.{p}", "encoder.layer.{i}.intermediate.dense.{p}")``.
    """

    _FIELDS = {"i": r"(?P<i>\d+)", "p": r"(?P<p>weight|bias)"}

    def __init__(self, rules: Iterable[Tuple[str, str]]):
        self.rules = list(rules)
        self._ours = [(self._compile(a), b) for a, b in self.rules]
        self._theirs = [(self._compile(b), a) for a, b in self.rules]

    @classmethod
    def _compile(cls, template: str) -> "re.Pattern[str]":
        pattern = re.escape(template)
        for name, group in cls._FIELDS.items():
            pattern = pattern.replace(re.escape("{" + name + "}"), group)
        return re.compile(pattern + "$")

    @staticmethod
    def _apply(table, key: str) -> Optional[str]:
        for pattern, target in table:
            m = pattern.match(key)
            if m:
                return target.format(**m.groupdict())
        return None

    def to_theirs(self, key: str) -> Optional[str]:
        """Our name -> their name, or None when no rule matches."""
        return self._apply(self._ours, key)

    def to_ours(self, key: str) -> Optional[str]:
        """Their name -> our name, or None when no rule matches."""
        return self._apply(self._theirs, key)


def _json_error(path: Path, err: json.JSONDecodeError) -> CheckpointError:
    return CheckpointError(f"{path}:{err.lineno}:{err.colno}: malformed JSON: {err.msg}")


def read_config(directory: os.PathLike) -> dict:
    """Read ``config.json`` from a checkpoint folder.

    Raises:
        CheckpointError: missing file or malformed JSON (with file, line and column).
    """
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json (not an HF-format checkpoint folder)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise _json_error(path, err) from None
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except RecursionError:
        raise CheckpointError(f"{path}: JSON nested too deeply to be a model configuration") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object of settings, got {type(config).__name__}")
    return config


def check_config_fields(config: dict, source: str, positive: Sequence[str] = (), non_negative: Sequence[str] = (),
                        fractions: Sequence[str] = (), positive_floats: Sequence[str] = (), strings: Sequence[str] = ()) -> None:
    """Check the values of a ``config.json`` before a model is built from them, naming the file
    and the field: ``positive`` integers (sizes, counts), ``non_negative`` integers,
    ``fractions`` in [0, 1) (dropout), ``positive_floats`` (epsilons) and ``strings``.

    Raises:
        CheckpointError: the first value of the wrong type or out of range.
    """
    def bad(name, want):
        return CheckpointError(f"{source}: field {name!r} is {quote(config[name])}; expected {want}")

    for name in positive + non_negative:
        if name in config:
            value = config[name]
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(name, "an integer")
            if value < (1 if name in positive else 0) or value > 1 << 31:
                raise bad(name, "a positive integer" if name in positive else "an integer >= 0")
    for name in fractions + positive_floats:
        if name in config:
            value = config[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad(name, "a number")
            if (name in fractions and not 0 <= value < 1) or (name in positive_floats and not 0 < value < 1):
                raise bad(name, "a number in [0, 1)" if name in fractions else "a small positive number")
    for name in strings:
        if name in config and not isinstance(config[name], str):
            raise bad(name, "a string")


def read_weights(directory: os.PathLike) -> Dict[str, Tensor]:
    """Read a state dict from a checkpoint folder (safetensors first, then ``.bin``).

    Sharded checkpoints (``model.safetensors.index.json``) are read shard by shard.

    Raises:
        CheckpointError: no weight file, or a file that cannot be parsed (truncated, corrupted).
    """
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as err:
            raise CheckpointError(f"{index}: malformed shard index ({type(err).__name__}: {err})") from None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index}: 'weight_map' must map tensor names to shard file names")
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            _check_shard_name(index, shard)
        state: Dict[str, Tensor] = {}
        for shard in shards:
            state.update(_read_weight_file(directory / shard))
        return state
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return _read_weight_file(directory / name)
    raise CheckpointError(f"{directory}: no weight file (looked for {', '.join(WEIGHT_FILES)})")


def _check_shard_name(index: Path, shard: str) -> None:
    """A shard index names files of its own folder: an absolute path or a ``..`` would make
    loading a downloaded checkpoint read any file on the machine. Checked on the names, not on
    resolved paths: the Hugging Face cache links each file to a blob outside the folder.

    Raises:
        CheckpointError: in one line, naming the index and the shard.
    """
    path = PurePath(shard)
    if not shard or path.anchor or ".." in path.parts:  # anchor: "/", or a Windows drive or share
        raise CheckpointError(f"{index}: shard {quote(shard)} is outside the checkpoint folder; a shard index "
                              "may name only files inside its own folder")


def _read_weight_file(path: Path) -> Dict[str, Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as err:  # safetensors raises several types for bad bytes
            raise CheckpointError(f"{path}: could not read weights, the file is corrupted or truncated "
                                  f"({type(err).__name__}: {str(err)[:200]})") from None
    state = read_pickled_state(path, what="weights")
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a dict of tensors, got {type(state).__name__}")
    return state


def read_pickled_state(path: os.PathLike, what: str = "state") -> object:
    """``torch.load(path, weights_only=True)``: tensors, numbers, strings and containers only.

    A file that would need anything else (a class, a function: code) is refused, and the
    message says so: it never suggests loading it without ``weights_only``.

    Raises:
        CheckpointError: the file is refused for safety, or is corrupted or truncated.
    """

    path = Path(path)
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "weights only" in str(err).lower() or "weights_only" in str(err):
            raise CheckpointError(
                f"{path}: refused for safety: the file holds pickled objects other than tensors (code a pickle can "
                f"run), and ctxkit reads {what} only as plain tensors (torch.load with weights_only=True). Use a "
                "safetensors file (model.safetensors), or convert this one with a tool you trust") from None
        raise CheckpointError(f"{path}: could not read {what}, the file is corrupted or truncated (UnpicklingError)") from None
    except (FileNotFoundError, IsADirectoryError):
        raise CheckpointError(f"{path}: no such file") from None
    except Exception as err:  # zip / EOF / runtime errors of a damaged file
        raise CheckpointError(f"{path}: could not read {what}, the file is corrupted or truncated "
                              f"({type(err).__name__}: {str(err)[:200]})") from None


def load_state_dict_strict(module: nn.Module, state: Mapping[str, Tensor], source: str = "state dict", assign: bool = False) -> None:
    """Copy ``state`` into ``module`` after checking every key and shape.

    With ``assign=True`` the tensors are adopted rather than copied, which is what a
    module built on the ``meta`` device (no memory, no initialisation) needs.

    Raises:
        CheckpointMismatchError: listing all missing, unexpected and misshaped keys at once.
    """
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    misshaped = [(k, tuple(state[k].shape), tuple(own[k].shape)) for k in own if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or misshaped:
        raise CheckpointMismatchError(source, missing, unexpected, misshaped)
    # Weights must be numbers of the right kind: integer or boolean tensors in place of
    # floating-point weights (a damaged or foreign file) would only fail deep inside a forward.
    wrong = [f"{k} ({state[k].dtype})" for k in own if own[k].is_floating_point() and not state[k].is_floating_point()]
    if wrong:
        raise CheckpointError(f"{source}: {len(wrong)} tensor(s) are not floating point where weights are: "
                              + ", ".join(wrong[:8]) + (" ..." if len(wrong) > 8 else ""))
    module.load_state_dict(dict(state), strict=True, assign=assign)


def _own_storage(t: Tensor) -> Tensor:
    # A view into a larger buffer (e.g. MasterAdamW's flat parameters) is copied out.
    return t if t.untyped_storage().nbytes() == t.numel() * t.element_size() else t.clone()


def save_weights(state: Mapping[str, Tensor], path: os.PathLike) -> Path:
    """Save a state dict as safetensors, atomically."""
    from safetensors.torch import save_file

    # safetensors refuses shared or non-contiguous storage; tied weights must be dropped by the caller.
    tensors = {k: _own_storage(v.detach().contiguous().cpu()) for k, v in state.items()}
    return atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}), size=tensor_bytes(tensors))


def model_folder_of_run(path: os.PathLike) -> Path:
    """A run folder's model: ``RUN/best`` (finetune, lm-train, ...) or ``RUN/final`` (pretrain)
    when ``RUN`` itself holds no ``config.json``; any other path as it is. So every entry takes
    ``runs/x`` where the model lives in ``runs/x/best``."""
    path = Path(path)
    if path.is_dir() and not (path / "config.json").is_file():
        for inner in ("best", "final"):
            if (path / inner / "config.json").is_file():
                return path / inner
    return path


def write_json(obj, path: os.PathLike) -> Path:
    """Write JSON (indented, sorted keys) atomically."""
    text = json.dumps(obj, indent=2, sort_keys=True) + "\n"
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), size=len(text.encode("utf-8")))


def sha256_file(path: os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def verify_sha256(directory: os.PathLike, expected: Mapping[str, str]) -> None:
    """Check files in ``directory`` against expected SHA-256 digests.

    Raises:
        CheckpointError: listing every missing file and every digest mismatch.
    """
    problems: List[str] = []
    for name, digest in expected.items():
        path = Path(directory) / name
        if not path.is_file():
            problems.append(f"{name}: missing")
            continue
        actual = sha256_file(path)
        if actual != digest:
            problems.append(f"{name}: sha256 {actual} != expected {digest}")
    if problems:
        raise CheckpointError(f"checkpoint files in {directory} failed verification:" + capped_list(problems))


# -- config.json against itself and its weights (GPT-2, XLNet, Transformer-XL) ------------
#
# check_config_fields covers sizes, rates and names; what follows covers the rest of a config
# that a family reads before it builds a model: required fields, integers of either sign,
# switches, lists, heads that divide the width, and sizes the weights must agree with.


def require_config_fields(config: dict, source: str, names: Sequence[str]) -> None:
    """The fields a model cannot be built without are present.

    Raises:
        CheckpointError: naming the file and the first missing field.
    """
    for name in names:
        if name not in config:
            raise CheckpointError(f"{source}: no field {name!r}; the model cannot be built without it")


def check_config_types(config: dict, source: str, integers: Sequence[str] = (), booleans: Sequence[str] = (),
                       int_lists: Sequence[str] = (), bool_lists: Sequence[str] = (), nullable: Sequence[str] = ()) -> None:
    """Check values :func:`check_config_fields` has no rule for: ``integers`` of either sign
    (e.g. ``clamp_len``, where -1 means "off"), ``booleans`` (JSON true/false, or 0/1 as some
    published configs write them), lists of integers and lists of booleans. A field named in
    ``nullable`` may also be null.

    Raises:
        CheckpointError: the first value of the wrong type, naming the file and the field.
    """
    def bad(name, want):
        return CheckpointError(f"{source}: field {name!r} is {quote(config[name])}; expected {want}")

    def is_int(value):
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 1 << 31

    def is_bool(value):
        return isinstance(value, bool) or (is_int(value) and value in (0, 1))

    for name in (*integers, *booleans, *int_lists, *bool_lists):
        if name not in config or (config[name] is None and name in nullable):
            continue
        value = config[name]
        if name in integers and not is_int(value):
            raise bad(name, "an integer")
        if name in booleans and not is_bool(value):
            raise bad(name, "true or false")
        if name in int_lists and not (isinstance(value, list) and all(is_int(v) for v in value)):
            raise bad(name, "a list of integers")
        if name in bool_lists and not (isinstance(value, list) and all(is_bool(v) for v in value)):
            raise bad(name, "a list of true/false values")


def check_heads_divide(config: dict, source: str, width: str, heads: str, head_size: Optional[str] = None) -> None:
    """The attention heads split the width evenly (``width % heads == 0``) and, when the
    config gives a per-head size, ``head_size * heads == width``. Call it after
    :func:`check_config_fields` has made both positive integers.

    Raises:
        CheckpointError: naming the file and the fields.
    """
    w, h = config.get(width), config.get(heads)
    if not (isinstance(w, int) and isinstance(h, int) and h > 0):
        return
    if w % h:
        raise CheckpointError(f"{source}: {width} {w} is not a multiple of {heads} {h}")
    d = config.get(head_size) if head_size else None
    if isinstance(d, int) and d * h != w:
        raise CheckpointError(f"{source}: {head_size} {d} * {heads} {h} is not {width} {w}")


def check_config_against_weights(config: dict, source: str, held: Mapping[str, Tuple[Optional[int], str]],
                                 layers: Optional[Tuple[str, int]] = None) -> None:
    """Sizes of ``config.json`` against the weights, before a model is built from them: a
    config may ask for far more memory than its weights hold (a vocabulary of 10**9, ten
    million layers), which would fail late, in an allocation, or not at all.

    Args:
        held: field -> ``(size the weights hold, the weight that says so)``; a size of None
            (the weight is absent) skips the field, which the strict load then reports.
        layers: ``(field, layers the weights hold)``: the config may not ask for more.

    Raises:
        CheckpointError: naming the file, the field and the weight.
    """
    if layers is not None:
        name, present = layers
        value = config.get(name)
        if isinstance(value, int) and value > present:
            raise CheckpointError(f"{source}: field {name!r} is {value}: {value} layers, but the weights hold {present}")
    for name, (size, weight) in held.items():
        if size is not None and name in config and config[name] != size:
            raise CheckpointError(f"{source}: field {name!r} is {quote(config[name])}, but the weights hold {size} ({weight})")


def weight_dim(state: Mapping[str, Tensor], key: str, dim: int) -> Tuple[Optional[int], str]:
    """``(size of dimension dim of state[key], a description)`` for
    :func:`check_config_against_weights`; ``(None, key)`` when the weight is absent or has
    fewer dimensions. A ``{i}`` in ``key`` stands for any layer number: the largest size over
    the layers counts (a config may not ask for more than that; one layer of another shape is
    for the strict load to list with the other mismatches)."""
    if "{i}" not in key:
        value = state.get(key)
        if value is None or value.dim() <= dim:
            return None, key
        return int(value.shape[dim]), f"{key} is {tuple(value.shape)}"
    pattern = re.compile(re.escape(key).replace(re.escape("{i}"), r"\d+"))
    sizes = [int(v.shape[dim]) for k, v in state.items() if pattern.fullmatch(k) and v.dim() > dim]
    return (max(sizes), f"{key} has dimension {dim} of {max(sizes)}") if sizes else (None, key)


def count_layers(keys: Iterable[str], pattern: "re.Pattern[str]") -> int:
    """How many layers the weight names hold: distinct numbers ``pattern``'s first group
    matches (e.g. ``h\\.(\\d+)\\.`` for GPT-2)."""
    return len({int(m.group(1)) for k in keys for m in [pattern.search(k)] if m})
