"""Where a packed (variable-length) GPU batch spends its time: host work vs GPU kernels.

    python benchmarks/packed_overhead.py --tokenizer DIR --data SST2_DIR

Runs BERT-base (random weights, bf16) through :class:`ctxkit.inference.gpu.GPUEncoder`'s
packed path (bucketed graphs, or launched from Python) on the SST-2 dev batches (256 sentences each, file order) and prints, per
batch: the wall time of a synchronised call, the host time to build the
``PackedSequences``, and the GPU kernel time from the profiler. Diagnostic only.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from inference_gpu import sst2_batches  # noqa: E402

from ctxkit.inference.gpu import GPUEncoder  # noqa: E402
from ctxkit.layers.attention import PackedSequences  # noqa: E402
from ctxkit.models.bert import BertModel  # noqa: E402
from ctxkit.models.presets import PRESETS  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    batches, n, tokens = sst2_batches(Path(args.tokenizer), Path(args.data), 256)
    model = BertModel(PRESETS["bert_12_768_12"].config).eval()
    variants = (("graphs, eager kernels", {}), ("graphs, compiled", {"compile": "default"}),
                ("no graphs, compiled", {"compile": "default", "cuda_graphs": False}))
    for label, options in variants:
        enc = GPUEncoder(copy.deepcopy(model), **options)
        for ids, mask, types in batches * 2:  # compile every shape first
            enc(ids, types, mask)
        torch.cuda.synchronize()
        print(f"-- packed path, {label} (last path: {enc.last_path})")
        for i, (ids, mask, types) in enumerate(batches):
            walls, builds = [], []
            for _ in range(args.reps):
                start = time.perf_counter()
                PackedSequences(mask)
                builds.append(time.perf_counter() - start)
                start = time.perf_counter()
                enc(ids, types, mask)
                torch.cuda.synchronize()
                walls.append(time.perf_counter() - start)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                enc(ids, types, mask)
                torch.cuda.synchronize()
            gpu_ms = sum(e.self_device_time_total for e in prof.key_averages()) / 1000
            print(f"batch {i}: {int(mask.sum())} tokens in {mask.shape[0]} x {mask.shape[1]}: wall {1000 * statistics.median(walls):.2f} ms, "
                  f"PackedSequences {1000 * statistics.median(builds):.2f} ms, GPU kernels {gpu_ms:.2f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
