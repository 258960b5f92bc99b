"""A character-level LM corpus from a Wikipedia extract: text8-style or raw bytes.

text8 (Mahoney, 2006) is Wikipedia text reduced to 27 symbols: lowercase ``a``-``z`` and
the space. The reduction here follows Mahoney's ``wikifil.pl``: letters are lowercased,
each digit becomes its English name between spaces (``"1990"`` -> ``" one nine nine zero "``),
every other character becomes a space, and runs of spaces collapse to one. The ``bytes``
format keeps the UTF-8 text of each document unchanged (documents joined by a blank line).

**Split.** Each document goes to train, valid or test by the CRC-32 of its first line (the
article title in a WikiExtractor file): ``crc % 100`` below 90 is train, 90-94 valid, 95-99
test. The split depends only on the title, so it is the same whatever subset of files is
read, in any order, on any machine; the files' order decides the order within a split.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zlib
from pathlib import Path
from typing import Dict, List, Sequence, Union

from tqdm.auto import tqdm

from ..core.errors import UserError
from ..tokenizers.char import TEXT8_ALPHABET
from .corpus import read_documents

__all__ = ["text8_normalize", "split_of", "build_char_corpus", "SPLITS"]

PathLike = Union[str, os.PathLike]

SPLITS = ("train", "valid", "test")
_DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_NOT_LETTER = re.compile(r"[^a-z]+")
_DIGIT_TABLE = str.maketrans({str(d): f" {name} " for d, name in enumerate(_DIGITS)})


def text8_normalize(text: str) -> str:
    """Reduce text to text8's 27 symbols (see the module docstring); no leading or
    trailing space.

    >>> text8_normalize("In 1990, Émile's café!")
    'in one nine nine zero mile s caf'
    """
    # Accented letters are not ASCII letters: wikifil.pl drops them too (they become spaces).
    lowered = text.lower().translate(_DIGIT_TABLE)
    return _NOT_LETTER.sub(" ", lowered).strip()


def split_of(title: str) -> str:
    """``"train"``, ``"valid"`` or ``"test"`` for a document with this first line."""
    bucket = zlib.crc32(title.encode("utf-8")) % 100
    return "train" if bucket < 90 else "valid" if bucket < 95 else "test"


def build_char_corpus(files: Sequence[PathLike], out_dir: PathLike, format: str = "text8",
                      show_progress: bool = True) -> Dict[str, dict]:
    """Write ``train.txt``, ``valid.txt``, ``test.txt`` and ``meta.json`` into ``out_dir``.

    Args:
        files: WikiExtractor files (plain or ``.xz``), read in the given order.
        out_dir: output folder (created).
        format: ``"text8"`` (27 symbols, one line, no newline) or ``"bytes"`` (UTF-8 text,
            documents separated by a blank line).
        show_progress: a tqdm bar over the files.

    Returns:
        Per split: ``{"documents", "characters", "sha256"}`` (also in ``meta.json``, with
        the format, the split rule and the source file names).

    Raises:
        UserError: an unknown format, no files, or a split left empty.
    """
    if format not in ("text8", "bytes"):
        raise UserError(f"unknown character corpus format {format!r}; use 'text8' or 'bytes'")
    if not files:
        raise UserError("no input files for the character corpus")
    parts: Dict[str, List[str]] = {s: [] for s in SPLITS}
    for path in tqdm(list(files), desc="documents", unit="file", disable=not show_progress):
        for doc in read_documents(path):
            lines = [line for line in doc if line.strip()]
            if len(lines) < 2:  # a title with no article (most records of the extract)
                continue
            text = "\n".join(lines)
            body = text8_normalize(text) if format == "text8" else text.strip()
            if body:
                parts[split_of(lines[0])].append(body)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta: Dict[str, dict] = {}
    joiner = " " if format == "text8" else "\n\n"
    for split in SPLITS:
        if not parts[split]:
            raise UserError(f"the {split} split is empty: give more input files")
        data = joiner.join(parts[split])
        raw = data.encode("utf-8")
        tmp = out / f".{split}.txt.tmp"
        tmp.write_bytes(raw)
        os.replace(tmp, out / f"{split}.txt")
        meta[split] = {"documents": len(parts[split]), "characters": len(data), "sha256": hashlib.sha256(raw).hexdigest()}
    info = {"format": format, "alphabet": TEXT8_ALPHABET if format == "text8" else None,
            "split_rule": "crc32(first line) % 100: <90 train, 90-94 valid, 95-99 test",
            "sources": [Path(f).name for f in files], **meta}
    (out / "meta.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return meta
