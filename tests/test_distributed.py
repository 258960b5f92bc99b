"""DDP under torchrun on CPU (gloo, 2 processes) trains exactly like one process on the
same global batches: same logged losses, same weights."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "helpers" / "ddp_train.py"


def _run(tmp_path, name, nproc, grad_accum):
    out = tmp_path / name
    cmd = [sys.executable, str(SCRIPT), str(out), str(grad_accum)]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(29500 + os.getpid() % 1000)] + cmd[1:]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return [r["loss"] for r in log if r["event"] == "train"], json.loads((out / "result.json").read_text())


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_ddp_two_processes_equal_one_process(tmp_path, grad_accum):
    single_losses, single = _run(tmp_path, "single", 1, grad_accum)
    ddp_losses, ddp = _run(tmp_path, "ddp", 2, grad_accum)
    assert single["world"] == 1 and ddp["world"] == 2
    assert len(ddp_losses) == len(single_losses) == 8
    assert ddp_losses == pytest.approx(single_losses, abs=1e-5)
    for key, w in single["weights"].items():
        flat = [x for row in w for x in row]
        assert [x for row in ddp["weights"][key] for x in row] == pytest.approx(flat, abs=1e-5)
