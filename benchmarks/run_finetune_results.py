"""Fine-tune all_minilm_l6_v2 (bert_6_384_12) on every task family and record the scores.

    python benchmarks/run_finetune_results.py --data ../shared/data --out runs/results

Writes one run folder per (task, learning rate) under --out, prints a table, and writes
quality records (task, split, metric, value, model, peer_name, peer_value, device, date,
command, plus wall time and hyper-parameters) to benchmarks/results/finetune_minilm.json.
Small GLUE tasks use the usual dev-set learning-rate grid; the reported row is the grid
point with the best dev score (the MiniLM and BERT papers report dev the same way).
CoNLL-2003 picks the epoch on dev and reports dev and test. QA follows the article-split
protocols of ../shared/data/README.md (not the official dev set).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import sys
import time
from pathlib import Path

from harness import command_line, write_records

from ctxkit.tasks import finetune, get_task
from ctxkit.training import TrainConfig

REPO = Path(__file__).resolve().parents[1]

MODEL = "all_minilm_l6_v2"
# task: (data sub-folder, epochs, batch size, learning rates, task options, metrics to record, anchors)
PLAN = {
    "sst-2": ("glue/SST-2", 3, 32, [1e-4], {}, ["accuracy"], {"accuracy": ("MiniLM-L6-H384 paper, dev", 91.5)}),
    "mrpc": ("glue/MRPC", 5, 32, [5e-5, 1e-4, 2e-4], {}, ["f1", "accuracy"], {"f1": ("MiniLM-L6-H384 paper, dev", 88.9)}),
    "sts-b": ("glue/STS-B", 5, 32, [5e-5, 1e-4, 2e-4], {}, ["pearson", "spearman"], {}),
    "rte": ("glue/RTE", 5, 16, [5e-5, 1e-4, 2e-4], {}, ["accuracy"], {"accuracy": ("MiniLM-L6-H384 paper, dev", 68.8)}),
    "cola": ("glue/CoLA", 5, 32, [5e-5, 1e-4, 2e-4], {}, ["mcc"], {"mcc": ("MiniLM-L6-H384 paper, dev", 47.5)}),
    "conll2003": ("conll2003", 5, 32, [1e-4], {}, ["f1", "precision", "recall"], {"f1@test": ("BERT-base (Devlin et al.), test", 92.4)}),
    "squad": ("squad_v1.1", 3, 32, [1e-4], {}, ["exact_match", "f1"], {"f1": ("BERT-base, official dev, full SQuAD train", 88.5)}),
    "squad2": ("squad_v2.0_cs224n", 6, 32, [5e-5, 1e-4], {}, ["exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1"], {}),
}


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"


def run_task(task_name: str, data_root: Path, out_root: Path, limit: int = 0, model: str = MODEL) -> list:
    sub, epochs, batch, lrs, options, metrics, anchors = PLAN[task_name]
    runs = []
    for lr in lrs:
        task = get_task(task_name, **options)
        cfg = TrainConfig(epochs=epochs, batch_size=batch, lr=lr, progress=False, log_every=100)
        t0 = time.time()
        summary = finetune(task, model, data_root / sub, out_root / f"{task_name}_lr{lr:g}", cfg,
                           limit_train=limit or None, limit_eval=limit or None)
        summary["wall_s"] = round(time.time() - t0, 1)
        summary["lr"], summary["epochs"], summary["batch_size"] = lr, epochs, batch
        main = task.main_metric
        print(f"  {task_name} lr={lr:g}: dev {main}={summary['results'][task.eval_splits[0]][main]:.2f} ({summary['wall_s']}s)", flush=True)
        runs.append((summary, main, task.eval_splits[0]))
    best, main, first = max(runs, key=lambda r: r[0]["results"][r[2]][r[1]])
    records = []
    for split, values in best["results"].items():
        for metric in metrics:
            if metric not in values:
                continue
            anchor = anchors.get(metric if split == first else f"{metric}@{split}")
            records.append({
                "task": task_name, "split": "qa-eval" if task_name.startswith("squad") else split,
                "metric": metric, "value": round(float(values[metric]), 2), "model": f"bert_6_384_12 / {MODEL}",
                "peer_name": anchor[0] if anchor else None, "peer_value": anchor[1] if anchor else None,
                "lr": best["lr"], "lr_grid": lrs, "epochs": best["epochs"], "batch_size": best["batch_size"],
                "best_epoch": best["best_epoch"], "train_time_s": best["train_time_s"], "wall_s": best["wall_s"],
            })
    return records


def run_probe(data_root: Path, limit: int = 0, model: str = MODEL) -> list:
    """Frozen [CLS] and mean features + logistic regression on SST-2 (train -> dev)."""
    import torch

    from ctxkit.data import read_glue
    from ctxkit.features.probe import linear_probe

    train = read_glue("SST-2", data_root / "glue" / "SST-2", "train")
    dev = read_glue("SST-2", data_root / "glue" / "SST-2", "dev")
    if limit:
        train, dev = train[:limit], dev[:limit]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    records = []
    for pooling in ("cls", "mean"):
        t0 = time.time()
        res = linear_probe([e.text for e in train], [e.label for e in train], [e.text for e in dev], [e.label for e in dev],
                           model=model, pooling=pooling, device=device, batch_size=256)
        print(f"  probe {pooling}: dev accuracy {res.accuracy:.2f} (embed {res.embed_seconds:.0f}s, fit {res.fit_seconds:.0f}s)", flush=True)
        records.append({
            "task": "sst-2 (frozen features + logistic regression)", "split": "dev", "metric": "accuracy",
            "value": round(res.accuracy, 2), "model": f"bert_6_384_12 / {MODEL}, {pooling} pooling, frozen",
            "peer_name": "DistilBERT [CLS] + LR (lectures' demo, sst2 small split)", "peer_value": None,
            "train_examples": len(train), "wall_s": round(time.time() - t0, 1),
        })
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data"), help="the shared/data folder")
    parser.add_argument("--out", default="runs/results", help="folder for run folders")
    parser.add_argument("--tasks", nargs="*", default=list(PLAN), help=f"subset of {', '.join(PLAN)}")
    parser.add_argument("--probe", action="store_true", help="also run the frozen-feature SST-2 baseline")
    parser.add_argument("--model", default=MODEL, help="checkpoint name, or a folder holding the same files (verified by SHA-256)")
    parser.add_argument("--limit", type=int, default=0, help="smoke test: first N examples per split")
    parser.add_argument("--results", default=None, help="records file (default: benchmarks/results/finetune_minilm.json)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    data_root, out_root = Path(args.data), Path(args.out)
    command = command_line("run_finetune_results.py", argv if argv is not None else sys.argv[1:])
    device, date = _device(), datetime.date.today().isoformat()
    if Path(args.model).is_dir():
        # A copy of the packaged checkpoint (e.g. on a GPU machine without the package):
        # check it is byte-identical before calling the results all_minilm_l6_v2's.
        from ctxkit.core.checkpoint import verify_sha256
        from ctxkit.zoo import CHECKPOINTS

        verify_sha256(args.model, CHECKPOINTS[MODEL].sha256)
    records = []
    for name in args.tasks:
        print(f"{name}:", flush=True)
        records += run_task(name, data_root, out_root, args.limit, args.model)
    if args.probe:
        records += run_probe(data_root, args.limit, args.model)
    for r in records:
        r.update(device=device, date=date, command=command)
    if args.results:
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    path = write_records("finetune_minilm.json", records, args.results)  # replaces the same task, split, metric, model, device
    print(f"\n{'task':<12}{'split':<9}{'metric':<13}{'ctxkit':>8}{'anchor':>8}  anchor source")
    for r in records:
        anchor = "" if r["peer_value"] is None else f"{r['peer_value']:.1f}"
        print(f"{r['task'][:12]:<12}{r['split']:<9}{r['metric']:<13}{r['value']:>8.2f}{anchor:>8}  {r['peer_name'] or ''}")
    print(f"records written to {path} ({device}, {date})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
