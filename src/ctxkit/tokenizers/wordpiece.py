"""BERT-style WordPiece tokenizer built on the Hugging Face ``tokenizers`` library.

The heavy lifting (normalization, pre-tokenization, WordPiece, training) is done
by ``tokenizers``; this module adds a small, explicit API on top of it: HF-compatible
loading/saving, truncation that is never silent, input validation, and batching
into PyTorch tensors.
"""

from __future__ import annotations

import json
import lzma
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
from tokenizers.models import WordPiece

PathLike = Union[str, os.PathLike]

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")
PADDING_STRATEGIES = ("longest", "max_length")
# HF writes int(1e30) as model_max_length when a checkpoint has no real limit.
_NO_LIMIT_SENTINEL = 10**12


def read_lines(path: PathLike) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file, optionally ``.xz`` compressed.

    Lines are decoded one by one in binary mode so that a bad byte is reported
    with its exact location instead of a bare ``UnicodeDecodeError``. Trailing
    ``\\n`` / ``\\r\\n`` are removed and a UTF-8 byte-order mark at the start of the
    file is dropped (some GLUE files carry one).

    Args:
        path: File to read. A name ending in ``.xz`` is decompressed on the fly.

    Yields:
        Each line without its line terminator.

    Raises:
        ValueError: ``"{path}:{line_no}: invalid UTF-8 ..."`` on undecodable bytes
            (raised lazily, when the offending line is reached).
    """
    opener = lzma.open if str(path).endswith(".xz") else open
    with opener(path, "rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{path}:{line_no}: invalid UTF-8 at byte {exc.start} of the line "
                    f"({raw[exc.start:exc.start + 4]!r}): {exc.reason}"
                ) from None
            yield line.rstrip("\n").rstrip("\r")


@dataclass
class Encoding:
    """One encoded example (a single text or a text pair).

    Attributes:
        input_ids: Token ids, including [CLS]/[SEP] when special tokens are added.
        token_type_ids: Segment ids (0 for the first text, 1 for the second).
        attention_mask: 1 for real tokens, 0 for padding.
        offsets: ``(start, end)`` character offsets into the original text of the
            token's own segment; ``(0, 0)`` for special and padding tokens.
        tokens: Token strings.
        word_ids: Index of the pre-tokenized word each token came from (counted
            per segment), ``None`` for special and padding tokens.
        sequence_ids: 0 or 1 for tokens of the first/second text, else ``None``.
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

    @property
    def truncated(self) -> bool:
        """Whether truncation removed any token."""
        return self.num_truncated > 0

    def __len__(self) -> int:
        return len(self.input_ids)


def _build_tokenizer(vocab, lowercase, strip_accents, tokenize_chinese_chars, clean_text) -> Tokenizer:
    """Assemble the component pipeline that BertTokenizerFast uses."""
    model = WordPiece(vocab, unk_token=UNK, continuing_subword_prefix="##", max_input_chars_per_word=100)
    tok = Tokenizer(model)
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=clean_text,
        handle_chinese_chars=tokenize_chinese_chars,
        strip_accents=strip_accents,
        lowercase=lowercase,
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _finish_tokenizer(tok: Tokenizer) -> None:
    """Register special tokens and the [CLS]/[SEP] template once ids are known."""
    missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if missing:
        raise ValueError(f"vocabulary lacks the special token(s) {missing}; BERT needs {list(SPECIAL_TOKENS)}")
    # Special tokens must be "added tokens" so that e.g. a literal "[MASK]" in the
    # input maps to the mask id and decode() can skip them, as in HF.
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}",
        pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, tok.token_to_id(CLS)), (SEP, tok.token_to_id(SEP))],
    )


def _text_batches(source, batch_size: int) -> Iterator[List[str]]:
    """Stream training text in lists, which tokenizers consumes much faster than single strings."""
    if isinstance(source, (str, os.PathLike)):
        source = [source]
    if isinstance(source, (list, tuple)):
        paths = list(source)
        for p in paths:
            if not isinstance(p, (str, os.PathLike)):
                raise TypeError(f"expected file paths in the list, got {type(p).__name__}")
            if not os.path.isfile(p):
                raise FileNotFoundError(
                    f"training file not found: {p!s} (to train on in-memory strings pass an iterator, e.g. iter(lines))"
                )
        lines: Iterable[str] = (line for p in paths for line in read_lines(p))
    else:
        lines = source
    batch: List[str] = []
    for line in lines:
        if not isinstance(line, str):
            raise TypeError(f"training iterator must yield str, got {type(line).__name__}")
        batch.append(line)
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


