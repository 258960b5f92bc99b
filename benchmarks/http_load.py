"""A load generator that is not the bottleneck: raw HTTP/1.1 keep-alive from several processes.

``httpx.AsyncClient`` spends about a millisecond of its one core per request: at concurrency 64
it sent ~100 requests/s, which is what ``serve_load.py --device cuda`` recorded as the server's
throughput (issue 36 item 4). This client writes each request as bytes prepared in advance,
reads the status line, the headers and ``Content-Length`` bytes of body, and spreads the
connections over ``processes`` worker processes (each its own event loop, uvloop when
installed), so the server is measured, not the client.

    python benchmarks/http_load.py URL/health --requests 20000 --concurrency 64     # the client's ceiling

Used by ``serve_load.py``; the server must answer with ``Content-Length`` (uvicorn does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import time
from typing import List, Optional, Sequence
from urllib.parse import urlsplit


def request_bytes(host: str, port: int, path: str, body: Optional[dict]) -> bytes:
    """One HTTP/1.1 keep-alive request (GET without a body, POST with a JSON body)."""
    if body is None:
        return f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n")
    return head.encode() + data


async def _connection(host: str, port: int, todo: List[bytes], latencies: list, statuses: dict) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while todo:
            raw = todo.pop()
            start = time.perf_counter()
            writer.write(raw)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
                    break
            else:
                raise RuntimeError(f"a response without Content-Length: {head[:200]!r}")
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


def _worker(url: str, path: str, raws: List[bytes], connections: int, start_at: float, queue) -> None:
    try:
        import uvloop  # noqa: F401 - a faster event loop when the serve extra brought it

        uvloop.install()
    except ImportError:
        pass
    parts = urlsplit(url)
    latencies: list = []
    statuses: dict = {}

    async def main():
        todo = list(reversed(raws))  # pop() from the end keeps the requests' order
        while time.time() < start_at:  # every process starts together
            await asyncio.sleep(0.001)
        t0 = time.perf_counter()
        await asyncio.gather(*(_connection(parts.hostname, parts.port, todo, latencies, statuses)
                               for _ in range(connections)))
        return t0, time.perf_counter()

    t0, t1 = asyncio.run(main())
    cpu = sum(os.times()[:2])
    queue.put({"latencies": latencies, "statuses": statuses, "start": t0, "end": t1, "cpu_s": cpu})


def run_load(url: str, path: str, bodies: Sequence[Optional[dict]], concurrency: int, processes: int = 4) -> dict:
    """Send ``bodies`` to ``url + path`` from ``concurrency`` connections over ``processes`` processes.

    Returns:
        ``wall_s`` (first send to last answer), ``latencies`` (seconds, every request),
        ``statuses`` (status -> count) and ``client_cpu_s`` (the client processes' CPU time).
    """
    parts = urlsplit(url)
    raws = [request_bytes(parts.hostname, parts.port, path, b) for b in bodies]
    processes = max(1, min(processes, concurrency))
    ctx = multiprocessing.get_context("spawn")  # the caller may hold CUDA or threads: no fork
    queue = ctx.Queue()
    start_at = time.time() + 1.0 + 0.3 * processes  # spawned interpreters need a moment to start
    procs = []
    for p in range(processes):
        share = raws[p::processes]
        conns = concurrency // processes + (1 if p < concurrency % processes else 0)
        procs.append(ctx.Process(target=_worker, args=(url, path, share, conns, start_at, queue)))
    for proc in procs:
        proc.start()
    results = [queue.get() for _ in procs]
    for proc in procs:
        proc.join()
    statuses: dict = {}
    for r in results:
        for k, v in r["statuses"].items():
            statuses[k] = statuses.get(k, 0) + v
    # perf_counter is CLOCK_MONOTONIC on Linux: comparable across processes of one machine.
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {"wall_s": wall, "latencies": [x for r in results for x in r["latencies"]], "statuses": statuses,
            "client_cpu_s": sum(r["cpu_s"] for r in results)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="http://HOST:PORT/PATH (GET unless --body)")
    parser.add_argument("--body", default=None, help="a JSON body to POST")
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args(argv)
    parts = urlsplit(args.url)
    body = json.loads(args.body) if args.body else None
    r = run_load(f"{parts.scheme}://{parts.netloc}", parts.path or "/", [body] * args.requests, args.concurrency, args.processes)
    lat = sorted(r["latencies"])
    print(json.dumps({"requests_per_s": round(len(lat) / r["wall_s"], 1), "p50_ms": round(1000 * lat[len(lat) // 2], 2),
                      "statuses": r["statuses"], "client_cpu_s": round(r["client_cpu_s"], 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
