"""What every model family shares: :class:`Preset` (a named architecture with one line for
``ctxkit list-models``), the config mixins :class:`Replaceable` and :class:`PaperNames`, and
:class:`IndexableOutput`, the output mixin that reads like transformers' ``ModelOutput``.
The families themselves are listed in :mod:`.families`."""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Tuple, TypeVar

from torch import nn

from ..core.build_guard import weights_file
from ..core.checkpoint import CheckpointError, model_folder_of_run
from ..core.errors import UserError
from ..core.hub import hub_snapshot, is_hub_id, push_folder
from ..core.catalog import hub_model

__all__ = ["Preset", "Replaceable", "PaperNames", "IndexableOutput", "PretrainedHabits", "check_vocab_fits"]

_Config = TypeVar("_Config", bound="Replaceable")


class PretrainedHabits:
    """transformers' model habits on a ctxkit model class: ``from_pretrained`` (a folder, a
    run folder, or a Hub repository fetched into the Hugging Face cache at the revision the
    catalog pins), ``save_pretrained`` (the HF layout transformers reads, safetensors) and
    ``num_parameters``. The family file says how its folders are read and written
    (``_load_folder``, ``_save_folder``); ``ctxkit.AutoModel`` takes every zoo name too."""

    @classmethod
    def _load_folder(cls, folder):
        raise NotImplementedError

    def _save_folder(self, folder, tokenizer):
        raise NotImplementedError

    @classmethod
    def from_pretrained(cls, name_or_path, revision=None, device: str = "cpu"):
        """The model of a folder, a run folder (its ``best/``) or a Hub id, in eval mode on ``device``.

        Raises:
            UserError: a name that is neither (zoo names: ``ctxkit.AutoModel``), or a folder of another family.
        """
        path = Path(name_or_path)
        if path.is_dir():
            folder = model_folder_of_run(path)
        elif hub_model(str(name_or_path)) is not None:
            known = hub_model(str(name_or_path))
            folder = hub_snapshot(known.repo_id, revision or known.revision)
        elif "/" in str(name_or_path) and is_hub_id(str(name_or_path)):  # org/name (top-level ids: the catalog's)
            folder = hub_snapshot(str(name_or_path), revision)
        else:
            raise UserError(f"{name_or_path!r}: not a folder or a Hub id (ctxkit.AutoModel.from_pretrained takes zoo names too)")
        model = cls._load_folder(folder)
        if not isinstance(model, cls):
            raise UserError(f"{folder} holds a {type(model).__name__}, not a {cls.__name__}")
        return model.to(device).eval()

    def save_pretrained(self, directory, tokenizer=None):
        """Write the model (and ``tokenizer``'s files, when given) into ``directory`` in the HF
        layout: ``transformers.AutoModel.from_pretrained(directory)`` loads it. Returns the folder."""
        return self._save_folder(directory, tokenizer)

    def push_to_hub(self, repo_id: str, tokenizer=None, *, private=None, commit_message=None, revision=None, token=None) -> str:
        """Upload the model (and ``tokenizer``'s files) to the Hub repository ``repo_id`` in the HF
        layout, creating it if needed, in one commit (``huggingface_hub``'s upload API); returns
        the commit's URL. ``from_pretrained(repo_id)`` (ours or transformers') loads it back."""
        with tempfile.TemporaryDirectory(prefix="ctxkit-push-") as tmp:
            self.save_pretrained(tmp, tokenizer=tokenizer)
            return push_folder(Path(tmp), repo_id, private=private, commit_message=commit_message, revision=revision, token=token)

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """Parameters, as transformers counts them (tied weights once)."""
        skip = {id(p) for m in self.modules() if isinstance(m, nn.Embedding) for p in m.parameters()} if exclude_embeddings else set()
        return sum(p.numel() for p in self.parameters() if id(p) not in skip and (p.requires_grad or not only_trainable))


class Replaceable:
    """``replace`` for the families' (frozen) config dataclasses.

    Callers (presets shrunk for tests,
    training loops fitting a vocabulary) derive variants with ``config.replace(...)`` rather
    than importing :mod:`dataclasses` themselves. The mixin declares no fields, so a
    dataclass that inherits it keeps exactly its own fields, defaults, equality and hash.
    """

    def replace(self: _Config, **changes: Any) -> _Config:
        """A copy with some fields changed.

        Args:
            **changes: field names and their new values.

        Returns:
            A new instance of the same class (``__post_init__`` runs again, so its checks
            apply to the changed values).
        """
        return dataclasses.replace(self, **changes)


