"""Byte-level BPE (GPT-2's tokenizer), a thin wrapper over HF ``tokenizers``.

Text is turned into UTF-8 bytes, each byte mapped to a printable character, pre-split on
GPT-2's regular expression (words with their leading space, numbers, punctuation), and
merged by the learned BPE ranks. Every string round-trips: there is no unknown token.
The files are GPT-2's own: ``vocab.json`` (token -> id) and ``merges.txt``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Union

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from .batch import Encoding, TransformersStyle, _check_text, _raise_unencodable
from .wordpiece import _text_batches, decode_lines, load_tokenizer_json, logger, read_json_object
from ..core.errors import MissingFileError, UserError, quote
from ..data.errors import check_input, open_input

__all__ = ["ByteLevelBPETokenizer", "END_OF_TEXT"]

END_OF_TEXT = "<|endoftext|>"
PathLike = Union[str, "os.PathLike[str]"]


def _read_vocab(path: Path) -> dict:
    """``vocab.json`` as ``{token: id}``; every way it can be malformed is named with the file."""
    vocab = read_json_object(path)
    seen: dict = {}
    for token, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < 2**32:
            raise UserError(f"{path}: the id of {quote(token, 100)} must be an integer in [0, 2**32), got {str(i)[:40]}")
        if i in seen:
            raise UserError(f"{path}: {quote(token, 100)} and {quote(seen[i], 100)} have the same id {i}")
        seen[i] = token
    return vocab


def _build(model: models.BPE) -> Tokenizer:
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


class ByteLevelBPETokenizer(TransformersStyle):
    """GPT-2 style tokenizer.

    Called like a transformers tokenizer (``tok(texts, padding=True, truncation=True,
    return_tensors="pt")``, ``tokenize``, ``convert_tokens_to_ids``, ``vocab``: see
    :class:`~ctxkit.tokenizers.batch.TransformersStyle`), it gives GPT2TokenizerFast's
    ``input_ids`` and ``attention_mask``. As there, there is no pad token until one is set
    (``tok.pad_token = tok.eos_token``), and padding without one is an error; ``<|endoftext|>``
    is the BOS, EOS and "unknown" token (what ``convert_tokens_to_ids`` gives a string outside
    the vocabulary).

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` with a byte-level BPE model.
        max_length: the model's context length (for callers that truncate or window; the
            default ``max_length`` of a call).
        pad_token: the padding token of calls with ``padding``; None: no padding.
    """

    bos_token = eos_token = unk_token = END_OF_TEXT

    def __init__(self, tokenizer: Tokenizer, max_length: int = 1024, pad_token: Optional[str] = None):
        self._tok = tokenizer
        self.max_length = max_length
        eot = tokenizer.token_to_id(END_OF_TEXT)
        if eot is None:
            raise UserError(f"the vocabulary has no {END_OF_TEXT} token")
        self.eos_id = eot  # GPT-2 uses <|endoftext|> as BOS, EOS and padding
        self.pad_token = pad_token

    @property
    def pad_token(self) -> Optional[str]:
        """The token that pads a call's batch (None: padding is an error, as in transformers)."""
        return self._pad_token

    @pad_token.setter
    def pad_token(self, token: Optional[str]) -> None:
        if token is not None and self._tok.token_to_id(token) is None:
            raise UserError(f"pad_token {token!r} is not in the vocabulary (GPT-2 pads with {END_OF_TEXT!r})")
        self._pad_token = token

    @classmethod
    def from_files(cls, vocab_json: PathLike, merges_txt: PathLike, max_length: int = 1024) -> "ByteLevelBPETokenizer":
        """Load GPT-2's ``vocab.json`` and ``merges.txt``.

        Raises:
            FileNotFoundError: a file is missing (a :class:`~ctxkit.core.errors.MissingFileError`).
            UserError: (a ``ValueError``) malformed files, named with the line: invalid UTF-8
                or JSON, a vocabulary that is not ``{token: id}`` with distinct ids, a merge
                that is not two tokens or whose tokens are not in the vocabulary.
        """
        vocab_json, merges_txt = Path(vocab_json), Path(merges_txt)
        for path in (vocab_json, merges_txt):
            try:
                check_input(path)
            except MissingFileError:
                raise MissingFileError(f"{path}: not found (a byte-level BPE tokenizer needs vocab.json "
                                       f"and merges.txt)") from None
        vocab = _read_vocab(vocab_json)
        merges = []
        with open_input(merges_txt) as fh:
            for lineno, line in enumerate(decode_lines(fh, str(merges_txt)), 1):
                if not line.strip() or (lineno == 1 and line.startswith("#version")):
                    continue
                parts = line.split(" ")
                if len(parts) != 2 or not all(parts):
                    raise UserError(f"{merges_txt}:{lineno}: expected two space-separated tokens, got {quote(line)}")
                # tokenizers panics (or fails without a line number) on a merge outside the vocabulary.
                missing = [t for t in (parts[0], parts[1], parts[0] + parts[1]) if t not in vocab]
                if missing:
                    raise UserError(f"{merges_txt}:{lineno}: the merge {quote(line, 100)} needs {quote(missing[0], 100)}, "
                                    f"which {vocab_json} lacks")
                merges.append((parts[0], parts[1]))
        return cls(_build(models.BPE(vocab=vocab, merges=merges)), max_length)

    @classmethod
    def from_dir(cls, path: PathLike) -> "ByteLevelBPETokenizer":
        """Load a folder with ``vocab.json`` + ``merges.txt`` (an HF GPT-2 checkpoint folder);
        a ``tokenizer.json`` written by :meth:`save` is preferred (it keeps special tokens)."""
        path = Path(path)
        max_length = 1024
        if (path / "config.json").is_file():
            max_length = read_json_object(path / "config.json").get("n_positions", max_length)
        if (path / "tokenizer.json").is_file():
            file = path / "tokenizer.json"
            try:
                tok = cls(load_tokenizer_json(file), max_length)
            except UserError as exc:
                if str(exc).startswith(str(file)):
                    raise
                raise UserError(f"{file}: {exc}") from None  # e.g. no <|endoftext|> token
        else:
            tok = cls.from_files(path / "vocab.json", path / "merges.txt", max_length)
        if (path / "special_tokens_map.json").is_file():  # a pad token, as transformers saves one
            pad = read_json_object(path / "special_tokens_map.json").get("pad_token")
            tok.pad_token = pad.get("content") if isinstance(pad, dict) else pad
        return tok

    @classmethod
    def train(cls, files_or_iterator, vocab_size: int = 50257, min_frequency: int = 2, show_progress: bool = True,
              max_length: int = 1024, special_tokens: Sequence[str] = ()) -> "ByteLevelBPETokenizer":
        """Learn merges on text files (plain or ``.xz``) or an iterator of strings.

        The 256 byte symbols are always in the vocabulary, so any text can be encoded;
        ``<|endoftext|>`` is the last id, as in GPT-2. ``special_tokens`` (e.g. pad,
        begin and end markers for translation) take ids 0, 1, ... and are never split.
        """
        tok = _build(models.BPE())
        trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, min_frequency=min_frequency, show_progress=show_progress,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=list(special_tokens))
        tok.train_from_iterator(_text_batches(files_or_iterator, 1000), trainer=trainer)
        tok.add_special_tokens([END_OF_TEXT])
        return cls(tok, max_length)

    def save(self, directory: PathLike) -> Path:
        """Write ``vocab.json``, ``merges.txt`` (loadable by ``transformers.GPT2TokenizerFast``)
        and ``tokenizer.json``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = json.loads(self._tok.to_str())
        vocab = dict(state["model"]["vocab"])
        for added in state.get("added_tokens", []):
            vocab[added["content"]] = added["id"]
        (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
        (directory / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges), encoding="utf-8")
        self._tok.save(str(directory / "tokenizer.json"))
        if self.pad_token is not None:
            (directory / "special_tokens_map.json").write_text(json.dumps({"pad_token": self.pad_token}), encoding="utf-8")
        return directory

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        """Token ids of ``text``. GPT-2 adds no special tokens, so ``add_special_tokens``
        (accepted for transformers' habit) changes nothing, as in GPT2TokenizerFast.

        Raises:
            TypeError: ``text`` is not a str.
            ValueError: ``text`` holds a lone surrogate (it is not valid Unicode).
        """
        _check_text(text, "text")
        try:
            return self._tok.encode(text).ids
        except TypeError:  # what tokenizers raises for a str it cannot encode as UTF-8
            _raise_unencodable([text], 1)
            raise

    def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
        """Token ids of each text.

        Raises:
            TypeError: ``texts`` is not a list/tuple of str (a bare str is refused), naming the index.
            ValueError: A text holds a lone surrogate, naming its index.
        """
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise TypeError(f"texts must be a list/tuple of str, got {type(texts).__name__}")
        texts = list(texts)
        for i, t in enumerate(texts):
            _check_text(t, f"texts[{i}]")
        try:
            return [e.ids for e in self._tok.encode_batch(texts)]
        except TypeError:
            _raise_unencodable(texts, len(texts))
            raise

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (bytes that do not form complete UTF-8 characters become U+FFFD)."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        """Id of a token string, or None."""
        return self._tok.token_to_id(token)

    def _call_encode(self, texts, pairs, add_special_tokens, max_length, truncation) -> List[Encoding]:
        """:meth:`__call__`'s encoder: single texts, cut on the right to ``max_length``."""
        if pairs is not None:
            raise UserError("ByteLevelBPETokenizer encodes single texts, not pairs (GPT-2 has no pair template); "
                            "join the two texts yourself")
        if truncation == "only_second":
            raise UserError("truncation='only_second' needs text pairs")
        try:
            rows = [Encoding.from_backend(e) for e in self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)]
        except TypeError:  # what tokenizers raises for a str it cannot encode as UTF-8
            _raise_unencodable(texts, len(texts))
            raise
        if max_length is None:
            return rows
        cut = [r.cut(max_length) for r in rows]
        if any(r.truncated for r in cut):  # never silent (as WordPieceTokenizer)
            logger.warning("truncated %d of %d inputs to max_length=%d; %d tokens removed in total",
                           sum(r.truncated for r in cut), len(cut), max_length, sum(r.num_truncated for r in cut))
        return cut
