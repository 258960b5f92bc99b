"""Pretrain a small BERT from scratch within a time budget, then fine-tune it on SST-2
next to the same architecture from random initialisation.

    python benchmarks/pretrain_from_scratch.py --shards SHARDS --tokenizer VOCAB_DIR \\
        --sst2 ../shared/data/glue/SST-2 --preset bert_4_256_4 --minutes 15 --out runs/scratch

How fast the pretraining runs is the fast plan ``--fast`` (``TrainConfig.fast``; default
``auto``, e.g. ``--fast auto+compile+bf16res``; ``python -m ctxkit.fast.plan`` lists the
options). The old flags ``--compile`` and ``--bf16-residual`` still work: they add
``+compile`` and ``+bf16res`` to the plan.

A budget longer than one sitting (e.g. the device tool's 10-minute calls) is spent in
parts: ``--phase pretrain --budget 25 --minutes 9`` run repeatedly continues the same
pretraining run (exact resume) until 25 minutes of pretraining are used, then
``--phase finetune`` fine-tunes and writes the record. The time used so far is kept in
OUT/pretrain_budget.json.

Writes run folders (log.jsonl, curve.png) under --out and quality records to
benchmarks/results/pretrain_from_scratch.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
import time
from pathlib import Path

from harness import RESULTS, command_line

from ctxkit.models import BertModel, get_preset, save_bert
from ctxkit.pretraining import MaskingConfig
from ctxkit.pretraining.train import pretrain
from ctxkit.tasks import finetune, get_task
from ctxkit.tokenizers import WordPieceTokenizer
from ctxkit.training import TrainConfig, set_seed


def fast_plan(args) -> str:
    """The pretraining's fast plan: ``--fast`` plus what the old flags ask for."""
    return args.fast + ("+compile" if args.compile else "") + ("+bf16res" if args.bf16_residual else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--sst2", required=True)
    parser.add_argument("--preset", default="bert_4_256_4")
    parser.add_argument("--minutes", type=float, default=15.0, help="pretraining minutes in this call")
    parser.add_argument("--budget", type=float, default=None, help="total pretraining minutes over all calls (default: --minutes)")
    parser.add_argument("--phase", choices=("all", "pretrain", "finetune"), default="all")
    parser.add_argument("--fast", default="auto", help="the pretraining's fast plan (TrainConfig.fast; default: auto)")
    parser.add_argument("--compile", action="store_true", help="old flag: adds +compile to --fast")
    parser.add_argument("--bf16-residual", action="store_true", help="old flag: adds +bf16res to --fast")
    parser.add_argument("--steps", type=int, default=40000, help="schedule length (the budget usually stops earlier)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default="runs/scratch")
    parser.add_argument("--limit", type=int, default=0, help="smoke test: first N SST-2 examples")
    parser.add_argument("--results", default=None, help="records file (default: benchmarks/results/pretrain_from_scratch.json)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    import torch

    this_command = command_line("pretrain_from_scratch.py", argv if argv is not None else sys.argv[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget_file = out / "pretrain_budget.json"
    used = json.loads(budget_file.read_text()) if budget_file.is_file() else {"minutes": 0.0, "calls": 0}
    budget = args.budget if args.budget is not None else args.minutes
    if args.phase in ("all", "pretrain") and used["minutes"] < budget:
        t0 = time.time()
        summary = pretrain(args.shards, args.preset, out / "pretrain",
                           TrainConfig(epochs=1000, max_steps=args.steps, batch_size=args.batch, lr=args.lr, warmup_ratio=0.02,
                                       progress=False, log_every=200, eval_each_epoch=False,
                                       max_minutes=min(args.minutes, budget - used["minutes"]), peak_tflops=None, save_every=2000,
                                       fast=fast_plan(args)),
                           tokenizer_dir=args.tokenizer, masking=MaskingConfig(max_predictions=20), resume=used["calls"] > 0)
        used = {"minutes": used["minutes"] + (time.time() - t0) / 60, "calls": used["calls"] + 1, "summary": summary,
                "commands": used.get("commands", []) + [this_command]}
        budget_file.write_text(json.dumps(used, indent=1) + "\n")
        print("pretrain:", json.dumps(summary), f"({used['minutes']:.1f} of {budget} min used)", flush=True)
    if args.phase == "pretrain":
        return 0
    summary = used["summary"]
    pretrain_s = used["minutes"] * 60
    # The same architecture from random initialisation, saved in the same layout.
    tokenizer = WordPieceTokenizer.from_dir(args.tokenizer)
    set_seed(0)
    random_dir = out / "random_init"
    save_bert(BertModel(get_preset(args.preset).config.replace(vocab_size=tokenizer.vocab_size)), random_dir, tokenizer)
    scores = {}
    for name, model_dir in (("pretrained", summary["final"]), ("random_init", str(random_dir))):
        cfg = TrainConfig(epochs=3, batch_size=32, lr=1e-4, progress=False, log_every=500)
        res = finetune(get_task("sst-2"), model_dir, args.sst2, out / f"sst2_{name}", cfg,
                       limit_train=args.limit or None, limit_eval=args.limit or None)
        scores[name] = res["results"]["dev"]["accuracy"]
        print(f"SST-2 dev accuracy, {name}: {scores[name]:.2f}", flush=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    # Every call that spent pretraining time, then this one (when it is a separate call).
    command = " && ".join(dict.fromkeys(used.get("commands", []) + [this_command]))
    record = {
        "task": "sst-2", "split": "dev", "metric": "accuracy", "value": round(scores["pretrained"], 2),
        "model": f"{args.preset} pretrained from scratch ({summary['steps']} steps x {args.batch}, {pretrain_s / 60:.1f} min, MLM+NSP)",
        "peer_name": f"{args.preset} from random initialisation, same fine-tuning", "peer_value": round(scores["random_init"], 2),
        "pretrain": summary, "device": device, "date": datetime.date.today().isoformat(), "command": command,
    }
    # The file holds this one experiment, rewritten whole. Not harness.write_records: its key
    # holds the model text, which names this run's steps and minutes, so a rerun would add a
    # record beside the old one (and the tables read the first) instead of replacing it.
    (Path(args.results) if args.results else RESULTS / "pretrain_from_scratch.json").write_text(json.dumps([record], indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
