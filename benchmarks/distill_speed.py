"""Teacher vs. distilled student speed on one GPU, measured the fair way (issue 21).

The distillation results (benchmarks/distill_results.py) timed eager bf16 forwards of batch
32 x 128: a 3-layer MiniLM classifier runs that in 2-5 ms, where kernel launches from Python
are a large share, so the ratio moved between 1.67x and 2.22x from run to run. This script
times the same two architectures (all-MiniLM-L6-v2's 6 x 384 encoder + a 2-way sequence
classification head, and its 3-layer student) on the paths that remove the launch overhead:

* ctxkit's GPU inference path (:class:`ctxkit.inference.gpu.GPUEncoder` with the fast plan
  ``graphs+qkv``: bf16 weights, fused q/k/v, one CUDA graph per shape, no compilation) at
  batch 1, 32 and 256 x 128;
* eager bf16 autocast at batch 32 (the earlier measure, for reference) and 256.

Speed does not depend on the weights' values, so the models are randomly initialised with
the real shapes (a 30,522-word vocabulary); each figure is the median of ``--reps`` timed
calls after warm-up, teacher and student alternating in the same process.

    python benchmarks/distill_speed.py --results benchmarks/results/distill_speed.json
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys

import torch

from harness import command_line, write_records

from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead
from ctxkit.inference.gpu import GPUEncoder
from ctxkit.models.bert.model import PRESETS as BERT_PRESETS, BertModel

PLAN = "graphs+qkv"  # the GPU path's fast plan: CUDA graphs and fused q/k/v, no compilation


def classifier(layers: int) -> torch.nn.Module:
    config = BERT_PRESETS["bert_6_384_12"].config.replace(num_layers=layers)
    return EncoderWithHead(BertModel(config), SequenceClassificationHead(config.hidden_size, 2), cls_only=True)


# Kept local (not harness.seconds_per_call, a mean over back-to-back calls): the recorded
# figure is the median of per-call CUDA-event times, each call timed on its own.
def median_ms(fn, reps: int) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--results", default=None, help="records file (default: benchmarks/results/distill_speed.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("distill_speed.py measures GPU paths; no CUDA device here", file=sys.stderr)
        return 2
    command = command_line("distill_speed.py", argv if argv is not None else sys.argv[1:])
    device, date = torch.cuda.get_device_name(0), datetime.date.today().isoformat()
    torch.manual_seed(0)
    models = {"teacher": classifier(6), "student": classifier(3)}
    params = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
    records = []

    def record(case: str, ms: dict) -> None:
        records.append({"benchmark": "distill_speed", "case": f"3-layer student vs 6-layer teacher (MiniLM shapes), {case}",
                        "metric": "latency (median)", "unit": "ms", "ctxkit": round(ms["student"], 4),
                        "peer_name": "the 6-layer teacher, same path", "peer": round(ms["teacher"], 4),
                        "speedup": round(ms["teacher"] / ms["student"], 3),
                        "size_ratio": round(params["teacher"] / params["student"], 3),
                        "device": device, "date": date, "command": command})
        print(f"{case}: teacher {ms['teacher']:.3f} ms, student {ms['student']:.3f} ms, x{ms['teacher'] / ms['student']:.2f}", flush=True)

    eager = {k: m.cuda().eval() for k, m in models.items()}
    for rows in (32, 256):
        ids = torch.randint(1000, 30522, (rows, args.seq), device="cuda")
        ms = {}
        for k, m in eager.items():
            def run(m=m):
                with torch.inference_mode(), torch.autocast("cuda", torch.bfloat16):
                    m(ids)
            ms[k] = median_ms(run, args.reps)
        record(f"eager bf16 autocast, batch {rows} x {args.seq}", ms)
    runners = {k: GPUEncoder(classifier(6 if k == "teacher" else 3), plan=PLAN) for k in models}
    for rows in (1, 32, 256):
        ids = torch.randint(1000, 30522, (rows, args.seq), device="cuda")
        mask = torch.ones_like(ids)
        ms = {k: median_ms(lambda r=r: r(ids, mask), args.reps) for k, r in runners.items()}
        record(f"ctxkit GPU path (bf16 weights, CUDA graphs), batch {rows} x {args.seq}", ms)
    write_records("distill_speed.json", records, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
