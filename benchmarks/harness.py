"""What every benchmark shares: the timer, the measured peak, the command line, one record writer.

A benchmark times ctxkit through the entry a user calls (``ctxkit.cli.bench``: the
Trainer, the GPU encoder, ``generate``, each with a fast plan) and its peer in the same
run, then writes records with :func:`write_records`:

* speed records: ``benchmark, case, metric, unit, ctxkit, peer_name, peer, speedup`` plus
  ``device, date, command``; ``command`` is the ``ctxkit ...`` line that reproduces the
  ctxkit figure (``benchmark_command`` the script line that also times the peer);
* a rerun replaces the record with the same benchmark, case, metric, peer and device
  instead of appending (the history of a figure lives in git);
* no machine paths: :func:`command_line` drops ``--results`` and its value.

ctxkit must be importable (``pip install -e .``, or ``PYTHONPATH=src`` on a machine
without an install): no benchmark edits ``sys.path``.
"""

from __future__ import annotations

import datetime
import json
import shlex
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

import torch

from ctxkit.core.timing import measured_peak_tflops, seconds_per_call

__all__ = ["RESULTS", "SPEED_FIELDS", "bench_record", "command_line", "device_name", "measured_peak_tflops", "seconds_per_call",
           "speed_record", "today", "write_records"]

RESULTS = Path(__file__).resolve().parent / "results"
SPEED_FIELDS = ("benchmark", "case", "metric", "unit", "ctxkit", "peer_name", "peer", "speedup", "device", "date", "command")
_KEY = ("benchmark", "case", "task", "split", "metric", "model", "peer_name", "device", "fast")  # speed and quality records


def today() -> str:
    return datetime.date.today().isoformat()


def device_name(device: str = "cuda") -> str:
    """The GPU's name (``NVIDIA H100 80GB HBM3``), or ``CPU (N threads)``."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU ({torch.get_num_threads()} threads)"


def command_line(script: str, argv: Sequence[str]) -> str:
    """``python benchmarks/<script> ARGS`` without ``--results PATH``, absolute paths named by their
    option (``--data /x/SST-2`` -> ``--data DATA``): records name no machine path."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--results":
            skip = True
        elif arg.startswith("/"):  # a folder of this machine: named by the option it answers
            kept.append(kept[-1].lstrip("-").upper().replace("-", "_") if kept and kept[-1].startswith("--") else "PATH")
        elif not arg.startswith("--results="):
            kept.append(arg)
    return " ".join(["python", f"benchmarks/{script}", *map(shlex.quote, kept)])


def speed_record(benchmark: str, case: str, metric: str, unit: str, ctxkit: float, peer_name: Optional[str], peer: Optional[float],
                 command: str, lower_is_better: bool = False, device: Optional[str] = None, **extra) -> dict:
    """One speed record; ``speedup`` > 1 means ctxkit is faster (for times: peer / ctxkit).

    Raises:
        ValueError: a ``command`` that is not a ``ctxkit ...`` line.
    """
    if not command.startswith("ctxkit "):
        raise ValueError(f"a speed record's command reproduces the ctxkit figure with one ctxkit command, got {command!r}")
    record = {"benchmark": benchmark, "case": case, "metric": metric, "unit": unit, "ctxkit": round(float(ctxkit), 4),
              "peer_name": peer_name, "peer": None if peer is None else round(float(peer), 4), "speedup": None,
              "device": device or device_name(), "date": today(), "command": command}
    if peer:
        record["speedup"] = round(peer / ctxkit if lower_is_better else ctxkit / peer, 3)
    record.update(extra)
    return record


def write_records(name: str, records: Iterable[dict], results: Optional[str] = None) -> Path:
    """Merge ``records`` into ``benchmarks/results/<name>`` (or ``results``): each replaces
    the record with its benchmark, case, metric, peer and device (quality records: task,
    split, metric, model, peer, device and plan), the others stay."""
    path = Path(results) if results else RESULTS / name
    old: List[dict] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    new = list(records)
    keys = {tuple(r.get(k) for k in _KEY) for r in new}
    merged = [r for r in old if tuple(r.get(k) for k in _KEY) not in keys] + new
    path.write_text(json.dumps(merged, indent=1) + "\n", encoding="utf-8")
    return path


# What each ``ctxkit bench`` figure is recorded as: (results file, benchmark, case, metric, unit, figure key).
_BENCH = {
    "pretrain": ("pretrain_throughput.json", "pretrain_throughput", "{preset}, seq {seq}, batch {batch}, bf16, 1 GPU, --fast {asked}",
                 "sequences per second", "seq/s", "seq_per_s"),
    "infer": ("inference_gpu.json", "inference_gpu", "BERT-base classifier, bf16, batch {batch}, seq {seq}, --fast {asked}",
              "throughput", "sequences/s", "seq_per_s"),
    "decode": ("generate.json", "generate", "{preset} random weights, prompt {prompt}, {new} new tokens, greedy, batch {batch}, bf16, "
               "--fast {asked}", "new tokens per second", "tokens/s", "tokens_per_s"),
}


def bench_record(line: dict, command: str) -> tuple:
    """``(results file, record)`` of one ``ctxkit bench`` JSON line (a ctxkit figure, no peer),
    ``command`` being the ``ctxkit bench ...`` line that printed it."""
    name, benchmark, case, metric, unit, key = _BENCH[line["bench"]]
    fields = {**line, "asked": line.get("asked", "auto")}
    extra = {k: line[k] for k in ("warmup_s", "mfu", "ms_per_batch", "ms_per_call") if line.get(k) is not None}
    return name, speed_record(benchmark, case.format(**fields), metric, unit, line[key], None, None, command, device=line["device"],
                              ctxkit_plan=line["fast"], **extra)


def main(argv=None) -> int:
    """``python benchmarks/harness.py BENCH_OUTPUT``: record the figures of a ``ctxkit bench``
    log (each ``$ ctxkit bench ...`` command line followed by the JSON line it printed)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("log", help="a file of '$ ctxkit bench ...' lines, each followed by that command's JSON output line")
    args = parser.parse_args(argv)
    command, by_file = None, {}
    for raw in Path(args.log).read_text(encoding="utf-8").splitlines():
        if raw.startswith("$ ctxkit bench "):
            command = raw[2:].strip()
        elif raw.startswith("{") and command:
            name, record = bench_record(json.loads(raw), command)
            by_file.setdefault(name, []).append(record)
            command = None
    for name, records in by_file.items():
        print(f"{write_records(name, records)}: {len(records)} record(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
