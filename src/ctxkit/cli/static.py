"""``ctxkit`` verbs for context-free word vectors: word2vec-train, neighbors, analogy, bag-classifier.

Wiring: ``ctxkit.cli.build_parser`` registers them beside the other verb groups::

    from ctxkit.cli.static import add_static_parsers
    add_static_parsers(sub)   # sub = parser.add_subparsers(...)

Each parser stores its handler as ``func``; a handler takes the parsed namespace and returns
the exit status, so ``ctxkit.cli.main`` runs it like any other verb and reports a
``ValueError`` (e.g. a malformed vector file, named with its line) or ``OSError`` as
``ctxkit: error: ...`` with status 2.

Imports inside the handlers are on purpose: a verb loads its machinery (models, training,
tasks) only when it runs, so parsing the command line and every other verb stay light.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ctxkit.data.glue import read_sst2
from ctxkit.training.callbacks import add_log_to_argument, make_callbacks
from ..core.errors import UserError
from ..core.interrupts import resume_or_start
from ..data.errors import check_input
from ..pretraining.word2vec import train_word2vec
from ..tasks.bag_classifier import train_bag_classifier
from ..zoo.vectors import FORMATS, WordVectors, guess_format
from .train_flags import device_option, ON_SIGTERM, add_on_sigterm_argument, signal_status

__all__ = ["add_static_parsers"]

SST2_TASKS = ("sst-2",)


def _require_files(paths) -> None:
    for path in paths:
        check_input(path)  # readers that need two passes refuse a pipe themselves


def _load(args: argparse.Namespace):
    _require_files([args.vectors])
    return WordVectors.load(args.vectors, format=args.format, progress=not args.no_progress,
                            max_words=args.max_words)


def _cmd_word2vec_train(args: argparse.Namespace) -> int:
    # The vectors are one file, so the writers' files go into a folder beside it.
    callbacks = make_callbacks(args.log_to, args.log_dir or Path(args.out).with_suffix(".logs"))
    _require_files(args.corpus)
    fmt = args.format or guess_format(args.out, for_writing=True)
    resume = args.resume
    if resume:  # a run that crashed before its first checkpoint starts again; finished vectors are not trained over
        if args.checkpoint is None:
            raise UserError("--resume needs --checkpoint DIR, the folder to resume from")
        resume = resume_or_start(args.checkpoint, finished=[args.out],
                                 say=lambda note: print(f"ctxkit: note: {note}", file=sys.stderr))
    vectors = train_word2vec(
        args.corpus, model=args.model, dim=args.dim, window=args.window, negative=args.negative,
        min_count=args.min_count, epochs=args.epochs, subsample=args.subsample, subwords=args.subwords,
        minn=args.minn, maxn=args.maxn, buckets=args.buckets, lr=args.lr, batch_size=args.batch_size,
        lowercase=args.lowercase, seed=args.seed, device=args.device, progress=not args.no_progress,
        num_threads=args.threads or None, callbacks=callbacks, checkpoint=args.checkpoint, save_every=args.save_every,
        resume=resume)
    stop = vectors.meta.get("stopped")
    if stop:  # SIGTERM/SIGUSR1: the vectors of an unfinished run are not written
        if not stop["saved"]:
            print(f"ctxkit: stopped by a signal at {stop['at']}; nothing saved: --checkpoint DIR makes a run resumable",
                  file=sys.stderr)
            return ON_SIGTERM[args.on_sigterm]
        return signal_status({"stopped": stop}, None, args.on_sigterm, checkpoint=args.checkpoint)
    path = vectors.save(args.out, format=fmt, decimals=args.decimals, progress=not args.no_progress)
    meta = vectors.meta
    print(f"{len(vectors):,} words x {vectors.dim} dims; {meta['train_tokens']:,} tokens x {meta['epochs']} epochs "
          f"in {meta['seconds']:.1f} s ({meta['words_per_sec']:,.0f} words/s); final loss {meta['final_loss']:.3f}")
    print(f"saved {fmt} vectors to {path}")
    if args.subwords and fmt != "npz":
        print("ctxkit: note: only .npz keeps the n-gram buckets that give out-of-vocabulary words a vector",
              file=sys.stderr)
    return 0


def _cmd_neighbors(args: argparse.Namespace) -> int:
    vectors = _load(args)
    status = 0
    for word in args.words:
        if not vectors.has_vector(word):
            print(f"ctxkit: error: {word!r} is not in the vocabulary", file=sys.stderr)
            status = 2
            continue
        print(word if word in vectors else f"{word} (not in the vocabulary: vector from its character n-grams)")
        for rank, (other, cos) in enumerate(vectors.most_similar(word, args.k, restrict=args.restrict), start=1):
            print(f"  {rank:>3}. {other:<24} {cos:.4f}")
    return status


def _cmd_analogy(args: argparse.Namespace) -> int:
    vectors = _load(args)
    missing = [w for w in (args.a, args.b, args.c) if not vectors.has_vector(w)]
    for word in missing:
        print(f"ctxkit: error: {word!r} is not in the vocabulary", file=sys.stderr)
    if missing:
        return 2
    print(f"{args.a} : {args.b} :: {args.c} : ?")
    for rank, (answer, cos) in enumerate(vectors.analogy(args.a, args.b, args.c, args.k, restrict=args.restrict), 1):
        print(f"  {rank:>3}. {answer:<24} {cos:.4f}")
    return 0


def _cmd_bag_classifier(args: argparse.Namespace) -> int:
    data = Path(args.data)
    train_texts, train_labels = read_sst2(data / "train.tsv")
    dev_texts, dev_labels = read_sst2(data / "dev.tsv")
    if args.limit_train:
        train_texts, train_labels = train_texts[:args.limit_train], train_labels[:args.limit_train]
    vectors = _load(args)
    result = train_bag_classifier(
        vectors, train_texts, train_labels, dev_texts, dev_labels, epochs=args.epochs, lr=args.lr,
        batch_size=args.batch_size, hidden=args.hidden or None, freeze=not args.trainable, dropout=args.dropout,
        weight_decay=args.weight_decay, lowercase=args.lowercase, seed=args.seed, device=args.device,
        progress=not args.no_progress)
    for h in result.history:
        print(f"epoch {h['epoch']}: train loss {h['train_loss']:.4f}, train acc {h['train_accuracy']:.4f}, "
              f"dev acc {h['dev_accuracy']:.4f}")
    print(f"{args.task} dev accuracy: {result.dev_accuracy:.4f} ({len(dev_texts)} sentences; "
          f"{result.coverage:.1%} of dev tokens have a vector)")
    return 0


def _vector_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("vectors", metavar="VECTORS", help="GloVe .txt, word2vec .vec/.txt, word2vec .bin or ctxkit .npz")
    p.add_argument("--format", choices=FORMATS, default=None, help="file format (default: from suffix and first line)")
    p.add_argument("--max-words", type=int, default=None, help="read only the first N vectors (default: all)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def add_static_parsers(sub: argparse._SubParsersAction) -> None:
    """Registers word2vec-train, neighbors, analogy and bag-classifier on ``sub``."""
    p = sub.add_parser("word2vec-train", help="train CBOW / skip-gram (optionally fastText sub-word) vectors",
                       description="Train word2vec or fastText-style vectors with negative sampling on text files "
                                   "(whitespace tokens, one sentence per line; .xz/.gz read transparently).")
    p.add_argument("corpus", nargs="+", metavar="CORPUS", help="UTF-8 text files")
    p.add_argument("--model", choices=("cbow", "skipgram"), default="skipgram", help="default: skipgram")
    p.add_argument("--subwords", action="store_true", help="fastText character n-grams (OOV words get vectors)")
    p.add_argument("--dim", type=int, default=100, help="vector size (default: 100)")
    p.add_argument("--window", type=int, default=5, help="largest context distance (default: 5)")
    p.add_argument("--negative", type=int, default=5, help="negative samples per example (default: 5)")
    p.add_argument("--min-count", type=int, default=5, help="drop rarer words (default: 5)")
    p.add_argument("--epochs", type=int, default=5, help="passes over the corpus (default: 5)")
    p.add_argument("--subsample", type=float, default=1e-3, help="frequent-word subsampling threshold, 0 = off (default: 1e-3)")
    p.add_argument("--lr", type=float, default=None, help="start learning rate (default: 0.025 skipgram, 0.05 cbow)")
    p.add_argument("--batch-size", type=int, default=1024, help="examples per update (default: 1024)")
    p.add_argument("--minn", type=int, default=3, help="shortest n-gram with --subwords (default: 3)")
    p.add_argument("--maxn", type=int, default=6, help="longest n-gram with --subwords (default: 6)")
    p.add_argument("--buckets", type=int, default=2_000_000, help="n-gram hash buckets (default: 2000000)")
    p.add_argument("--lowercase", action="store_true", help="lowercase the corpus")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--device", type=device_option, default="cpu", help="torch device (default: cpu)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads, 0 = leave as is (default: 1)")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="output; format by suffix: .txt GloVe, .vec word2vec text, .bin word2vec binary, .npz "
                        "(keeps sub-word buckets)")
    p.add_argument("--format", choices=FORMATS, default=None, help="override the format chosen by --out's suffix")
    p.add_argument("--decimals", type=int, default=None, help="text formats: fixed decimals (default: exact %%.9g)")
    p.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="keep a resumable checkpoint in DIR (every --save-every chunks and at each epoch's end)")
    p.add_argument("--save-every", type=int, default=10, help="chunks between checkpoints (default: 10)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint DIR exactly")
    add_on_sigterm_argument(p)
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_log_to_argument(p)
    p.add_argument("--log-dir", default=None, metavar="DIR",
                   help="folder for the --log-to writers' files (default: OUT without its suffix plus .logs, e.g. vectors.logs/)")
    p.set_defaults(func=_cmd_word2vec_train)

    p = sub.add_parser("neighbors", help="nearest neighbours of words by cosine similarity",
                       description="Print the nearest neighbours of each WORD in a word-vector file.")
    _vector_args(p)
    p.add_argument("words", nargs="+", metavar="WORD")
    p.add_argument("-k", type=int, default=10, help="neighbours per word (default: 10)")
    p.add_argument("--restrict", type=int, default=None, help="rank only the first N (most frequent) words")
    p.set_defaults(func=_cmd_neighbors)

    p = sub.add_parser("analogy", help="A : B :: C : ? by 3CosAdd (B - A + C)",
                       description="Answer the analogy A is to B as C is to ? (word2vec's 3CosAdd, "
                                   "A, B and C excluded).")
    _vector_args(p)
    p.add_argument("a", metavar="A")
    p.add_argument("b", metavar="B")
    p.add_argument("c", metavar="C")
    p.add_argument("-k", type=int, default=5, help="answers to print (default: 5)")
    p.add_argument("--restrict", type=int, default=None, help="rank only the first N (most frequent) words")
    p.set_defaults(func=_cmd_analogy)

    p = sub.add_parser("bag-classifier", help="averaged word vectors -> linear/MLP sentence classifier (SST-2)",
                       description="Train the bag-of-embeddings (CBOW) baseline on a task's train split and "
                                   "print dev accuracy after the last epoch.")
    _vector_args(p)
    p.add_argument("--task", choices=SST2_TASKS, default="sst-2", help="default: sst-2")
    p.add_argument("--data", required=True, metavar="DIR", help="folder with train.tsv and dev.tsv (GLUE SST-2)")
    p.add_argument("--epochs", type=int, default=5, help="default: 5")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default: 1e-3)")
    p.add_argument("--batch-size", type=int, default=64, help="default: 64")
    p.add_argument("--hidden", type=int, default=0, help="ReLU hidden layer width, 0 = linear (default: 0)")
    p.add_argument("--trainable", action="store_true", help="fine-tune the word vectors too")
    p.add_argument("--dropout", type=float, default=0.1, help="default: 0.1")
    p.add_argument("--weight-decay", type=float, default=0.0, help="default: 0")
    p.add_argument("--lowercase", action="store_true", help="lowercase sentences before lookup")
    p.add_argument("--limit-train", type=int, default=None, help="use only the first N training sentences")
    p.add_argument("--seed", type=int, default=0, help="default: 0")
    p.add_argument("--device", type=device_option, default="cpu", help="torch device (default: cpu)")
    p.set_defaults(func=_cmd_bag_classifier)
