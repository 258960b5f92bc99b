"""Options are checked when the command line is read (issue 44 item 5): a device this machine
lacks or a value out of range is one line naming the option, exit 2, before any work."""

import pytest
import torch

from ctxkit.cli import main
from ctxkit.core.device import check_device, resolve_device
from ctxkit.core.errors import UserError


def _refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    return err[-1]


@pytest.mark.parametrize("argv, message", [
    (["serve", "RUN", "--port", "70000"], "argument --port: must be a TCP port, 0 to 65535, got '70000'"),
    (["serve", "RUN", "--max-wait-ms", "-1"], "argument --max-wait-ms: must be a number >= 0, got '-1'"),
    (["serve", "RUN", "--max-wait-ms", "nan"], "argument --max-wait-ms: must be a number >= 0, got 'nan'"),
    (["serve", "RUN", "--max-batch", "0"], "argument --max-batch: must be an integer >= 1, got '0'"),
    (["serve", "RUN", "--max-items", "0"], "argument --max-items: must be an integer >= 1, got '0'"),
    (["serve", "RUN", "--device", "foo"], "argument --device: not a device name; use auto, cpu, cuda, cuda:N or mps"),
    (["finetune", "sst-2", "--data", "D", "--out", "O", "--device", "gpu0"], "argument --device: not a device name"),
    (["generate", "gpt2_2_128_2", "--random-init", "--device", "tpu"], "argument --device: not a device name"),
])
def test_out_of_range_options_are_one_line(argv, message, capsys):
    line = _refused(argv, capsys)
    assert line.startswith(f"ctxkit {argv[0]}: error: {message}"), line


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_device_this_machine_lacks_is_named(capsys):
    line = _refused(["serve", "RUN", "--device", "cuda"], capsys)
    assert line == ("ctxkit serve: error: argument --device: no CUDA device here "
                    f"({'this torch is built without CUDA' if torch.version.cuda is None else 'it sees no GPU'}); "
                    "use --device cpu or auto")
    with pytest.raises(UserError, match="no CUDA device here"):
        resolve_device("cuda:1")
    if not (torch.backends.mps.is_available()):
        with pytest.raises(UserError, match="no Apple MPS device here"):
            check_device("mps")


def test_good_devices_pass():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda")
    assert check_device(torch.device("cpu")) == torch.device("cpu")


def test_a_port_in_use_is_one_line_before_the_run_is_loaded(tmp_path, capsys):
    """``serve --port P`` with P taken: exit 2 and one line naming the address, in
    milliseconds (before any run is read: the folder here is not even a run)."""
    import socket
    import time

    pytest.importorskip("fastapi")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        start = time.perf_counter()
        rc = main(["serve", str(tmp_path), "--port", str(port)])
        seconds = time.perf_counter() - start
    finally:
        taken.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [f"ctxkit: error: 127.0.0.1:{port} is in use (another server?): pick another --port or --host"]
    assert seconds < 5
