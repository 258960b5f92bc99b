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

from .wordpiece import _text_batches

__all__ = ["ByteLevelBPETokenizer", "END_OF_TEXT"]

END_OF_TEXT = "<|endoftext|>"
PathLike = Union[str, "os.PathLike[str]"]


def _build(model: models.BPE) -> Tokenizer:
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


class ByteLevelBPETokenizer:
    """GPT-2 style tokenizer.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` with a byte-level BPE model.
        max_length: the model's context length (for callers that truncate or window).
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int = 1024):
        self._tok = tokenizer
        self.max_length = max_length
        eot = tokenizer.token_to_id(END_OF_TEXT)
        if eot is None:
            raise ValueError(f"the vocabulary has no {END_OF_TEXT} token")
        self.eos_id = eot  # GPT-2 uses <|endoftext|> as BOS, EOS and padding

    @classmethod
    def from_files(cls, vocab_json: PathLike, merges_txt: PathLike, max_length: int = 1024) -> "ByteLevelBPETokenizer":
        """Load GPT-2's ``vocab.json`` and ``merges.txt``.

        Raises:
            FileNotFoundError: a file is missing.
            ValueError: malformed files, named with the line.
        """
        vocab_json, merges_txt = Path(vocab_json), Path(merges_txt)
        for path in (vocab_json, merges_txt):
            if not path.is_file():
                raise FileNotFoundError(f"{path}: not found (a byte-level BPE tokenizer needs vocab.json and merges.txt)")
        try:
            vocab = json.loads(vocab_json.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{vocab_json}:{err.lineno}:{err.colno}: malformed JSON: {err.msg}") from None
        merges = []
        for lineno, line in enumerate(merges_txt.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip() or (lineno == 1 and line.startswith("#version")):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise ValueError(f"{merges_txt}:{lineno}: expected two space-separated tokens, got {line!r}")
            merges.append((parts[0], parts[1]))
        return cls(_build(models.BPE(vocab=vocab, merges=merges)), max_length)

    @classmethod
    def from_dir(cls, path: PathLike) -> "ByteLevelBPETokenizer":
        """Load a folder with ``vocab.json`` + ``merges.txt`` (an HF GPT-2 checkpoint folder);
        a ``tokenizer.json`` written by :meth:`save` is preferred (it keeps special tokens)."""
        path = Path(path)
        max_length = 1024
        if (path / "config.json").is_file():
            max_length = json.loads((path / "config.json").read_text(encoding="utf-8")).get("n_positions", max_length)
        if (path / "tokenizer.json").is_file():
            return cls(Tokenizer.from_file(str(path / "tokenizer.json")), max_length)
        return cls.from_files(path / "vocab.json", path / "merges.txt", max_length)

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
        return directory

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> List[int]:
        """Token ids of ``text`` (no special tokens added)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        return self._tok.encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
        """Token ids of each text."""
        return [e.ids for e in self._tok.encode_batch(list(texts))]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (bytes that do not form complete UTF-8 characters become U+FFFD)."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        """Id of a token string, or None."""
        return self._tok.token_to_id(token)
