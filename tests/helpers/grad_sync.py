"""Run on 2 ranks (gloo): the hand-written gradient average equals DDP's.

Usage: python -m torch.distributed.run --nproc_per_node 2 grad_sync.py OUT.json
(tests/test_fast_paths.py starts the two ranks itself, with torchrun's environment variables.)
"""

import gc
import json
import sys

import torch
import torch.distributed as dist

from ctxkit.training.distributed import broadcast_parameters, setup
from ctxkit.training.speed import FlatGradAllReduce, all_reduce_gradients


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.unused = torch.nn.Linear(6, 5), torch.nn.Linear(5, 3), torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def overlapped_reducer_check(rank: int) -> dict:
    """Bucket-by-bucket all-reduce during backward vs DDP, over two steps."""
    import copy

    from ctxkit.training.reducer import OverlappedGradReducer

    torch.manual_seed(0)
    net = Net()
    low_net, ref = copy.deepcopy(net), copy.deepcopy(net)
    ddp = torch.nn.parallel.DistributedDataParallel(ref, find_unused_parameters=True)
    reducer = OverlappedGradReducer(net, bucket_mb=1e-4)  # tiny buckets: several launches
    low = OverlappedGradReducer(low_net, bucket_mb=1e-4, reduce_dtype=torch.bfloat16)
    diffs, low_errs, unused_none = [], [], []
    for step in range(2):
        torch.manual_seed(100 + 10 * step + rank)
        x = torch.randn(4, 6)
        for r, module in ((reducer, net), (low, low_net)):
            r.start()
            module(x).square().sum().backward()
            r.finish()
        ddp(x).square().sum().backward()
        used = [i for i, q in enumerate(ref.parameters()) if q.grad is not None]
        ours, lows, refs = ([list(m.parameters())[i].grad for i in used] for m in (net, low_net, ref))
        diffs.append(max((a - b).abs().max().item() for a, b in zip(ours, refs)))
        low_errs.append(max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(lows, refs)))
        unused_none.append(net.unused.weight.grad is None and len(used) == 4)
        for m in (net, low_net, ref):  # what optimizer.zero_grad(set_to_none=True) does
            m.zero_grad(set_to_none=True)
    return {"reducer_buckets": len(reducer.buckets), "reducer_max_diff": max(diffs), "reducer_unused_none": all(unused_none),
            "reducer_bf16_rel_err": max(low_errs)}


def main(out: str) -> None:
    rank, world = setup("cpu")
    torch.manual_seed(rank)  # different weights per rank: broadcast must fix that
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    broadcast_parameters(model)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    torch.manual_seed(100 + rank)  # each rank its own data
    x = torch.randn(4, 6)
    model(x).square().sum().backward()
    manual = [p.grad.clone() for p in model.parameters()]
    all_reduce_gradients(model.parameters())
    synced = [p.grad.clone() for p in model.parameters()]
    storages = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    for p, g in zip(model.parameters(), manual):
        p.grad = g.clone()
    all_reduce_gradients(model.parameters(), torch.bfloat16)
    in_bf16 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    sync = FlatGradAllReduce(model)  # sums only: the loss is divided by the world size first
    (model(x).square().sum() * sync.loss_scale).backward()
    sync()
    presummed = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp(x).square().sum().backward()
    reference = [p.grad for p in model.parameters()]
    overlap = overlapped_reducer_check(rank)
    if rank == 0:
        result = {
            **overlap,
            "world": world,
            "same_weights": all(torch.equal(g, gathered[0]) for g in gathered),
            "max_diff_vs_ddp": max((a - b).abs().max().item() for a, b in zip(synced, reference)),
            "loss_scale": sync.loss_scale,
            "grad_storages_after_sync": len(storages),
            "prescaled_max_diff": max((a - b).abs().max().item() for a, b in zip(presummed, reference)),
            "bf16_max_rel_err": max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(in_bf16, reference)),
            "bf16_is_rounded": any(not torch.equal(a, b) for a, b in zip(in_bf16, reference)),
            "local_differs": max((a - b).abs().max().item() for a, b in zip(manual, reference)) > 1e-3,
        }
        with open(out, "w") as f:
            json.dump(result, f)
    # DDP's reducer holds the process group: freed after destroy_process_group (when main's
    # locals go), its destructor could hang at exit (seen ~1 run in 10). Free it first.
    del ddp
    gc.collect()
    dist.barrier()  # nobody tears gloo down while the other rank still talks
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
