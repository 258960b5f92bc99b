"""The generation server (issue 40 item 1): continuous batching gives every request the
tokens ``generate`` gives it alone (greedy, and sampled with its seed), long prompts are
prefilled in chunks between decoding steps, requests join and leave the running batch, a
client that goes away frees its slot, a full queue answers 429, and the routes speak
/generate and OpenAI's /v1/completions, streamed or not. The decoding step's CUDA graphs
(one per batch width) are checked against the eager step on a GPU; on the CPU their
bookkeeping runs through a stand-in capture."""

import asyncio
import contextlib
import dataclasses
import json
import random
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from ctxkit.core.errors import UserError
from ctxkit.decoding import GenerationConfig, continuous, generate, sampling
from ctxkit.decoding.continuous import ContinuousBatcher, QueueFull, Request, bucket_width, bucket_widths, graphs_wanted
from ctxkit.fast import DeviceInfo, FastPlan, resolve
from ctxkit.models.gpt2.model import GPT2Config, GPT2LMHeadModel
from ctxkit.tokenizers import ByteLevelBPETokenizer

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from ctxkit.inference.serve_generate import create_generation_app, serving_dtype  # noqa: E402

CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def tiny():
    """A 2-layer GPT-2 with random weights over a byte-level vocabulary (every id decodes).

    The batchers over it run the plain modules (``plan="reference"``): ``auto`` would fuse its
    q/k/v for the whole module, and the first fused call imports torch._dynamo (~10 s on
    two cores); the ``ctxkit serve`` test runs ``auto`` end to end."""
    tokenizer = ByteLevelBPETokenizer.train(iter([""]), vocab_size=257, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = GPT2Config(num_layers=2, hidden_size=64, num_heads=4, vocab_size=tokenizer.vocab_size, max_position=128, ffn_size=256)
    return GPT2LMHeadModel(config).eval(), tokenizer


def _alone(model, prompt, config, seed):
    device = next(model.parameters()).device
    generator = torch.Generator(device).manual_seed(seed)
    out = generate(model, torch.tensor([prompt], device=device), None, config, generator=generator, plan="reference", static=False)
    return out[0, len(prompt):].tolist()


def _serve(batcher, jobs, got, device="cpu"):
    """Submit ``jobs`` ``(prompt, config, seed)``; each request's tokens, then its end, go to ``got[i]``."""
    for i, (prompt, config, seed) in enumerate(jobs):
        batcher.submit(Request(prompt, config, lambda t, why, i=i: got.setdefault(i, []).append(t if why is None else why),
                               generator=torch.Generator(device).manual_seed(seed)))


def _mixed_jobs(vocab, n, prompt_lengths, max_len, seed=0):
    """``n`` requests ``(prompt, config, seed)``: greedy and sampled (top-k, top-p, a repetition penalty)."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(*prompt_lengths))]
        config = GenerationConfig(max_new_tokens=min(4 + 5 * i, max_len - len(prompt)), do_sample=i % 2 == 1, temperature=0.8,
                                  top_k=30 * (i % 3), top_p=0.9 if i % 4 == 3 else 1.0, repetition_penalty=1.3 if i == 5 else 1.0)
        jobs.append((prompt, config, 7 + i))
    return jobs


def test_every_request_gets_the_tokens_generate_gives_it_alone(tiny):
    model, _ = tiny
    rng = random.Random(0)
    batcher = ContinuousBatcher(model, slots=3, max_len=48, plan="reference")  # fewer slots than requests: they queue, join, leave
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
    batcher = ContinuousBatcher(model, slots=8, max_len=64, plan="reference")
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


def test_long_prompts_prefilled_in_chunks_while_others_decode_get_the_tokens_of_generate(tiny):
    """Prompts of up to 100 tokens arrive while other requests decode and are prefilled 8
    tokens per step: every request, greedy or sampled with its seed, still gets exactly what
    ``generate`` gives it alone (the prompt pass in one piece)."""
    model, _ = tiny
    batcher = ContinuousBatcher(model, slots=3, max_len=128, prefill_chunk=8, plan="reference")
    got = {}
    first = _mixed_jobs(model.config.vocab_size, 2, (2, 6), 128, seed=1)  # short prompts: decoding when the long ones come
    _serve(batcher, first, got)
    for _ in range(3):
        batcher.step()
    later = _mixed_jobs(model.config.vocab_size, 7, (30, 101), 128, seed=2)
    for i, (prompt, config, seed) in enumerate(later, start=len(first)):
        batcher.submit(Request(prompt, config, lambda t, why, i=i: got.setdefault(i, []).append(t if why is None else why),
                               generator=torch.Generator().manual_seed(seed)))
    while batcher.step():
        assert batcher.busy <= 3
    for i, (prompt, config, seed) in enumerate(first + later):
        assert got[i] == _alone(model, prompt, config, seed) + ["length"], i
    long_tokens = sum(len(p) for p, _, _ in later)
    assert batcher.stats["prefill_tokens"] == long_tokens + sum(len(p) for p, _, _ in first)
    assert batcher.stats["prefill_chunks"] >= 2 * len(later)  # chunked (a prompt runs whole only while none decodes)
    assert batcher.stats["admitted"] == batcher.stats["finished"] == 9


def test_a_decoding_step_runs_between_two_chunks_of_a_long_prompt():
    """A 40-token prompt arriving while a request decodes runs as five 8-token chunks with a
    decoding step (a token for the running request) after each; arriving at an idle batcher,
    the same prompt runs whole (it stalls no one)."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(num_layers=1, hidden_size=32, num_heads=2, vocab_size=64, max_position=96,
                                       ffn_size=64)).eval()
    calls, forward = [], model.transformer.forward
    tokens = []

    def spy(input_ids, cache=None, **kwargs):  # every pass goes through the body: chunk or step
        calls.append(("step", input_ids.size(0)) if cache.is_static else ("chunk", input_ids.size(1)))
        calls.append(("tokens so far", len(tokens)))
        return forward(input_ids, cache=cache, **kwargs)

    model.transformer.forward = spy
    batcher = ContinuousBatcher(model, slots=2, prefill_chunk=8, plan="reference")
    long = list(range(1, 41))
    batcher.submit(Request(long, GenerationConfig(max_new_tokens=2), lambda t, why: None))
    batcher.step()
    assert [c for c in calls if c[0] != "tokens so far"][:2] == [("chunk", 40), ("step", 1)]  # idle: the prompt whole
    while batcher.step():
        pass
    calls.clear()
    batcher.submit(Request([3, 4, 5], GenerationConfig(max_new_tokens=30), lambda t, why: tokens.append(t)))
    batcher.step()  # its prompt, then a step: it decodes from now on
    batcher.submit(Request(long, GenerationConfig(max_new_tokens=4), lambda t, why: None))
    while batcher.step():
        pass
    passes = [c for c in calls if c[0] != "tokens so far"]
    chunks = [i for i, c in enumerate(passes) if c == ("chunk", 8)]
    assert len(chunks) == 5 and passes[0] == ("chunk", 3)
    for a, b in zip(chunks, chunks[1:]):
        assert ("step", 1) in passes[a + 1 : b]  # the running request advanced between two chunks
    seen = [c[1] for c in calls if c[0] == "tokens so far"]
    at_chunk = [seen[i] for i in chunks]
    assert at_chunk == sorted(set(at_chunk))  # a new token for it before every next chunk



