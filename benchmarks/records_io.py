"""Reading benchmarks/results/*.json records and formatting their values (for the table pages)."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def load_records(name: str) -> list:
    """The records of ``benchmarks/results/<name>``; ``[]`` when the file does not exist."""
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else []


def fmt(v) -> str:
    """Two decimals for floats, the value itself otherwise, empty for None."""
    if v is None:
        return ""
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def record_key(r: dict) -> tuple:
    """What makes two speed records measurements of the same thing: benchmark, case, metric, peer.

    The metric is part of the key because one case can carry several (sparse attention records
    forward time, forward+backward time and peak memory under one case string).
    """
    return r.get("benchmark"), r.get("case"), r.get("metric"), r.get("peer_name")


def newest(records: list, key=record_key) -> list:
    """The newest record per ``key``: the latest ``date``, and of one date the last in file order.

    Args:
        records: records in file order (as :func:`load_records` returns them).
        key: maps a record to what identifies its measurement (default :func:`record_key`).

    Returns:
        One record per key, in the order each key first appears in the file (so a table keeps
        the grouping the benchmark wrote its cases in, whatever order the reruns came in).
    """
    chosen: dict = {}
    for r in records:
        k = key(r)
        # ISO dates compare as strings; ">=" lets a later record of the same date win
        if k not in chosen or r.get("date", "") >= chosen[k].get("date", ""):
            chosen[k] = r
    return list(chosen.values())


def card(device: str) -> str:
    """A short name of the machine of a record ("NVIDIA H100 80GB HBM3, torch 2.11" -> "H100")."""
    name = device.split(", torch")[0]
    return name.replace("NVIDIA ", "").replace(" 80GB HBM3", "")


def figure(v, unit: str = "") -> str:
    """A measured value for a reader: thousands separated above 1,000, else 4 significant digits."""
    if v is None:
        return "-"
    text = f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return text + unit if unit == "x" else f"{text} {unit}".strip()  # "1.9x", "13.1 s"
