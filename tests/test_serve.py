"""``ctxkit serve``: a real uvicorn server on loopback, driven over HTTP by httpx.

Run folders are built from the real checkpoint with a seeded head (no training): what
is checked is that every served answer equals the offline ``predict_lines`` answer for
the same input from the same model, under concurrent load and next to malformed traffic.
The model's depth plays no part in that, so the runs hold the checkpoint's first
``LAYERS`` layers (each layer cut off was ~1/6 of every forward pass, offline and served),
except the load test's: there the 6-layer forward pass is what lets concurrent requests
queue up and share batches (with 2 layers, HTTP handling outlasts it and batches shrink).
"""

import asyncio
import contextlib
import csv
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from ctxkit.core.checkpoint import write_json  # noqa: E402
from ctxkit.features.embed import embed  # noqa: E402
from ctxkit.core.errors import UserError  # noqa: E402
from ctxkit.cli.deploy import add_serve_command  # noqa: E402
from ctxkit.inference.serve import MicroBatcher, QueueFull, ShuttingDown, create_app  # noqa: E402
from ctxkit.inference.serve_limits import TokenCheck, available_cores, choose_threads  # noqa: E402
from ctxkit.tasks import get_task, load_run, save_run_model  # noqa: E402
from ctxkit.zoo import get_model  # noqa: E402
from tolerance import assert_paths_agree  # noqa: E402
from servers import running  # noqa: E402

LAYERS = 2  # of all-MiniLM-L6-v2's 6, for every run but the load test's
CONLL_TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
# Concurrent requests in the load test (32 at a time; the durability issue's 8,000-request run is by hand,
# benchmarks/serve_load.py measures 2,000). Ten times the concurrency: batching, ordering and stats under
# a steady load, in ~10 s on 2 cores.
N_REQUESTS = 320
# One unit in the last of the 4 decimals predict_lines rounds probabilities and scores to.
ROUNDING = 1.01e-4


def _make_run(folder: Path, task, encoder_dir: Path) -> Path:
    """A run folder as ``finetune`` writes it, with a seeded head instead of a trained one."""
    encoder, tokenizer = get_model(str(encoder_dir))
    torch.manual_seed(0)
    model = task.build_model(encoder)
    with torch.no_grad():
        for p in model.head.parameters():  # wide logits: answers far from ties, as after training
            p.normal_(0.0, 0.5)
    save_run_model(model, tokenizer, folder / "best")
    write_json({"task": task.name, "options": task.options(), "model": str(encoder_dir)}, folder / "task.json")
    return folder


_running = running  # tests/servers.py


