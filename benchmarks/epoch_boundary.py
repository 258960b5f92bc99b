"""Where an epoch boundary's time goes in ``ctxkit pretrain`` (issue 37 item 3).

Runs the ``ctxkit`` command line given after the script's name, as a user would, with timers
around the pieces of an epoch boundary (patched in, nothing else changes): the evaluation,
the epoch-end checkpoint and its pinned snapshot, the curve redraw, the next epoch's loader
start (its worker processes, once a run since one loader serves every epoch) and any wait of more than 3 ms for a batch. Each call is a line
of ``$OUT/boundary.jsonl`` (``fn``, ``ms``, ``at``: seconds since start). The evaluation and
the epoch end are timed between two device synchronisations; the rest as the host sees it.

On a GPU machine, after ``benchmarks/pretrain_long.py prepare --corpus FILES --work WORK``::

    OUT=logs python benchmarks/epoch_boundary.py pretrain --data WORK/shards \\
        --eval-data WORK/held_out --preset bert_12_768_12 --out WORK/run --batch-size 256 \\
        --epochs 40 --max-minutes 2.5 --save-every 1000 --log-every 25 --fast auto --no-progress

With 12 files of the Wikipedia extract an epoch is ~100 steps (~4 s on an H200), so two and a
half minutes hold ~30 boundaries. Results: docs/notes/fast-plan.md ("Fifth round").
"""

import json
import os
import sys
import time

import torch
import torch.utils.data.dataloader as loader_module

from ctxkit.cli import main
from ctxkit.core import run_state
from ctxkit.training import trainer as trainer_module

LOG = open(os.path.join(os.environ.get("OUT", "."), "boundary.jsonl"), "a", encoding="utf-8")
T0 = time.perf_counter()


def note(name: str, seconds: float) -> None:
    LOG.write(json.dumps({"fn": name, "ms": round(1e3 * seconds, 2), "at": round(time.perf_counter() - T0, 3)}) + "\n")
    LOG.flush()


def _sync(on: bool) -> None:
    if on and torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, name: str, sync: bool = True, min_ms: float = 0.0):
    def wrapper(*args, **kwargs):
        _sync(sync)
        t = time.perf_counter()
        result = fn(*args, **kwargs)
        _sync(sync)
        if (time.perf_counter() - t) * 1e3 >= min_ms:
            note(name, time.perf_counter() - t)
        return result
    return wrapper


def patch(owner, name: str, **kw) -> None:
    setattr(owner, name, timed(getattr(owner, name), name, **kw))


patch(trainer_module.Trainer, "_end_epoch")
for name in ("_checkpoint", "_draw_curve", "_stream", "_save_best"):
    patch(trainer_module.Trainer, name, sync=False)
patch(run_state.HostSnapshot, "take", sync=False)
patch(loader_module.DataLoader, "__iter__", sync=False)
patch(loader_module._MultiProcessingDataLoaderIter, "_next_data", sync=False, min_ms=3.0)

_init = trainer_module.Trainer.__init__


def _init_with_timed_evaluation(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    if self.evaluate is not None:
        self.evaluate = timed(self.evaluate, "evaluate")


trainer_module.Trainer.__init__ = _init_with_timed_evaluation

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
