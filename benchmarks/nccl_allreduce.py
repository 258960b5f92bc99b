"""Gradient all-reduce speed on this host: what one data-parallel step pays to average
BERT-base's gradients, with and without CUDA graphs, in fp32 and bf16.

    torchrun --nproc_per_node 2 benchmarks/nccl_allreduce.py
    NCCL_MIN_NCHANNELS=32 torchrun --nproc_per_node 2 benchmarks/nccl_allreduce.py

Prints milliseconds per all-reduce and the bus bandwidth (NCCL's definition: bytes x
2(n-1)/n / time) for a flat buffer of --numel elements (BERT-base's 110M parameters by
default); a diagnostic for multi-GPU training (the fast plan options ``overlap`` and
``bf16grad``), not a record.

Engineering measurement of a kernel, not a product figure (the product figures come from ctxkit bench).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

from ctxkit.training.distributed import setup


# Kept local (not harness.seconds_per_call): every rank waits at a barrier before the timed
# calls, so the ranks start the collective together and the figure is the all-reduce's own.
def timed(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--numel", type=int, default=109_514_298, help="elements (default: BERT-base pretraining parameters)")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    rank, world = setup("cuda")
    env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    for dtype in (torch.float32, torch.bfloat16):
        buf = torch.ones(args.numel, dtype=dtype, device="cuda")
        eager = timed(lambda: dist.all_reduce(buf), args.reps)
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dist.all_reduce(buf)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            dist.all_reduce(buf)
        graphed = timed(graph.replay, args.reps)
        nbytes = buf.numel() * buf.element_size() * 2 * (world - 1) / world
        if rank == 0:
            for name, t in (("eager", eager), ("graph", graphed)):
                print(f"{world} ranks {str(dtype):15s} {name}: {1000 * t:7.3f} ms  busbw {nbytes / t / 1e9:6.1f} GB/s  {env}", flush=True)
    sys.stdout.flush()
    # destroy_process_group() can hang once the communicator was used inside CUDA graphs that
    # are still alive; everything is printed, so leave at once.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
