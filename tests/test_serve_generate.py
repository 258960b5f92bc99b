"""The generation server (issue 40 item 1): continuous batching gives every request the
tokens ``generate`` gives it alone (greedy, and sampled with its seed), requests join and
leave the running batch, a client that goes away frees its slot, a full queue answers 429,
and the routes speak /generate and OpenAI's /v1/completions, streamed or not."""

import json
import random

import pytest
import torch

from ctxkit.decoding import GenerationConfig, generate
from ctxkit.decoding.continuous import ContinuousBatcher, QueueFull, Request
from ctxkit.models.gpt2 import GPT2Config, GPT2LMHeadModel
from ctxkit.tokenizers import ByteLevelBPETokenizer

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from ctxkit.inference.serve_generate import create_generation_app  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    """A 2-layer GPT-2 with random weights over a byte-level vocabulary (every id decodes)."""
    tokenizer = ByteLevelBPETokenizer.train(iter([""]), vocab_size=257, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = GPT2Config(num_layers=2, hidden_size=64, num_heads=4, vocab_size=tokenizer.vocab_size, max_position=128, ffn_size=256)
    return GPT2LMHeadModel(config).eval(), tokenizer


def _alone(model, prompt, config, seed):
    generator = torch.Generator().manual_seed(seed)
    out = generate(model, torch.tensor([prompt]), None, config, generator=generator, plan="reference", static=False)
    return out[0, len(prompt):].tolist()


def test_every_request_gets_the_tokens_generate_gives_it_alone(tiny):
    model, _ = tiny
    rng = random.Random(0)
    batcher = ContinuousBatcher(model, slots=3, max_len=48)  # fewer slots than requests: they queue, join, leave
    jobs, got = [], {}
    for i in range(8):
        prompt = [rng.randrange(model.config.vocab_size) for _ in range(rng.randrange(1, 18))]
        config = GenerationConfig(max_new_tokens=4 + 4 * i, do_sample=i % 2 == 1, temperature=0.8, top_k=30 * (i % 3),
                                  top_p=0.9 if i % 4 == 3 else 1.0, repetition_penalty=1.3 if i == 5 else 1.0)
        config.max_new_tokens = min(config.max_new_tokens, 48 - len(prompt))
        jobs.append((prompt, config, 7 + i))
        batcher.submit(Request(prompt, config, lambda t, why, i=i: got.setdefault(i, []).append(t if why is None else why),
                               generator=torch.Generator().manual_seed(7 + i)))
    while batcher.step():
        assert batcher.busy <= 3
    for i, (prompt, config, seed) in enumerate(jobs):
        want = _alone(model, prompt, config, seed)
        assert got[i] == want + ["length"], i
    # the ring of 48 columns wrapped: more steps than columns
    assert batcher.stats["steps"] > 48 and batcher.stats["admitted"] == 8 and batcher.stats["finished"] == 8


def test_only_the_rows_up_to_the_highest_busy_slot_run_and_tokens_stay_the_same(tiny):
    """A step runs the rows up to the highest occupied slot, rounded up to a power of two: with
    one long request in slot 0 and short ones beside it, the batch narrows to 1 row once the
    short ones left, and every request still gets what ``generate`` gives it alone."""
    model, _ = tiny
    batcher = ContinuousBatcher(model, slots=8, max_len=64)
    jobs, got = [], {}
    for i, new in enumerate((30, 3, 3, 5)):
        prompt = [5 + i, 9, 11 + i]
        config = GenerationConfig(max_new_tokens=new, do_sample=i % 2 == 0, temperature=0.9, top_k=20)
        jobs.append((prompt, config, 100 + i))
        batcher.submit(Request(prompt, config, lambda t, why, i=i: got.setdefault(i, []).append(t if why is None else why),
                               generator=torch.Generator().manual_seed(100 + i)))
    widths = []
    while True:
        before = batcher.stats["rows_stepped"]
        if not batcher.step():
            break
        widths.append(batcher.stats["rows_stepped"] - before)
    for i, (prompt, config, seed) in enumerate(jobs):
        assert got[i] == _alone(model, prompt, config, seed) + ["length"], i
    assert widths[0] == 4 and widths[-1] == 1 and set(widths) <= {1, 2, 4}  # 4 busy slots, then slot 0 alone
    assert batcher.stats["rows_active"] == sum(len(t) - 2 for t in got.values())  # every step-made token, one row each


def test_end_of_text_stop_and_cancel_free_the_slot(tiny):
    model, _ = tiny
    prompt = [5, 6, 7]
    config = GenerationConfig(max_new_tokens=20)
    tokens = _alone(model, prompt, config, 0)
    events = []
    eos = GenerationConfig(max_new_tokens=20, eos_token_id=tokens[3])  # the 4th greedy token ends it, unsent
    batcher = ContinuousBatcher(model, slots=1, max_len=64)
    batcher.submit(Request(prompt, eos, lambda t, why: events.append((t, why))))
    seen = []
    stopped = Request(prompt, config, lambda t, why: events.append((t, why)), stop=lambda token: seen.append(token) or len(seen) == 2)
    batcher.submit(stopped)
    while batcher.step():
        pass
    first = tokens.index(tokens[3])  # the first occurrence of that token ends the request
    assert events[: first + 1] == [(t, None) for t in tokens[:first]] + [(None, "eos")]
    assert events[first + 1:] == [(tokens[0], None), (tokens[1], None), (None, "stop")]
    events.clear()
    running = batcher.submit(Request(prompt, config, lambda t, why: events.append((t, why))))
    batcher.step()
    batcher.step()
    batcher.cancel(running)
    batcher.step()
    # admit + step, step: three tokens, then the slot is freed at the next step
    assert events[-1] == (None, "cancelled") and batcher.busy == 0 and len(events) == 4


def test_a_full_queue_and_an_overlong_request_are_refused(tiny):
    model, _ = tiny
    batcher = ContinuousBatcher(model, slots=1, max_len=32, max_waiting=2)
    noop = lambda t, why: None  # noqa: E731
    for _ in range(2):
        batcher.submit(Request([1, 2], GenerationConfig(max_new_tokens=4), noop))
    with pytest.raises(QueueFull) as err:
        batcher.submit(Request([1, 2], GenerationConfig(max_new_tokens=4), noop))
    assert err.value.retry_after >= 1
    with pytest.raises(Exception, match="exceeds the context of 32 tokens"):
        batcher.submit(Request([1] * 20, GenerationConfig(max_new_tokens=13), noop))


@pytest.fixture(scope="module")
def client(tiny):
    model, tokenizer = tiny
    app = create_generation_app(model, tokenizer, name="tiny-gpt2", slots=4, max_waiting=8, max_new_tokens=64, fast="reference")
    with TestClient(app) as c:
        yield c


def _events(response):
    return [line[len("data: "):] for line in response.text.split("\n\n") if line.startswith("data: ")]


def test_generate_route_equals_generate_and_streams_the_same_text(client, tiny):
    model, tokenizer = tiny
    prompt = "The bank of the river"
    ids = tokenizer.encode(prompt)
    config = GenerationConfig(max_new_tokens=12, do_sample=True, temperature=0.7, top_k=20, eos_token_id=tokenizer.eos_id,
                              pad_token_id=tokenizer.eos_id)
    want = _alone(model, ids, config, 3)
    want = want[: want.index(tokenizer.eos_id)] if tokenizer.eos_id in want else want
    body = {"prompt": prompt, "max_new_tokens": 12, "temperature": 0.7, "top_k": 20, "seed": 3}
    r = client.post("/generate", json=body)
    assert r.status_code == 200
    answer = r.json()
    assert answer["text"] == tokenizer.decode(want) and answer["completion_tokens"] == len(want) + (len(want) < 12)
    assert answer["prompt_tokens"] == len(ids) and answer["finish_reason"] in ("length", "stop")
    streamed = client.post("/generate", json={**body, "stream": True})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = _events(streamed)
    assert events[-1] == "[DONE]"
    pieces = [json.loads(e) for e in events[:-1]]
    assert "".join(p.get("text", "") for p in pieces) == answer["text"]
    assert pieces[-1]["finish_reason"] == answer["finish_reason"] and len(pieces) > 2  # token by token, not one blob


def test_stop_strings_greedy_and_openai_completions(client, tiny):
    model, tokenizer = tiny
    greedy = client.post("/generate", json={"prompt": "abc", "max_new_tokens": 16, "temperature": 0}).json()
    assert greedy == client.post("/generate", json={"prompt": "abc", "max_new_tokens": 16, "temperature": 0}).json()
    text = greedy["text"]
    assert len(text) > 4
    stop = text[2:4]
    cut = client.post("/generate", json={"prompt": "abc", "max_new_tokens": 16, "temperature": 0, "stop": [stop]}).json()
    assert cut["text"] == text[: text.find(stop)] and cut["finish_reason"] == "stop"
    done = client.post("/v1/completions", json={"model": "x", "prompt": "abc", "max_tokens": 16, "temperature": 0,
                                                "user": "someone"}).json()
    assert done["object"] == "text_completion" and done["choices"][0]["text"] == text and done["model"] == "x"
    assert done["usage"]["prompt_tokens"] == len(tokenizer.encode("abc")) and done["choices"][0]["finish_reason"] in ("length", "stop")
    chunks = _events(client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 16, "temperature": 0, "stream": True}))
    assert chunks[-1] == "[DONE]"
    parsed = [json.loads(c) for c in chunks[:-1]]
    assert "".join(c["choices"][0]["text"] for c in parsed) == text and parsed[0]["model"] == "tiny-gpt2"


