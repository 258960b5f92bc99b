"""ELMo against the context-free baselines (issue 7): CoNLL-2003 NER and SST-2 on frozen features.

    python benchmarks/elmo_results.py --bilm RUN_DIR --static-vectors .devstatic/wt2_skipgram_d100_e5.vec \\
        --conll .devdata/data/conll2003 --sst2 .devdata/data/glue/SST-2 --device cuda --out elmo_results.json

Every model is the same BiLSTM (:mod:`ctxkit.tasks.feature_models`) on frozen per-word features;
for ELMo the softmax-normalised mix of the biLM's layers (and its scale gamma) is learned with
the task, as in Peters et al. (2018), while the biLM stays frozen. Runs:

* CoNLL-2003 NER, 2-layer BiLSTM tagger; test entity F1 (seqeval) with the weights of the epoch
  of best dev F1. Features: static vectors; static vectors + 4 casing indicators (vectors
  trained on lowercased text cannot see capitals, ELMo's character CNN can); ELMo layers.
* SST-2, 1-layer BiLSTM, max+mean pooling; dev accuracy after the final epoch and at the best
  epoch (picked on dev itself: SST-2 has no labelled test split). Features: static; ELMo.

--bilm takes a train_bilm run folder (final/ or checkpoint.pt), a save_elmo_lm folder, a bilm-tf
options.json + weights.hdf5 folder or a checkpoint.pt (see ctxkit.tasks.feature_sources.load_bilm).
--limit N keeps the first N sentences of every split (smoke tests; the numbers mean nothing).
Writes quality records (a JSON list in the style of benchmarks/results/*.json) to --out; a
rerun replaces the records of the same task, metric, model and device there, the others stay.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import sys
import time
from pathlib import Path

import torch

from harness import RESULTS, command_line, write_records

from ctxkit.core.checkpoint import CheckpointError
from ctxkit.data.conll import label_list, read_conll
from ctxkit.models.static.vectors import WordVectors
from ctxkit.data.glue import read_sst2
from ctxkit.tasks.feature_models import (
    ElmoFeatures,
    StaticFeatures,
    load_bilm,
    train_feature_classifier,
    train_feature_tagger,
)

CONLL_FILES = {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}
SST2_FILES = {"train": "train.tsv", "dev": "dev.tsv"}
# Peters et al. (2018), Table 1, CoNLL-2003 NER test F1: their baseline (biLSTM-CRF on GloVe +
# character CNN, Peters et al. 2017) and the same model with ELMo from a biLM trained on 1B Word.
PEER_NER_BASELINE = ("Peters et al. 2018, Table 1: baseline biLSTM-CRF (GloVe + char-CNN), test", 90.15)
PEER_NER_ELMO = ("Peters et al. 2018, Table 1: baseline + ELMo (biLM on 1B Word Benchmark), test", 92.22)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()} (torch threads {torch.get_num_threads()})"
    except OSError:
        pass
    return f"CPU: {platform.processor() or 'unknown'}"


def repo_peer(file: str, label: str, match) -> tuple:
    """(name, value) of the first record of benchmarks/results/<file> that ``match``-es, else (None, None)."""
    path = RESULTS / file
    try:
        record = next(r for r in json.loads(path.read_text()) if match(r))
    except (OSError, ValueError, StopIteration):
        return None, None
    return f"{label}: {record['model']} ({record['metric']}, {record['split']}; benchmarks/results/{file})", record["value"]


def bilm_summary(bilm, info: dict, path: Path) -> dict:
    cfg = bilm.config
    out = {"source": info["source"], "format": info["format"], "parameters": sum(p.numel() for p in bilm.parameters()),
           "cell_size": cfg.cell_size, "projection_dim": cfg.projection_dim, "num_layers": cfg.num_layers,
           "n_filters": cfg.n_filters, "n_highway": cfg.n_highway}
    # train_bilm's results.json (in the run folder) holds the validation perplexity.
    for results in (path / "results.json", path.parent / "results.json", path.parent.parent / "results.json"):
        if results.is_file():
            try:
                summary = json.loads(results.read_text())
                out.update(valid_perplexity=round(summary["valid"]["perplexity"], 2), train_steps=summary.get("steps"),
                           train_tokens=summary.get("train_tokens"), train_time_s=summary.get("train_time_s"))
            except (ValueError, KeyError, TypeError):
                pass
            break
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bilm", required=True, help="biLM run folder / final folder / checkpoint.pt / bilm-tf folder")
    p.add_argument("--static-vectors", required=True, help="word vectors (.vec, .txt, .bin or .npz)")
    p.add_argument("--conll", default=".devdata/data/conll2003", help="folder with train.txt, valid.txt, test.txt")
    p.add_argument("--sst2", default=".devdata/data/glue/SST-2", help="folder with train.tsv, dev.tsv")
    p.add_argument("--tasks", nargs="+", choices=("ner", "sst2"), default=["ner", "sst2"])
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cuda, cpu, ...")
    p.add_argument("--epochs", type=int, help="epochs of every task model (default: --ner-epochs / --sst2-epochs)")
    p.add_argument("--ner-epochs", type=int, default=10)
    p.add_argument("--sst2-epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=200, help="BiLSTM size per direction")
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--ner-batch-size", type=int, default=32)
    p.add_argument("--sst2-batch-size", type=int, default=64)
    p.add_argument("--layer-norm", action="store_true", help="normalise each ELMo layer before the scalar mix")
    p.add_argument("--static-lowercase", choices=("auto", "yes", "no"), default="auto",
                   help="look words up lowercased first (auto: when the vectors have no uppercase word)")
    p.add_argument("--no-casing", action="store_true", help="skip the NER run on static vectors + casing indicators")
    p.add_argument("--elmo-batch-size", type=int, default=128, help="sentences per biLM forward pass")
    p.add_argument("--compile", action="store_true", help="torch.compile the biLM's LSTM step (GPU)")
    p.add_argument("--limit", type=int, help="first N sentences of every split only (smoke test)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", required=True, help="JSON file for the quality records (merged: a rerun replaces its own records)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    ner_epochs, sst2_epochs = (args.epochs, args.epochs) if args.epochs else (args.ner_epochs, args.sst2_epochs)

    # All inputs are checked before anything slow starts.
    needed = [Path(args.static_vectors)]
    if "ner" in args.tasks:
        needed += [Path(args.conll) / f for f in CONLL_FILES.values()]
    if "sst2" in args.tasks:
        needed += [Path(args.sst2) / f for f in SST2_FILES.values()]
    missing = [str(f) for f in needed if not f.is_file()] + ([] if Path(args.bilm).exists() else [args.bilm])
    if missing:
        p.error("missing input files:\n  " + "\n  ".join(missing))
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    progress = not args.no_progress
    if args.threads:
        torch.set_num_threads(args.threads)
    cut = (lambda xs: xs[: args.limit]) if args.limit else (lambda xs: xs)

    try:
        bilm, info = load_bilm(args.bilm)
    except (FileNotFoundError, ValueError, CheckpointError) as err:
        p.error(str(err))
    vectors = WordVectors.load(args.static_vectors, progress=progress)
    lowercase = {"yes": True, "no": False}.get(args.static_lowercase, not any(w != w.lower() for w in vectors.words))
    bilm_info = bilm_summary(bilm, info, Path(info["source"]))
    if args.compile:
        bilm.compile_steps()
    elmo = ElmoFeatures(bilm, device, batch_size=args.elmo_batch_size, progress=progress)
    print(f"biLM: {bilm_info}\nstatic vectors: {vectors} (lookup lowercased first: {lowercase}); device {device}", flush=True)

    common = dict(device=device_name(device), date=datetime.date.today().isoformat(),
                  command=command_line("elmo_results.py", sys.argv[1:] if argv is None else argv),
                  seed=args.seed, **({"limit": args.limit} if args.limit else {}))
    static_name = f"static vectors {Path(args.static_vectors).name} (dim {vectors.dim}, {len(vectors):,} words; frozen)"
    elmo_name = (f"ELMo biLM {Path(bilm_info['source']).as_posix()} ({bilm_info['parameters'] / 1e6:.1f}M parameters, "
                 f"{bilm.num_representation_layers} layers of {elmo.dim}; frozen, scalar mix learned with the task)")
    records, table = [], []

    def features(source, splits: dict, what: str):
        start = time.perf_counter()
        out = {k: source(v, desc=f"{what} {k}") if isinstance(source, ElmoFeatures) else source(v) for k, v in splits.items()}
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out, round(time.perf_counter() - start, 1)

    if "ner" in args.tasks:
        conll = {k: cut(read_conll(Path(args.conll) / f)) for k, f in CONLL_FILES.items()}
        words = {k: [s.words for s in v] for k, v in conll.items()}
        tags = {k: [s.tags for s in v] for k, v in conll.items()}
        labels = label_list(conll["train"])
        print("CoNLL-2003: " + ", ".join(f"{k} {len(v):,} sentences" for k, v in conll.items()), flush=True)
        runs = [("static", StaticFeatures(vectors, lowercase=lowercase), static_name, PEER_NER_BASELINE)]
        if not args.no_casing:
            runs.append(("static + casing", StaticFeatures(vectors, lowercase=lowercase, casing=True),
                         static_name + " + 4 casing indicators", PEER_NER_BASELINE))
        runs.append(("ELMo", elmo, elmo_name, PEER_NER_ELMO))
        for label, source, name, peer in runs:
            feats, feat_s = features(source, words, "ELMo CoNLL")
            res = train_feature_tagger(feats["train"], tags["train"], feats["dev"], tags["dev"], feats["test"], tags["test"], labels,
                                       epochs=ner_epochs, lr=args.lr, batch_size=args.ner_batch_size, device=device, seed=args.seed,
                                       hidden=args.hidden, dropout=args.dropout, layer_norm=args.layer_norm, progress=progress)
            extra = {"static_coverage": round(100 * source.coverage, 1), "static_lowercase_first": lowercase} if isinstance(source, StaticFeatures) else {"bilm": bilm_info}
            records.append(dict(task="conll2003", split="test", metric="f1 (entity-level, epoch of best dev F1)", value=res["test_f1"],
                                model=f"BiLSTM tagger (2 x {args.hidden} per direction, dropout {args.dropout}, per-word softmax, no CRF) on {name}",
                                peer_name=peer[0], peer_value=peer[1], features=label, epochs=ner_epochs, best_epoch=res["best_epoch"],
                                dev_f1=res["dev_f1"], dev_curve=res["dev_f1_curve"], test_precision=res["test_precision"],
                                test_recall=res["test_recall"], test_per_type_f1=res["test_per_type_f1"],
                                test_f1_last_epoch=res["test_f1_last_epoch"], scalar_mix=res["scalar_mix"], lr=args.lr,
                                batch_size=args.ner_batch_size, train_seconds=res["train_seconds"], feature_seconds=feat_s,
                                parameters=res["parameters"], **extra, **common))
            table.append(("CoNLL-2003 NER test F1", label, res["test_f1"], f"dev {res['dev_f1']} @ epoch {res['best_epoch']}",
                          res["train_seconds"] + feat_s, peer[1]))
            print(f"NER {label}: test F1 {res['test_f1']} (dev {res['dev_f1_curve']}), {res['train_seconds']} s training, "
                  f"{feat_s} s features; mix {res['scalar_mix']}", flush=True)
            del feats, res
            gc.collect()

    if "sst2" in args.tasks:
        sst = {k: read_sst2(Path(args.sst2) / f) for k, f in SST2_FILES.items()}
        words = {k: cut([t.split() for t in texts]) for k, (texts, _) in sst.items()}
        y = {k: cut(labels) for k, (_, labels) in sst.items()}
        print(f"SST-2: train {len(words['train']):,}, dev {len(words['dev']):,} sentences", flush=True)
        minilm = repo_peer("finetune_minilm.json", "fine-tuned MiniLM", lambda r: r.get("task") == "sst-2" and r.get("metric") == "accuracy")
        cbow = repo_peer("static_vectors.json", "CBOW bag of embeddings, same vectors", lambda r: r.get("task") == "sst-2" and r["model"].startswith("frozen vectors, linear head"))
        runs = [("static", StaticFeatures(vectors, lowercase=lowercase), static_name, cbow),
                ("ELMo", elmo, elmo_name, minilm)]
        for label, source, name, peer in runs:
            feats, feat_s = features(source, words, "ELMo SST-2")
            res = train_feature_classifier(feats["train"], y["train"], feats["dev"], y["dev"], num_classes=2, epochs=sst2_epochs,
                                           lr=args.lr, batch_size=args.sst2_batch_size, device=device, seed=args.seed,
                                           hidden=args.hidden, dropout=args.dropout, layer_norm=args.layer_norm, progress=progress)
            extra = {"static_coverage": round(100 * source.coverage, 1), "static_lowercase_first": lowercase} if isinstance(source, StaticFeatures) else {"bilm": bilm_info}
            model = f"BiLSTM (1 x {args.hidden} per direction, max+mean pooling, dropout {args.dropout}) on {name}"
            shared = dict(model=model, peer_name=peer[0], peer_value=peer[1], features=label, epochs=sst2_epochs,
                          dev_curve=res["dev_accuracy_curve"], scalar_mix=res["scalar_mix"], lr=args.lr, batch_size=args.sst2_batch_size,
                          train_seconds=res["train_seconds"], feature_seconds=feat_s, parameters=res["parameters"], **extra, **common)
            records.append(dict(task="sst-2", split="dev", metric="accuracy (final epoch)", value=res["last_dev_accuracy"], **shared))
            records.append(dict(task="sst-2", split="dev", metric=f"accuracy (best of {sst2_epochs} epochs, selected on dev itself)",
                                value=res["best_dev_accuracy"], best_epoch=res["best_epoch"], **shared))
            table.append(("SST-2 dev accuracy (final epoch)", label, res["last_dev_accuracy"],
                          f"best {res['best_dev_accuracy']} @ epoch {res['best_epoch']} (chosen on dev)", res["train_seconds"] + feat_s, peer[1]))
            print(f"SST-2 {label}: dev accuracy {res['dev_accuracy_curve']}, {res['train_seconds']} s training, {feat_s} s features; "
                  f"mix {res['scalar_mix']}", flush=True)
            del feats, res
            gc.collect()

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_records(out.name, records, str(out))
    print(f"\n{'result':<34} {'features':<16} {'value':>7}  {'peer':>6}  {'seconds':>7}  notes")
    for what, label, value, note, seconds, peer in table:
        print(f"{what:<34} {label:<16} {value:>7.2f}  {peer if peer is not None else '-':>6}  {seconds:>7.1f}  {note}")
    print(f"wrote {len(records)} records to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