def test_prompt_chunks_run_without_cudnn_attention_which_plans_every_new_shape(monkeypatch):
    """cuDNN's attention builds a plan per (query, key) shape: every prompt chunk of a server
    is a new one (~100 ms of host time each on an H200, 91 % of the decoding thread). Chunks
    run in varying_shape_attention(device): on CUDA flash, memory-efficient and math only;
    the decoding steps (fixed shapes, CUDA graphs) keep the defaults."""
    from ctxkit.fast import varying_shape_attention

    backends = torch.backends.cuda
    before = (backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled(), backends.mem_efficient_sdp_enabled())
    with varying_shape_attention(torch.device("cuda")):
        assert (backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled(), backends.mem_efficient_sdp_enabled(),
                backends.math_sdp_enabled()) == (False, True, True, True)
    assert (backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled(), backends.mem_efficient_sdp_enabled()) == before
    with varying_shape_attention(torch.device("cpu")):  # nothing to change on a CPU
        assert backends.cudnn_sdp_enabled() == before[0]

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(num_layers=1, hidden_size=32, num_heads=2, vocab_size=64, max_position=96, ffn_size=64)).eval()
    inside, passes, forward = [], [], model.transformer.forward

    @contextlib.contextmanager
    def spy_context(device):
        inside.append(device)
        yield
        inside.pop()

    def spy(input_ids, cache=None, **kwargs):
        passes.append(("step" if cache.is_static else "chunk", bool(inside)))
        return forward(input_ids, cache=cache, **kwargs)

    monkeypatch.setattr(continuous, "varying_shape_attention", spy_context)
    model.transformer.forward = spy
    batcher = ContinuousBatcher(model, slots=2, prefill_chunk=8, plan="reference")
    batcher.submit(Request(list(range(1, 21)), GenerationConfig(max_new_tokens=3), lambda t, why: None))
    while batcher.step():
        pass
    assert ("chunk", True) in passes and ("step", False) in passes
    assert all(within == (kind == "chunk") for kind, within in passes)