class PaperNames(Replaceable):
    """For configs whose stored fields keep their paper's and checkpoint format's names
    (``d_model``, ``n_layers``, ``n_heads``, ``d_inner``: Transformer-XL, XLNet): the common
    names of :mod:`.families` as read-only views, and ``replace`` (from :class:`Replaceable`)."""

    @property
    def hidden_size(self) -> int:
        return self.d_model

    @property
    def num_layers(self) -> int:
        return self.n_layers

    @property
    def num_heads(self) -> int:
        return self.n_heads

    @property
    def ffn_size(self) -> int:
        return self.d_inner


@dataclass(frozen=True)
class Preset:
    """A named architecture.

    Attributes:
        name: registry name.
        config: the architecture (the family's config class).
        description: one line for ``ctxkit list-models``.
    """

    name: str
    config: Any
    description: str


class IndexableOutput:
    """Index, unpack and key access for the families' output dataclasses, as transformers'
    ``ModelOutput`` and its older tuple outputs allow.

    The values are the non-None fields, in field order (or in ``_tuple_names``, where a class
    lists the names transformers' output has, in its order): ``out[0]`` is the first
    (``last_hidden_state`` of :class:`~ctxkit.models.bert.model.BertOutput`), ``out[1]`` the next
    non-None one, ``out[:2]`` a tuple, ``len(out)`` how many there are, ``hidden, pooled = out``
    unpacks them, and ``out["last_hidden_state"]`` reads by name (``KeyError`` for a None
    field, as in transformers). ``keys()``, ``values()``, ``items()`` and ``to_tuple()`` list
    them, so ``dict(out)`` works too. Attribute access is unchanged.

    Unlike ``ModelOutput`` (an ordered dict), iterating yields the values, not the names: the
    habit this serves is ``last_hidden_state, pooler_output = model(...)``, which in
    transformers needs ``return_dict=False``; ``"name" in out`` still asks for a name. The mixin
    declares no fields, so a dataclass that inherits it keeps its own fields and equality.
    """

    _tuple_names: Tuple[str, ...] = ()  # no annotation in subclasses: not a dataclass field

    def _names(self) -> Tuple[str, ...]:
        return self._tuple_names or tuple(f.name for f in dataclasses.fields(self))

    def keys(self) -> List[str]:
        """Names of the non-None values, in order."""
        return [name for name in self._names() if getattr(self, name) is not None]

    def values(self) -> List[Any]:
        """The non-None values, in order."""
        return [getattr(self, name) for name in self.keys()]

    def items(self) -> List[Tuple[str, Any]]:
        """``(name, value)`` of the non-None values, in order."""
        return [(name, getattr(self, name)) for name in self.keys()]

    def to_tuple(self) -> tuple:
        """The non-None values as a tuple (what transformers returns with ``return_dict=False``)."""
        return tuple(self.values())

    def __getitem__(self, key):
        if isinstance(key, str):
            if key in self.keys():
                return getattr(self, key)
            raise KeyError(f"{key!r}: this {type(self).__name__} holds {self.keys()}")
        return self.to_tuple()[key]

    def __iter__(self):
        return iter(self.to_tuple())

    def __len__(self) -> int:
        return len(self.keys())

    def __contains__(self, key) -> bool:
        return key in self.keys()


# The files a folder's tokenizer is read from, in the order the tokenizers prefer them.
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json")


def _embedding_rows(model: Any) -> Optional[int]:
    """Rows of the model's token embedding table: its config's ``vocab_size`` (the strict
    load has held the table to it), or its encoder's for a model with a task head."""
    for part in (model, getattr(model, "encoder", None), getattr(model, "bert", None)):
        rows = getattr(getattr(part, "config", None), "vocab_size", None)
        if isinstance(rows, int) and not isinstance(rows, bool):
            return rows
    return None


def check_vocab_fits(model: Any, tokenizer: Any, folder: Any, weights: Any = None) -> None:
    """The tokenizer's ids all index the model's embedding table.

    A tokenizer with more tokens than the table has rows (the files of two models mixed in
    one folder) loads fine and fails later, on the first text with a high id, as an
    IndexError deep in the forward pass; this says so when the folder is loaded.

    Args:
        model: the loaded model.
        tokenizer: its tokenizer (``vocab_size``), or None (nothing to check).
        folder: where the tokenizer was read from.
        weights: where the weights were read from (default: ``folder``).

    Raises:
        CheckpointError: one line naming both files and both numbers.
    """
    tokens = getattr(tokenizer, "vocab_size", None)
    rows = _embedding_rows(model)
    if not isinstance(tokens, int) or rows is None or tokens <= rows:
        return
    folder = Path(folder)
    tok_file = next((folder / n for n in _TOKENIZER_FILES if (folder / n).is_file()), folder)
    raise CheckpointError(f"{tok_file}: the tokenizer has {tokens} tokens, but the embedding table in "
                          f"{weights_file(weights if weights is not None else folder)} has {rows} rows (vocab_size {rows}): "
                          f"token ids {rows} to {tokens - 1} would index past it; the tokenizer and the weights are of "
                          "different models")
