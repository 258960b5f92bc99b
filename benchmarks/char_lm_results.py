"""Character-level LM results (issue 22): Al-Rfou et al.'s deep character Transformer with
its auxiliary losses and their ablation, a character LSTM of about the same parameter count
trained for the same GPU time, Sparse Transformer attention (strided, fixed) vs dense at
equal steps, and quaternion layers at equal width and at about equal parameters.

One named run per call (so runs can share out the GPUs of a machine), then ``--collect``
writes the records and prints the table:

    python benchmarks/char_lm_results.py --corpus DIR --run t12 --steps 3000
    python benchmarks/char_lm_results.py --corpus DIR --run lstm --minutes 2.5
    python benchmarks/char_lm_results.py --collect --results benchmarks/results/char_lm.json

DIR holds ``train.txt``, ``valid.txt``, ``test.txt`` from ``ctxkit char-corpus`` over the 64
files of ../shared/data/wikipedia-en-extract (text8 rules; 50.9 M / 2.88 M / 2.95 M characters).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

from harness import write_records

from ctxkit.models.char_lm.model import CHAR_PRESETS, CharLSTMConfig
from ctxkit.pretraining.char_lm import train_char_lm
from ctxkit.training import TrainConfig

T12 = CHAR_PRESETS["char_t12_512"]
# name -> (architecture, auxiliary-loss switches, what the run shows)
RUNS = {
    "t12": (T12, {}, "T12, dense attention, all three auxiliary losses"),
    "t12_no_aux_layers": (T12, {"aux_layers": False}, "T12 without the intermediate-layer losses"),
    "t12_no_aux_positions": (T12, {"aux_positions": False}, "T12 scoring only the last position of each segment"),
    "t12_no_second_target": (T12.replace(second_target=False), {}, "T12 without the character-after-next loss"),
    "t12_strided": (T12.replace(attention="strided"), {}, "T12 with strided sparse attention (stride 32)"),
    "t12_fixed": (T12.replace(attention="fixed"), {}, "T12 with fixed sparse attention (blocks of 32, 4 summary positions)"),
    "t12_quaternion": (T12.replace(quaternion=True), {}, "T12 with quaternion projections and FFN, same width"),
    # About twice the width gives the quaternion layers about the real model's weights (4 x 1/4): 960 wide.
    "t12_quaternion_wide": (T12.replace(quaternion=True, hidden_size=960, ffn_size=3840, num_heads=15), {},
                            "T12 with quaternion layers at twice the width (about the real model's parameters)"),
    # 2 layers: 4H(E+H) + 4H(2H) weights ~ 12 H^2: H = 1792 gives about T12's 38 M parameters.
    "lstm": (CharLSTMConfig(embedding_size=256, hidden_size=1792, num_layers=2, dropout=0.1, context=512), {},
             "2-layer character LSTM, about T12's parameters, same GPU time as T12"),
}


def _smoke(arch):
    """The same kind of model at toy size (a CPU check of the whole path)."""
    if isinstance(arch, CharLSTMConfig):
        return arch.replace(embedding_size=16, hidden_size=32, context=64)
    small = dict(num_layers=2, hidden_size=32, num_heads=2, ffn_size=64, context=64, sparse_stride=8, sparse_summary=2)
    if arch.hidden_size != T12.hidden_size:  # the wide quaternion run stays wider than the others
        small.update(hidden_size=64, num_heads=4, ffn_size=128)
    return arch.replace(**small)


def run(args) -> None:
    arch, switches, _ = RUNS[args.run]
    arch = _smoke(arch) if args.smoke else arch
    out = Path(args.out) / args.run
    lr = 2e-3 if isinstance(arch, CharLSTMConfig) else args.lr
    # data_workers=0: the blocks are in memory and collate in microseconds, and worker processes
    # sharing tensors through file descriptors failed on the GPU machine (ConnectionResetError).
    # --smoke pads to multiples of 16 as the CUDA-graph path does, so a CPU run exercises it.
    cfg = TrainConfig(epochs=100, batch_size=args.batch_size, lr=lr, warmup_ratio=0.02, weight_decay=0.01, max_steps=args.steps,
                      max_minutes=args.minutes, progress=False, log_every=200, eval_each_epoch=False, save_checkpoints=False,
                      eval_batch_size=64, data_workers=0, pad_multiple=16 if args.smoke else 1)
    t0 = time.time()
    summary = train_char_lm(Path(args.corpus) / "train.txt", Path(args.corpus) / "valid.txt", arch, out, cfg,
                            test_file=Path(args.corpus) / "test.txt", max_eval_chars=args.eval_chars, **switches)
    summary["total_time_s"] = round(time.time() - t0, 1)
    summary["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(args.run, f"valid {summary['valid']['bpc']:.4f} test {summary['test']['bpc']:.4f} bpc, "
          f"{summary['steps']} steps, {summary['wall_time_s']} s, {summary['parameters'] / 1e6:.1f} M params", flush=True)


def _command(name: str, summary: dict) -> str:
    """How one run was made (every run: ``benchmarks/lectures_more.sh char`` or ``char-serial``)."""
    budget = f"--minutes {summary['wall_time_s'] / 60:.2f}" if name == "lstm" else f"--steps {summary['steps']}"
    return (f"python benchmarks/char_lm_results.py --corpus CORPUS --run {name} {budget} "
            "(every run: STEPS=<the Transformers' steps> bash benchmarks/lectures_more.sh char-serial CORPUS - OUT)")


def collect(args) -> None:
    date = datetime.date.today().isoformat()
    records, rows = [], []
    found = {name: json.loads((Path(args.out) / name / "results.json").read_text())
             for name in RUNS if (Path(args.out) / name / "results.json").is_file()}
    base = found.get("t12")
    for name, s in found.items():
        peer = found.get("t12") if name != "t12" else found.get("lstm")
        records.append({
            "task": "character LM (text8 rules on the Wikipedia extract)", "split": "test", "metric": "bits per character",
            "value": round(s["test"]["bpc"], 4), "valid_value": round(s["valid"]["bpc"], 4), "model": f"{name}: {RUNS[name][2]}",
            "peer_name": "t12" if name != "t12" else "lstm", "peer_value": round(peer["test"]["bpc"], 4) if peer else None,
            "parameters": s["parameters"], "steps": s["steps"], "train_time_s": s["wall_time_s"],
            "train_characters_seen": s["steps"] * args.batch_size * (s["config"]["context"]),
            "eval_characters": s["test"]["characters"], "device": s["device"], "date": date,
            "command": _command(name, s)})
        rows.append(f"| {name} | {RUNS[name][2]} | {s['parameters'] / 1e6:.1f} M | {s['steps']} | {s['wall_time_s']:.0f} s | "
                    f"{s['valid']['bpc']:.3f} | {s['test']['bpc']:.3f} |")
    write_records("char_lm.json", records, args.results)  # a rerun replaces its runs' records, keeps the others
    print("| run | model | parameters | steps | train time | valid bpc | test bpc |\n|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if base:
        print(f"\nreference: T12 test bpc {base['test']['bpc']:.4f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="runs/text8")
    parser.add_argument("--out", default="runs/char_lm")
    parser.add_argument("--run", choices=list(RUNS))
    parser.add_argument("--steps", type=int, default=None, help="training steps (Transformers: equal steps)")
    parser.add_argument("--minutes", type=float, default=None, help="training wall-clock budget (the LSTM: T12's time)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-chars", type=int, default=1_000_000, help="score the first N characters of valid and test")
    parser.add_argument("--collect", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="toy-size models (CPU check of the path; not a result)")
    parser.add_argument("--results", default=None, help="records file (default: benchmarks/results/char_lm.json)")
    args = parser.parse_args(argv)
    if args.collect:
        collect(args)
    elif args.run:
        run(args)
    else:
        parser.error("give --run NAME or --collect")
    return 0


if __name__ == "__main__":
    sys.exit(main())
