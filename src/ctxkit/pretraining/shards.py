"""Pretraining shards on disk: build them from raw text in parallel, read them memory-mapped.

A shard folder holds, per shard ``shard_XXXXX``:

* ``shard_XXXXX.tokens.npy``: every instance's ``[CLS] A [SEP] B [SEP]`` ids, concatenated
  (1-D). ``uint16`` when the vocabulary has at most 65536 tokens (BERT's 30522 fits),
  which halves the size; ``int32`` otherwise.
* ``shard_XXXXX.index.npy``: ``(n, 3)`` int64 rows ``(start offset, length, length of
  segment A including [CLS] and the first [SEP])``.
* ``shard_XXXXX.nsp.npy``: ``(n,)`` uint8 next-sentence labels (1 = B is random).

and one ``meta.json`` (tokenizer vocabulary size, special ids and vocabulary SHA-256,
build settings, counts, and each shard file's size and SHA-256). Every file is written
under a temporary name and renamed, and ``meta.json`` is written last and removed first
on a rebuild, so a folder with a ``meta.json`` is always a complete build.
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import random
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
from tqdm.auto import tqdm

from ..core.checkpoint import atomic_write, sha256_file, write_json
from ..core.errors import MissingFileError, UserError
from ..tokenizers import WordPieceTokenizer
from .corpus import create_instances, read_documents, split_sentences

PathLike = Union[str, os.PathLike]
META_FORMAT = "ctxkit-pretrain-shards/1"
_SUFFIXES = ("tokens.npy", "index.npy", "nsp.npy")

__all__ = ["PretrainDataset", "ShardError", "build_shards", "train_vocab", "vocab_sha256"]


class ShardError(UserError):
    """A shard folder is incomplete, corrupt, or does not match its ``meta.json``."""


def vocab_sha256(tokenizer: WordPieceTokenizer) -> str:
    """SHA-256 of the vocabulary as ``vocab.txt`` text (tokens in id order, one per line).

    Equal to the hash of the ``vocab.txt`` that :meth:`WordPieceTokenizer.save` writes.
    """
    by_id = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256("".join(t + "\n" for t, _ in by_id).encode("utf-8")).hexdigest()


def _iter_documents(inputs: Sequence[PathLike], format: str, limit_docs: Optional[int]) -> Iterator[List[str]]:
    docs = (doc for path in inputs for doc in read_documents(path, format))
    for n, doc in enumerate(docs):
        if limit_docs is not None and n >= limit_docs:
            return
        yield doc


def _chunks(docs: Iterable[List[str]], size: int) -> Iterator[Tuple[int, List[List[str]]]]:
    chunk: List[List[str]] = []
    task = 0
    for doc in docs:
        chunk.append(doc)
        if len(chunk) == size:
            yield task, chunk
            task, chunk = task + 1, []
    if chunk:
        yield task, chunk


# ---------------------------------------------------------------- workers

_WORKER: Dict[str, object] = {}


def _init_worker(tokenizer_dir: str, settings: dict, out_dir: str, parallel_tokenizer: bool) -> None:
    if not parallel_tokenizer:
        # The pool already uses the cores; nested rayon threads would only compete.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER.update(tokenizer=WordPieceTokenizer.from_dir(tokenizer_dir), settings=settings, out_dir=out_dir)


def _save_npy(path: Path, array: np.ndarray) -> None:
    def write(tmp):
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        Path(tmp).write_bytes(buf.getvalue())

    atomic_write(path, write)


def _build_one(task: Tuple[int, List[List[str]]]) -> dict:
    """Tokenize one chunk of documents, make its instances and write its shard."""
    index, documents = task
    tok: WordPieceTokenizer = _WORKER["tokenizer"]  # type: ignore[assignment]
    cfg: dict = _WORKER["settings"]  # type: ignore[assignment]
    # The seed depends on (seed, task) only, so the output is the same for any
    # number of workers. Seeding with a str hashes it with SHA-512: no collisions
    # between e.g. (seed 0, task 10) and (seed 1, task 0), no PYTHONHASHSEED effect.
    rng = random.Random(f"ctxkit-pretrain:{cfg['seed']}:{index}")
    sentences = [[s for line in doc for s in split_sentences(line)] for doc in documents]
    flat = [s for doc in sentences for s in doc]
    # No length limit here: long sentences are cut later by truncate_seq_pair.
    encs = tok.encode_batch(flat, padding=None, truncation=None, max_length=1 << 40, add_special_tokens=False) if flat else []
    ids = iter([e.input_ids for e in encs])
    token_docs = [[next(ids) for _ in doc] for doc in sentences]
    instances = []
    for _ in range(cfg["dupe_factor"]):
        instances.extend(create_instances(token_docs, cfg["max_seq_len"], cfg["short_seq_prob"], cfg["nsp_prob"], rng))
    rng.shuffle(instances)

    cls_id, sep_id = tok.cls_id, tok.sep_id
    lengths = np.array([len(x.tokens_a) + len(x.tokens_b) + 3 for x in instances], dtype=np.int64)
    index_arr = np.zeros((len(instances), 3), dtype=np.int64)
    index_arr[:, 1] = lengths
    index_arr[1:, 0] = np.cumsum(lengths)[:-1]
    index_arr[:, 2] = [len(x.tokens_a) + 2 for x in instances]
    flat_ids: List[int] = []
    for x in instances:
        flat_ids.append(cls_id)
        flat_ids.extend(x.tokens_a)
        flat_ids.append(sep_id)
        flat_ids.extend(x.tokens_b)
        flat_ids.append(sep_id)
    tokens = np.array(flat_ids, dtype=cfg["token_dtype"])
    nsp = np.array([x.is_random_next for x in instances], dtype=np.uint8)

    name = f"shard_{index:05d}"
    out = Path(_WORKER["out_dir"])  # type: ignore[arg-type]
    files = {}
    for suffix, array in zip(_SUFFIXES, (tokens, index_arr, nsp)):
        path = out / f"{name}.{suffix}"
        _save_npy(path, array)
        files[suffix] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    return {"name": name, "num_documents": len(documents), "num_instances": len(instances),
            "num_tokens": int(tokens.size), "num_random_next": int(nsp.sum()), "files": files}


# ---------------------------------------------------------------- build


def build_shards(inputs: Sequence[PathLike], tokenizer_dir: PathLike, out_dir: PathLike, max_seq_len: int = 128,
                 short_seq_prob: float = 0.1, nsp_prob: float = 0.5, dupe_factor: int = 1, seed: int = 0,
                 workers: Optional[int] = None, docs_per_shard: int = 2000, format: str = "auto",
                 limit_docs: Optional[int] = None, show_progress: bool = True) -> dict:
    """Turn raw text files into pretraining shards (documents -> sentences -> ids -> pairs).

    Documents are read in order (:func:`read_documents`) and cut into tasks of
    ``docs_per_shard`` documents; each task is split into sentences, tokenized with the
    ``tokenizers`` batch API, paired with :func:`create_instances` (``dupe_factor``
    passes, random-next segments drawn from the same task's documents, as BERT draws
    them from the documents in memory), shuffled, and written as one shard. Tasks run
    on a ``multiprocessing`` pool; each is seeded from ``(seed, task index)`` alone, so
    the same arguments give byte-identical files for any ``workers``.

    Args:
        inputs: Text files (plain or ``.xz``).
        tokenizer_dir: A tokenizer folder (``vocab.txt`` or ``tokenizer.json``).
        out_dir: Output folder; an earlier build there (``meta.json`` and
            ``shard_*.npy``) is removed first.
        max_seq_len: Length limit per instance, special tokens included.
        short_seq_prob, nsp_prob: As in :func:`create_instances`.
        dupe_factor: Passes over each task's documents (different pairs each time).
        seed: Base seed.
        workers: Processes; ``None`` = CPU count, ``0`` or ``1`` = in this process.
        docs_per_shard: Documents per task and shard (also the pool of random-next
            documents, so not too small).
        format: Corpus format, see :func:`read_documents`.
        limit_docs: Use only the first N documents over all inputs.
        show_progress: Show a tqdm bar over documents.

    Returns:
        The ``meta.json`` content.

    Raises:
        FileNotFoundError: An input or the tokenizer folder is missing.
        ValueError: Bad arguments, or a corpus error naming ``file:line``.
    """
    inputs = [str(p) for p in inputs]
    if not inputs:
        raise UserError("no input files given")
    for p in inputs:
        if not os.path.isfile(p):
            raise MissingFileError(f"{p}: no such file")
    if dupe_factor < 1 or docs_per_shard < 1:
        raise UserError(f"dupe_factor and docs_per_shard must be >= 1, got {dupe_factor} and {docs_per_shard}")
    tok = WordPieceTokenizer.from_dir(tokenizer_dir)
    if max_seq_len < 5 or max_seq_len > tok.max_length:
        raise UserError(f"max_seq_len must be in [5, {tok.max_length}] (the tokenizer's maximum), got {max_seq_len}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # meta.json goes first: from here on the folder no longer claims to be complete.
    (out / "meta.json").unlink(missing_ok=True)
    for stale in out.glob("shard_*.npy"):
        stale.unlink()
    token_dtype = "uint16" if tok.vocab_size <= 1 << 16 else "int32"
    settings = {"seed": seed, "max_seq_len": max_seq_len, "short_seq_prob": short_seq_prob, "nsp_prob": nsp_prob,
                "dupe_factor": dupe_factor, "token_dtype": token_dtype}
    workers = (os.cpu_count() or 1) if workers is None else workers
    tasks = _chunks(_iter_documents(inputs, format, limit_docs), docs_per_shard)
    init_args = (str(tokenizer_dir), settings, str(out), workers <= 1)
    bar = tqdm(desc="pretrain-data", unit="doc", disable=not show_progress)
    shards = []
    try:
        if workers <= 1:
            _init_worker(*init_args)
            results: Iterable[dict] = map(_build_one, tasks)
            shards = _collect(results, bar)
        else:
            # fork (where available) skips re-importing ctxkit and torch in each worker.
            ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
            with ctx.Pool(workers, initializer=_init_worker, initargs=init_args) as pool:
                shards = _collect(pool.imap(_build_one, tasks), bar)
    finally:
        bar.close()
    meta = {
        "format": META_FORMAT,
        "tokenizer": {"path": str(tokenizer_dir), "vocab_size": tok.vocab_size, "vocab_sha256": vocab_sha256(tok),
                      "lowercase": tok.lowercase, "pad_id": tok.pad_id, "unk_id": tok.unk_id, "cls_id": tok.cls_id,
                      "sep_id": tok.sep_id, "mask_id": tok.mask_id},
        "inputs": inputs, "corpus_format": format, "limit_docs": limit_docs, "docs_per_shard": docs_per_shard,
        **settings,
        "num_documents": sum(s["num_documents"] for s in shards),
        "num_instances": sum(s["num_instances"] for s in shards),
        "num_tokens": sum(s["num_tokens"] for s in shards),
        "num_random_next": sum(s["num_random_next"] for s in shards),
        "shards": shards,
    }
    write_json(meta, out / "meta.json")
    return meta


def _collect(results: Iterable[dict], bar) -> List[dict]:
    shards = []
    for r in results:
        shards.append(r)
        bar.update(r["num_documents"])
        bar.set_postfix(instances=sum(s["num_instances"] for s in shards), refresh=False)
    return shards


# ---------------------------------------------------------------- read


class PretrainDataset:
    """The instances of a shard folder, memory-mapped (``np.load(mmap_mode="r")``).

    Opening checks ``meta.json`` against the files (presence, byte sizes, array shapes
    and dtypes) and raises one :class:`ShardError` listing every problem; pass
    ``verify=True`` to also check the SHA-256 of every file (reads everything).

    What is read: opening maps the files (no token is read) and :attr:`lengths` reads the
    index arrays, 24 bytes per instance; ``dataset[i]`` reads instance ``i``'s tokens, and
    the pages around them, through the map. Under torchrun each rank of the trainer calls
    it for its own rows of every global batch only (issue 42 item 5: rows are split across
    ranks, no rank reads everything; ``tests/test_distributed.py`` counts them per rank).

    Args:
        out_dir: A folder written by :func:`build_shards`.
        verify: Hash every shard file against ``meta.json``.

    Attributes:
        meta: The parsed ``meta.json``.
        pad_id, cls_id, sep_id, mask_id, vocab_size: From the tokenizer the shards were built with.
    """

    def __init__(self, out_dir: PathLike, verify: bool = False):
        self.root = Path(out_dir)
        meta_path = self.root / "meta.json"
        if not meta_path.is_file():
            raise ShardError(f"{meta_path}: not found; is {self.root} a finished build_shards/pretrain-data output?")
        try:
            self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ShardError(f"{meta_path}: not valid JSON ({exc})") from None
        if self.meta.get("format") != META_FORMAT:
            raise ShardError(f"{meta_path}: format {self.meta.get('format')!r}, expected {META_FORMAT!r}")
        t = self.meta["tokenizer"]
        self.vocab_size, self.pad_id, self.cls_id, self.sep_id, self.mask_id = (
            t["vocab_size"], t["pad_id"], t["cls_id"], t["sep_id"], t["mask_id"])
        problems: List[str] = []
        self._shards = []
        for shard in self.meta["shards"]:
            arrays = self._open_shard(shard, verify, problems)
            if arrays is not None:
                self._shards.append(arrays)
        if problems:
            raise ShardError(f"{self.root}: {len(problems)} missing or corrupt shard file(s); rebuild with "
                             "pretrain-data:\n  " + "\n  ".join(problems))
        counts = [len(nsp) for _, _, nsp in self._shards]
        self._offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])

    def _open_shard(self, shard: dict, verify: bool, problems: List[str]):
        arrays = []
        for suffix in _SUFFIXES:
            path = self.root / f"{shard['name']}.{suffix}"
            expected = shard["files"][suffix]
            if not path.is_file():
                problems.append(f"{path.name}: missing")
                continue
            size = path.stat().st_size
            if size != expected["bytes"]:
                problems.append(f"{path.name}: {size} bytes, meta.json says {expected['bytes']} (truncated or replaced)")
                continue
            if verify and sha256_file(path) != expected["sha256"]:
                problems.append(f"{path.name}: SHA-256 differs from meta.json")
                continue
            try:
                arrays.append(np.load(path, mmap_mode="r", allow_pickle=False))
            except (ValueError, OSError) as exc:
                problems.append(f"{path.name}: unreadable ({exc})")
        if len(arrays) != 3:
            return None
        tokens, index, nsp = arrays
        n, ntok = shard["num_instances"], shard["num_tokens"]
        if tokens.shape != (ntok,) or index.shape != (n, 3) or nsp.shape != (n,):
            problems.append(f"{shard['name']}: shapes {tokens.shape}, {index.shape}, {nsp.shape} do not match "
                            f"meta.json ({ntok} tokens, {n} instances)")
            return None
        return tokens, index, nsp

    def __len__(self) -> int:
        return int(self._offsets[-1])

    @property
    def lengths(self) -> np.ndarray:
        """Token count of every instance, from the index (no token reads)."""
        return np.concatenate([index[:, 1] for _, index, _ in self._shards]) if self._shards else np.zeros(0, np.int64)

    def __getitem__(self, i: int) -> dict:
        """Instance ``i`` as plain lists.

        Returns:
            ``input_ids`` (``[CLS] A [SEP] B [SEP]``), ``token_type_ids`` (0 up to and
            including the first ``[SEP]``, then 1), ``attention_mask`` (all 1; no
            padding here) — each a ``list[int]`` of length ``seq`` — and
            ``next_sentence_label`` (int, 1 = random next).
        """
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} instances")
        i = i + n if i < 0 else i
        s = int(np.searchsorted(self._offsets, i, side="right")) - 1
        tokens, index, nsp = self._shards[s]
        start, length, len_a = (int(v) for v in index[i - self._offsets[s]])
        return {
            "input_ids": tokens[start:start + length].tolist(),
            "token_type_ids": [0] * len_a + [1] * (length - len_a),
            "attention_mask": [1] * length,
            "next_sentence_label": int(nsp[i - self._offsets[s]]),
        }


# ---------------------------------------------------------------- vocabulary


def train_vocab(files: Sequence[PathLike], vocab_size: int, out_dir: PathLike, format: str = "auto",
                min_frequency: int = 2, lowercase: bool = True, limit_docs: Optional[int] = None,
                show_progress: bool = True) -> WordPieceTokenizer:
    """Train a WordPiece vocabulary on the documents of a corpus and save it to ``out_dir``.

    Reads the same formats as :func:`build_shards` (so WikiExtractor markup and titles
    do not enter the vocabulary) and calls :meth:`WordPieceTokenizer.train`.

    Returns:
        The trained tokenizer; ids 0..4 are ``[PAD] [UNK] [CLS] [SEP] [MASK]``.
    """
    files = [str(f) for f in files]
    for f in files:
        if not os.path.isfile(f):
            raise MissingFileError(f"{f}: no such file")
    lines = (line for doc in _iter_documents(files, format, limit_docs) for line in doc)
    tok = WordPieceTokenizer.train(lines, vocab_size=vocab_size, min_frequency=min_frequency,
                                   lowercase=lowercase, show_progress=show_progress)
    tok.save(out_dir)
    return tok
