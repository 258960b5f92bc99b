"""BERT WordPiece tokenizer: a thin layer over the Hugging Face ``tokenizers`` library.

All algorithms come from ``tokenizers``; this module adds HF-compatible I/O,
truncation that is never silent, input validation and PyTorch batching.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence, Union

from tokenizers import (
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from tokenizers.models import WordPiece

from .batch import NO_LIMIT, Encoding, TransformersStyle, _as_list, _check_text, _raise_unencodable
from .bulk import PrefixBudget, capped_ids, cuts_at_spaces
from ..core.errors import MissingFileError, UserError, quote
from ..data.blocks import TokenBlock
from ..data.errors import check_input, open_input, require_rereadable
from ..data.errors import raw_lines as _file_lines
from ..data.lines import decode_lines, read_lines  # noqa: F401  (read_lines: ctxkit.tokenizers re-exports it)

PathLike = Union[str, os.PathLike]
PAD, UNK, CLS, SEP, MASK = SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")
PADDING_STRATEGIES = ("longest", "max_length")
logger = logging.getLogger("ctxkit")
# HF stores int(1e30) as model_max_length when a checkpoint declares no limit.
_NO_LIMIT_SENTINEL = 10**12


def read_json_object(path: PathLike) -> dict:
    """A small JSON settings file (``tokenizer_config.json``, ``config.json``) as a dict.

    Raises:
        UserError: ``PATH:LINE:COL: malformed JSON: ...``, invalid UTF-8, or not an object.
    """
    with open_input(path) as fh:
        data = fh.read()
    try:
        value = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: invalid UTF-8 ({err.reason})") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path}:{err.lineno}:{err.colno}: malformed JSON: {err.msg}") from None
    except (RecursionError, ValueError) as err:  # nested too deeply; an integer with too many digits
        raise UserError(f"{path}: malformed JSON: {str(err).split(';')[0]}") from None
    if not isinstance(value, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def load_tokenizer_json(path: PathLike) -> Tokenizer:
    """``tokenizers.Tokenizer.from_file`` whose failures name the file (a ``UserError``)."""
    read_json_object(path)  # JSON problems with line and column
    try:
        return Tokenizer.from_file(os.fspath(path))
    except Exception as exc:  # tokenizers raises a bare Exception on a bad layout
        raise UserError(f"{path}: not a tokenizers file ({str(exc)[:200]})") from None


def _build_tokenizer(vocab, lowercase, strip_accents, tokenize_chinese_chars, clean_text) -> Tokenizer:
    """Assemble the same component pipeline that BertTokenizerFast uses."""
    tok = Tokenizer(WordPiece(vocab, unk_token=UNK, continuing_subword_prefix="##", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=clean_text, handle_chinese_chars=tokenize_chinese_chars,
        strip_accents=strip_accents, lowercase=lowercase,
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _text_batches(source, batch_size: int) -> Iterator[List[str]]:
    """Stream training text in lists, which tokenizers ingests much faster than single strings."""
    if isinstance(source, (str, os.PathLike)):
        source = [source]
    if isinstance(source, (list, tuple)):
        for p in source:
            if not isinstance(p, (str, os.PathLike)):
                raise TypeError(f"expected file paths in the list, got {type(p).__name__}")
            try:
                check_input(p)  # a regular file, or a FIFO / <(...): training reads each file once
            except MissingFileError:
                raise MissingFileError(f"{p}: no such file (pass iter(lines) to train on strings)") from None
        lines: Iterable[str] = (line for p in source for line in read_lines(p))
    else:
        lines = iter(source)
    while batch := list(itertools.islice(lines, batch_size)):
        bad = next((x for x in batch if not isinstance(x, str)), None)
        if bad is not None:
            raise TypeError(f"training iterator must yield str, got {type(bad).__name__}")
        yield batch


class WordPieceTokenizer(TransformersStyle):
    """BERT WordPiece tokenizer whose ids, offsets and truncation match HF's BertTokenizerFast.

    Build one with :meth:`from_vocab`, :meth:`from_dir` or :meth:`train`. Empty or
    whitespace-only text is valid input and encodes to just ``[CLS] [SEP]``. The
    special tokens are always BERT's ``[PAD] [UNK] [CLS] [SEP] [MASK]``.

    Called like a transformers tokenizer (``tok(texts, padding=True, truncation=True,
    return_tensors="pt")``, with ``tokenize``, ``convert_tokens_to_ids``, ``vocab``: see
    :class:`~ctxkit.tokenizers.batch.TransformersStyle`), it gives BertTokenizerFast's
    ``input_ids``, ``token_type_ids`` and ``attention_mask``.

    Args:
        tokenizer: A ``tokenizers.Tokenizer`` with a WordPiece model and BertNormalizer;
            its post-processor becomes BERT's and its truncation/padding are turned off.
        max_length: Default maximum sequence length, special tokens included.
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int = 512):
        if not isinstance(tokenizer.model, WordPiece):
            raise UserError(f"expected a WordPiece model, got {type(tokenizer.model).__name__}")
        if not isinstance(tokenizer.normalizer, normalizers.BertNormalizer):
            raise UserError(f"expected a BertNormalizer, got {type(tokenizer.normalizer).__name__}")
        if int(max_length) < 3:
            raise UserError(f"max_length must be >= 3 to fit [CLS] x [SEP], got {max_length}")
        missing = [t for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
        if missing:
            raise UserError(f"vocabulary lacks the special token(s) {missing}")
        # As "added" special tokens, a literal "[MASK]" in the input maps to the mask
        # id and decode() can skip them, exactly as in HF.
        tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A {SEP}", pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
            special_tokens=[(CLS, tokenizer.token_to_id(CLS)), (SEP, tokenizer.token_to_id(SEP))],
        )
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tok = tokenizer
        self._max_length = int(max_length)
        # Truncation is a setting on the shared backend object; serialize its use.
        self._lock = threading.Lock()
        self.pad_token, self.unk_token, self.cls_token, self.sep_token, self.mask_token = SPECIAL_TOKENS
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = map(tokenizer.token_to_id, SPECIAL_TOKENS)

    @classmethod
    def from_vocab(cls, vocab_path: PathLike, lowercase: bool = True, strip_accents: Optional[bool] = None,
                   tokenize_chinese_chars: bool = True, clean_text: bool = True,
                   max_length: int = 512) -> "WordPieceTokenizer":
        """Build a tokenizer from a BERT ``vocab.txt`` (one token per line, id = line number).

        Args:
            vocab_path: Path to the vocabulary file.
            lowercase: Lowercase the input (uncased models).
            strip_accents: Remove accents; ``None`` follows ``lowercase`` as in BERT.
            tokenize_chinese_chars: Put spaces around CJK ideographs.
            clean_text: Drop control characters and map all whitespace to spaces.
            max_length: Default maximum sequence length.

        Raises:
            MissingFileError: (a ``FileNotFoundError``) no such file.
            UserError: (a ``ValueError``) invalid UTF-8 (``PATH:LINE: ...``), special tokens
                missing, or a pipe (the file is read twice).
        """
        name = os.fspath(vocab_path)
        require_rereadable(vocab_path, "loading a WordPiece vocabulary")
        for _ in decode_lines(_file_lines(vocab_path, compressed=()), name):  # names the line of a bad byte
            pass
        try:
            vocab = WordPiece.read_file(name)
        except Exception as exc:  # tokenizers raises a bare Exception for I/O problems
            raise UserError(f"{name}: cannot read the vocabulary ({exc})") from None
        missing = [t for t in SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise UserError(f"{name}: the vocabulary lacks the special token(s) {missing}")
        return cls(_build_tokenizer(vocab, lowercase, strip_accents, tokenize_chinese_chars, clean_text), max_length)

    @classmethod
    def from_dir(cls, path: PathLike) -> "WordPieceTokenizer":
        """Load a Hugging Face style tokenizer directory.

        ``vocab.txt`` plus ``tokenizer_config.json`` (``do_lower_case``,
        ``strip_accents``, ``tokenize_chinese_chars``, ``model_max_length``) is
        preferred because its settings are explicit; otherwise ``tokenizer.json`` is
        used. Truncation/padding stored in ``tokenizer.json`` are ignored.

        Raises:
            FileNotFoundError: Neither ``vocab.txt`` nor ``tokenizer.json`` exists.
            UserError: A malformed file, named (with line and column for JSON).
        """
        path = Path(path)
        config = {}
        if (path / "tokenizer_config.json").is_file():
            config = read_json_object(path / "tokenizer_config.json")
        max_length = config.get("model_max_length") or 512
        if isinstance(max_length, bool) or not isinstance(max_length, (int, float)) or max_length < 3:
            raise UserError(f"{path / 'tokenizer_config.json'}: model_max_length must be a number >= 3, "
                            f"got {str(max_length)[:40]}")
        max_length = 512 if max_length > _NO_LIMIT_SENTINEL else int(max_length)
        for name, allowed in (("do_lower_case", (bool,)), ("tokenize_chinese_chars", (bool,)), ("clean_text", (bool,)),
                              ("strip_accents", (bool, type(None)))):
            if name in config and not isinstance(config[name], allowed):
                raise UserError(f"{path / 'tokenizer_config.json'}: {name} must be "
                                f"{'true, false or null' if type(None) in allowed else 'true or false'}, got {quote(config[name])}")
        if (path / "vocab.txt").is_file():
            return cls.from_vocab(
                path / "vocab.txt", lowercase=config.get("do_lower_case", True),
                strip_accents=config.get("strip_accents"),
                tokenize_chinese_chars=config.get("tokenize_chinese_chars", True),
                clean_text=config.get("clean_text", True), max_length=max_length,
            )
        if (path / "tokenizer.json").is_file():
            file = path / "tokenizer.json"
            try:
                return cls(load_tokenizer_json(file), max_length=max_length)
            except UserError as exc:
                if str(exc).startswith(str(file)):
                    raise
                raise UserError(f"{file}: {exc}") from None  # e.g. not a WordPiece model
        raise MissingFileError(f"{path} has neither vocab.txt nor tokenizer.json")

    @classmethod
    def train(cls, files_or_iterator, vocab_size: int = 30522, min_frequency: int = 2, lowercase: bool = True,
              strip_accents: Optional[bool] = None, tokenize_chinese_chars: bool = True, clean_text: bool = True,
              limit_alphabet: int = 1000, show_progress: bool = True, max_length: int = 512,
              batch_size: int = 1000) -> "WordPieceTokenizer":
        """Train a new WordPiece vocabulary with ``tokenizers``' WordPieceTrainer.

        The learned token set is deterministic, but ``tokenizers`` breaks count ties
        in hash order, so the ids of equally frequent tokens may differ between runs.

        Args:
            files_or_iterator: A path, a list/tuple of paths (plain or ``.xz``), or
                any other iterable yielding str. Lists are always read as paths;
                wrap in-memory lines with ``iter()``.
            vocab_size: Target size, special tokens and alphabet included.
            min_frequency: Minimum pair count for a merge.
            lowercase, strip_accents, tokenize_chinese_chars, clean_text: As in
                :meth:`from_vocab`; the normalizer applies to the training text too.
            limit_alphabet: Maximum number of distinct initial characters.
            show_progress: Show the ``tokenizers`` progress bars.
            max_length: Default maximum sequence length of the result.
            batch_size: Lines handed to the trainer at a time.

        Returns:
            A tokenizer whose ids 0..4 are ``[PAD] [UNK] [CLS] [SEP] [MASK]``.
        """
        tok = _build_tokenizer({}, lowercase, strip_accents, tokenize_chinese_chars, clean_text)
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, show_progress=show_progress,
            special_tokens=list(SPECIAL_TOKENS), limit_alphabet=limit_alphabet, continuing_subword_prefix="##",
        )
        tok.train_from_iterator(_text_batches(files_or_iterator, batch_size), trainer=trainer)
        return cls(tok, max_length=max_length)

    def save(self, directory: PathLike) -> Path:
        """Write ``vocab.txt``, ``tokenizer.json`` and ``tokenizer_config.json``.

        The directory loads with :meth:`from_dir` and with
        ``transformers.BertTokenizerFast.from_pretrained``. HF's config has no
        ``clean_text`` switch; that key is only read back by :meth:`from_dir`.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        by_id = sorted(self.get_vocab().items(), key=lambda kv: kv[1])
        if [i for _, i in by_id] != list(range(len(by_id))):
            raise UserError("vocabulary ids are not contiguous; cannot write vocab.txt")
        with open(directory / "vocab.txt", "w", encoding="utf-8", newline="\n") as fh:
            fh.writelines(tok + "\n" for tok, _ in by_id)
        self._tok.save(str(directory / "tokenizer.json"))
        config = {
            "tokenizer_class": "BertTokenizer", "do_lower_case": self.lowercase,
            "strip_accents": self.strip_accents, "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "clean_text": self.clean_text, "do_basic_tokenize": True, "never_split": None,
            "model_max_length": self.max_length,
            "unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS, "mask_token": MASK,
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        return directory

    backend = property(lambda self: self._tok, doc="The underlying ``tokenizers.Tokenizer`` (read-only use).")
    vocab_size = property(lambda self: self._tok.get_vocab_size(with_added_tokens=True), doc="Number of tokens.")
    max_length = property(lambda self: self._max_length, doc="Default max sequence length.")
    lowercase = property(lambda self: self._tok.normalizer.lowercase, doc="Whether input is lowercased.")
    strip_accents = property(lambda self: self._tok.normalizer.strip_accents, doc="None = follow lowercase.")
    tokenize_chinese_chars = property(lambda self: self._tok.normalizer.handle_chinese_chars)
    clean_text = property(lambda self: self._tok.normalizer.clean_text)

    def token_to_id(self, token: str) -> Optional[int]:
        """Id of ``token``, or ``None`` if it is not in the vocabulary."""
        return self._tok.token_to_id(token)

    def id_to_token(self, id: int) -> Optional[str]:
        """Token string for ``id``, or ``None`` if out of range."""
        return self._tok.id_to_token(int(id))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Turn ids (a list or 1-D tensor) back into text, joining ``##`` continuations."""
        return self._tok.decode([int(i) for i in _as_list(ids)], skip_special_tokens=skip_special_tokens)

    def encode(self, text: str, text_pair: Optional[str] = None, max_length: Optional[int] = None,
               truncation: Union[str, bool, None] = "longest_first", add_special_tokens: bool = True) -> Encoding:
        """Encode one text or text pair.

        The result is ctxkit's rich :class:`Encoding` (ids, segments, offsets, word ids, what was
        truncated), which every ctxkit caller reads by attribute, and it is also the list of its
        ``input_ids``: ``len(e)``, ``for i in e``, ``e[0]``, ``e + [0] * k`` (a plain list) and
        ``e == [101, ...]`` act on the ids. So transformers' habit ``ids = tok.encode(text,
        add_special_tokens=True)`` followed by list arithmetic (padding by hand, ``len(ids)``,
        ``np.array``, ``torch.tensor``) works unchanged, while no ctxkit caller gets anything
        new: one return type, rather than a second method (which the habit would not call) or
        a flag that changes the type (which every reader of the call would have to check).
        Where the difference shows: ``isinstance(e, list)`` is False, and ``e.append`` does
        not exist (``list(e)`` or ``e.input_ids`` is the plain list).

        Args:
            text: The (first) text. Empty/whitespace-only text gives ``[CLS] [SEP]``.
            text_pair: Optional second text (segment 1).
            max_length: Length limit including special tokens; defaults to
                :attr:`max_length`.
            truncation: ``"longest_first"`` (or ``True``), ``"only_first"``, ``"only_second"``
                (HF semantics), ``"error"``/``None`` to raise instead of cutting, or ``False``
                for no limit at all (``max_length`` ignored).
            add_special_tokens: Add ``[CLS]``/``[SEP]``.

        Returns:
            An :class:`Encoding` (``len`` tokens); its ``num_truncated`` says how much was cut.

        Raises:
            TypeError: ``text`` or ``text_pair`` is not a str.
            ValueError: Lone surrogates (not UTF-8 encodable); or too long while truncation
                is ``"error"``/``None`` or cannot reach the limit (e.g. a short 2nd text).
        """
        _check_text(text, "text")
        if text_pair is not None:
            _check_text(text_pair, "text_pair")
        if truncation is True:
            truncation = "longest_first"
        elif truncation is False:
            max_length, truncation = NO_LIMIT, None
        pairs = None if text_pair is None else [text_pair]
        return self._encode_many([text], pairs, max_length, truncation, add_special_tokens)[0]

    def encode_batch(self, texts: Sequence[str], text_pairs: Optional[Sequence[str]] = None,
                     max_length: Optional[int] = None, truncation: Optional[str] = "longest_first",
                     padding: Optional[str] = "longest", return_tensors: Optional[str] = None,
                     add_special_tokens: bool = True):
        """Encode many texts or pairs in parallel with the ``tokenizers`` batch API.

        Args:
            texts: Sequence of str.
            text_pairs: Optional second texts, as many as ``texts``.
            max_length: As in :meth:`encode`; also the target of ``padding="max_length"``.
            truncation: As in :meth:`encode`.
            padding: ``"longest"`` (longest in the batch), ``"max_length"`` or ``None``.
                Padding is on the right with ``[PAD]`` and applies to the returned
                Encodings too (pad positions: mask 0, offsets (0, 0), ids None).
            return_tensors: ``None`` to get a list of :class:`Encoding`; ``"pt"`` to
                get a dict of LongTensors ``input_ids``, ``token_type_ids``,
                ``attention_mask`` plus that list under ``encodings``.
            add_special_tokens: As in :meth:`encode`.

        Raises:
            TypeError: ``texts`` is not a list/tuple of str (a bare str is refused).
            ValueError: As in :meth:`encode`, naming the failing input; also for bad
                arguments, or ragged lengths with ``padding=None, return_tensors="pt"``.
        """
        for name, seq in (("texts", texts), ("text_pairs", text_pairs)):
            if seq is None:
                continue
            if isinstance(seq, str) or not isinstance(seq, Sequence):
                raise TypeError(f"{name} must be a list/tuple of str, got {type(seq).__name__}")
            for i, t in enumerate(seq):
                _check_text(t, f"{name}[{i}]")
        if text_pairs is not None and len(text_pairs) != len(texts):
            raise UserError(f"got {len(texts)} texts but {len(text_pairs)} text_pairs")
        if padding not in (None,) + PADDING_STRATEGIES:
            raise UserError(f"padding must be one of {PADDING_STRATEGIES} or None, got {padding!r}")
        if return_tensors not in (None, "pt"):
            raise UserError(f"return_tensors must be None or 'pt', got {return_tensors!r}")
        raw = self._encode_many(list(texts), text_pairs, max_length, truncation, add_special_tokens, keep_raw=True)
        if padding is not None and raw:
            target = self._limit(max_length) if padding == "max_length" else max(len(e) for e, _ in raw)
            for enc, _ in raw:
                enc.pad(target, direction="right", pad_id=self.pad_id, pad_type_id=0, pad_token=PAD)
        out = [Encoding.from_backend(enc, n) for enc, n in raw]
        if return_tensors is None:
            return out
        if len({len(e) for e in out}) > 1:
            raise UserError("cannot stack sequences of different lengths into a tensor; pass padding='longest'")
        import torch  # lazy: plain tokenization does not need torch (imported for return_tensors='pt')

        def stack(field):
            return torch.tensor([getattr(e, field) for e in out], dtype=torch.long).reshape(len(out), -1)

        return {"input_ids": stack("input_ids"), "token_type_ids": stack("token_type_ids"),
                "attention_mask": stack("attention_mask"), "encodings": out}

    model_input_names = ("input_ids", "token_type_ids", "attention_mask")

    def _call_encode(self, texts, pairs, add_special_tokens, max_length, truncation) -> List[Encoding]:
        """:meth:`__call__`'s encoder: ``truncation=None`` is no limit at all, as in transformers."""
        if truncation is None:
            max_length = NO_LIMIT
        return self._encode_many(texts, pairs, max_length, truncation, add_special_tokens)

    def _limit(self, max_length: Optional[int]) -> int:
        return self._max_length if max_length is None else int(max_length)

    def _encode_many(self, texts, pairs, max_length, truncation, add_special_tokens, keep_raw=False):
        limit = self._limit(max_length)
        if truncation not in (None, "error") + TRUNCATION_STRATEGIES:
            raise UserError(f"truncation must be one of {TRUNCATION_STRATEGIES}, 'error' or None, got {truncation!r}")
        inputs = list(texts) if pairs is None else list(zip(texts, pairs))
        where = (lambda i: "input") if len(inputs) == 1 else (lambda i: f"input {i}")
        n_special = self._tok.num_special_tokens_to_add(pairs is not None) if add_special_tokens else 0
        if pairs is None and truncation in ("longest_first", "only_first") and limit > n_special and self._overflow_counts():
            return self._encode_singles_cut(inputs, limit, truncation, n_special, add_special_tokens, keep_raw)
        with self._lock:
            # An untruncated first pass yields the true lengths (so truncation is never
            # silent) and, for the usual short inputs, already the final result.
            encs = self._run(inputs, add_special_tokens, texts, pairs)
            full = [len(e) for e in encs]
            long_idx = [i for i, n in enumerate(full) if n > limit]
            if long_idx and truncation not in TRUNCATION_STRATEGIES:
                i = long_idx[0]
                raise UserError(
                    f"{where(i)} is {full[i]} tokens long (special tokens included), exceeding max_length={limit}; "
                    f"pass truncation='longest_first' (or 'only_first'/'only_second') to cut it"
                )
            if long_idx and limit < n_special:
                # tokenizers would silently return the input uncut in this case.
                raise UserError(f"max_length={limit} is smaller than the {n_special} special tokens to add")
            if long_idx:
                # Overlong inputs are re-encoded through the same truncation code HF
                # uses, so ids, offsets and sequence ids match it exactly.
                self._tok.enable_truncation(limit, stride=0, strategy=truncation, direction="right")
                try:
                    cut = self._run([inputs[i] for i in long_idx], add_special_tokens, texts, pairs)
                except Exception:  # tokenizers raises a bare Exception; find the culprit
                    for i in long_idx:
                        try:
                            self._tok.encode(*_as_args(inputs[i]), add_special_tokens=add_special_tokens)
                        except Exception as exc:
                            seq = encs[i].sequence_ids
                            sizes = f"first text {seq.count(0)} tokens"
                            sizes += "" if pairs is None else f", second text {seq.count(1)} tokens"
                            raise UserError(f"{where(i)} ({sizes}) cannot be truncated to max_length={limit} "
                                             f"with truncation={truncation!r}: {exc}") from None
                    raise
                finally:
                    self._tok.no_truncation()
                for i, enc in zip(long_idx, cut):
                    if len(enc) > limit:  # never hand back an over-limit result unnoticed
                        raise UserError(f"{where(i)} could not be truncated to max_length={limit}")
                    encs[i] = enc
                # Recorded per Encoding too; the log line makes the cut visible to callers
                # who never look at num_truncated.
                logger.warning(
                    "truncated %d of %d inputs to max_length=%d (%s); %d tokens removed in total",
                    len(long_idx), len(inputs), limit, truncation, sum(full[i] - len(encs[i]) for i in long_idx),
                )
        raw = [(enc, n - len(enc)) for enc, n in zip(encs, full)]
        return raw if keep_raw else [Encoding.from_backend(enc, n) for enc, n in raw]

    def encode_ids(self, texts: Sequence[str], max_length: Optional[int] = None) -> List[List[int]]:
        """Token ids of single texts, special tokens included, each cut from the right to
        ``max_length``: the ``input_ids`` of :meth:`encode_batch` with
        ``truncation="longest_first"``, for featurizing many texts at once (``predict``,
        ``serve``). No :class:`Encoding` objects, no count of the removed tokens: one warning
        says how many texts were cut.

        A text is tokenized with room for one token more than ``max_length``: one that fills
        it was longer, and dropping its last content token is exactly truncation's result,
        without reading the cut-off pieces. Of a long text only a prefix is tokenized where
        that is exact (:mod:`ctxkit.tokenizers.bulk`).
        """
        rows, cut = self._ids_and_cut(texts, max_length)
        if cut:
            logger.warning("truncated %d of %d inputs to max_length=%d (longest_first)", cut, len(rows), self._limit(max_length))
        return rows

    def encode_block(self, texts: Sequence[str], max_length: Optional[int] = None) -> TokenBlock:
        """:meth:`encode_ids` as one :class:`~ctxkit.data.blocks.TokenBlock` (a padded id array,
        the lengths and how many texts were cut, which the caller reports): inference over many
        single texts without per-text objects."""
        rows, cut = self._ids_and_cut(texts, max_length)
        return TokenBlock.from_ids(rows, truncated=cut)

    def _ids_and_cut(self, texts: Sequence[str], max_length: Optional[int]) -> tuple:
        limit = self._limit(max_length)
        front, back = self._special_ends()
        if limit <= front + back:  # nothing but special tokens fits: the general path says what is wrong
            encs = self.encode_batch(texts, max_length=limit, truncation="longest_first", padding=None)
            return [e.input_ids for e in encs], 0
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise TypeError(f"texts must be a list/tuple of str, got {type(texts).__name__}")
        for i, t in enumerate(texts):
            _check_text(t, f"texts[{i}]")
        with self._lock:
            self._tok.enable_truncation(limit + 1, stride=0, strategy="longest_first", direction="right")
            try:
                rows = capped_ids(lambda inputs: self._run_fast(inputs, texts), texts, limit + 1, limit + 1 - front - back,
                                  self._prefix_budget())
            finally:
                self._tok.no_truncation()
        out, cut = [], 0
        for ids in rows:
            if len(ids) > limit:
                ids, cut = ids[:limit - back] + ids[len(ids) - back:], cut + 1
            out.append(ids)
        return out, cut

    def _prefix_budget(self) -> Optional[PrefixBudget]:
        """How long a prefix of a long text to tokenize (:mod:`ctxkit.tokenizers.bulk`), or None
        when this pipeline's tokens of a prefix are not a prefix of the text's tokens."""
        if "_budget" not in self.__dict__:
            self._budget = PrefixBudget() if cuts_at_spaces(self._tok) else None
        return self._budget

    def _run_fast(self, inputs: List[str], texts) -> list:
        """Encodings of single texts without character offsets (``encode_batch_fast``, where
        this ``tokenizers`` has it: the ids are the same, the offsets are not computed)."""
        fast = getattr(self._tok, "encode_batch_fast", None)
        if fast is None or len(inputs) == 1:
            return self._run(inputs, True, texts, None)
        try:
            return fast(inputs, add_special_tokens=True)
        except TypeError:
            _raise_unencodable(list(texts), len(texts))
            raise

    def _special_ends(self) -> tuple:
        """How many special tokens a single text gets before and after its own (BERT: 1, 1)."""
        ends = self.__dict__.get("_ends")
        if ends is None:
            with self._lock:
                mask = self._tok.encode("a").special_tokens_mask
            front = next((i for i, m in enumerate(mask) if not m), len(mask))
            ends = self._ends = (front, len(mask) - front - sum(1 for m in mask[front:] if not m))
        return ends

    def single_segment_is_zero(self) -> bool:
        """Whether a single text's token type ids are all 0 (BERT's ``[CLS] A [SEP]``
        template), checked once on a probe: then a caller that needs them can write zeros
        instead of reading them from every encoding."""
        ok = self.__dict__.get("_single_zero")
        if ok is None:
            with self._lock:
                ok = self._single_zero = not any(self._tok.encode("a b").type_ids)
        return ok

    def _overflow_counts(self) -> bool:
        """Whether this ``tokenizers`` build reports what truncation cut off (``overflowing``)
        in full, checked once on a probe text: 0.23.2 keeps only a stub of it, so the
        one-pass path below would undercount the removed tokens there."""
        ok = self.__dict__.get("_overflow_ok")
        if ok is None:
            probe = " ".join(["the"] * 60)
            n_special = self._tok.num_special_tokens_to_add(False)
            with self._lock:
                full = len(self._tok.encode(probe))
                self._tok.enable_truncation(n_special + 8, stride=0, strategy="longest_first", direction="right")
                try:
                    cut = self._tok.encode(probe)
                finally:
                    self._tok.no_truncation()
            ok = self._overflow_ok = full - len(cut) == sum(len(o) - n_special for o in cut.overflowing)
        return ok

    def _encode_singles_cut(self, inputs, limit, truncation, n_special, add_special_tokens, keep_raw):
        """Single texts cut to ``limit`` in one pass (what :meth:`_encode_many` gives, at half
        the cost for long inputs): tokenizers truncates, and the pieces it cut off
        (``overflowing``, each with its own special tokens) count the removed tokens."""
        with self._lock:
            self._tok.enable_truncation(limit, stride=0, strategy=truncation, direction="right")
            try:
                encs = self._run(inputs, add_special_tokens, inputs, None)
            finally:
                self._tok.no_truncation()
        removed = [sum(len(o) - n_special for o in enc.overflowing) if len(enc) == limit else 0 for enc in encs]
        cut = sum(n > 0 for n in removed)
        if cut:
            logger.warning("truncated %d of %d inputs to max_length=%d (%s); %d tokens removed in total",
                           cut, len(inputs), limit, truncation, sum(removed))
        raw = list(zip(encs, removed))
        return raw if keep_raw else [Encoding.from_backend(enc, n) for enc, n in raw]

    def _run(self, inputs, add_special_tokens, texts, pairs):
        try:
            if len(inputs) == 1:  # skip the thread-pool round trip for a single input
                return [self._tok.encode(*_as_args(inputs[0]), add_special_tokens=add_special_tokens)]
            return self._tok.encode_batch(inputs, add_special_tokens=add_special_tokens)
        except TypeError:
            # Types were checked already, so this is tokenizers refusing a str that
            # is not valid Unicode; its own message does not say so.
            _raise_unencodable(list(texts) + list(pairs or []), len(texts))
            raise


def _as_args(item):  # encode() takes a pair as two arguments, encode_batch() as a tuple
    return item if isinstance(item, tuple) else (item,)