def test_bucket_widths_and_the_plan_turns_cuda_graphs_on_only_on_a_gpu(tiny):
    assert [bucket_width(r, 64) for r in (1, 2, 3, 5, 33, 64)] == [1, 2, 4, 8, 64, 64]
    assert bucket_width(5, 6) == 6 and bucket_width(1, 1) == 1
    assert bucket_widths(64) == [1, 2, 4, 8, 16, 32, 64] and bucket_widths(6) == [1, 2, 4, 6] and bucket_widths(1) == [1]
    graphs, reference = FastPlan.parse("graphs"), FastPlan.parse("reference")
    assert graphs_wanted(graphs, torch.device("cuda")) and not graphs_wanted(graphs, torch.device("cpu"))
    assert not graphs_wanted(reference, torch.device("cuda"))
    # auto for decoding takes graphs on a GPU (what the server resolves there), not on the CPU
    h200 = DeviceInfo("cuda", (9, 0), "NVIDIA H200")
    assert graphs_wanted(resolve("auto", use="decode", device=h200), torch.device("cuda"))
    narrowed = ContinuousBatcher._narrowed(resolve("auto", use="decode", device=h200))
    assert narrowed.tokens() == ["graphs", "qkv"] and any("not compiled" in n for n in narrowed.notes)
    model = GPT2LMHeadModel(tiny[0].config).eval()  # auto fuses q/k/v: not in the shared model (see tiny)
    batcher = ContinuousBatcher(model, slots=4, max_len=32)  # auto on the CPU
    assert batcher.graphs is None and batcher.plan.tokens() == ["qkv"]
    with pytest.raises(UserError, match="graphs need a CUDA GPU"):
        ContinuousBatcher(model, slots=4, max_len=32, plan="graphs")


