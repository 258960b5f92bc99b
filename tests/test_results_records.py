"""Every figure in benchmarks/results is a record a reader can trust and re-run.

Speed records carry ``benchmark, case, metric, unit, ctxkit, peer_name, peer, speedup``, quality
records ``task, split, metric, value, model, peer_name, peer_value``; both say ``device, date,
command``. A record names no machine path (``/root/...``, ``/tmp/...``): a run folder appears as a
placeholder (``runs/NAME``, ``OUT/``, ``RUN_DIR``), so a record reads the same on every machine.
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
SPEED = ("benchmark", "case", "metric", "unit", "ctxkit", "peer_name", "peer", "speedup")
QUALITY = ("task", "split", "metric", "value", "model", "peer_name", "peer_value")
BOTH = ("device", "date", "command")
# Absolute paths, and the checkout's own git-ignored scratch folders (.devdata/, .devscratch/, ...)
# that exist on one developer's machine only.
MACHINE_PATH = re.compile(r"(?<![\w.])(/root/|/tmp/|/home/|/work/|/Users/|/mnt/|[A-Za-z]:\\)|(?<![\w/])\.dev[a-z]*/")
FILES = sorted(RESULTS.glob("*.json"))


def _records(path: Path) -> list:
    data = json.loads(path.read_text())
    assert isinstance(data, list) and data, f"{path.name}: a non-empty list of records"
    return data


def test_results_exist():
    assert len(FILES) >= 20, [p.name for p in FILES]


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_records_have_the_schema(path):
    for i, record in enumerate(_records(path)):
        kind = SPEED if "benchmark" in record else QUALITY if "task" in record else None
        assert kind is not None, f"{path.name}[{i}]: neither a speed (benchmark) nor a quality (task) record"
        missing = [k for k in kind + BOTH if k not in record]
        assert not missing, f"{path.name}[{i}] lacks {missing}"
        datetime.date.fromisoformat(record["date"])
        assert record["command"] and record["device"], f"{path.name}[{i}]: empty command or device"
        if kind is SPEED and record["speedup"] is not None and record["peer"] and record["ctxkit"]:
            # The ratio is ctxkit's advantage either way round: time units divide peer / ctxkit,
            # rates ctxkit / peer; a stored speedup matches one of them to its rounding.
            ratios = (record["peer"] / record["ctxkit"], record["ctxkit"] / record["peer"])
            assert min(abs(record["speedup"] - r) for r in ratios) <= 0.01 * max(1.0, record["speedup"]) + 0.006, \
                f"{path.name}[{i}]: speedup {record['speedup']} vs ctxkit {record['ctxkit']} / peer {record['peer']}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_records_name_no_machine_path(path):
    for i, record in enumerate(_records(path)):
        text = json.dumps(record)
        hit = MACHINE_PATH.search(text)
        assert hit is None, f"{path.name}[{i}] names a machine path: ...{text[max(0, hit.start() - 40):hit.end() + 40]}..."


def test_machine_path_pattern():
    assert MACHINE_PATH.search("--out /root/elmo_wt2")
    assert MACHINE_PATH.search('"final": "/tmp/scratch/final"')
    assert MACHINE_PATH.search("--results /work/main/x.json")
    assert MACHINE_PATH.search("--tokenizer .devdata/minilm --data .devdata/glue/SST-2")
    assert MACHINE_PATH.search('"vectors_file": ".devstatic/wt2.vec"')
    assert not MACHINE_PATH.search("--out runs/elmo_wt2 --data ../shared/data/glue")
    assert not MACHINE_PATH.search("ctxkit predict RUN FILE --device cuda (model.dev/x is a name, not a folder)")
    assert not MACHINE_PATH.search("benchmarks/results/x.json OUT/inference_gpu.json")
