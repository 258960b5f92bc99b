"""Task-specific distillation results (issue 21): teacher = all-MiniLM-L6-v2 fine-tuned (6 layers),
student = 3 of its layers, distilled vs the same student fine-tuned without distillation.

    python benchmarks/distill_results.py --data ../shared/data --out runs/distill \
        --results benchmarks/results/distill.json

For each task: ``finetune`` the teacher, ``distill`` the student with ``--alpha`` (soft
targets) and with ``alpha=0`` (hard labels only; same initialisation, data, steps), score
all three on the task's evaluation split, and time teacher and student on the same batch
(GPU: bf16, batch 32 x 128; CPU: fp32, batch 1 x 128). Writes quality records (value = the
distilled student, peer = the undistilled one, ``teacher_value`` beside) and speed records
(ctxkit = student, peer = teacher).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics
import sys
import time
from pathlib import Path

import torch

from harness import command_line, write_records

from ctxkit.tasks import finetune, get_task, load_run
from ctxkit.tasks.distill import distill
from ctxkit.training import TrainConfig

REPO = Path(__file__).resolve().parents[1]

# data folder, epochs, batch, lr, metrics (the first is the main one): as in benchmarks/run_finetune_results.py
TASKS = {
    "sst-2": ("glue/SST-2", 3, 32, 1e-4, ["accuracy"]),
    "mrpc": ("glue/MRPC", 5, 32, 2e-4, ["f1", "accuracy"]),
    "conll2003": ("conll2003", 5, 32, 1e-4, ["f1"]),
    "squad": ("squad_v1.1", 3, 32, 1e-4, ["f1", "exact_match"]),
}


# Kept local (not harness.seconds_per_call, a mean over back-to-back calls): the recorded
# figure is the median latency of single synchronised calls, on the GPU and on the CPU.
def _time(model: torch.nn.Module, batch: dict, device: str, reps: int) -> float:
    """Median milliseconds of one forward pass (synchronised), after warm-up."""
    model = model.to(device).eval()
    batch = {k: v.to(device) for k, v in batch.items()}
    times = []
    with torch.inference_mode(), torch.autocast("cuda", torch.bfloat16, enabled=device == "cuda"):
        for i in range(reps + 5):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(**batch)
            if device == "cuda":
                torch.cuda.synchronize()
            if i >= 5:
                times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _batch(vocab: int, rows: int, seq: int) -> dict:
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(1000, vocab, (rows, seq), generator=g), "token_type_ids": torch.zeros(rows, seq, dtype=torch.long),
            "attention_mask": torch.ones(rows, seq, dtype=torch.long)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--model", default="all_minilm_l6_v2", help="the teacher's starting checkpoint")
    parser.add_argument("--out", default="runs/distill")
    parser.add_argument("--tasks", nargs="*", default=list(TASKS))
    parser.add_argument("--student-layers", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42], help="student seeds (the teacher uses the first)")
    parser.add_argument("--limit", type=int, default=0, help="smoke test: first N examples per split (records not written)")
    parser.add_argument("--results", default=None, help="records file (default: benchmarks/results/distill.json)")
    args = parser.parse_args(argv)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    command = command_line("distill_results.py", argv if argv is not None else sys.argv[1:])
    date = datetime.date.today().isoformat()
    limit = args.limit or None
    records = []  # tasks run in separate calls add up in one file (write_records replaces only what this call measured)
    for name in args.tasks:
        sub, epochs, batch, lr, metrics = TASKS[name]
        data, out = Path(args.data) / sub, Path(args.out) / name
        cfg = TrainConfig(epochs=epochs, batch_size=batch, lr=lr, progress=False, log_every=200, seed=args.seeds[0])
        t0 = time.time()
        teacher = finetune(get_task(name), args.model, data, out / "teacher", cfg, limit_train=limit, limit_eval=limit)
        t1 = time.time()
        common = dict(student_layers=args.student_layers, temperature=args.temperature, limit_train=limit, limit_eval=limit)
        runs = {"distilled": [], "plain": []}
        for seed in args.seeds:
            scfg = dataclasses.replace(cfg, seed=seed)
            suffix = "" if seed == args.seeds[0] else f"_seed{seed}"
            runs["distilled"].append(distill(out / "teacher", data, out / f"distilled{suffix}", scfg, alpha=args.alpha, **common))
            runs["plain"].append(distill(out / "teacher", data, out / f"plain{suffix}", scfg, alpha=0.0, **common))
        t3 = time.time()
        taught, plain = runs["distilled"][0], runs["plain"][0]
        split = next(iter(teacher["results"]))
        print(f"{name}: teacher {teacher['results'][split]}, distilled {[r['results'][split] for r in runs['distilled']]}, "
              f"plain {[r['results'][split] for r in runs['plain']]} ({t1 - t0:.0f}s, {t3 - t1:.0f}s)", flush=True)
        _, t_model, _, _ = load_run(out / "teacher", "cpu")
        _, s_model, _, _ = load_run(out / "distilled", "cpu")
        size = sum(p.numel() for p in t_model.parameters()) / sum(p.numel() for p in s_model.parameters())
        lat = {}
        for dev, rows, reps in (("cuda", 32, 50), ("cpu", 1, 30)) if torch.cuda.is_available() else (("cpu", 1, 30),):
            vocab = t_model.encoder.config.vocab_size
            lat[dev] = (_time(t_model, _batch(vocab, rows, 128), dev, reps), _time(s_model, _batch(vocab, rows, 128), dev, reps))
        for metric in metrics:
            per_seed = {k: [round(r["results"][split][metric], 2) for r in v] for k, v in runs.items()}
            mean = {k: statistics.mean(r["results"][split][metric] for r in v) for k, v in runs.items()}
            records.append({
                "task": name, "split": "qa-eval" if name == "squad" else split, "metric": metric,
                "value": round(mean["distilled"], 2), "seeds": args.seeds, "per_seed": per_seed,
                "model": f"{args.student_layers}-layer student of all_minilm_l6_v2 (every other layer), distilled (T={args.temperature:g}, "
                         f"alpha={args.alpha:g})",
                "peer_name": "the same student fine-tuned without distillation", "peer_value": round(mean["plain"], 2),
                "teacher_value": round(teacher["results"][split][metric], 2),
                "retained_of_teacher": round(mean["distilled"] / max(teacher["results"][split][metric], 1e-9), 4),
                "epochs": epochs, "batch_size": batch, "lr": lr, "size_ratio": round(size, 3),
                "train_time_s": {"teacher": teacher["train_time_s"], "distilled": taught["train_time_s"], "plain": plain["train_time_s"]},
                "mean_over": f"{len(args.seeds)} student seed(s)",
                "device": device, "date": date, "command": command})
        for dev, (t_ms, s_ms) in lat.items():
            case = (f"{name} classifier, bf16, batch 32 x 128 (eager)" if dev == "cuda" else f"{name} model, fp32, batch 1 x 128, CPU "
                    f"({torch.get_num_threads()} threads)")
            records.append({"benchmark": "distill", "case": f"{name}: {args.student_layers}-layer student vs 6-layer teacher, {case}",
                            "metric": "latency (median)", "unit": "ms", "ctxkit": round(s_ms, 3), "peer_name": "the 6-layer teacher",
                            "peer": round(t_ms, 3), "speedup": round(t_ms / s_ms, 3), "size_ratio": round(size, 3),
                            "device": device if dev == "cuda" else f"CPU of the {device} machine", "date": date, "command": command})
    if not args.limit:
        write_records("distill.json", records, args.results)
    for r in records:
        if "task" in r:
            print(f"{r['task']:<10} {r['metric']:<12} teacher {r['teacher_value']:>6.2f}  distilled {r['value']:>6.2f}  "
                  f"plain {r['peer_value']:>6.2f}  kept {100 * r['retained_of_teacher']:.1f}%")
        else:
            print(f"{r['case']}: teacher {r['peer']} ms, student {r['ctxkit']} ms, x{r['speedup']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