def test_replayed_steps_of_every_width_give_the_tokens_of_generate(tiny, monkeypatch):
    """The CUDA-graph bookkeeping on the CPU: a stand-in for ``capture_graph`` runs the warm-ups
    and the capture (they move the ring's index, the positions and the key mask, which
    ``capture`` must reset) and "replays" by recomputing into the captured output tensor.
    Stepping through those replays, one per width, every request gets generate's tokens."""
    model, _ = tiny
    captured = []

    def stand_in(run, *, warmup=3, pool=None, generator=None, device=None):
        for _ in range(warmup + 1):  # the warm-ups, then the call a capture records
            out = run()

        class Graph:
            def replay(self):
                out.copy_(run())  # a graph recomputes its outputs in place

        captured.append(out.size(0))
        return Graph(), out

    monkeypatch.setattr(continuous, "capture_graph", stand_in)
    batcher = ContinuousBatcher(model, slots=6, max_len=48, prefill_chunk=6, plan="reference")
    batcher.capture()
    assert captured == [1, 2, 4, 6] and sorted(batcher.graphs) == [1, 2, 4, 6] and batcher.column == 0
    got = {}
    jobs = _mixed_jobs(model.config.vocab_size, 9, (1, 20), 48, seed=3)
    _serve(batcher, jobs, got)
    while batcher.step():
        pass
    for i, (prompt, config, seed) in enumerate(jobs):
        assert got[i] == _alone(model, prompt, config, seed) + ["length"], i
    assert batcher.graphs.hits == batcher.stats["steps"] > 48 and batcher.graphs.captures == 4


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graphed_decoding_gives_the_tokens_of_eager_decoding_on_a_gpu(dtype):
    """One CUDA graph per batch width replays the eager step: the same requests (greedy and
    sampled with their seeds, long prompts prefilled in chunks) get the same tokens."""
    torch.manual_seed(0)
    config = GPT2Config(num_layers=2, hidden_size=64, num_heads=4, vocab_size=300, max_position=128, ffn_size=256)
    model = GPT2LMHeadModel(config).eval().to("cuda", dtype)
    jobs = _mixed_jobs(300, 12, (1, 90), 128, seed=4)
    results = []
    for plan in ("graphs", "reference"):
        batcher = ContinuousBatcher(model, slots=8, max_len=128, prefill_chunk=16, plan=plan)
        got = {}
        _serve(batcher, jobs, got, device="cuda")
        while batcher.step():
            pass
        results.append(got)
        if plan == "graphs":
            assert sorted(batcher.graphs) == bucket_widths(8) and batcher.graphs.hits == batcher.stats["steps"]
        else:
            assert batcher.graphs is None
    assert results[0] == results[1]
    assert all(g[-1] in ("length", "eos") for g in results[0].values())


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_the_generation_server_runs_bf16_with_graphs_on_a_gpu():
    tokenizer = ByteLevelBPETokenizer.train(iter([""]), vocab_size=257, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = GPT2Config(num_layers=2, hidden_size=64, num_heads=4, vocab_size=tokenizer.vocab_size, max_position=128, ffn_size=256)
    model = GPT2LMHeadModel(config).eval().cuda()
    app = create_generation_app(model, tokenizer, name="tiny-gpt2", slots=4, max_new_tokens=16)
    assert next(model.parameters()).dtype == torch.bfloat16
    with TestClient(app) as c:
        health = c.get("/health").json()
        assert health["precision"] == "bf16" and health["cuda_graphs"] == [1, 2, 4] and "graphs" in health["fast"]
        answer = c.post("/generate", json={"prompt": "abc" * 30, "max_new_tokens": 8, "temperature": 0}).json()
        assert answer["completion_tokens"] >= 1


def test_end_of_text_stop_and_cancel_free_the_slot(tiny):
    model, _ = tiny
    prompt = [5, 6, 7]
    config = GenerationConfig(max_new_tokens=20)
    tokens = _alone(model, prompt, config, 0)
    events = []
    eos = GenerationConfig(max_new_tokens=20, eos_token_id=tokens[3])  # the 4th greedy token ends it, unsent
    batcher = ContinuousBatcher(model, slots=1, max_len=64, plan="reference")
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
    batcher = ContinuousBatcher(model, slots=1, max_len=32, max_waiting=2, plan="reference")
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
    assert health["precision"] == "fp32" and health["fast"] == "reference" and health["cuda_graphs"] is None
    assert health["prefill_chunk"] == 256 and health["stats"]["prefill_tokens"] >= 1


def test_the_model_is_served_in_bf16_on_a_gpu_and_fp32_on_the_cpu():
    """The precision ``auto`` means everywhere (resolve_precision), or --precision fp32/bf16;
    the gpu backend's fp8 is refused in one line."""
    assert serving_dtype(None, torch.device("cuda")) == serving_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert serving_dtype(None, torch.device("cpu")) == serving_dtype("fp32", torch.device("cuda")) == torch.float32
    assert serving_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(UserError, match="gpu backend"):
        serving_dtype("fp8", torch.device("cuda"))


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

    from ctxkit.models.gpt2.model import load_gpt2, save_gpt2

    model, tokenizer = tiny
    folder = tmp_path / "gpt"
    save_gpt2(model, folder)
    tokenizer.save(folder)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH")) if p), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ctxkit", "serve", str(folder), "--port", str(port), "--device", "cpu",
                             "--max-batch", "2", "--prefill-chunk", "4"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
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
        assert health["prefill_chunk"] == 4 and health["precision"] == "fp32"
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
    # the start line says how the model runs
    start = next(json.loads(line) for line in proc.stderr.read().decode().splitlines() if '"event": "startup"' in line)
    assert start["precision"] == "fp32" and start["prefill_chunk"] == 4 and start["cuda_graphs"] is None and "fast" in start


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


def _choice_configs():
    """Greedy and sampled configs (temperature, top-k, top-p, repetition penalty), two rows each."""
    plain = {"max_new_tokens": 8}
    return [GenerationConfig(**plain), GenerationConfig(**plain, repetition_penalty=1.3),
            GenerationConfig(**plain, do_sample=True), GenerationConfig(**plain, do_sample=True, temperature=0.7, top_k=20),
            GenerationConfig(**plain, do_sample=True, top_p=0.9), GenerationConfig(**plain, do_sample=True, temperature=1.3, top_k=5,
                                                                                     top_p=0.8, repetition_penalty=1.2)] * 2


def test_the_batched_choice_is_next_tokens_row_by_row_for_mixed_configs():
    torch.manual_seed(1)
    configs = _choice_configs()
    rng = random.Random(0)
    seen = [[rng.randrange(257) for _ in range(rng.randrange(1, 30))] for _ in configs]
    batched = [torch.Generator().manual_seed(100 + i) for i in range(len(configs))]
    alone = [torch.Generator().manual_seed(100 + i) for i in range(len(configs))]
    for _ in range(6):  # several draws: each generator's stream stays the row's own
        logits = torch.randn(len(configs), 257) * 3
        got = sampling.choose_rows(logits, [s if c.repetition_penalty != 1.0 else None for s, c in zip(seen, configs)],
                                   configs, batched)
        want = [int(sampling.next_tokens(logits[i : i + 1], torch.tensor([seen[i]]), configs[i], alone[i])[0])
                for i in range(len(configs))]
        assert got.tolist() == want
        for s, token in zip(seen, want):
            s.append(token)
    # One group (every row the same sampled config): no gather, the same draws.
    logits = torch.randn(5, 257)
    config = configs[3]
    got = sampling.choose_rows(logits, [None] * 5, [config] * 5, [torch.Generator().manual_seed(i) for i in range(5)])
    assert got.tolist() == [int(sampling.next_tokens(logits[i : i + 1], None, config, torch.Generator().manual_seed(i))[0])
                            for i in range(5)]


def test_a_step_with_a_gap_in_the_busy_slots_gets_the_tokens_of_generate(tiny):
    model, _ = tiny
    batcher = ContinuousBatcher(model, slots=4, max_len=128, plan="reference")
    configs = _choice_configs()[:4]
    jobs = [([3 + i, 40, 7 * i + 1], dataclasses.replace(c, max_new_tokens=3 if i == 1 else 12), 20 + i)
            for i, c in enumerate(configs)]
    got = {}
    _serve(batcher, jobs, got)
    while batcher.step():  # request 1 ends first: slots 0, 2, 3 busy (an index_select, not a slice)
        pass
    for i, (prompt, config, seed) in enumerate(jobs):
        assert got[i] == _alone(model, prompt, config, seed) + ["length"]


def test_the_server_wakes_its_event_loop_once_per_step_not_once_per_token(tiny, monkeypatch):
    model, tokenizer = tiny
    wakes = []
    real = asyncio.BaseEventLoop.call_soon_threadsafe

    def counted(loop, *args, **kwargs):
        if threading.current_thread().name == "ctxkit-generate":
            wakes.append(1)
        return real(loop, *args, **kwargs)

    monkeypatch.setattr(asyncio.BaseEventLoop, "call_soon_threadsafe", counted)
    app = create_generation_app(model, tokenizer, slots=4, max_new_tokens=64, fast="reference", switch_interval=0.0003)
    batcher = app.state.batcher
    steps = []
    real_step = batcher.step
    monkeypatch.setattr(batcher, "step", lambda: steps.append(1) or real_step())
    before = sys.getswitchinterval()
    body = {"prompt": "The bank of the river", "max_new_tokens": 16, "temperature": 0, "stream": True}
    with TestClient(app) as c:
        assert sys.getswitchinterval() == pytest.approx(0.0003)  # while the server runs
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda i: c.post("/generate", json={**body, "seed": i}), range(4)))
        tokens, woken, stepped = batcher.stats["finished"], len(wakes), len(steps)
        assert all(a.status_code == 200 for a in answers) and tokens == 4
    assert sys.getswitchinterval() == pytest.approx(before, abs=2e-6)  # restored when it stops (kept in whole microseconds)
    emitted = sum(len(json.loads(e).get("text", "")) > 0 for a in answers for e in _events(a)[:-1])
    assert emitted >= 4 * 8  # many events...
    assert 1 <= woken <= stepped  # ...delivered in at most one wake-up per step
    assert woken < emitted / 2
