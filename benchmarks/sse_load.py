"""A streaming load generator for ``POST /generate``: raw HTTP/1.1, server-sent events timed as they arrive.

Each connection sends one request at a time (``"stream": true``), reads the chunked answer
and stamps every ``data: {"text": ...}`` event with ``time.perf_counter()`` when its chunk
is read: time to first token is the first event's stamp minus the send, inter-token
latencies are the gaps between successive events of one request. The final event's
``completion_tokens`` and ``finish_reason`` are kept. As in ``http_load.py`` the requests are
prepared as bytes in advance and the connections are spread over worker processes (each
its own event loop, uvloop when installed), so that the client is not what is measured;
``processes=1`` runs in the calling process (no spawn: what the suite's test uses).

    python benchmarks/sse_load.py http://127.0.0.1:8000 --requests 256 --concurrency 64   # against a running server

An event can hold more than one token (the server holds back a piece that ends inside a
UTF-8 character): events and tokens are counted apart.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import os
import time
from typing import List, Optional, Sequence
from urllib.parse import urlsplit

import numpy as np

from http_load import request_bytes


async def _chunks(reader):
    """The body's chunks of a ``Transfer-Encoding: chunked`` answer, as they arrive."""
    while True:
        line = await reader.readuntil(b"\r\n")
        size = int(line.split(b";", 1)[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, then the blank line
                pass
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


async def _exchange(reader, writer, raw: bytes) -> tuple:
    """Send one request, read its answer; returns (result dict, whether the server closes)."""
    sent = time.perf_counter()
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        headers[key.strip().lower()] = value.strip().lower()
    close = headers.get(b"connection") == b"close"
    stamps: List[float] = []
    final: dict = {}
    if headers.get(b"transfer-encoding") == b"chunked":
        buf = b""
        async for data in _chunks(reader):
            now = time.perf_counter()
            buf += data
            *events, buf = buf.split(b"\n\n")
            for event in events:
                if not event.startswith(b"data: "):
                    continue
                payload = event[6:]
                if payload.startswith(b'{"text"'):
                    stamps.append(now)
                elif payload != b"[DONE]":
                    final = json.loads(payload)
    else:
        body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
        final = {"error": body[:300].decode("utf-8", "replace")}
    done = time.perf_counter()
    result = {"status": status, "sent": sent, "done": done, "events": len(stamps),
              "ttft": stamps[0] - sent if stamps else None,
              "gaps": [b - a for a, b in zip(stamps, stamps[1:])],
              "tokens": final.get("completion_tokens"), "prompt_tokens": final.get("prompt_tokens"),
              "finish_reason": final.get("finish_reason"), "error": final.get("error")}
    return result, close


async def _drive(host: str, port: int, raws: Sequence[bytes], connections: int, start_at: Optional[float],
                 timeout: Optional[float] = None) -> tuple:
    todo = collections.deque(enumerate(raws))
    results: list = []

    async def connection():
        reader = writer = None
        while todo:
            index, raw = todo.popleft()
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(host, port)
                result, close = await asyncio.wait_for(_exchange(reader, writer, raw), timeout)
            except (OSError, EOFError, ValueError, asyncio.TimeoutError) as err:  # IncompleteReadError is an EOFError
                result, close = {"status": 0, "error": repr(err)[:300], "events": 0, "gaps": [], "tokens": None}, True
            result["index"] = index
            results.append(result)
            if close and writer is not None:
                writer.close()
                writer = None
        if writer is not None:
            writer.close()

    if start_at is not None:
        while time.time() < start_at:  # every process starts together
            await asyncio.sleep(0.001)
    t0 = time.perf_counter()
    await asyncio.gather(*(connection() for _ in range(connections)))
    return results, t0, time.perf_counter()


def _install_uvloop() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass


def _worker(url: str, raws: List[bytes], indices: List[int], connections: int, start_at: float, timeout, queue) -> None:
    _install_uvloop()
    parts = urlsplit(url)
    results, t0, t1 = asyncio.run(_drive(parts.hostname, parts.port, raws, connections, start_at, timeout))
    for r in results:
        r["index"] = indices[r["index"]]
    queue.put({"results": results, "start": t0, "end": t1, "cpu_s": sum(os.times()[:2])})


def run_stream_load(url: str, bodies: Sequence[dict], concurrency: int, processes: int = 2, path: str = "/generate",
                    timeout: Optional[float] = 600.0) -> dict:
    """Stream ``bodies`` to ``url + path`` from ``concurrency`` connections over ``processes`` processes;
    a request not answered in ``timeout`` seconds is an error (its connection is closed).

    Returns:
        ``results`` (one dict per request, in the order of ``bodies``: status, ttft and gaps
        in seconds, events, tokens, prompt_tokens, finish_reason, error), ``wall_s`` (first
        send to last answer) and ``client_cpu_s``.
    """
    parts = urlsplit(url)
    raws = [request_bytes(parts.hostname, parts.port, path, {**b, "stream": True}) for b in bodies]
    processes = max(1, min(processes, concurrency))
    if processes == 1:
        before = sum(os.times()[:2])
        results, t0, t1 = asyncio.run(_drive(parts.hostname, parts.port, raws, concurrency, None, timeout))
        return {"results": sorted(results, key=lambda r: r["index"]), "wall_s": t1 - t0,
                "client_cpu_s": sum(os.times()[:2]) - before}
    ctx = multiprocessing.get_context("spawn")  # the caller may hold CUDA or threads: no fork
    queue = ctx.Queue()
    start_at = time.time() + 1.0 + 0.3 * processes  # spawned interpreters need a moment to start
    procs = []
    for p in range(processes):
        indices = list(range(p, len(raws), processes))
        conns = concurrency // processes + (1 if p < concurrency % processes else 0)
        procs.append(ctx.Process(target=_worker, args=(url, [raws[i] for i in indices], indices, conns, start_at, timeout, queue)))
    for proc in procs:
        proc.start()
    parts_back = [queue.get() for _ in procs]
    for proc in procs:
        proc.join()
    results = sorted((r for part in parts_back for r in part["results"]), key=lambda r: r["index"])
    # perf_counter is CLOCK_MONOTONIC on Linux: comparable across processes of one machine.
    wall = max(p["end"] for p in parts_back) - min(p["start"] for p in parts_back)
    return {"results": results, "wall_s": wall, "client_cpu_s": sum(p["cpu_s"] for p in parts_back)}


def summarize(load: dict, asked: Optional[Sequence[int]] = None) -> dict:
    """Throughput and latency figures of one :func:`run_stream_load` answer.

    ``asked``: each request's ``max_new_tokens`` (to count requests that ended early).
    """
    results = load["results"]
    good = [r["status"] == 200 and r.get("tokens") is not None for r in results]
    ok = [r for r, g in zip(results, good) if g]
    tokens = sum(r["tokens"] for r in ok)
    ttft = np.array([r["ttft"] for r in ok if r["ttft"] is not None] or [np.nan]) * 1000
    gaps = np.array([g for r in ok for g in r["gaps"]] or [np.nan]) * 1000
    out = {"requests": len(results), "answered": len(ok), "errors": len(results) - len(ok), "output_tokens": tokens,
           "events": sum(r["events"] for r in ok), "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in ok),
           "wall_s": round(load["wall_s"], 3), "tokens_per_s": tokens / load["wall_s"] if load["wall_s"] > 0 else 0.0,
           "ttft_p50_ms": float(np.percentile(ttft, 50)), "ttft_p99_ms": float(np.percentile(ttft, 99)),
           "itl_p50_ms": float(np.percentile(gaps, 50)), "itl_p99_ms": float(np.percentile(gaps, 99)),
           "itl_mean_ms": float(gaps.mean()), "client_cores": load["client_cpu_s"] / load["wall_s"] if load["wall_s"] > 0 else 0.0}
    if asked is not None:
        out["ended_early"] = sum(1 for r, g, n in zip(results, good, asked) if g and r["tokens"] < n)
        out["asked_tokens"] = int(sum(asked))
    errors = [r.get("error") or f"status {r['status']}" for r, g in zip(results, good) if not g]
    if errors:
        out["first_error"] = str(errors[0])[:300]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="http://HOST:PORT of a generation server")
    parser.add_argument("--prompt", default="The river bank was")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    bodies = [{"prompt": args.prompt, "max_new_tokens": args.max_new_tokens, "seed": i} for i in range(args.requests)]
    figures = summarize(run_stream_load(args.url, bodies, args.concurrency, args.processes))
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
