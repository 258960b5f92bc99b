"""Context-free baselines: word2vec / fastText vectors on WikiText-2, then the bag-of-embeddings SST-2 classifier.

    python benchmarks/static_baselines.py                          # skip-gram, dim 100, 5 epochs
    python benchmarks/static_baselines.py --subwords --epochs 3    # fastText-style sub-word vectors
    python benchmarks/static_baselines.py --reuse                  # load .devstatic/<name>.npz, skip training

Trains on WikiText-2 train (lowercased, because GLUE SST-2 is lowercase), saves the vectors to
.devstatic/<name>.vec and .npz, prints nearest neighbours and the answers to a handful of
hand-picked analogies (3CosAdd, top-1), then trains the bag-of-embeddings classifier on
SST-2 train and scores SST-2 dev after the last epoch (no epoch selection on dev):

* frozen vectors, linear head (the classic CBOW baseline);
* frozen vectors, one-hidden-layer MLP head;
* vectors fine-tuned with the linear head;
* controls with random vectors over the same vocabulary (frozen and fine-tuned), which show
  how much the pre-trained vectors add.

Writes quality records (SST-2 dev accuracy per variant, analogy accuracy) to
benchmarks/results/static_vectors.json (--results to change; a rerun replaces the records of
the same variant, vectors and machine, the others stay). Training time and words/s
ride along in every record. Data: ../shared/data beside the checkout, or $CTXKIT_DATA.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from harness import command_line, write_records

from ctxkit.models.static.vectors import WordVectors
from ctxkit.pretraining.word2vec import train_word2vec
from ctxkit.tasks.bag_classifier import train_bag_classifier
from ctxkit.data.glue import read_sst2

REPO = Path(__file__).resolve().parents[1]

NEIGHBOUR_WORDS = ("bank", "king", "river", "money", "france", "film", "good", "war")
# (a, b, c, expected d): "a is to b as c is to d". Hand-picked, not the Google analogy set;
# a question counts only when all four words are in the vocabulary.
ANALOGIES = [
    ("man", "king", "woman", "queen"), ("he", "his", "she", "her"), ("brother", "sister", "son", "daughter"),
    ("father", "mother", "husband", "wife"), ("boy", "girl", "man", "woman"),
    ("france", "paris", "germany", "berlin"), ("england", "london", "france", "paris"),
    ("japan", "tokyo", "china", "beijing"), ("italy", "rome", "spain", "madrid"),
    ("france", "french", "germany", "german"), ("italy", "italian", "spain", "spanish"),
    ("china", "chinese", "japan", "japanese"), ("big", "bigger", "small", "smaller"),
    ("good", "better", "bad", "worse"), ("large", "largest", "small", "smallest"),
    ("song", "songs", "album", "albums"), ("city", "cities", "country", "countries"),
    ("game", "games", "player", "players"), ("play", "played", "walk", "walked"),
    ("go", "went", "see", "saw"), ("write", "wrote", "sing", "sang"), ("play", "playing", "write", "writing"),
]


def data_dir() -> Path:
    return Path(os.environ.get("CTXKIT_DATA", REPO.parent / "shared" / "data"))


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(data_dir() / "wikitext-2" / "wiki.train.tokens.xz"))
    parser.add_argument("--sst2", default=str(data_dir() / "glue" / "SST-2"), help="folder with train.tsv, dev.tsv")
    parser.add_argument("--model", choices=("skipgram", "cbow"), default="skipgram")
    parser.add_argument("--subwords", action="store_true", help="fastText-style character n-grams")
    parser.add_argument("--buckets", type=int, default=500_000, help="n-gram buckets with --subwords")
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--negative", type=int, default=5)
    parser.add_argument("--min-count", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--bag-epochs", type=int, default=5)
    parser.add_argument("--out-dir", default=str(REPO / ".devstatic"))
    parser.add_argument("--reuse", action="store_true", help="load the saved .npz instead of training")
    parser.add_argument("--results", default=None, help="records file (default: benchmarks/results/static_vectors.json)")
    parser.add_argument("--no-results", action="store_true", help="print only, do not write records")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    name = f"wt2_{args.model}{'_ft' if args.subwords else ''}_d{args.dim}_e{args.epochs}"
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.reuse:
        vectors = WordVectors.load(out_dir / f"{name}.npz")
    else:
        vectors = train_word2vec(args.corpus, model=args.model, subwords=args.subwords, buckets=args.buckets,
                                 dim=args.dim, window=args.window, negative=args.negative, min_count=args.min_count,
                                 epochs=args.epochs, batch_size=args.batch_size, lowercase=True, seed=args.seed,
                                 num_threads=args.threads)
        vectors.save(out_dir / f"{name}.npz")
        vectors.save(out_dir / f"{name}.vec", decimals=6)
    meta = vectors.meta
    print(f"{name}: {len(vectors):,} words x {vectors.dim}; {meta['train_tokens']:,} tokens x {meta['epochs']} epochs "
          f"in {meta['seconds']:.1f} s = {meta['words_per_sec']:,.0f} words/s; epoch losses {meta['epoch_losses']}")

    neighbours = {}
    for word in NEIGHBOUR_WORDS:
        if vectors.has_vector(word):
            neighbours[word] = [[w, round(c, 3)] for w, c in vectors.most_similar(word, 8)]
            print(f"  {word:<8} " + ", ".join(f"{w} {c:.2f}" for w, c in neighbours[word]))
    answered, correct, analogy_log = 0, 0, []
    for a, b, c, d in ANALOGIES:
        if not all(w in vectors for w in (a, b, c, d)):
            analogy_log.append([a, b, c, d, None])
            continue
        guess = vectors.analogy(a, b, c, k=1)[0][0]
        answered, correct = answered + 1, correct + (guess == d)
        analogy_log.append([a, b, c, d, guess])
        print(f"  {a} : {b} :: {c} : {guess}  ({'ok' if guess == d else 'expected ' + d})")
    print(f"analogies: {correct}/{answered} top-1 ({len(ANALOGIES) - answered} skipped: words missing)")

    train_texts, train_labels = read_sst2(Path(args.sst2) / "train.tsv")
    dev_texts, dev_labels = read_sst2(Path(args.sst2) / "dev.tsv")
    rng = np.random.default_rng(args.seed)
    random_vectors = WordVectors(vectors.words, rng.normal(0, float(vectors.vectors.std()), vectors.vectors.shape))
    variants = [
        ("frozen vectors, linear head", vectors, dict(freeze=True, lr=1e-3)),
        ("frozen vectors, MLP head (256 hidden)", vectors, dict(freeze=True, hidden=256, lr=1e-3)),
        ("fine-tuned vectors, linear head", vectors, dict(freeze=False, lr=1e-3)),
        ("control: frozen random vectors, linear head", random_vectors, dict(freeze=True, lr=1e-3)),
        ("control: fine-tuned random vectors, linear head", random_vectors, dict(freeze=False, lr=1e-3)),
    ]
    bag_results = []
    for label, vecs, kw in variants:
        start = time.perf_counter()
        res = train_bag_classifier(vecs, train_texts, train_labels, dev_texts, dev_labels, epochs=args.bag_epochs,
                                   batch_size=64, dropout=0.1, seed=args.seed, progress=False, **kw)
        seconds = time.perf_counter() - start
        bag_results.append((label, kw, res, seconds))
        print(f"SST-2 dev {100 * res.dev_accuracy:.2f}  {label}  (per epoch: "
              f"{[round(100 * h['dev_accuracy'], 1) for h in res.history]}, {seconds:.0f} s, "
              f"dev token coverage {100 * res.coverage:.1f}%)")

    if args.no_results:
        return 0
    device = f"CPU: {cpu_name()} (2 cores shared with other jobs; torch threads {args.threads})"
    date = datetime.date.today().isoformat()
    command = command_line("static_baselines.py", argv if argv is not None else sys.argv[1:])
    model = (f"{'fastText-style ' if args.subwords else ''}{args.model} dim {args.dim}, window {args.window}, "
             f"negative {args.negative}, min_count {args.min_count}, {args.epochs} epochs on WikiText-2 train "
             f"(lowercased, {meta['train_tokens']:,} tokens, {len(vectors):,} words)")
    train = dict(vectors_file=f".devstatic/{name}.vec", vector_train_time_s=meta["seconds"],
                 vector_words_per_s=meta["words_per_sec"], vector_epoch_losses=meta["epoch_losses"])
    records = []
    for label, kw, res, seconds in bag_results:
        records.append(dict(task="sst-2", split="dev", metric="accuracy (bag of embeddings, final epoch)",
                            value=round(100 * res.dev_accuracy, 2), model=f"{label}; vectors: {model}",
                            peer_name=None, peer_value=None, bag_epochs=args.bag_epochs, bag_lr=kw["lr"],
                            bag_batch_size=64, dev_curve=[round(100 * h["dev_accuracy"], 2) for h in res.history],
                            dev_token_coverage=round(100 * res.coverage, 1), bag_train_time_s=round(seconds, 1),
                            **train, device=device, date=date, command=command))
    records.append(dict(task="word analogies (hand-picked, 3CosAdd)", split=f"{answered} questions listed in benchmarks/static_baselines.py "
                        f"({len(ANALOGIES) - answered} skipped: words missing)",
                        metric="top-1 accuracy", value=round(100 * correct / max(1, answered), 2), model=model,
                        peer_name=None, peer_value=None, analogies=analogy_log, neighbours=neighbours, **train,
                        device=device, date=date, command=command))
    path = write_records("static_vectors.json", records, args.results)
    print(f"wrote {len(records)} records to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
