"""``ctxkit serve`` against idle, slow and oversized clients (issue 43), over loopback.

One real server subprocess (``python -m ctxkit serve``) with an open-file limit of 256 and
short deadlines (headers and body 2 s, keep-alive 1 s), a 2-layer MiniLM run with a
seeded head. Against it: 1,000 connections that never send a byte and 50 clients that
send their headers or body a byte at a time; meanwhile a fresh client must get its
``/health`` and ``/classify`` answers within the header deadline + 1 s, every idle
connection must be closed within its deadline, and the server's log must stay short.
Then oversized headers (431), an oversized body (413), and answers without host paths.
"""

import asyncio
import contextlib
import errno
import functools
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from ctxkit.cli.deploy import add_serve_command  # noqa: E402
from ctxkit.core.checkpoint import write_json  # noqa: E402
from ctxkit.core.errors import UserError  # noqa: E402
from ctxkit.inference.serve import create_app  # noqa: E402
from ctxkit.inference.serve_conn import ConnectionLimits, Listener, server_class  # noqa: E402
from ctxkit.inference.serve_limits import BurstLog, PathRedactor, public_name  # noqa: E402
from ctxkit.tasks import get_task, save_run_model  # noqa: E402
from ctxkit.zoo import get_model  # noqa: E402

FILE_LIMIT = 256  # the server's open-file limit (RLIMIT_NOFILE), as in the test
HEADER_TIMEOUT, BODY_TIMEOUT, KEEP_ALIVE = 2.0, 2.0, 1.0
IDLE, SLOW = 1000, 50  # connections that never send a byte; clients that drip their headers or body
MAX_BODY = 65536
SLACK = 1.0  # the allowance over a deadline


@pytest.fixture(scope="module")
def run_dir(minilm_layers, tmp_path_factory) -> Path:
    """A classification run folder as ``finetune`` writes it, with a seeded head."""
    encoder, tokenizer = get_model(str(minilm_layers(2)))
    task = get_task("table", labels=["negative", "positive"], regression=False)
    torch.manual_seed(0)
    model = task.build_model(encoder)
    folder = tmp_path_factory.mktemp("conn_run")
    save_run_model(model, tokenizer, folder / "best")
    write_json({"task": task.name, "options": task.options(), "model": str(minilm_layers(2))}, folder / "task.json")
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(run_dir, tmp_path_factory):
    """``(port, log path)`` of ``ctxkit serve RUN`` with 256 open files and short deadlines."""
    port, log_path = _free_port(), tmp_path_factory.mktemp("conn_log") / "serve.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, "-m", "ctxkit", "serve", str(run_dir), "--port", str(port), "--device", "cpu", "--threads", "1",
            "--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT), "--keep-alive-timeout", str(KEEP_ALIVE),
            "--max-body-bytes", str(MAX_BODY)]
    with open(log_path, "wb") as log:  # a file, not a pipe: nobody reads a pipe during the test
        # The limit is set in the child between fork and exec: one bound call, no import or lock there.
        limit = functools.partial(resource.setrlimit, resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, env=env, preexec_fn=limit)  # noqa: PLW1509
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, log_path.read_text()
            assert time.time() < deadline, "the server did not come up"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            time.sleep(0.1)
        yield port, log_path
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def many_files():
    """This process may open the 1,000+ client sockets (its soft limit raised, if need be)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = IDLE + SLOW + 200
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"the open-file limit ({hard}) is too low for {IDLE} client connections")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def _until_closed(reader: asyncio.StreamReader, opened: float) -> tuple:
    """``(seconds from opened until the server closed the connection, what it sent)``."""
    data = b""
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(65536):
            data += chunk
    return time.monotonic() - opened, data


async def _slow_client(port: int, head: bytes, drip: bytes) -> tuple:
    """A client that sends ``head``, then ``drip`` every 0.25 s until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    opened = time.monotonic()
    writer.write(head)

    async def dripping():
        with contextlib.suppress(ConnectionError):
            while True:
                await asyncio.sleep(0.25)
                writer.write(drip)
                await writer.drain()

    dripper = asyncio.ensure_future(dripping())
    try:
        return await _until_closed(reader, opened)
    finally:
        dripper.cancel()
        writer.close()