def test_bad_requests_and_health(client):
    assert client.post("/generate", json={"prompt": ""}).status_code == 422
    assert client.post("/generate", json={"prompt": "a", "temperature": -1}).status_code == 422
    assert client.post("/generate", json={"prompt": "a", "unknown": 1}).status_code == 422
    over = client.post("/generate", json={"prompt": "a", "max_new_tokens": 65})
    assert over.status_code == 422 and "limit of 64" in over.text
    long = client.post("/generate", json={"prompt": "a" * 120, "max_new_tokens": 20})
    assert long.status_code == 422 and "exceeds the context of 128 tokens" in long.text
    assert client.post("/v1/completions", json={"prompt": "a", "n": 2}).status_code == 422
    health = client.get("/health").json()
    assert health["model"] == "tiny-gpt2" and health["slots"] == 4 and health["busy"] == 0 and health["stats"]["admitted"] >= 1


def test_ctxkit_serve_on_a_gpt2_folder_streams_and_frees_the_slot_of_a_client_that_leaves(tiny, tmp_path):
    """The command itself: ``ctxkit serve FOLDER`` of a GPT-2 serves generation; a streaming
    client that hangs up mid-answer has its request cancelled and its slot freed."""
    import os
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    import httpx

    from ctxkit.models.gpt2 import load_gpt2, save_gpt2

    model, tokenizer = tiny
    folder = tmp_path / "gpt"
    save_gpt2(model, folder)
    tokenizer.save(folder)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ctxkit", "serve", str(folder), "--port", str(port), "--device", "cpu",
                             "--max-batch", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "the server did not come up"
            try:
                health = httpx.get(f"{base}/health", timeout=2).json()
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert health["model"] == "gpt" and health["task"] == "text-generation" and health["slots"] == 2
        # greedy over HTTP = generate() in this process with the server's plan (auto)
        answer = httpx.post(f"{base}/generate", json={"prompt": "abc", "max_new_tokens": 10, "temperature": 0}, timeout=60).json()
        local = load_gpt2(folder).eval()
        ids = tokenizer.encode("abc")
        config = GenerationConfig(max_new_tokens=10, eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.eos_id)
        out = generate(local, torch.tensor([ids]), None, config)[0, len(ids):].tolist()
        out = out[: out.index(tokenizer.eos_id)] if tokenizer.eos_id in out else out
        assert answer["text"] == tokenizer.decode(out)
        # a streaming client that reads one event and hangs up
        body = json.dumps({"prompt": "abc", "max_new_tokens": 100, "temperature": 0.8, "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            sock.settimeout(30)
            got = b""
            while b"data: " not in got:  # the headers, then the first event
                got += sock.recv(4096)
        deadline = time.time() + 30
        while True:
            health = httpx.get(f"{base}/health", timeout=5).json()
            if health["busy"] == 0 and health["stats"]["cancelled"] >= 1:
                break
            assert time.time() < deadline, health
            time.sleep(0.1)
        assert health["stats"]["rows_stepped"] < 2 * 100  # it did not run to its 100 tokens
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_failed_decoding_step_answers_every_request_instead_of_hanging(tiny):
    """An error inside a decoding step (e.g. a CUDA assert) must not leave requests waiting for a
    thread that is gone: the running request ends with 503 (or a streamed ``finish_reason:
    error``), later ones get 503 at once, and /health reports the error with 503."""
    model, tokenizer = tiny
    app = create_generation_app(model, tokenizer, name="tiny-gpt2", slots=2, max_waiting=4, max_new_tokens=16, fast="reference")
    batcher = app.state.batcher

    def broken_step():
        raise RuntimeError("CUDA error: device-side assert triggered")

    batcher.step = broken_step  # what run() calls on the decoding thread
    with TestClient(app) as c:
        first = c.post("/generate", json={"prompt": "abc", "max_new_tokens": 4}, timeout=10)
        assert first.status_code == 503 and "device-side assert" in first.json()["detail"]
        later = c.post("/generate", json={"prompt": "abc", "max_new_tokens": 4, "stream": True}, timeout=10)
        assert later.status_code == 503
        health = c.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "error" and "RuntimeError" in health.json()["error"]
