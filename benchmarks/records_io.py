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
