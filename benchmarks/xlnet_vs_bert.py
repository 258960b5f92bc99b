"""XLNet vs BERT pretrained from scratch at the same size and budget, then fine-tuned (issue 8).

    python benchmarks/xlnet_vs_bert.py --shards SHARDS --tokenizer VOCAB_DIR --steps 5000 \\
        --sst2 ../shared/data/glue/SST-2 --squad ../shared/data/squad_v1.1 --out runs/xvb

Both models are 4 layers, width 256, 4 heads, FFN 1024 (``xlnet_4_256_4`` / ``bert_4_256_4``)
over the same WordPiece vocabulary and the same shards (``ctxkit pretrain-data``). The
budget is a token budget: both train ``--steps`` steps (same batch, learning rate, warmup
and linear decay), so both see the same sequences; the wall time of each is recorded
(the default, 5,000 steps, took XLNet 4 minutes with eager steps on an H100; whole-step
CUDA graphs, now the default for XLNet too, make them about 1.8x faster). XLNet trains the permutation LM (K = 6, two-stream attention), BERT MLM + NSP.

Each pretrained model is then fine-tuned with the same ``ctxkit finetune`` recipe on
SST-2 (dev accuracy) and on the SQuAD v1.1 article split (first 38 articles of the dev
file train, the last 10 evaluate; EM and F1), XLNet through
:class:`~ctxkit.models.xlnet.encoder.XLNetEncoder`.

``--phase pretrain`` and ``--phase finetune`` split the work over two sittings (the run
folders under ``--out`` carry the state). Quality records (value = XLNet, peer = BERT) go
to ``--results``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import sys
import time
from pathlib import Path

from harness import RESULTS, command_line

from ctxkit.zoo.presets import XLNET_PRESETS
from ctxkit.pretraining import MaskingConfig
from ctxkit.pretraining.train import pretrain
from ctxkit.pretraining.xlnet_pretrain import pretrain_xlnet
from ctxkit.tasks import finetune, get_task
from ctxkit.training import TrainConfig

REPO = Path(__file__).resolve().parents[1]

logger = logging.getLogger("ctxkit")


def _pretrain_config(args, steps: int) -> TrainConfig:
    return TrainConfig(epochs=1000, max_steps=steps, batch_size=args.batch, lr=args.lr, warmup_ratio=args.warmup_ratio,
                       progress=False, log_every=100, eval_each_epoch=False, peak_tflops=None, save_every=0, seed=0)


def run_pretraining(args, models=("xlnet", "bert")) -> dict:
    """Pretrain ``models``; their summaries are merged into OUT/pretrain_state.json."""
    out = Path(args.out)
    state_file = out / "pretrain_state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    if state.get("steps", args.steps) != args.steps:
        raise SystemExit(f"{state_file} holds a {state['steps']}-step run; use another --out for {args.steps} steps")
    state["steps"] = args.steps
    for name in models:
        t0 = time.time()
        if name == "xlnet":
            summary = pretrain_xlnet(args.shards, XLNET_PRESETS["xlnet_4_256_4"], out / "xlnet", _pretrain_config(args, args.steps),
                                     tokenizer_dir=args.tokenizer)
        else:
            summary = pretrain(args.shards, "bert_4_256_4", out / "bert", _pretrain_config(args, args.steps),
                               tokenizer_dir=args.tokenizer, masking=MaskingConfig(max_predictions=20))
        state[name] = {**summary, "wall_s": round(time.time() - t0, 1)}
        state_file.write_text(json.dumps(state, indent=1) + "\n")
        print(f"pretrained {name}:", json.dumps(state[name]), flush=True)
    return state


def run_finetuning(args, state: dict, command: str) -> list:
    import torch

    out = Path(args.out)
    scores = {}
    for name in ("xlnet", "bert"):
        model_dir = state[name]["final"]
        cfg = TrainConfig(epochs=3, batch_size=32, lr=args.ft_lr, progress=False, log_every=500)
        r = finetune(get_task("sst-2"), model_dir, args.sst2, out / f"sst2_{name}", cfg,
                     limit_train=args.limit or None, limit_eval=args.limit or None)
        scores[(name, "sst-2", "accuracy")] = r["results"]["dev"]["accuracy"]
        print(f"{name} SST-2 dev accuracy {r['results']['dev']['accuracy']:.2f} ({r['train_time_s']} s)", flush=True)
        r = finetune(get_task("squad"), model_dir, args.squad, out / f"squad_{name}", cfg,
                     limit_train=args.limit or None, limit_eval=args.limit or None)
        for metric in ("exact_match", "f1"):
            scores[(name, "squad", metric)] = r["results"]["dev"][metric]
        print(f"{name} SQuAD article split EM {r['results']['dev']['exact_match']:.2f} F1 {r['results']['dev']['f1']:.2f} "
              f"({r['train_time_s']} s)", flush=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    x, b = state["xlnet"], state["bert"]
    budget = (f"{state['steps']} steps x {args.batch} sequences (<= 128 tokens), lr {args.lr:g}; XLNet {x['wall_s'] / 60:.1f} min, "
              f"BERT {b['wall_s'] / 60:.1f} min")
    records = []
    for task, split, metric in (("sst-2", "dev", "accuracy"), ("squad", "qa-eval", "exact_match"), ("squad", "qa-eval", "f1")):
        records.append({
            "task": task, "split": split, "metric": metric, "value": round(scores[("xlnet", task, metric)], 2),
            "model": f"xlnet_4_256_4 pretrained from scratch (permutation LM, K=6; final loss {x.get('loss', math.nan):.3f})",
            "peer_name": f"bert_4_256_4 pretrained from scratch on the same shards and steps (MLM+NSP; MLM acc "
                         f"{b.get('mlm_acc', math.nan):.3f})",
            "peer_value": round(scores[("bert", task, metric)], 2), "budget": budget,
            "finetune": f"3 epochs, batch 32, lr {args.ft_lr:g}" + (", SQuAD windows of 384 tokens, stride 128" if task == "squad" else ""),
            "pretrain": {"xlnet": x, "bert": b},
            "device": device, "date": datetime.date.today().isoformat(), "command": command})
    # The file holds this one experiment, rewritten whole. Not harness.write_records: its key
    # holds the model and peer texts, which name this run's final losses, so a rerun would add
    # records beside the old ones (and the tables read the first) instead of replacing them.
    path = Path(args.results) if args.results else RESULTS / "xlnet_vs_bert.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records, indent=1) + "\n")
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", required=True, help="ctxkit pretrain-data folder")
    p.add_argument("--tokenizer", required=True, help="the shards' WordPiece vocabulary folder")
    p.add_argument("--sst2", default=str(REPO.parent / "shared" / "data" / "glue" / "SST-2"))
    p.add_argument("--squad", default=str(REPO.parent / "shared" / "data" / "squad_v1.1"))
    p.add_argument("--steps", type=int, default=5000, help="pretraining steps of each model (the shared budget)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-ratio", type=float, default=0.05)
    p.add_argument("--ft-lr", type=float, default=1e-4)
    p.add_argument("--phase", choices=("all", "pretrain", "pretrain-xlnet", "pretrain-bert", "finetune"), default="all",
                   help="pretrain-xlnet / pretrain-bert: one model per call (e.g. over two device sittings)")
    p.add_argument("--limit", type=int, default=0, help="smoke test: first N examples of every fine-tuning split")
    p.add_argument("--out", default="runs/xvb")
    p.add_argument("--results", default=None, help="records file (default: benchmarks/results/xlnet_vs_bert.json)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    command = command_line("xlnet_vs_bert.py", argv if argv is not None else sys.argv[1:])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    state_file = Path(args.out) / "pretrain_state.json"
    if args.phase.startswith("pretrain"):
        run_pretraining(args, ("xlnet", "bert") if args.phase == "pretrain" else (args.phase.split("-")[1],))
        return 0
    if args.phase == "all":
        run_pretraining(args)
    state = json.loads(state_file.read_text())
    for r in run_finetuning(args, state, command):
        print(f"{r['task']} {r['split']} {r['metric']}: XLNet {r['value']} vs BERT {r['peer_value']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
