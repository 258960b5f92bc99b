"""Task-agnostic distillation results (issue 21): all-MiniLM-L6-v2 -> a 3-layer student on the
Wikipedia extract within a GPU-time budget, then fine-tuned on SST-2, against the same 3-layer
student (the teacher's layers 0, 2, 4) fine-tuned with no distillation.

    python benchmarks/distill_agnostic.py --wiki ../shared/data/wikipedia-en-extract/AA \
        --glue ../shared/data/glue --minutes 10 --results benchmarks/results/distill_agnostic.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

from harness import command_line, write_records

from ctxkit.models.bert.model import load_bert, save_bert
from ctxkit.pretraining import build_shards
from ctxkit.pretraining.distill import distill_pretrain
from ctxkit.tasks import finetune, get_task
from ctxkit.tokenizers import WordPieceTokenizer
from ctxkit.training import TrainConfig
from ctxkit.training.distill import every_other_layer, student_from_teacher
from ctxkit.zoo import checkpoint_folder

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wiki", default=str(REPO.parent / "shared" / "data" / "wikipedia-en-extract" / "AA"))
    parser.add_argument("--files", type=int, default=20, help="wiki_*.xz files to read (in name order)")
    parser.add_argument("--glue", default=str(REPO.parent / "shared" / "data" / "glue"))
    parser.add_argument("--teacher", default="all_minilm_l6_v2")
    parser.add_argument("--out", default="runs/distill_agnostic")
    parser.add_argument("--minutes", type=float, default=10.0, help="the student's distillation budget (wall clock)")
    parser.add_argument("--head-steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--distill-only", action="store_true", help="stop after distillation (a later call fine-tunes)")
    parser.add_argument("--limit", type=int, default=0, help="smoke test: SST-2 examples per split (records not written)")
    parser.add_argument("--results", default=None, help="records file (default: benchmarks/results/distill_agnostic.json)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    teacher_dir = checkpoint_folder(args.teacher, verify=False)
    shards = out / "shards"
    if not (shards / "meta.json").is_file():
        files = sorted(Path(args.wiki).glob("wiki_*"))[: args.files]
        build_shards(files, teacher_dir, shards, max_seq_len=128, show_progress=False, limit_docs=args.limit or None)
    meta = json.loads((shards / "meta.json").read_text())
    t0 = time.time()
    cfg = TrainConfig(batch_size=args.batch_size, lr=args.lr, epochs=100, max_minutes=args.minutes, warmup_ratio=0.01,
                      progress=False, log_every=100, eval_each_epoch=False)
    done = out / "agnostic" / "summary.json"
    if done.is_file():  # distilled by an earlier call: only the fine-tuning is left
        summary = json.loads(done.read_text())
        distill_s = summary.get("wall_clock_s", 0.0)
    else:
        summary = distill_pretrain(shards, str(teacher_dir), out / "agnostic", cfg, student_layers=3, head_steps=args.head_steps)
        distill_s = summary["wall_clock_s"] = time.time() - t0
        done.write_text(json.dumps(summary, indent=2) + "\n")
    if args.distill_only:
        return 0
    print(json.dumps(summary, indent=1), flush=True)
    # the baseline: the same 3 teacher layers, no distillation
    plain = out / "truncated"
    teacher = load_bert(teacher_dir)
    save_bert(student_from_teacher(teacher, every_other_layer(teacher.config.num_layers, 3)), plain,
              WordPieceTokenizer.from_dir(teacher_dir))
    ft = TrainConfig(epochs=3, batch_size=32, lr=1e-4, progress=False, log_every=500)
    scores = {}
    for name, model in (("distilled", summary["final"]), ("truncated", str(plain)), ("teacher", str(teacher_dir))):
        s = finetune(get_task("sst-2"), model, Path(args.glue) / "SST-2", out / f"sst2_{name}", ft,
                     limit_train=args.limit or None, limit_eval=args.limit or None)
        scores[name] = s["results"]["dev"]["accuracy"]
        print(name, scores[name], flush=True)
    command = command_line("distill_agnostic.py", argv if argv is not None else sys.argv[1:])
    record = {"task": "sst-2", "split": "dev", "metric": "accuracy", "value": round(scores["distilled"], 2),
              "model": "3-layer student of all_minilm_l6_v2 distilled task-agnostically (DistilBERT triple loss) on the "
                       f"Wikipedia extract ({args.files} files, {meta.get('num_instances')} sequences of 128), then fine-tuned",
              "peer_name": "the same 3 teacher layers fine-tuned with no distillation", "peer_value": round(scores["truncated"], 2),
              "teacher_value": round(scores["teacher"], 2), "distill_minutes": round(distill_s / 60, 1),
              "distill_steps": summary["steps"], "head_fitted": summary["head_fitted"],
              "last_losses": {k: summary.get(k) for k in ("loss", "soft_loss", "mlm_loss", "cos_loss")},
              "device": device, "date": datetime.date.today().isoformat(), "command": command}
    if not args.limit:
        write_records("distill_agnostic.json", [record], args.results)
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
