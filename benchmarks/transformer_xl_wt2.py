"""Transformer-XL against a vanilla Transformer LM on WikiText-2 (or other word-level files; issue 8).

    python benchmarks/transformer_xl_wt2.py --data ../shared/data/wikitext-2 --minutes 3.5 \\
        --out runs/xl_wt2 --results benchmarks/results/transformer_xl.json

Both models have the preset's depth, width and adaptive softmax and train on segments of
``--tgt-len`` tokens with the same batch size, schedule and seed. The Transformer-XL trains
for ``--minutes`` (with a memory of ``--mem-len`` states per layer, relative positions); the
vanilla model (learned absolute positions, no memory, so every segment starts from nothing)
then trains for exactly as many steps, so both see the same tokens. Test perplexity: the
vanilla model on its training length, the XL with memory 0, 1x, 2x and 4x the training
segment length (evaluation at a longer attention length than training).

Writes quality records (test perplexity, peer = the vanilla model) and speed records
(training and evaluation tokens/s; peer = the vanilla model, so a speedup below 1 is the
price of attending over the memory) to ``--results``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from harness import RESULTS, command_line

from ctxkit.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]


def _corpus(data: Path, split: str) -> str:
    for name in (f"wiki.{split}.tokens.xz", f"wiki.{split}.tokens"):
        if (data / name).is_file():
            return str(data / name)
    raise SystemExit(f"{data}: no wiki.{split}.tokens(.xz)")


def _files(args) -> list:
    if args.files:
        return list(args.files)
    return [_corpus(args.data, split) for split in ("train", "valid", "test")]


def _train(args, model: str, out: Path, budget: list) -> dict:
    train, valid, test = _files(args)
    argv = ["--train", train, "--valid", valid, "--test", test,
            "--out", str(out), "--preset", args.preset, "--model", model, "--tgt-len", str(args.tgt_len),
            "--mem-len", str(args.mem_len), "--batch-size", str(args.batch_size), "--lr", str(args.lr),
            "--warmup-steps", str(args.warmup_steps), "--clip-norm", "0.25", "--eval-every", str(args.eval_every),
            "--device", args.device, "--eval-mem-lens", *[str(m * args.tgt_len) for m in (0, 1, 2, 4)], *budget]
    if args.no_progress:
        argv.append("--no-progress")
    if args.d_model:
        argv += ["--d-model", str(args.d_model)]
    if args.max_vocab:
        argv += ["--max-vocab", str(args.max_vocab)]
    cli_main(["train-transformer-xl", *argv])
    return json.loads((out / "results.json").read_text())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "wikitext-2")
    p.add_argument("--files", nargs=3, metavar=("TRAIN", "VALID", "TEST"), help="word-level files instead of --data "
                   "(e.g. `ctxkit lm-corpus` output for the Wikipedia extract)")
    p.add_argument("--corpus", default="wikitext-2", help="corpus name in the records")
    p.add_argument("--max-vocab", type=int, default=None, help="keep the most frequent words (large corpora)")
    p.add_argument("--xl-only", action="store_true", help="train only the Transformer-XL (no vanilla baseline)")
    p.add_argument("--preset", default="transfo_xl_wt2_small")
    p.add_argument("--d-model", type=int, default=None, help="override the preset's width (smoke tests)")
    p.add_argument("--minutes", type=float, default=3.5, help="Transformer-XL training time; the vanilla model gets its steps")
    p.add_argument("--tgt-len", type=int, default=64)
    p.add_argument("--mem-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=1000)
    p.add_argument("--device", default="auto")
    p.add_argument("--out", type=Path, default=Path("runs/xl_wt2"))
    p.add_argument("--results", type=Path, default=RESULTS / "transformer_xl.json")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    command = command_line("transformer_xl_wt2.py", argv if argv is not None else sys.argv[1:])

    # The XL's cosine schedule runs over its time budget; the vanilla model's runs over the
    # XL's final step count: the same learning-rate curve, the same tokens, the same updates.
    xl = _train(args, "xl", args.out / "xl", ["--max-time-s", str(args.minutes * 60), "--max-steps", "0"])
    van = None if args.xl_only else _train(args, "vanilla", args.out / "vanilla", ["--max-steps", str(xl["steps"])])
    if van is not None and van["steps"] != xl["steps"]:
        raise SystemExit(f"vanilla stopped at step {van['steps']}, the XL at {xl['steps']}: not the same token budget")

    device = xl.get("gpu") or f"CPU ({xl['device']})"
    today = datetime.date.today().isoformat()
    L = args.tgt_len
    base = {"device": device, "date": today, "command": command}
    van_ppl = van["test"]["mem_len=0"]["perplexity"] if van else None
    xl_name = (f"Transformer-XL {args.preset} ({xl['parameters'] / 1e6:.1f}M params), tgt_len {L}, train mem_len {args.mem_len}, "
               f"{xl['steps']} steps x {args.batch_size} x {L} tokens, {xl['train_time_s'] / 60:.1f} min")
    van_name = (f"vanilla Transformer LM, same depth/width/softmax ({van['parameters'] / 1e6:.1f}M params), absolute positions, "
                f"no memory, same {van['steps']} steps ({van['train_time_s'] / 60:.1f} min)") if van else None
    records = []
    for m in (0, 1, 2, 4):
        r = xl["test"][f"mem_len={m * L}"]
        records.append({"task": f"{args.corpus} language modelling", "split": "test", "metric": "perplexity",
                        "value": round(r["perplexity"], 2), "model": f"{xl_name}; evaluated with mem_len {m * L} ({m}x the training segment)",
                        "eval_mem_len": m * L, "vocab_size": xl["vocab_size"], "peer_name": van_name,
                        "peer_value": round(van_ppl, 2) if van else None, **base})
    speed = [] if van is None else [("train", xl["train_tokens_per_s"], van["train_tokens_per_s"]),
                                    ("eval", xl["test"][f"mem_len={2 * L}"]["tokens_per_s"], van["test"]["mem_len=0"]["tokens_per_s"])]
    for phase, ours, theirs in speed:
        case = (f"{phase}: {args.preset}, bf16 autocast, batch {args.batch_size}, tgt_len {L}, "
                + (f"mem_len {args.mem_len}" if phase == "train" else f"mem_len {2 * L} (eval batch {xl['train_config']['eval_batch_size']})"))
        records.append({"benchmark": "transformer_xl", "case": case, "metric": "throughput", "unit": "tokens/s",
                        "ctxkit": ours, "peer_name": "ctxkit vanilla Transformer LM (same size, no memory)", "peer": theirs,
                        "speedup": round(ours / theirs, 3), **base})
    # Replace this corpus's records, keep the others (one file for every corpus). Not
    # harness.write_records: its key holds the model text, which names this run's steps and
    # minutes, so a rerun would add records beside the old ones instead of replacing them.
    old = json.loads(args.results.read_text()) if args.results.is_file() else []
    keep = [r for r in old if r.get("task", "wikitext-2 language modelling" if "benchmark" in r else None)
            != f"{args.corpus} language modelling"]
    for r in records:
        if "benchmark" in r:
            r["task"] = f"{args.corpus} language modelling"
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(keep + records, indent=1) + "\n")
    print(f"\nvanilla test ppl {van_ppl if van else float('nan'):.2f}; Transformer-XL test ppl by eval memory: "
          + ", ".join(f"{r['eval_mem_len']}: {r['value']}" for r in records if "eval_mem_len" in r))
    print(f"train tokens/s XL {xl['train_tokens_per_s']:,.0f}; wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
