"""FP8 training convergence check (issue 24): BERT pretraining with the Transformer layers'
Linears in float8 (row-wise scales, torchao) against the same run in bf16.

    python benchmarks/fp8_training.py --text ../shared/data/wikipedia-en-extract/AA/wiki_0[0-7].xz \\
        --tokenizer VOCAB_DIR --out runs/fp8 --steps 600

Both runs see the same shards, seed, initial weights, batches and masks (``ctxkit.pretraining.pretrain``;
the bf16 run with ``TrainConfig(fast="train")``, i.e. CUDA graphs and fused q/k/v, no compilation, the
float8 run with ``TrainConfig(fast="train+fp8train-qkv-master")``, i.e. CUDA graphs and torchao's
float8 Linears); only the Linears' precision differs. The figure of
merit is the MLM loss averaged over the log entries of the last fifth of the steps (one
entry per ``--log-every`` steps, each itself a mean over its steps): the float8 run passes
when it is within ``--tolerance`` (1 %) of the bf16 run's. Throughput of both runs is
recorded too (the float8 casts are extra kernels; at BERT-base sizes they may cost more
than the faster GEMMs save). Writes quality records to benchmarks/results/fp8_training.json
(a rerun replaces the records of the same case and card).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from harness import command_line, write_records

from ctxkit.pretraining import MaskingConfig, build_shards
from ctxkit.pretraining.train import pretrain
from ctxkit.training import TrainConfig

# The two runs' fast plans: the eager graphed step ("CUDA graphs, eager" in the records), and
# the same with torchao's float8 Linears (three float8 q/k/v GEMMs, no master weights).
PLANS = {"bf16": "train", "fp8": "train+fp8train-qkv-master"}


def tail_mean(log_path: Path, key: str, from_step: int) -> float:
    rows = [json.loads(line) for line in log_path.read_text().splitlines()]
    vals = [r[key] for r in rows if r.get("event") == "train" and key in r and r.get("step", 0) > from_step]
    if not vals:
        raise SystemExit(f"{log_path}: no training log entries with {key!r} after step {from_step}")
    return sum(vals) / len(vals)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", nargs="+", help="raw text files to build shards from (or --shards)")
    parser.add_argument("--shards", help="an existing shard folder (ctxkit pretrain-data)")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", default="runs/fp8_training")
    parser.add_argument("--preset", default="bert_12_768_12")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--tolerance", type=float, default=0.01, help="largest relative MLM-loss difference that passes")
    parser.add_argument("--results", default=None, help="records file (default: benchmarks/results/fp8_training.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/fp8_training.py trains on a GPU: no CUDA device here")
    out = Path(args.out)
    shards = Path(args.shards) if args.shards else out / "shards"
    if not args.shards:
        if not args.text:
            raise SystemExit("give --text files or --shards")
        build_shards(args.text, args.tokenizer, shards, max_seq_len=128, seed=0, show_progress=False)
    runs = {}
    for name in ("bf16", "fp8"):
        config = TrainConfig(epochs=1000, max_steps=args.steps, batch_size=args.batch, lr=args.lr, warmup_ratio=0.1,
                             seed=0, log_every=args.log_every, progress=False, eval_each_epoch=False,
                             save_checkpoints=False, peak_tflops=None, fast=PLANS[name])
        summary = pretrain(shards, args.preset, out / name, config, tokenizer_dir=args.tokenizer,
                           masking=MaskingConfig(max_predictions=20))
        from_step = args.steps - args.steps // 5
        runs[name] = {"mlm_loss": tail_mean(out / name / "log.jsonl", "mlm_loss", from_step),
                      "mlm_acc": tail_mean(out / name / "log.jsonl", "mlm_acc", from_step),
                      "seq_per_s": summary.get("seq_per_s")}
        print(f"{name}: {json.dumps(runs[name])}", flush=True)
    rel = (runs["fp8"]["mlm_loss"] - runs["bf16"]["mlm_loss"]) / runs["bf16"]["mlm_loss"]
    verdict = "PASS" if abs(rel) <= args.tolerance else "FAIL"
    print(f"fp8 vs bf16 MLM loss over the last {args.steps // 5} of {args.steps} steps: {runs['fp8']['mlm_loss']:.4f} vs "
          f"{runs['bf16']['mlm_loss']:.4f} ({rel:+.2%}; tolerance {args.tolerance:.0%}): {verdict}", flush=True)
    base = {"device": f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}", "date": datetime.date.today().isoformat(),
            "command": command_line("fp8_training.py", argv if argv is not None else sys.argv[1:])}
    split = f"pretraining shards, steps {args.steps - args.steps // 5 + 1}-{args.steps} of {args.steps} (batch {args.batch}, seq 128)"
    records = [
        {"task": f"{args.preset} MLM pretraining, fp8 training (torchao row-wise) vs bf16", "split": split,
         "metric": "MLM loss", "value": round(runs["fp8"]["mlm_loss"], 4), "model": f"{args.preset}, fp8 Linears",
         "peer_name": "same run in bf16 autocast", "peer_value": round(runs["bf16"]["mlm_loss"], 4),
         "relative_difference": round(rel, 4), "tolerance": args.tolerance, "verdict": verdict},
        {"task": f"{args.preset} MLM pretraining, fp8 training (torchao row-wise) vs bf16", "split": split,
         "metric": "MLM accuracy", "value": round(runs["fp8"]["mlm_acc"], 4), "model": f"{args.preset}, fp8 Linears",
         "peer_name": "same run in bf16 autocast", "peer_value": round(runs["bf16"]["mlm_acc"], 4)},
        {"benchmark": "fp8_training", "case": f"{args.preset} pretraining step, batch {args.batch}, seq 128 (CUDA graphs, eager)",
         "metric": "throughput", "unit": "sequences/s", "ctxkit": runs["fp8"]["seq_per_s"], "ctxkit_variant": "fp8 Linears",
         "peer_name": "ctxkit bf16 autocast, same run", "peer": runs["bf16"]["seq_per_s"],
         "speedup": round(runs["fp8"]["seq_per_s"] / runs["bf16"]["seq_per_s"], 3)
         if runs["fp8"]["seq_per_s"] and runs["bf16"]["seq_per_s"] else None},
    ]
    print(f"wrote {write_records('fp8_training.json', [{**r, **base} for r in records], args.results)}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