def _sst2(shared_data, split: str, n: int):
    with open(shared_data / "glue" / "SST-2" / f"{split}.tsv", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return list(dict.fromkeys(r[0].strip() for r in rows if r[0].strip()))[:n]


@pytest.fixture(scope="module")
def encoder_dir(minilm_layers):
    """all-MiniLM-L6-v2's first ``LAYERS`` layers (real weights) and its tokenizer."""
    return minilm_layers(LAYERS)


@pytest.fixture(scope="module")
def cls_run(encoder_dir, tmp_path_factory):
    task = get_task("table", labels=["negative", "positive"], regression=False)
    return _make_run(tmp_path_factory.mktemp("cls_run"), task, encoder_dir)


@pytest.fixture(scope="module")
def cls_loaded(cls_run):
    return load_run(cls_run, "cpu")


@pytest.fixture(scope="module")
def cls_loaded_6_layers(minilm_dir, tmp_path_factory):
    """The classification run on all 6 layers, for the load test (module docstring)."""
    task = get_task("table", labels=["negative", "positive"], regression=False)
    return load_run(_make_run(tmp_path_factory.mktemp("cls_run_6"), task, minilm_dir), "cpu")


@pytest.fixture(scope="module")
def sentences(shared_data):
    """300 real SST-2 sentences of 4-14 words (dev, then training phrases): short enough
    that 2,000 requests take seconds on 2 CPU cores."""
    pool = _sst2(shared_data, "dev", 900) + _sst2(shared_data, "train", 5000)
    return [s for s in pool if 4 <= len(s.split()) <= 14][:300]


def test_micro_batcher_merges_concurrent_requests_and_isolates_failures():
    calls = []

    def fn(items):
        calls.append(list(items))
        if "bad" in items:
            raise ValueError("bad item")
        return [x * 10 for x in items]

    async def scenario():
        with ThreadPoolExecutor(1) as executor:
            b = MicroBatcher("t", fn, executor, max_batch=4, max_wait_ms=200)
            b.start()
            merged = await asyncio.gather(*(b.submit([i]) for i in range(10)), b.submit([20, 21, 22, 23, 24, 25]))
            sizes = [len(c) for c in calls]
            calls.clear()
            mixed = await asyncio.gather(b.submit([1]), b.submit(["bad"]), b.submit([2, 3]), return_exceptions=True)
            retried = [list(c) for c in calls]
            t0 = time.perf_counter()
            await b.submit([7])  # alone: waits max_wait_ms for company, then runs
            lone = time.perf_counter() - t0
            await b.close()
            with pytest.raises(ShuttingDown):
                await b.submit([1])
        return merged, sizes, mixed, retried, lone, b.stats

    merged, sizes, mixed, retried, lone, stats = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert merged == [[i * 10] for i in range(10)] + [[200, 210, 220, 230, 240, 250]]
    # 10 one-item requests fill batches of 4, 4, 2 (the 6-item request does not fit the
    # third, and runs alone since it is larger than max_batch).
    assert sizes == [4, 4, 2, 6]
    assert mixed[0] == [10] and mixed[2] == [20, 30]
    assert isinstance(mixed[1], ValueError) and str(mixed[1]) == "bad item"
    assert retried == [[1, "bad", 2, 3], [1], ["bad"], [2, 3]]  # one merged try, then each alone
    assert 0.18 <= lone < 2.0
    assert stats["largest_batch"] == 6 and stats["requests"] == 11 + 3 + 1


def _malformed_cases(max_items: int, max_text_chars: int):
    """``(method, path, kwargs, status, words in the error message)`` per kind of bad request."""
    js = {"content-type": "application/json"}
    return [
        ("POST", "/classify", {"content": b'{"text": "a fine film"', "headers": js}, 400, ["malformed JSON"]),
        ("POST", "/classify", {"content": b'{"text": "\xff\xfe"}', "headers": js}, 400, ["malformed JSON", "UTF-8"]),
        ("POST", "/classify", {"content": b"", "headers": js}, 422, ["body is empty"]),
        ("POST", "/classify", {"content": b'{"text": "a"}', "headers": {"content-type": "text/plain"}}, 415, ["application/json"]),
        ("POST", "/classify", {"json": [1, 2]}, 422, ["must be a JSON object"]),
        ("POST", "/classify", {"json": {"text": 5}}, 422, ["text", "valid string"]),
        ("POST", "/classify", {"json": {"texts": ["fine", None]}}, 422, ["texts[1]", "valid string"]),
        ("POST", "/classify", {"json": {"texts": "not a list"}}, 422, ["texts", "valid list"]),
        ("POST", "/classify", {"json": {}}, 422, ["either 'text'", "'texts'"]),
        ("POST", "/classify", {"json": {"txt": "typo"}}, 422, ["txt", "Extra inputs"]),
        ("POST", "/classify", {"json": {"texts": ["a", "b"], "pairs": ["c"]}}, 422, ["'pairs' has 1 items"]),
        ("POST", "/classify", {"json": {"text": "   "}}, 422, ["text is empty"]),
        ("POST", "/classify", {"content": b'{"text": "a\\ud800"}', "headers": js}, 422, ["text has an unpaired surrogate"]),
        ("POST", "/classify", {"json": {"texts": []}}, 422, ["empty"]),
        ("POST", "/classify", {"json": {"text": "x" * (max_text_chars + 1)}}, 413,
         [f"{max_text_chars + 1} characters", f"limit is {max_text_chars}"]),
        ("POST", "/classify", {"json": {"texts": ["fine", "y" * (max_text_chars + 5)]}}, 413, ["texts[1]", "characters"]),
        ("POST", "/classify", {"json": {"texts": ["fine"] * (max_items + 1)}}, 413, [f"{max_items + 1} items", f"limit is {max_items}"]),
        ("POST", "/embed", {"json": {"texts": ["fine"] * (max_items + 1)}}, 413, ["limit is"]),
        ("POST", "/classify", {"content": b'{"text": "' + b"z" * 3_000_000 + b'"}', "headers": js}, 413, ["request body over"]),
        ("POST", "/ner", {"json": {"text": "Paris"}}, 404, ["no endpoint POST /ner", "/classify"]),
        ("GET", "/classify", {}, 405, ["no endpoint GET /classify"]),
    ]


async def _drive(base: str, jobs, concurrency: int, bad_cases):
    """Send ``jobs`` (path, body) from ``concurrency`` workers while one more client sends
    every one of ``bad_cases`` each 0.3 s until they finish (at least twice); returns the
    answers, latencies, wall time, the bad cases' answers and ``/health`` afterwards."""
    answers, latencies, wall, bad = [None] * len(jobs), [], [], []
    done = asyncio.Event()
    todo = iter(enumerate(jobs))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client, \
            httpx.AsyncClient(base_url=base, timeout=30) as bad_client:
        async def worker():
            for i, (path, body) in todo:
                t0 = time.perf_counter()
                r = await client.post(path, json=body)
                latencies.append(time.perf_counter() - t0)
                answers[i] = (r.status_code, r.json())

        async def workers():
            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            wall.append(time.perf_counter() - t0)
            done.set()

        async def bad_sender():
            rounds = 0
            while rounds < 2 or not done.is_set():
                for method, path, kwargs, *_ in bad_cases:
                    r = await bad_client.request(method, path, **kwargs)
                    bad.append((r.status_code, r.json()))
                rounds += 1
                await asyncio.sleep(0.3)

        await asyncio.gather(bad_sender(), workers())
        health = (await client.get("/health")).json()
    return answers, latencies, wall[0], bad, health


def test_320_concurrent_requests_match_offline_predictions_next_to_malformed_ones(cls_loaded_6_layers, sentences, caplog):
    task, model, tokenizer, _ = loaded = cls_loaded_6_layers
    n = len(sentences)
    jobs, lines = [], []
    for i in range(N_REQUESTS):
        s = sentences[(7 * i) % n]
        if i % 10 == 0:  # a list of 3 texts in one request
            texts = [sentences[(7 * i + k) % n] for k in range(3)]
            jobs.append(("/classify", {"texts": texts}))
            lines.append(texts)
        elif i % 10 == 5:  # a sentence pair (one of 40)
            s, pair = sentences[(i // 10) % 40], sentences[(i // 10) % 40 + 40]
            jobs.append(("/classify", {"text": s, "pair": pair}))
            lines.append([f"{s}\t{pair}"])
        else:
            jobs.append(("/classify", {"text": s}))
            lines.append([s])
    unique = sorted({line for group in lines for line in group})
    offline = dict(zip(unique, task.predict_lines(model, tokenizer, unique, 64, "cpu")))

    max_items, max_text_chars = 64, 10_000
    bad_cases = _malformed_cases(max_items, max_text_chars)
    caplog.set_level(logging.INFO, logger="ctxkit.serve")
    app = create_app(loaded, max_batch=32, max_wait_ms=5, max_items=max_items, max_text_chars=max_text_chars)
    with _running(app) as base:
        answers, latencies, wall, bad, health = asyncio.run(asyncio.wait_for(_drive(base, jobs, 32, bad_cases), 300))

    exact = 0
    for (status, body), (_, request), group in zip(answers, jobs, lines):
        assert status == 200, body
        got = body["predictions"] if "texts" in request else [body["prediction"]]
        assert len(got) == len(group)
        for pred, line in zip(got, group):
            want = offline[line]
            assert pred["label"] == want["label"], (line, pred, want)
            # Padding to a different batch-mate changes float sums in the last bits, which
            # can move the rounded 4th decimal (about 1 answer in 100); nothing more.
            assert pred["probs"] == pytest.approx(want["probs"], abs=ROUNDING), (line, pred, want)
            exact += pred == want
    items = sum(len(g) for g in lines)

    rounds = len(bad) // len(bad_cases)
    assert rounds >= 2 and len(bad) == rounds * len(bad_cases)
    for k, (status, body) in enumerate(bad):
        _, _, _, want_status, words = bad_cases[k % len(bad_cases)]
        assert status == want_status, (bad_cases[k % len(bad_cases)][:3], body)
        assert set(body) == {"error"} and all(w in body["error"] for w in words), (words, body)

    # Requests that arrived together shared forward passes.
    stats = health["stats"]["classify"]
    assert stats["requests"] == N_REQUESTS and stats["items"] == items and stats["queued"] == 0
    assert stats["largest_batch"] <= 32 and stats["batches"] <= items / 4, stats
    # One JSON log line per request and per batch.
    records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ctxkit.serve"]
    requests = [r for r in records if r["event"] == "request" and r["path"] == "/classify"]
    batches = [r for r in records if r["event"] == "batch"]
    assert len(requests) == N_REQUESTS + rounds * sum(path == "/classify" for _, path, *_ in bad_cases)
    assert sum(r["status"] == 200 for r in requests) == N_REQUESTS and all(r["latency_ms"] > 0 for r in requests)
    assert len(batches) == stats["batches"] and sum(b["batch_size"] for b in batches) == items
    assert all(1 <= b["batch_size"] <= 32 and b["compute_ms"] > 0 for b in batches)

    lat = np.array(latencies) * 1000
    print(f"\n{N_REQUESTS} requests ({items} texts) at concurrency 32 in {wall:.1f}s: {N_REQUESTS / wall:.0f} req/s, "
          f"p50 {np.percentile(lat, 50):.1f} ms, p99 {np.percentile(lat, 99):.1f} ms, "
          f"mean batch {items / stats['batches']:.1f} texts, {exact}/{items} answers bit-identical")


def test_embed_endpoint_matches_offline_embeddings(cls_loaded, sentences):
    _, model, tokenizer, _ = cls_loaded
    texts = sentences[:48]
    want = embed(texts, (model.encoder, tokenizer), pooling="mean")

    async def requests(base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            singles = await asyncio.gather(*(client.post("/embed", json={"text": t}) for t in texts[:40]))
            listed = await client.post("/embed", json={"texts": texts[40:]})
            return [r.json() for r in singles], listed.json()

    with _running(create_app(cls_loaded, max_batch=16, max_wait_ms=10)) as base:
        singles, listed = asyncio.run(asyncio.wait_for(requests(base), 30))
    got = np.array([s["embedding"] for s in singles] + listed["embeddings"], dtype=np.float32)
    assert listed["dim"] == 384 and got.shape == (48, 384)
    # other batch-mates, other padded shapes (tests/README.md): all-MiniLM-L6-v2's embeddings
    # and LAYERS layers (FFN 1536), then the mean over a sentence's tokens
    assert_paths_agree(got, want, k=(1536,) * (1 + LAYERS) + (64,), name="served vs offline embeddings")


async def _post_all(base, path, bodies):
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        return [(r.status_code, r.json()) for r in await asyncio.gather(*(client.post(path, json=b) for b in bodies))]


def test_ner_endpoint_matches_offline_entities(shared_data, encoder_dir, tmp_path):
    task = get_task("conll2003", labels=CONLL_TAGS)
    loaded = load_run(_make_run(tmp_path, task, encoder_dir), "cpu")
    lines = [" ".join(s.words) for s in task.load(shared_data / "conll2003", "dev")[1:41]]
    offline = task.predict_lines(loaded[1], loaded[2], lines, 64, "cpu")
    bodies = [{"text": line} for line in lines[:30]] + [{"texts": lines[30:]}]
    with _running(create_app(loaded, max_wait_ms=10)) as base:
        answers = asyncio.run(asyncio.wait_for(_post_all(base, "/ner", bodies), 30))
        (bad_status, bad), = asyncio.run(_post_all(base, "/ner", [{"text": "Paris", "pair": "London"}]))
    got = [body["prediction"] for _, body in answers[:30]] + answers[30][1]["predictions"]
    assert all(status == 200 for status, _ in answers)
    assert got == offline
    assert sum(len(r["entities"]) for r in got) > 10  # the comparison is not of empty lists
    assert bad_status == 422 and "takes no 'pair'" in bad["error"]


def test_qa_endpoint_matches_offline_answers(shared_data, encoder_dir, tmp_path):
    task = get_task("squad")
    loaded = load_run(_make_run(tmp_path, task, encoder_dir), "cpu")
    with zipfile.ZipFile(shared_data / "squad_v1.1" / "dev-v1.1.json.zip") as z:
        articles = json.loads(z.read("dev-v1.1.json"))["data"][:2]
    pairs = [(qa["question"], p["context"]) for a in articles for p in a["paragraphs"] for qa in p["qas"]][:14]
    # A long context (several windows) in which this head finds no valid span: its score
    # is -inf offline, which JSON cannot carry; the server sends null.
    pairs.append(("What is it?", "word " * 600))
    lines = [json.dumps({"question": q, "context": c}) for q, c in pairs]
    offline = task.predict_lines(loaded[1], loaded[2], lines, 64, "cpu")
    bodies = [{"question": q, "context": c} for q, c in pairs[:10]]
    bodies.append({"items": [{"question": q, "context": c} for q, c in pairs[10:]]})
    bodies.append({"question": "Who?"})  # no context
    with _running(create_app(loaded, max_wait_ms=10)) as base:
        answers = asyncio.run(asyncio.wait_for(_post_all(base, "/qa", bodies), 30))
    assert [status for status, _ in answers] == [200] * 11 + [422]
    got = [body["prediction"] for _, body in answers[:10]] + answers[10][1]["predictions"]
    assert len(got) == len(offline)
    for pred, want, (_, context) in zip(got, offline, pairs):
        assert {k: pred[k] for k in ("question", "answer", "start", "end")} == {k: want[k] for k in ("question", "answer", "start", "end")}
        if not math.isfinite(want["score"]):
            assert pred["score"] is None and pred["answer"] == ""
            continue
        assert pred["score"] == pytest.approx(want["score"], abs=ROUNDING)
        assert context[pred["start"]:pred["end"]] == pred["answer"] != ""
    assert sum(p["score"] is None for p in got) == 1  # the long context, and only it
    assert "'question' and 'context'" in answers[11][1]["error"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_finishes_in_flight_requests_then_exits_cleanly(cls_run, cls_loaded, sentences):
    """The CLI entry point in a subprocess: SIGTERM while 20 requests wait in the batcher."""
    task, model, tokenizer, _ = cls_loaded
    texts = sentences[:20]
    offline = task.predict_lines(model, tokenizer, texts, 64, "cpu")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "ctxkit", "serve", str(cls_run), "--port", str(port), "--device", "cpu",
                             "--max-wait-ms", "1500", "--max-batch", "64"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    base = f"http://127.0.0.1:{port}"

    async def scenario():
        async with httpx.AsyncClient(base_url=base, timeout=30) as client, httpx.AsyncClient(base_url=base, timeout=5) as probe:
            deadline = time.time() + 60
            while True:
                assert proc.poll() is None and time.time() < deadline, "server did not come up"
                with contextlib.suppress(httpx.TransportError):
                    if (await probe.get("/health")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
            pending = [asyncio.ensure_future(client.post("/classify", json={"text": t})) for t in texts]
            while (await probe.get("/health")).json()["stats"]["classify"]["queued"] < len(texts):
                await asyncio.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            answers = await asyncio.gather(*pending)
            await asyncio.sleep(0.2)
            with pytest.raises(httpx.TransportError):  # no longer accepting
                await probe.get("/health")
            return answers

    try:
        answers = asyncio.run(asyncio.wait_for(scenario(), 90))
        rc = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert [a.status_code for a in answers] == [200] * len(texts)
    assert [a.json()["prediction"]["label"] for a in answers] == [o["label"] for o in offline]
    assert rc == 0, err.decode()
    events = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    assert names[:2] == ["startup", "listening"] and names[-1] == "shutdown" and "stopping" in names, names
    assert events[1]["port"] == port
    # The thread count the model thread really runs with, and why (CI sets OMP_NUM_THREADS in some runs).
    omp = os.environ.get("OMP_NUM_THREADS")
    want = (int(omp), "OMP_NUM_THREADS") if omp else (max(1, available_cores() - 1), "auto")
    assert (events[0]["threads"]["torch"], events[0]["threads"]["source"]) == want, events[0]
    assert events[0]["max_queue"] == 4 * 64  # 4 x --max-batch
    assert next(e for e in events if e["event"] == "stopping")["signal"] == "SIGTERM"
    batch = [e for e in events if e["event"] == "batch"]
    assert len(batch) == 1 and batch[0]["batch_size"] == 20  # one forward pass, after the signal
    assert names.index("stopping") < names.index("batch")
    assert sum(e["event"] == "request" and e["path"] == "/classify" and e["status"] == 200 for e in events) == 20


def test_serve_command_options():
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(["serve", "RUN", "--port", "9001", "--max-batch", "8", "--max-wait-ms", "2.5"])
    assert (args.run_dir, args.port, args.host, args.max_batch, args.max_wait_ms, args.max_items) == ("RUN", 9001, "127.0.0.1", 8, 2.5, 64)
    assert (args.threads, args.max_queue) == (None, None)  # None: chosen at startup
    assert args.func.__name__ == "_cmd_serve"
    args = parser.parse_args(["serve", "RUN", "--threads", "3", "--max-queue", "10"])
    assert (args.threads, args.max_queue) == (3, 10)


@pytest.mark.parametrize("option, value", [("--threads", "0"), ("--threads", "-2"), ("--threads", "two"), ("--threads", "1.5"),
                                           ("--max-queue", "0")])
def test_serve_command_refuses_a_thread_or_queue_count_below_one(option, value, capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="ctxkit")
    add_serve_command(parser.add_subparsers(dest="verb"))
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["serve", "RUN", option, value])
    assert exit_info.value.code == 2
    assert f"argument {option}: must be an integer >= 1, got '{value}'" in capsys.readouterr().err


def test_thread_count_default_follows_the_cores_and_omp_num_threads():
    assert choose_threads(cores=2, environ={}) == (1, "auto")  # one core left to the event loop and clients
    assert choose_threads(cores=1, environ={}) == (1, "auto")
    assert choose_threads(cores=16, environ={}) == (15, "auto")
    assert choose_threads(cores=2, environ={"OMP_NUM_THREADS": "4"}) == (4, "OMP_NUM_THREADS")  # the user's, even above the cores
    assert choose_threads(cores=2, environ={"OMP_NUM_THREADS": "3,1"}) == (3, "OMP_NUM_THREADS")  # per nesting level: the first
    assert choose_threads(2, cores=8, environ={"OMP_NUM_THREADS": "4"}) == (2, "--threads")  # the option wins
    for bad in ("0", "many", "-1"):
        with pytest.raises(UserError, match=f"OMP_NUM_THREADS must be an integer >= 1, got '{bad}'"):
            choose_threads(environ={"OMP_NUM_THREADS": bad})
    with pytest.raises(UserError, match="--threads must be an integer >= 1, got 0"):
        choose_threads(0)
    assert 1 <= available_cores() <= (os.cpu_count() or 1)


def test_health_reports_the_model_threads_and_the_caller_keeps_its_own(cls_loaded, caplog):
    from fastapi.testclient import TestClient

    with pytest.raises(UserError, match="--threads must be an integer >= 1"):
        create_app(cls_loaded, threads=0)
    with pytest.raises(UserError, match="--max-queue must be an integer >= 1"):
        create_app(cls_loaded, threads=1, max_queue=0)
    caplog.set_level(logging.INFO, logger="ctxkit.serve")
    before = torch.get_num_threads()
    wanted = 3 if before != 3 else 2  # differs from the caller's, to show whose count is whose
    with TestClient(create_app(cls_loaded, threads=wanted, max_batch=8)) as client:
        health = client.get("/health").json()
    assert health["threads"] == {"torch": wanted, "source": "--threads", "cores": available_cores()}
    assert health["batching"]["max_queue"] == 32  # 4 x max_batch
    assert torch.get_num_threads() == before
    startup = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ctxkit.serve" and '"startup"' in r.getMessage()]
    assert startup[-1]["threads"] == health["threads"] and startup[-1]["max_queue"] == 32


def test_an_int8_run_serves_classify_and_explains_missing_embed(cls_run, tmp_path, monkeypatch):
    """`ctxkit quantize` output (ONNX Runtime, no torch weights) behind the same API."""
    pytest.importorskip("onnxruntime")
    from fastapi.testclient import TestClient

    from ctxkit.tasks import ort_model
    from ctxkit.inference.export import quantize_run
    from ctxkit.inference.serve import create_app
    from ctxkit.tasks import load_run

    quantize_run(cls_run, tmp_path / "int8")
    task, model, tokenizer, _ = load_run(tmp_path / "int8", device="cpu")
    texts = ["a wonderful , moving film", "the worst mess of the year", "it is fine"]
    offline = task.predict_lines(model, tokenizer, texts, 8, "cpu")
    # The server's ONNX Runtime session gets the serving thread count, not the caller's.
    session, sizes = ort_model._session, []
    monkeypatch.setattr(ort_model, "_session", lambda path, threads=None: sizes.append(threads or torch.get_num_threads())
                        or session(path, threads))
    wanted = 3 if torch.get_num_threads() != 3 else 2
    with TestClient(create_app(tmp_path / "int8", threads=wanted)) as client:
        assert sizes == [wanted] and client.get("/health").json()["threads"]["torch"] == wanted
        body = client.post("/classify", json={"texts": texts}).json()
        assert [r["label"] for r in body["predictions"]] == [r["label"] for r in offline]
        r = client.post("/embed", json={"text": "hello"})
        assert r.status_code == 404 and "serves: GET /health, POST /classify" in r.json()["error"]
        assert "POST /embed" not in client.get("/health").json()["endpoints"]


def test_onnxruntime_backend_serves_the_same_labels_and_keeps_embed(cls_run):
    pytest.importorskip("onnxruntime")
    from fastapi.testclient import TestClient

    from ctxkit.inference.serve import create_app

    texts = ["a wonderful , moving film", "the worst mess of the year", "it is fine"]
    answers = {}
    for backend in ("pytorch", "onnxruntime", "auto"):
        with TestClient(create_app(cls_run, device="cpu", backend=backend)) as client:
            name = client.get("/health").json()["backend"]
            assert name.startswith({"pytorch": "PyTorch", "onnxruntime": "ONNX Runtime", "auto": "auto: "}[backend])
            answers[backend] = client.post("/classify", json={"texts": texts}).json()["predictions"]
            assert len(client.post("/embed", json={"text": "hello"}).json()["embedding"]) == 384
    assert [a["label"] for a in answers["pytorch"]] == [a["label"] for a in answers["onnxruntime"]] == [a["label"] for a in answers["auto"]]
    with pytest.raises(ValueError, match="gpu backend needs a CUDA device"):
        create_app(cls_run, device="cpu", backend="gpu")


def test_full_queue_answers_429_with_retry_after_and_counts_it(minilm_dir, cls_loaded):
    """Deterministic: the batch function blocks until released, so what is queued is known."""
    task = get_task("table", labels=["negative", "positive"], regression=False)
    entered, release, seen = threading.Event(), threading.Event(), []

    def blocked_predict(model, tokenizer, lines, batch_size, device):
        seen.append(list(lines))
        entered.set()
        assert release.wait(30)
        return [{"label": "positive", "probs": {"negative": 0.0, "positive": 1.0}} for _ in lines]

    task.predict_lines = blocked_predict  # this task object only
    app = create_app((task, *cls_loaded[1:]), max_batch=1, max_wait_ms=0, max_queue=2)

    async def scenario(base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            first = asyncio.ensure_future(client.post("/classify", json={"text": "in the forward pass"}))
            assert await asyncio.to_thread(entered.wait, 30)  # running, so no longer queued
            waiting = [asyncio.ensure_future(client.post("/classify", json={"text": f"queued {i}"})) for i in range(2)]
            deadline = time.time() + 30
            while (await client.get("/health")).json()["stats"]["classify"]["queued"] < 2:
                assert time.time() < deadline, "the two requests did not queue"
                await asyncio.sleep(0.01)
            full = [await client.post("/classify", json=body) for body in ({"text": "one too many"}, {"texts": ["a", "b"]})]
            health = (await client.get("/health")).json()
            release.set()
            answered = [await first] + list(await asyncio.gather(*waiting))
            # Drained: a request larger than --max-queue is taken when nothing waits.
            large = await client.post("/classify", json={"texts": ["x", "y", "z"]})
            return full, health, answered, large

    with _running(app) as base:
        full, health, answered, large = asyncio.run(asyncio.wait_for(scenario(base), 60))
    for r in full:
        assert r.status_code == 429, r.text
        assert r.json() == {"error": "the /classify queue is full (2 texts waiting, limit 2: --max-queue); retry in 1 s"}
        assert r.headers["retry-after"] == "1"  # no batch has finished yet: the estimate's floor
    assert [r.status_code for r in answered] == [200] * 3 and large.status_code == 200
    stats = health["stats"]["classify"]
    assert (stats["rejected"], stats["queued"], health["batching"]["max_queue"]) == (2, 2, 2)
    # Refused requests never reached the model.
    assert sorted(line for call in seen for line in call) == ["in the forward pass", "queued 0", "queued 1", "x", "y", "z"]


def test_micro_batcher_retry_after_follows_the_batch_time():
    entered, gate = threading.Event(), threading.Event()

    def fn(items):
        if items == ["slow"]:
            time.sleep(0.5)  # sets the batch-time estimate
        elif items == ["block"]:
            entered.set()
            assert gate.wait(30)
        return items

    async def scenario():
        with ThreadPoolExecutor(1) as executor:
            b = MicroBatcher("t", fn, executor, max_batch=2, max_wait_ms=0, max_queue=4)
            b.start()
            await b.submit(["slow"])
            blocked = asyncio.ensure_future(b.submit(["block"]))
            assert await asyncio.to_thread(entered.wait, 30)
            queued = [asyncio.ensure_future(b.submit([i])) for i in range(4)]
            await asyncio.sleep(0)  # they queue; the worker is still waiting for "block"
            waiting = b.stats["queued"]
            with pytest.raises(QueueFull) as refused:
                await b.submit([9])
            gate.set()
            answers = await asyncio.gather(blocked, *queued)
            await b.close()
        return waiting, refused.value, answers, b.stats

    waiting, refused, answers, stats = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert waiting == 4 and answers == [["block"], [0], [1], [2], [3]]
    # 4 waiting = 2 batches after the one running, each ~0.5 s: 1.5 s, rounded up.
    assert (refused.endpoint, refused.queued, refused.limit, refused.retry_after) == ("t", 4, 4, 2)
    assert stats["rejected"] == 1 and stats["items"] == 6 and stats["queued"] == 0


def _in_memory_app(task, cls_loaded, **options):
    """An app for ``task`` on the classification run's encoder (a seeded head, no training)."""
    torch.manual_seed(0)
    model = task.build_model(cls_loaded[1].encoder).eval()
    return create_app((task, model, cls_loaded[2], {"task": task.name, "options": task.options()}), **options)


TOKENLESS = {"zero-width spaces": "\u200b\u200b", "a control character": "\u0001", "a lone combining mark": "\u0301",
             "NUL and a word joiner": "\u0000\u2060", "private use": "\ue000"}


def test_texts_without_tokens_get_422_naming_the_item_and_never_reach_the_model(cls_loaded):
    from fastapi.testclient import TestClient

    tokenizer = cls_loaded[2]
    for text in TOKENLESS.values():  # the premise: the run's tokenizer gives them no token
        assert tokenizer.encode(text, add_special_tokens=False).input_ids == []
    cases = [("/classify", {"text": t}, "text") for t in TOKENLESS.values()] + [
        ("/classify", {"texts": ["a fine film", "\u0001"]}, "texts[1]"),
        ("/classify", {"texts": ["a", "b", "\u0301\u0302"]}, "texts[2]"),
        ("/classify", {"text": "a fine film", "pair": "\u200b"}, "pair"),
        ("/classify", {"texts": ["a", "b"], "pairs": ["c", "\u200d\u0000"]}, "pairs[1]"),
        ("/embed", {"text": "\u200b\u200b"}, "text"),
        ("/embed", {"texts": ["fine", "\ufeff"]}, "texts[1]"),
    ]
    with TestClient(create_app(cls_loaded, max_wait_ms=0)) as client:
        for path, body, field in cases:
            r = client.post(path, json=body)
            assert r.status_code == 422 and r.json()["error"].startswith(f"invalid request: {field} has no tokens: "), (body, r.text)
        # Whitespace keeps its own message; a dropped character next to a kept one is fine.
        assert "text is empty or only whitespace" in client.post("/classify", json={"text": " \u3000"}).json()["error"]
        kept = [client.post("/classify", json={"text": t}) for t in ("ok\u200b", "e\u0301", "\u4e2d", "\U0001f970", "[MASK]")]
        assert [r.status_code for r in kept] == [200] * 5, [r.text for r in kept]
        stats = client.get("/health").json()["stats"]
    assert stats["classify"]["requests"] == 5 and stats["embed"]["requests"] == 0


def test_ner_and_qa_refuse_texts_without_tokens_by_field(cls_loaded):
    from fastapi.testclient import TestClient

    ner = _in_memory_app(get_task("conll2003", labels=CONLL_TAGS), cls_loaded, max_wait_ms=0)
    qa = _in_memory_app(get_task("squad"), cls_loaded, max_wait_ms=0)
    with TestClient(ner) as client:
        r = client.post("/ner", json={"texts": ["Angela Merkel visited Paris .", "\u200b\u0001"]})
        assert r.status_code == 422 and r.json()["error"].startswith("invalid request: texts[1] has no tokens"), r.text
    item = {"question": "Who won?", "context": "The Broncos won."}
    with TestClient(qa) as client:
        for body, field in (({"question": "\u0301", "context": "The Broncos won."}, "question"),
                            ({"items": [item, {"question": "Who?", "context": "\u200b"}]}, "items[1].context"),
                            ({"items": [{"question": "\u2060", "context": "x"}]}, "items[0].question")):
            r = client.post("/qa", json=body)
            assert r.status_code == 422 and r.json()["error"].startswith(f"invalid request: {field} has no tokens"), r.text
        assert client.get("/health").json()["stats"]["qa"]["requests"] == 0


def test_token_check_agrees_with_the_tokenizer_on_mixed_strings(cls_loaded):
    """A text has a token exactly when one of its characters has one on its own."""
    import random

    tokenizer = cls_loaded[2]
    check = TokenCheck(tokenizer)
    rng = random.Random(0)
    dropped = [*TOKENLESS.values(), "\u0300", "\u034f", "\u180e", "\u200c", "\U000e0001", "\U0010fffd", "\t", " ", "\ufffd"]
    kept = ["a", "Z", "9", ".", "\u00e9", "\u0130", "\u4e2d", "\uac00", "\U0001f970", "\u0378", "[", "\u02b9"]
    for _ in range(3000):
        text = "".join(rng.choice(dropped if rng.random() < 0.8 else kept) for _ in range(rng.randint(1, 6)))
        assert check.has_tokens(text) == bool(tokenizer.encode(text, add_special_tokens=False).input_ids), repr(text)