class WordPieceTokenizer:
    """BERT WordPiece tokenizer with HF-identical ids, offsets and truncation.

    Build one with :meth:`from_vocab`, :meth:`from_dir` or :meth:`train`. Empty or
    whitespace-only text is valid and encodes to just ``[CLS] [SEP]``.

    Args:
        tokenizer: A ``tokenizers.Tokenizer`` with a WordPiece model and a
            BertNormalizer; its own truncation/padding settings are disabled because
            this class manages both explicitly.
        max_length: Default maximum sequence length, special tokens included.
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int = 512):
        if not isinstance(tokenizer.model, WordPiece):
            raise ValueError(f"expected a WordPiece model, got {type(tokenizer.model).__name__}")
        norm = tokenizer.normalizer
        if not isinstance(norm, normalizers.BertNormalizer):
            raise ValueError(f"expected a BertNormalizer, got {type(norm).__name__}")
        if int(max_length) < 3:
            raise ValueError(f"max_length must be >= 3 to fit [CLS] x [SEP], got {max_length}")
        _finish_tokenizer(tokenizer)
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tok = tokenizer
        self._max_length = int(max_length)
        # The backend's truncation setting is shared state; serialize its use.
        self._lock = threading.Lock()
        self.pad_token, self.unk_token, self.cls_token, self.sep_token, self.mask_token = SPECIAL_TOKENS

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_vocab(
        cls,
        vocab_path: PathLike,
        lowercase: bool = True,
        strip_accents: Optional[bool] = None,
        tokenize_chinese_chars: bool = True,
        clean_text: bool = True,
        max_length: int = 512,
    ) -> "WordPieceTokenizer":
        """Build a tokenizer from a BERT ``vocab.txt`` (one token per line, id = line number).

        Args:
            vocab_path: Path to the vocabulary file.
            lowercase: Lowercase the input (uncased models).
            strip_accents: Remove accents; ``None`` follows ``lowercase`` as in BERT.
            tokenize_chinese_chars: Put spaces around CJK ideographs.
            clean_text: Drop control characters and map all whitespace to spaces.
            max_length: Default maximum sequence length.
        """
        vocab = WordPiece.read_file(str(vocab_path))
        tok = _build_tokenizer(vocab, lowercase, strip_accents, tokenize_chinese_chars, clean_text)
        return cls(tok, max_length=max_length)

    @classmethod
    def from_dir(cls, path: PathLike) -> "WordPieceTokenizer":
        """Load a Hugging Face style tokenizer directory.

        ``vocab.txt`` (+ ``tokenizer_config.json`` if present) is preferred because
        its settings are explicit; otherwise ``tokenizer.json`` is used as is. Any
        truncation/padding stored in ``tokenizer.json`` is ignored.
        """
        path = Path(path)
        config = {}
        if (path / "tokenizer_config.json").is_file():
            config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
        max_length = config.get("model_max_length") or 512
        if max_length > _NO_LIMIT_SENTINEL:
            max_length = 512
        if (path / "vocab.txt").is_file():
            lowercase = config.get("do_lower_case", True)
            return cls.from_vocab(
                path / "vocab.txt",
                lowercase=lowercase,
                strip_accents=config.get("strip_accents"),
                tokenize_chinese_chars=config.get("tokenize_chinese_chars", True),
                clean_text=config.get("clean_text", True),
                max_length=max_length,
            )
        if (path / "tokenizer.json").is_file():
            return cls(Tokenizer.from_file(str(path / "tokenizer.json")), max_length=max_length)
        raise FileNotFoundError(f"{path} has neither vocab.txt nor tokenizer.json")

    @classmethod
    def train(
        cls,
        files_or_iterator,
        vocab_size: int = 30522,
        min_frequency: int = 2,
        lowercase: bool = True,
        strip_accents: Optional[bool] = None,
        tokenize_chinese_chars: bool = True,
        clean_text: bool = True,
        limit_alphabet: int = 1000,
        show_progress: bool = True,
        max_length: int = 512,
        batch_size: int = 1000,
    ) -> "WordPieceTokenizer":
        """Train a new WordPiece vocabulary.

        Args:
            files_or_iterator: A path, a list/tuple of paths (plain or ``.xz``), or
                any other iterable yielding text strings. A list is always taken
                as paths; wrap in-memory lines with ``iter()``.
            vocab_size: Target size including the special tokens and alphabet.
            min_frequency: Minimum pair count for a merge.
            lowercase, strip_accents, tokenize_chinese_chars, clean_text: As in
                :meth:`from_vocab`; they also shape what the trainer sees.
            limit_alphabet: Maximum number of distinct initial characters.
            show_progress: Show the ``tokenizers`` progress bars.
            max_length: Default maximum sequence length of the result.
            batch_size: Lines handed to the trainer per batch.

        Returns:
            A tokenizer whose ids 0..4 are [PAD] [UNK] [CLS] [SEP] [MASK].
        """
        tok = _build_tokenizer({}, lowercase, strip_accents, tokenize_chinese_chars, clean_text)
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            show_progress=show_progress,
            special_tokens=list(SPECIAL_TOKENS),
            limit_alphabet=limit_alphabet,
            continuing_subword_prefix="##",
        )
        tok.train_from_iterator(_text_batches(files_or_iterator, batch_size), trainer=trainer)
        return cls(tok, max_length=max_length)

    def save(self, directory: PathLike) -> Path:
        """Write ``vocab.txt``, ``tokenizer.json`` and ``tokenizer_config.json``.

        The result loads with :meth:`from_dir` and with
        ``transformers.BertTokenizerFast.from_pretrained``. Note that HF's config
        has no ``clean_text`` switch; the key is written for :meth:`from_dir` only.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        vocab = self._tok.get_vocab(with_added_tokens=True)
        by_id = sorted(vocab.items(), key=lambda kv: kv[1])
        if [i for _, i in by_id] != list(range(len(by_id))):
            raise ValueError("vocabulary ids are not contiguous; cannot write vocab.txt")
        with open(directory / "vocab.txt", "w", encoding="utf-8", newline="\n") as fh:
            fh.writelines(tok + "\n" for tok, _ in by_id)
        self._tok.save(str(directory / "tokenizer.json"))
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self.lowercase,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "clean_text": self.clean_text,
            "do_basic_tokenize": True,
            "never_split": None,
            "model_max_length": self.max_length,
            "unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS, "mask_token": MASK,
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        return directory

    # ------------------------------------------------------------------ properties
    @property
    def backend(self) -> Tokenizer:
        """The underlying ``tokenizers.Tokenizer`` (do not enable truncation/padding on it)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def lowercase(self) -> bool:
        return self._tok.normalizer.lowercase

    @property
    def strip_accents(self) -> Optional[bool]:
        return self._tok.normalizer.strip_accents

    @property
    def tokenize_chinese_chars(self) -> bool:
        return self._tok.normalizer.handle_chinese_chars

    @property
    def clean_text(self) -> bool:
        return self._tok.normalizer.clean_text

    pad_id = property(lambda self: self._tok.token_to_id(PAD))
    unk_id = property(lambda self: self._tok.token_to_id(UNK))
    cls_id = property(lambda self: self._tok.token_to_id(CLS))
    sep_id = property(lambda self: self._tok.token_to_id(SEP))
    mask_id = property(lambda self: self._tok.token_to_id(MASK))

    def get_vocab(self) -> dict:
        return self._tok.get_vocab(with_added_tokens=True)

    def token_to_id(self, token: str) -> Optional[int]:
        """Id of ``token``, or ``None`` if it is not in the vocabulary."""
        return self._tok.token_to_id(token)

    def id_to_token(self, id: int) -> Optional[str]:
        """Token string for ``id``, or ``None`` if out of range."""
        return self._tok.id_to_token(int(id))

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> List[str]:
        """Map ids (list or 1-D tensor) to token strings; unknown ids raise ValueError."""
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        out = []
        for i in ids:
            tok = self._tok.id_to_token(int(i))
            if tok is None:
                raise ValueError(f"id {i} is outside the vocabulary (size {self.vocab_size})")
            out.append(tok)
        return out

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Turn ids back into text, joining ``##`` continuations."""
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ encoding
    def encode(
        self,
        text: str,
        text_pair: Optional[str] = None,
        max_length: Optional[int] = None,
        truncation: Optional[str] = "longest_first",
        add_special_tokens: bool = True,
    ) -> Encoding:
        """Encode one text or text pair.

        Args:
            text: The (first) text. Empty/whitespace-only text gives ``[CLS] [SEP]``.
            text_pair: Optional second text (segment 1).
            max_length: Length limit including special tokens; defaults to
                :attr:`max_length`.
            truncation: ``"longest_first"``, ``"only_first"``, ``"only_second"``
                (same semantics as HF), or ``"error"``/``None`` to raise instead.
            add_special_tokens: Add [CLS]/[SEP].

        Returns:
            An :class:`Encoding`; ``num_truncated`` tells how much was cut.

        Raises:
            TypeError: ``text``/``text_pair`` is not a str.
            ValueError: Unencodable text (lone surrogates), or the input is too long
                and truncation is ``"error"``/``None`` or cannot satisfy the limit.
        """
        _check_text(text, "text")
        if text_pair is not None:
            _check_text(text_pair, "text_pair")
        pairs = None if text_pair is None else [text_pair]
        return self._encode_many([text], pairs, max_length, truncation, add_special_tokens)[0]

    def encode_batch(
        self,
        texts: Sequence[str],
        text_pairs: Optional[Sequence[str]] = None,
        max_length: Optional[int] = None,
        truncation: Optional[str] = "longest_first",
        padding: Optional[str] = "longest",
        return_tensors: Optional[str] = None,
        add_special_tokens: bool = True,
    ):
        """Encode many texts (or pairs) in parallel with the ``tokenizers`` batch API.

        Args:
            texts: Sequence of str.
            text_pairs: Optional sequence of second texts, same length as ``texts``.
            max_length, truncation, add_special_tokens: As in :meth:`encode`.
            padding: ``"longest"`` (pad to the longest in the batch), ``"max_length"``
                or ``None``. Padding is on the right with [PAD] (id 0 in BERT vocabs)
                and is applied to the returned Encodings as well.
            return_tensors: ``None`` for a list of :class:`Encoding`, or ``"pt"`` for
                a dict of LongTensors ``input_ids``, ``token_type_ids``,
                ``attention_mask`` plus the list under ``encodings``.
        """
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise TypeError(f"texts must be a list/tuple of str, got {type(texts).__name__}")
        for i, t in enumerate(texts):
            _check_text(t, f"texts[{i}]")
        if text_pairs is not None:
            if isinstance(text_pairs, str) or not isinstance(text_pairs, Sequence):
                raise TypeError(f"text_pairs must be a list/tuple of str, got {type(text_pairs).__name__}")
            if len(text_pairs) != len(texts):
                raise ValueError(f"got {len(texts)} texts but {len(text_pairs)} text_pairs")
            for i, t in enumerate(text_pairs):
                _check_text(t, f"text_pairs[{i}]")
        if padding not in (None,) + PADDING_STRATEGIES:
            raise ValueError(f"padding must be one of {PADDING_STRATEGIES} or None, got {padding!r}")
        if return_tensors not in (None, "pt"):
            raise ValueError(f"return_tensors must be None or 'pt', got {return_tensors!r}")
        limit = self._max_length if max_length is None else int(max_length)
        encs = self._encode_many(list(texts), text_pairs, max_length, truncation, add_special_tokens, keep_raw=True)
        if padding is not None and encs:
            target = limit if padding == "max_length" else max(len(e) for e, _ in encs)
            for raw, _ in encs:
                raw.pad(target, direction="right", pad_id=self.pad_id, pad_type_id=0, pad_token=PAD)
        out = [_to_encoding(raw, n) for raw, n in encs]
        if return_tensors is None:
            return out
        lengths = {len(e) for e in out}
        if len(lengths) > 1:
            raise ValueError(f"cannot stack sequences of lengths {sorted(lengths)} into a tensor; use padding")
        import torch  # deferred: tokenizing does not otherwise need torch

        def stack(field):
            return torch.tensor([getattr(e, field) for e in out], dtype=torch.long).reshape(len(out), -1)

        return {
            "input_ids": stack("input_ids"),
            "token_type_ids": stack("token_type_ids"),
            "attention_mask": stack("attention_mask"),
            "encodings": out,
        }

    def _encode_many(self, texts, pairs, max_length, truncation, add_special_tokens, keep_raw=False):
        limit = self._max_length if max_length is None else int(max_length)
        if truncation not in (None, "error") + TRUNCATION_STRATEGIES:
            raise ValueError(
                f"truncation must be one of {TRUNCATION_STRATEGIES}, 'error' or None, got {truncation!r}"
            )
        n_special = [self._tok.num_special_tokens_to_add(False), self._tok.num_special_tokens_to_add(True)]
        if not add_special_tokens:
            n_special = [0, 0]
        if limit < n_special[pairs is not None] + 1:
            raise ValueError(f"max_length={limit} leaves no room for text next to {n_special[pairs is not None]} special tokens")
        flat = list(texts) + (list(pairs) if pairs is not None else [])
        with self._lock:
            # Segments are encoded bare so their untruncated lengths are known;
            # post_process then applies exactly the truncation + template that
            # Tokenizer.encode would, keeping parity with HF.
            try:
                if len(flat) == 1:
                    segs = [self._tok.encode(flat[0], add_special_tokens=False)]
                else:
                    segs = self._tok.encode_batch(flat, add_special_tokens=False)
            except TypeError:
                _raise_unencodable(flat, len(texts))
                raise
            first, second = segs[: len(texts)], (segs[len(texts):] if pairs is not None else None)
            if truncation in TRUNCATION_STRATEGIES:
                self._tok.enable_truncation(limit, stride=0, strategy=truncation, direction="right")
            results = []
            try:
                for i, a in enumerate(first):
                    b = second[i] if second is not None else None
                    where = "input" if len(first) == 1 else f"input {i}"
                    full = len(a) + (len(b) if b is not None else 0) + n_special[b is not None]
                    if full > limit and truncation not in TRUNCATION_STRATEGIES:
                        raise ValueError(
                            f"{where} is {full} tokens long (special tokens included), exceeding "
                            f"max_length={limit}; pass truncation='longest_first' (or only_first/only_second) to cut it"
                        )
                    try:
                        enc = self._tok.post_process(a, b, add_special_tokens=add_special_tokens)
                    except Exception as exc:  # tokenizers raises a bare Exception here
                        sizes = f"first text {len(a)} tokens" + ("" if b is None else f", second text {len(b)} tokens")
                        raise ValueError(
                            f"{where}: cannot truncate to max_length={limit} with truncation={truncation!r} "
                            f"({sizes}, {n_special[b is not None]} special tokens): {exc}"
                        ) from None
                    results.append((enc, full - len(enc)))
            finally:
                self._tok.no_truncation()
        return results if keep_raw else [_to_encoding(e, n) for e, n in results]


def _to_encoding(enc, num_truncated: int) -> Encoding:
    return Encoding(
        input_ids=enc.ids,
        token_type_ids=enc.type_ids,
        attention_mask=enc.attention_mask,
        offsets=enc.offsets,
        tokens=enc.tokens,
        word_ids=enc.word_ids,
        sequence_ids=enc.sequence_ids,
        num_truncated=num_truncated,
    )


def _check_text(text, name: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be str, got {type(text).__name__}")


def _raise_unencodable(texts: Sequence[str], n_first: int) -> None:
    """Turn tokenizers' opaque TypeError about non-UTF-8 strings into a clear ValueError."""
    for i, t in enumerate(texts):
        name = f"text {i}" if i < n_first else f"text_pair {i - n_first}"
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = t[exc.start]
            raise ValueError(
                f"{name} cannot be encoded as UTF-8: character U+{ord(bad):04X} at index {exc.start} "
                f"is a lone surrogate (was the text decoded with errors='surrogateescape'?)"
            ) from None
