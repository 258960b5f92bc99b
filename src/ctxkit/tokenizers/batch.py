"""What both tokenizers share: the rich :class:`Encoding` of one example, and the calling
conventions users bring from ``transformers`` (:class:`TransformersStyle`: ``tok(texts,
padding=True, truncation=True, return_tensors="pt")`` returning a :class:`BatchEncoding`,
``tokenize``, ``convert_tokens_to_ids``, ``convert_ids_to_tokens``, ``vocab``).

One implementation serves :class:`~ctxkit.tokenizers.WordPieceTokenizer` and
:class:`~ctxkit.tokenizers.ByteLevelBPETokenizer`; each supplies only how it encodes a list of
texts (``_call_encode``). The argument rules (which of ``padding``, ``truncation`` and
``max_length`` win, when there is no pad token) are transformers' own
(``PreTrainedTokenizerBase._get_padding_truncation_strategies``), so the same call gives the
same ids, masks and segment ids as ``BertTokenizerFast`` / ``GPT2TokenizerFast``.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..core.errors import UserError
from ..core.hub import hub_snapshot, is_hub_id, push_folder

__all__ = ["Encoding", "BatchEncoding", "TransformersStyle"]

logger = logging.getLogger("ctxkit")
# No limit: what truncation=False means (tokenizers' own "no truncation" is an absent setting).
NO_LIMIT = 1 << 40
_PADDING = {True: "longest", "longest": "longest", "max_length": "max_length", False: None, None: None,
            "do_not_pad": None}
_TRUNCATION = {True: "longest_first", "longest_first": "longest_first", "only_first": "only_first",
               "only_second": "only_second", False: None, None: None, "do_not_truncate": None}
_TENSOR_TYPES = (None, "pt", "np")


@dataclass
class Encoding:
    """One encoded example (a single text or a text pair).

    It is also the list of its ``input_ids``, as the list of ints ``transformers``'
    ``tokenizer.encode`` returns: ``len(e)``, ``iter(e)``, ``e[i]``, ``e[:n]``, ``e + [0] * k``
    (a plain list), ``e == [101, ...]``, ``np.array([e + pad])`` and ``torch.tensor(e)`` all
    act on ``input_ids``. Two Encodings compare equal only if every field is equal.

    Attributes:
        input_ids: Token ids, including special tokens when they are added.
        token_type_ids: Segment ids (0 for the first text, 1 for the second).
        attention_mask: 1 for real tokens, 0 for padding.
        offsets: ``(start, end)`` character offsets into the original text of the
            token's own segment; ``(0, 0)`` for special and padding tokens.
        tokens: Token strings.
        word_ids: Index (within its segment) of the pre-tokenized word each token
            came from; ``None`` for special and padding tokens.
        sequence_ids: 0/1 for tokens of the first/second text, else ``None``.
        num_truncated: How many tokens truncation removed (0 if none).
    """

    input_ids: List[int]
    token_type_ids: List[int]
    attention_mask: List[int]
    offsets: List[Tuple[int, int]]
    tokens: List[str]
    word_ids: List[Optional[int]]
    sequence_ids: List[Optional[int]]
    num_truncated: int = 0

    @classmethod
    def from_backend(cls, enc, num_truncated: int = 0) -> "Encoding":
        """From a ``tokenizers.Encoding``.

        Each field is read from ``enc`` when first used: converting all seven to Python lists
        cost as much as the tokenizing itself, and a classifier reads only the ids."""
        self = cls.__new__(cls)
        self.__dict__.update(_backend=enc, num_truncated=num_truncated)
        return self

    def __getattr__(self, name: str):
        # Only reached for a field not yet read from the backend Encoding (see from_backend).
        backend = self.__dict__.get("_backend")
        if backend is None or name not in _BACKEND_FIELDS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = getattr(backend, _BACKEND_FIELDS[name])
        self.__dict__[name] = value
        return value

    def _fields(self) -> tuple:
        return tuple(getattr(self, name) for name in _FIELD_ORDER)

    def __getstate__(self) -> dict:  # pickles and copies hold plain fields, not the backend object
        return dict(zip(_FIELD_ORDER, self._fields()))

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    @property
    def truncated(self) -> bool:
        """Whether truncation removed any token."""
        return self.num_truncated > 0

    def __len__(self) -> int:
        return len(self.input_ids)

    def __iter__(self):
        return iter(self.input_ids)

    def __getitem__(self, index):
        return self.input_ids[index]

    def __add__(self, other) -> list:
        return list(self.input_ids) + list(other)

    def __radd__(self, other) -> list:
        return list(other) + list(self.input_ids)

    def __eq__(self, other) -> bool:
        if isinstance(other, Encoding):
            return self._fields() == other._fields() if type(other) is type(self) else NotImplemented
        if isinstance(other, (list, tuple)):
            return list(self.input_ids) == list(other)
        return NotImplemented

    __hash__ = None  # mutable, like the dataclass it was

    def padded(self, length: int, pad_id: int, pad_token: str) -> "Encoding":
        """A copy padded on the right to ``length`` (unchanged if already that long): pad
        positions get ``pad_id``, segment 0, mask 0, offsets ``(0, 0)``, word/sequence id None."""
        n = length - len(self.input_ids)
        if n <= 0:
            return self
        return Encoding(self.input_ids + [pad_id] * n, self.token_type_ids + [0] * n, self.attention_mask + [0] * n,
                        self.offsets + [(0, 0)] * n, self.tokens + [pad_token] * n, self.word_ids + [None] * n,
                        self.sequence_ids + [None] * n, self.num_truncated)

    def cut(self, length: int) -> "Encoding":
        """A copy with only the first ``length`` tokens (right truncation); ``num_truncated`` counts the rest."""
        n = len(self.input_ids) - length
        if n <= 0:
            return self
        return Encoding(self.input_ids[:length], self.token_type_ids[:length], self.attention_mask[:length],
                        self.offsets[:length], self.tokens[:length], self.word_ids[:length],
                        self.sequence_ids[:length], self.num_truncated + n)


# Encoding field -> the tokenizers.Encoding attribute it is read from.
_BACKEND_FIELDS = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask", "offsets": "offsets",
                   "tokens": "tokens", "word_ids": "word_ids", "sequence_ids": "sequence_ids"}
_FIELD_ORDER = (*_BACKEND_FIELDS, "num_truncated")


class BatchEncoding(dict):
    """What calling a tokenizer returns: a dict of model inputs, also readable as attributes.

    Keys (in this order, as transformers): ``input_ids``, ``token_type_ids`` (WordPiece),
    ``attention_mask``. Values are lists (``(batch, seq)`` nested, or ``(seq,)`` for a single
    str), or ``torch.LongTensor`` / int64 ``numpy`` arrays ``(batch, seq)``. A plain dict
    otherwise: ``model(**batch)``, ``batch["input_ids"]``, ``batch.input_ids``, ``dict(batch)``.

    Attributes:
        encodings: the :class:`Encoding` of each example (padded as the values are), for
            offsets, tokens and word ids; ``batch[i]`` is ``encodings[i]``, as in transformers.
    """

    def __init__(self, data: Dict[str, Any], encodings: Optional[List[Encoding]] = None):
        super().__init__(data)
        self.encodings = encodings

    def __getattr__(self, name: str):
        if name.startswith("__"):  # pickle / copy probe dunders: not keys
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"BatchEncoding has no key or attribute {name!r}; keys: {list(self)}") from None

    def __getitem__(self, key):
        if isinstance(key, int) and not isinstance(key, bool):
            if self.encodings is None:
                raise KeyError(key)
            return self.encodings[key]
        return super().__getitem__(key)

    def to(self, device) -> "BatchEncoding":
        """A copy with every tensor moved to ``device`` (lists stay lists)."""
        return BatchEncoding({k: v.to(device) if hasattr(v, "to") else v for k, v in self.items()}, self.encodings)

    def word_ids(self, batch_index: int = 0) -> List[Optional[int]]:
        """The word index of each token of example ``batch_index`` (None: special or padding)."""
        return self[batch_index].word_ids

    def tokens(self, batch_index: int = 0) -> List[str]:
        """The token strings of example ``batch_index``."""
        return self[batch_index].tokens


def _check_text(text, name: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be str, got {type(text).__name__}")


def _raise_unencodable(texts: Sequence[str], n_first: int) -> None:
    for i, t in enumerate(texts):
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as exc:
            name = f"text {i}" if i < n_first else f"text_pair {i - n_first}"
            raise UserError(
                f"{name} cannot be encoded as UTF-8: U+{ord(t[exc.start]):04X} at index {exc.start} is a lone "
                f"surrogate (was the text decoded with errors='surrogateescape'?)"
            ) from None


def _as_list(ids):  # accept tensors and numpy arrays as well as lists
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)


def _texts(text, text_pair) -> Tuple[bool, List[str], Optional[List[str]]]:
    """``(single, texts, pairs)`` from a call's first two arguments, each text checked."""
    if isinstance(text, str):
        if text_pair is not None:
            _check_text(text_pair, "text_pair")
        return True, [text], None if text_pair is None else [text_pair]
    if not isinstance(text, (list, tuple)):
        raise TypeError(f"text must be a str or a list of str, got {type(text).__name__}")
    texts = list(text)
    if text_pair is None and texts and all(isinstance(t, (list, tuple)) and len(t) == 2 for t in texts):
        texts, text_pair = [t[0] for t in texts], [t[1] for t in texts]  # a list of (text, pair)
    for i, t in enumerate(texts):
        _check_text(t, f"text[{i}]")
    if text_pair is None:
        return False, texts, None
    if isinstance(text_pair, str) or not isinstance(text_pair, (list, tuple)):
        raise TypeError(f"text_pair must be a list of str when text is a list, got {type(text_pair).__name__}")
    if len(text_pair) != len(texts):
        raise UserError(f"got {len(texts)} texts but {len(text_pair)} text_pairs")
    for i, t in enumerate(text_pair):
        _check_text(t, f"text_pair[{i}]")
    return False, texts, list(text_pair)