def _status(data: bytes) -> int:
    return int(data[9:12]) if data.startswith(b"HTTP/1.1 ") else 0


async def _attack(port: int) -> dict:
    idle = []
    for _ in range(IDLE):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        idle.append((writer, asyncio.ensure_future(_until_closed(reader, time.monotonic()))))
    head = b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    slow = [asyncio.ensure_future(_slow_client(port, head, b"X")) for _ in range(SLOW // 2)]
    slow += [asyncio.ensure_future(_slow_client(port, head + b"Content-Length: 100000\r\n\r\n{\"text\": \"", b"a"))
             for _ in range(SLOW // 2)]
    await asyncio.sleep(0.2)  # every slow client has sent its first bytes
    fresh = {}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        for method, path, body in (("GET", "/health", None), ("POST", "/classify", {"text": "a wonderful , moving film"})):
            start = time.monotonic()
            r = await client.request(method, path, json=body)
            fresh[path] = (r.status_code, time.monotonic() - start)
        # A kept-alive connection that goes quiet is closed after --keep-alive-timeout.
        start = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        kept_alive = await _until_closed(reader, start)
        writer.close()
        idle_closed = [await task for _, task in idle]
        slow_closed = [await task for task in slow]
        health = (await client.get("/health")).json()
    for writer, _ in idle:
        writer.close()
    return {"fresh": fresh, "idle": idle_closed, "slow": slow_closed, "kept_alive": kept_alive, "health": health}


def test_idle_and_slow_clients_cannot_starve_a_fresh_one(server, many_files):
    port, log_path = server
    lines_before = len(log_path.read_text().splitlines())
    result = asyncio.run(asyncio.wait_for(_attack(port), 60))
    log_lines = log_path.read_text().splitlines()
    fresh, stats = result["fresh"], result["health"]["connections"]["stats"]
    print(f"\nfresh client: /health {fresh['/health'][1]:.3f} s, /classify {fresh['/classify'][1]:.3f} s; "
          f"idle connections closed after at most {max(t for t, _ in result['idle']):.2f} s; slow clients after at most "
          f"{max(t for t, _ in result['slow']):.2f} s; log lines during the attack: {len(log_lines) - lines_before} "
          f"(in all {len(log_lines)}); server counters: {stats}")
    for path, (status, seconds) in fresh.items():
        assert status == 200 and seconds < HEADER_TIMEOUT + SLACK, (path, status, seconds)
    # Every idle connection is closed: refused at once (503), evicted for a newer one, or
    # at the header deadline; none ever gets more than a refusal.
    assert max(t for t, _ in result["idle"]) < HEADER_TIMEOUT + SLACK
    assert {_status(data) for _, data in result["idle"]} <= {0, 503}
    # The slow ones get 408 at their deadline (or, squeezed out at once, 503).
    for (seconds, data), deadline in zip(result["slow"], [HEADER_TIMEOUT] * (SLOW // 2) + [BODY_TIMEOUT] * (SLOW // 2)):
        assert _status(data) in (408, 503) and seconds < deadline + SLACK, (seconds, data[:200])
    assert sum(_status(data) == 408 for _, data in result["slow"]) >= SLOW * 0.8
    seconds, data = result["kept_alive"]
    assert _status(data) == 200 and KEEP_ALIVE - 0.1 < seconds < KEEP_ALIVE + SLACK, (seconds, data[:200])
    assert stats["accepted"] + stats["refused"] >= IDLE + SLOW + 3 and stats["accept_errors"] == 0
    assert stats["timed_out"]["header"] >= SLOW * 0.4 and stats["timed_out"]["body"] >= SLOW * 0.4
    assert stats["open"] <= 2  # the fresh client's (and the closing kept-alive one)
    assert len(log_lines) < 100, "\n".join(log_lines[:120])
    events = [json.loads(line)["event"] for line in log_lines[lines_before:] if line.startswith("{")]
    assert "timeout" in events and "Traceback" not in log_path.read_text()


def _raw(port: int, request: bytes) -> bytes:
    """Send ``request`` on a fresh connection and read the answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        with contextlib.suppress(ConnectionError):
            while chunk := sock.recv(65536):
                data += chunk
    return data


def test_oversized_headers_get_431_and_oversized_bodies_413(server):
    port, _ = server
    big = _raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
    many = _raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 100) for i in range(400)) + b"\r\n")
    long_url = _raw(port, b"GET /health?" + b"q" * 40000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    for data in (big, many, long_url):
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431 "), data[:300]
        assert json.loads(body) == {"error": "request line and headers over 32768 bytes (--max-header-bytes)"}
    # Just under the limit is fine, and the connection serves the next request.
    ok = httpx.get(f"http://127.0.0.1:{port}/health", headers={f"X-H{i}": "c" * 100 for i in range(250)})
    assert ok.status_code == 200
    r = httpx.post(f"http://127.0.0.1:{port}/classify", content=b'{"text": "' + b"a" * MAX_BODY + b'"}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json() == {"error": f"request body over {MAX_BODY} bytes (--max-body-bytes)"}


def test_health_shows_names_and_settings_not_host_paths(server, run_dir):
    port, _ = server
    text = httpx.get(f"http://127.0.0.1:{port}/health").text
    health = json.loads(text)
    model = Path(json.loads((run_dir / "task.json").read_text())["model"])
    assert (health["run"], health["model"]) == (run_dir.name, model.name) and "run_dir" not in health
    for path in (str(run_dir.resolve()), str(run_dir.parent), str(Path.home())):
        assert path not in text
    settings = {k: v for k, v in health["connections"].items() if k != "stats"}
    assert settings == {"max_connections": FILE_LIMIT - 48, "open_file_limit": FILE_LIMIT, "header_timeout_s": HEADER_TIMEOUT,
                        "body_timeout_s": BODY_TIMEOUT, "keep_alive_timeout_s": KEEP_ALIVE, "max_header_bytes": 32768}


def test_error_messages_name_the_run_not_its_path(run_dir, monkeypatch):
    from fastapi.testclient import TestClient

    from ctxkit.tasks.text import TableClassificationTask

    def fails(self, model, tokenizer, lines, batch_size, device):
        raise ValueError(f"cannot read {run_dir.resolve() / 'best' / 'extra.json'} (under {Path.home()})")

    monkeypatch.setattr(TableClassificationTask, "predict_lines", fails)
    for expose in (False, True):
        with TestClient(create_app(run_dir, device="cpu", max_wait_ms=0, expose_paths=expose)) as client:
            error = client.post("/classify", json={"text": "fine"}).json()["error"]
            health = client.get("/health").json()
        if expose:
            assert str(run_dir.resolve()) in error and health["run_dir"] == str(run_dir.resolve())
        else:
            assert error == f"invalid request: cannot read {run_dir.name}/best/extra.json (under ~)", error
            assert "run_dir" not in health


def test_public_names_and_redaction(tmp_path):
    assert public_name(tmp_path / "runs" / "sst2") == "sst2"
    assert public_name("sentence-transformers/all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    assert public_name("all_minilm_l6_v2") == "all_minilm_l6_v2" and public_name(None) is None
    redact = PathRedactor(tmp_path / "run", "org/model")
    assert redact(f"cannot read {tmp_path / 'run'}/best/x") == "cannot read run/best/x"
    assert str(tmp_path) not in redact(f"see {tmp_path}/other") and redact("org/model is fine") == "org/model is fine"


@contextlib.contextmanager
def _front(limits: ConnectionLimits, events: list):
    """The server's front (``server_class``) on a free loopback port in a thread, before an
    app that answers ``ok``; yields the port."""
    import threading

    import uvicorn

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, access_log=False, lifespan="off", http="httptools",
                            ws="none", timeout_keep_alive=limits.keep_alive_timeout)
    server = server_class(lambda event, **fields: events.append((event, fields)))(config, limits)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "the front did not start"
        time.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


def test_past_the_cap_an_idle_connection_makes_room_and_busy_ones_refuse_at_once():
    events = []
    limits = ConnectionLimits(max_connections=4, header_timeout=5, file_limit=FILE_LIMIT)
    with _front(limits, events) as port:
        def connect(head=b""):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(head)
            return sock

        idle = [connect() for _ in range(4)]
        time.sleep(0.2)
        answer = _raw(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")  # takes the oldest one's place
        assert _status(answer) == 200 and idle[0].recv(10) == b""  # closed, without an answer
        busy = [connect(b"GET / HTTP/1.1\r\n") for _ in range(4)]  # inside a request: never evicted
        time.sleep(0.2)
        start = time.monotonic()
        refused = _raw(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        took = time.monotonic() - start
        stats = dict(limits.stats)
        for sock in idle + busy:
            sock.close()
    head, _, body = refused.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in head and took < 0.5, (refused, took)
    assert json.loads(body) == {"error": "the server has 4 connections open, all busy (--max-connections 4); retry later"}
    assert stats["refused"] == 1 and stats["evicted"] >= 4
    # One line when the burst began, one summing it up (written here as the server stops).
    assert [fields.get("count") for e, fields in events if e == "connections_full"] == [None, stats["refused"] + stats["evicted"]]


def test_accept_errors_are_logged_once_per_burst():
    """A listening socket out of descriptors: the accept loop rests and logs the burst twice
    (start, summary), not once per attempt."""
    lines = []

    class Exhausted:
        def fileno(self):
            return listening.fileno()

        def accept(self):
            raise OSError(errno.EMFILE, "Too many open files")

        def close(self):
            pass

    async def scenario():
        listener = Listener([Exhausted()], lambda _: None, ConnectionLimits(file_limit=FILE_LIMIT),
                            lambda event, **fields: lines.append((event, fields)))
        listener.log.quiet_s = 0.3
        listener.start()
        for _ in range(200):  # 200 attempts in 0.2 s, as a flood of connections would make
            listener._accept(listener.sockets[0])
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.5)
        listener.close()
        return listener.stats

    with socket.create_server(("127.0.0.1", 0)) as listening:
        stats = asyncio.run(scenario())
    assert stats["accept_errors"] == 200
    assert [(event, "burst_end" in fields) for event, fields in lines] == [("accept_error", False), ("accept_error", True)]
    assert lines[0][1]["error"] == "EMFILE: Too many open files" and lines[1][1]["count"] == 200


def test_burst_log_sums_up_after_a_quiet_spell():
    lines = []

    async def scenario():
        log = BurstLog(lambda event, **fields: lines.append((event, fields.get("kind"), fields.get("count"))), quiet_s=0.1)
        for _ in range(50):
            log.note("timeout", kind="idle")
        log.note("timeout", kind="body")  # another kind: a burst of its own
        await asyncio.sleep(0.3)
        log.note("timeout", kind="idle")  # a new burst
        log.close()

    asyncio.run(scenario())
    assert lines == [("timeout", "idle", None), ("timeout", "body", None), ("timeout", "idle", 50), ("timeout", "idle", None)]


def test_connection_limits_fit_the_open_file_limit():
    assert ConnectionLimits(file_limit=256).max_connections == 208
    assert ConnectionLimits(file_limit=1024).max_connections == 896
    assert ConnectionLimits(file_limit=1 << 20).max_connections == 4096
    assert ConnectionLimits(file_limit=None).max_connections == 4096
    assert ConnectionLimits(file_limit=256, max_connections=100).max_connections == 100
    with pytest.raises(UserError, match="--max-connections 250 does not fit the open-file limit of 256"):
        ConnectionLimits(file_limit=256, max_connections=250)
    with pytest.raises(UserError, match="--header-timeout must be a number of seconds > 0"):
        ConnectionLimits(header_timeout=0)
    with pytest.raises(UserError, match="raise it"):
        ConnectionLimits(file_limit=40)


def test_serve_command_connection_options(capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="ctxkit")
    add_serve_command(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(["serve", "RUN"])
    assert (args.header_timeout, args.body_timeout, args.keep_alive_timeout, args.max_header_bytes, args.max_connections,
            args.expose_paths) == (10.0, 30.0, 5.0, 32768, None, False)
    args = parser.parse_args(["serve", "RUN", "--header-timeout", "1.5", "--max-connections", "100", "--expose-paths"])
    assert (args.header_timeout, args.max_connections, args.expose_paths) == (1.5, 100, True)
    for option, value in (("--header-timeout", "0"), ("--body-timeout", "-1"), ("--keep-alive-timeout", "inf")):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "RUN", option, value])
        assert f"argument {option}: must be a number of seconds > 0, got '{value}'" in capsys.readouterr().err
