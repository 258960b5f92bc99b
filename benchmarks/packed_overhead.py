"""Where a packed (variable-length) GPU batch spends its time: host work vs GPU kernels.

    python benchmarks/packed_overhead.py --tokenizer DIR --data SST2_DIR

Runs BERT-base (random weights, bf16) through :class:`ctxkit.inference.gpu.GPUEncoder`'s
packed path (bucketed graphs, or launched from Python) on the SST-2 dev batches (256 sentences each, file order) and prints, per
batch: the wall time of a synchronised call, the host time to build the
``PackedSequences``, and the GPU kernel time from the profiler. Diagnostic only. The
encoder's fast plans: ``graphs+qkv`` (graphs, eager kernels), ``graphs+compile+qkv`` and
``qkv+compile`` (compiled, no graphs).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from ctxkit.cli.bench import _glue_batches
from ctxkit.inference.gpu import GPUEncoder
from ctxkit.layers.attention import PackedSequences
from ctxkit.models.bert.model import BertModel
from ctxkit.zoo.presets import PRESETS


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    batches, _ = _glue_batches("sst-2", args.data, args.tokenizer, "dev", 256)  # (ids, types, mask), pinned
    model = BertModel(PRESETS["bert_12_768_12"].config).eval()
    variants = (("graphs, eager kernels", "graphs+qkv"), ("graphs, compiled", "graphs+compile+qkv"),
                ("no graphs, compiled", "qkv+compile"))
    for label, plan in variants:
        enc = GPUEncoder(copy.deepcopy(model), plan=plan)
        for ids, types, mask in batches * 2:  # compile every shape first
            enc(ids, mask, token_type_ids=types)
        torch.cuda.synchronize()
        print(f"-- packed path, {label} (last path: {enc.last_path})")
        for i, (ids, types, mask) in enumerate(batches):
            # Per-call synchronised wall times and a profiler total, not harness.seconds_per_call:
            # the host's share of one call is the question here.
            walls, builds = [], []
            for _ in range(args.reps):
                start = time.perf_counter()
                PackedSequences(mask)
                builds.append(time.perf_counter() - start)
                start = time.perf_counter()
                enc(ids, mask, token_type_ids=types)
                torch.cuda.synchronize()
                walls.append(time.perf_counter() - start)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                enc(ids, mask, token_type_ids=types)
                torch.cuda.synchronize()
            gpu_ms = sum(e.self_device_time_total for e in prof.key_averages()) / 1000
            print(f"batch {i}: {int(mask.sum())} tokens in {mask.shape[0]} x {mask.shape[1]}: wall {1000 * statistics.median(walls):.2f} ms, "
                  f"PackedSequences {1000 * statistics.median(builds):.2f} ms, GPU kernels {gpu_ms:.2f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