def _strategies(padding, truncation, max_length, model_max_length: int) -> Tuple[Optional[str], Optional[str], Optional[int]]:
    """transformers' rules: ``max_length`` alone turns truncation on; a missing ``max_length``
    is the model's for ``padding="max_length"`` and for truncation."""
    if max_length is not None and padding is False and truncation is None:
        truncation = "longest_first"
    if not isinstance(padding, (bool, str, type(None))) or padding not in _PADDING:
        raise UserError(f"padding must be True, False, 'longest', 'max_length' or 'do_not_pad', got {padding!r}")
    if not isinstance(truncation, (bool, str, type(None))) or truncation not in _TRUNCATION:
        raise UserError(f"truncation must be True, False, 'longest_first', 'only_first', 'only_second' or "
                        f"'do_not_truncate', got {truncation!r}")
    pad, cut = _PADDING[padding], _TRUNCATION[truncation]
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise UserError(f"max_length must be a positive int, got {max_length!r}")
    if pad == "longest" and cut is None and max_length is not None:
        logger.warning("max_length=%d is ignored: padding=True pads to the longest in the batch and truncation is off "
                       "(pass padding='max_length' to pad to it, truncation=True to cut at it)", max_length)
    if max_length is None and (pad == "max_length" or cut is not None):
        max_length = model_max_length
    return pad, cut, max_length


class TransformersStyle:
    """The ``transformers`` tokenizer interface: calling, ``tokenize``, ``convert_tokens_to_ids``,
    ``convert_ids_to_tokens``, ``vocab`` / ``get_vocab``, ``len``, ``pad_token_id``,
    ``model_max_length``.

    For a tokenizer whose backend is ``self._tok`` (a ``tokenizers.Tokenizer``) and which
    defines ``_call_encode``, ``max_length``, ``pad_token``, ``unk_token`` and, if it has
    segments, ``model_input_names``. Only the arguments listed in :meth:`__call__` are
    accepted; any other (``return_offsets_mapping``, ``stride``, ...) is an error, not ignored
    (the offsets and word ids are in :attr:`BatchEncoding.encodings`)."""

    model_input_names: Tuple[str, ...] = ("input_ids", "attention_mask")

    def _call_encode(self, texts: List[str], pairs: Optional[List[str]], add_special_tokens: bool,
                     max_length: Optional[int], truncation: Optional[str]) -> List[Encoding]:
        """Encode a list of texts (or pairs), cut to ``max_length`` with ``truncation`` (None:
        not cut, and ``max_length`` is None)."""
        raise NotImplementedError

    def __call__(self, text: Union[str, Sequence[str]], text_pair: Union[str, Sequence[str], None] = None, *,
                 add_special_tokens: bool = True, padding: Union[bool, str] = False,
                 truncation: Union[bool, str, None] = None, max_length: Optional[int] = None,
                 pad_to_multiple_of: Optional[int] = None, return_tensors: Optional[str] = None,
                 return_token_type_ids: Optional[bool] = None, return_attention_mask: Optional[bool] = None,
                 **unsupported) -> BatchEncoding:
        """Encode a text, a list of texts, or (WordPiece) pairs, as transformers' tokenizers do.

        Args:
            text: a str, a list of str, or a list of ``(text, pair)`` tuples.
            text_pair: the second text(s) of pairs: a str for a str ``text``, else a list.
            add_special_tokens: add ``[CLS]``/``[SEP]`` (WordPiece; byte-level BPE has none).
            padding: ``True``/``"longest"`` (to the longest in the batch), ``"max_length"`` (to
                ``max_length``, or the model's), ``False`` (none). Right padding.
            truncation: ``True``/``"longest_first"``, ``"only_first"``, ``"only_second"``, or
                ``False``. ``None`` (the default) means False, unless ``max_length`` is given
                and ``padding`` is False, which turns it on (transformers' rule).
            max_length: length limit with special tokens; default: :attr:`model_max_length`.
            pad_to_multiple_of: round the padded length up to a multiple of this.
            return_tensors: ``None`` (lists), ``"pt"`` (``torch.LongTensor (batch, seq)``) or
                ``"np"`` (``int64`` arrays ``(batch, seq)``; unpadded rows of different lengths:
                an object array of ``(seq_i,)`` arrays, as transformers). A single str still
                gives ``(1, seq)``.
            return_token_type_ids, return_attention_mask: include those keys (default: as
                :attr:`model_input_names`).

        Returns:
            A :class:`BatchEncoding` with ``input_ids``, ``token_type_ids`` (WordPiece) and
            ``attention_mask``; lists are flat for a single str with ``return_tensors=None``.

        Raises:
            UserError: (a ``ValueError``) padding without a pad token (GPT-2: set
                ``tok.pad_token = tok.eos_token``), an unknown argument or value, rows of
                different lengths with ``return_tensors="pt"``, a pair that cannot be
                truncated as asked.
            TypeError: a text that is not a str.
        """
        if unsupported:
            raise UserError(f"unsupported tokenizer argument(s) {sorted(unsupported)}; ctxkit accepts text, text_pair, "
                            f"add_special_tokens, padding, truncation, max_length, pad_to_multiple_of, return_tensors, "
                            f"return_token_type_ids, return_attention_mask")
        if return_tensors not in _TENSOR_TYPES:
            raise UserError(f"return_tensors must be None, 'pt' or 'np', got {return_tensors!r}")
        single, texts, pairs = _texts(text, text_pair)
        pad, cut, limit = _strategies(padding, truncation, max_length, self.model_max_length)
        if pad is not None and self.pad_token_id is None:
            raise UserError("asked to pad but the tokenizer has no pad token; set one, e.g. "
                            "tokenizer.pad_token = tokenizer.eos_token")
        if pad_to_multiple_of is not None and (not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1):
            raise UserError(f"pad_to_multiple_of must be a positive int, got {pad_to_multiple_of!r}")
        if cut and pad and pad_to_multiple_of and limit % pad_to_multiple_of:
            raise UserError(f"truncation length ({limit}) is not a multiple of pad_to_multiple_of ({pad_to_multiple_of})")
        rows = self._call_encode(texts, pairs, add_special_tokens, limit if cut else None, cut)
        too_long = max((len(r) for r in rows), default=0)
        if cut is None and too_long > self.model_max_length:
            logger.warning("a sequence is %d tokens long, more than this model's %d; running it through the model "
                           "will fail (pass truncation=True)", too_long, self.model_max_length)
        if pad is not None and rows:
            target = limit if pad == "max_length" else max(len(r) for r in rows)
            if pad_to_multiple_of:
                target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
            rows = [r.padded(target, self.pad_token_id, self.pad_token) for r in rows]
        names = [n for n in self.model_input_names
                 if not (n == "token_type_ids" and return_token_type_ids is False)
                 and not (n == "attention_mask" and return_attention_mask is False)]
        if return_token_type_ids and "token_type_ids" not in names:
            names.insert(1, "token_type_ids")
        if return_attention_mask and "attention_mask" not in names:
            names.append("attention_mask")
        data = {n: [getattr(r, n) for r in rows] for n in names}
        if return_tensors is not None:
            data = _as_tensors(data, len(rows), return_tensors)
        elif single:
            data = {n: v[0] for n, v in data.items()}
        return BatchEncoding(data, rows)

    @property
    def model_max_length(self) -> int:
        """The default ``max_length`` of :meth:`__call__` (transformers' name for :attr:`max_length`)."""
        return self.max_length

    @property
    def pad_token_id(self) -> Optional[int]:
        """Id of :attr:`pad_token`; None without one."""
        return None if self.pad_token is None else self._tok.token_to_id(self.pad_token)

    @property
    def vocab(self) -> Dict[str, int]:
        """Token -> id, special tokens included (a new dict; transformers' ``tokenizer.vocab``)."""
        return self.get_vocab()

    def get_vocab(self) -> Dict[str, int]:
        """Token -> id mapping, special tokens included."""
        return self._tok.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def tokenize(self, text: str) -> List[str]:
        """Token strings of ``text``, without special tokens and without truncation.

        Raises:
            TypeError: ``text`` is not a str.
        """
        _check_text(text, "text")
        return self._call_encode([text], None, False, None, None)[0].tokens

    def convert_tokens_to_ids(self, tokens: Union[str, Sequence[str], None]):
        """Id of a token (a str gives an int, a list a list); a token outside the vocabulary
        gets the id of :attr:`unk_token`, as in transformers."""
        if tokens is None:
            return None
        unk = self._tok.token_to_id(self.unk_token) if self.unk_token is not None else None

        def one(token):
            _check_text(token, "token")
            i = self._tok.token_to_id(token)
            return unk if i is None else i

        return one(tokens) if isinstance(tokens, str) else [one(t) for t in tokens]

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        """Token strings of ids (an int gives a str; a list, tensor or array a list).

        Raises:
            UserError: an id outside the vocabulary (transformers returns None there).
        """
        if isinstance(ids, int) or (hasattr(ids, "ndim") and ids.ndim == 0):
            return self.convert_ids_to_tokens([int(ids)])[0]
        ids = [int(i) for i in _as_list(ids)]
        if skip_special_tokens:
            special = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
            ids = [i for i in ids if i not in special]
        out = [self._tok.id_to_token(i) for i in ids]
        if None in out:
            raise UserError(f"id {ids[out.index(None)]} is outside the vocabulary (size {len(self)})")
        return out

    def batch_decode(self, sequences, skip_special_tokens: bool = False, **unsupported) -> List[str]:
        """``decode`` of every row (a list of id lists, a 2-D tensor or array), as transformers'.

        Raises:
            UserError: an argument transformers has and this does not (named, not ignored).
        """
        if unsupported:
            raise UserError(f"batch_decode: unsupported argument(s) {', '.join(sorted(unsupported))}")
        rows = sequences.tolist() if hasattr(sequences, "tolist") else list(sequences)
        return [self.decode([int(i) for i in _as_list(row)], skip_special_tokens=skip_special_tokens) for row in rows]

    def save_pretrained(self, directory) -> Path:
        """Write the tokenizer's files into ``directory`` in the layout transformers reads
        (``AutoTokenizer.from_pretrained(directory)`` loads them); returns the folder."""
        return self.save(directory)

    def push_to_hub(self, repo_id: str, *, private=None, commit_message=None, revision=None, token=None) -> str:
        """Upload the tokenizer's files to the Hub repository ``repo_id`` (created if needed) in one
        commit; returns the commit's URL."""
        with tempfile.TemporaryDirectory(prefix="ctxkit-push-") as tmp:
            self.save_pretrained(tmp)
            return push_folder(Path(tmp), repo_id, private=private, commit_message=commit_message, revision=revision, token=token)

    @classmethod
    def from_pretrained(cls, name_or_path, revision: Optional[str] = None):
        """The tokenizer of a folder (a run folder: its ``best/``) or of a Hub repository
        (fetched into the Hugging Face cache; ``ctxkit.AutoTokenizer`` takes every zoo name too)."""
        path = Path(name_or_path)
        if path.is_dir():
            own = any((path / f).is_file() for f in ("vocab.txt", "vocab.json", "tokenizer.json"))
            return cls.from_dir(path if own or not (path / "best").is_dir() else path / "best")
        if "/" in str(name_or_path) and is_hub_id(str(name_or_path)):  # org/name
            return cls.from_dir(hub_snapshot(str(name_or_path), revision))
        raise UserError(f"{name_or_path!r}: not a folder or a Hub id (ctxkit.AutoTokenizer.from_pretrained takes zoo names too)")


def _as_tensors(data: Dict[str, list], n: int, kind: str) -> Dict[str, Any]:
    """``(n, seq)`` tensors; ragged rows are an error for ``"pt"`` and, as in transformers, a
    1-D object array of int64 arrays for ``"np"``."""
    ragged = len({len(v) for values in data.values() for v in values}) > 1
    if kind == "pt":
        import torch  # lazy: plain tokenization does not need torch

        if ragged:
            raise UserError("cannot make a tensor of sequences of different lengths; pass padding=True "
                            "(and truncation=True for inputs longer than max_length)")
        return {k: torch.tensor(v, dtype=torch.long).reshape(n, len(v[0]) if n else 0) for k, v in data.items()}
    import numpy as np  # lazy: only return_tensors="np" needs numpy

    if ragged:
        def rows(values):
            out = np.empty(len(values), dtype=object)
            out[:] = [np.array(v, dtype=np.int64) for v in values]
            return out

        return {k: rows(v) for k, v in data.items()}
    return {k: np.array(v, dtype=np.int64).reshape(n, len(v[0]) if n else 0) for k, v in data.items()}
