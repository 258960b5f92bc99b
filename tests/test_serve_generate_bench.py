"""benchmarks/serve_generate.py (issue 40 item 2) on the CPU: a tiny GPT-2 built by the script,
``ctxkit serve`` at two concurrencies, one request at a time (peer a) and transformers'
``generate`` behind the same HTTP API (peer b, skipped without transformers), driven by the
streaming client of benchmarks/sse_load.py; the records' fields are checked, not the figures.
Three servers start (their imports dominate: about 20 s on two idle cores)."""

import importlib.util
import json
from pathlib import Path

import pytest

from ctxkit.tokenizers import ByteLevelBPETokenizer

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

REPO = Path(__file__).resolve().parents[1]
HAS_HF = importlib.util.find_spec("transformers") is not None


@pytest.fixture(scope="module")
def bench():
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REPO / "benchmarks"))  # its helpers: harness, sse_load, http_load
        import serve_generate

        yield serve_generate


def test_workload_lengths_and_seeds(bench):
    text = bench.builtin_text(50_000)
    tokenizer = ByteLevelBPETokenizer.train(iter([text]), vocab_size=300, show_progress=False)
    bodies = bench.workload(tokenizer, text, 40, (8, 40), (4, 20), top_k=50, seed=3)
    assert bodies == bench.workload(tokenizer, text, 40, (8, 40), (4, 20), top_k=50, seed=3)  # seeded
    assert len({b["seed"] for b in bodies}) == 40
    for b in bodies:
        assert 1 <= len(tokenizer.encode(b["prompt"])) <= 40 and 4 <= b["max_new_tokens"] <= 20
        assert b["temperature"] == 1.0 and b["top_k"] == 50
    assert max(len(tokenizer.encode(b["prompt"])) for b in bodies) > 30  # the range is used, not one length


def test_the_benchmark_on_a_tiny_gpt2_writes_its_records(bench, tmp_path):
    results = tmp_path / "serve_generate.json"
    recorded = REPO / "benchmarks" / "results" / "serve_generate.json"
    before = recorded.stat().st_mtime if recorded.exists() else None
    # --corpus-chars: the tokenizer (vocabulary 300) learned from 50,000 characters of the built-in
    # text rather than 400,000, and the workload cut from them (~1 s of CPU less, same records)
    argv = ["--preset", "tiny", "--corpus-chars", "50000", "--device", "cpu", "--requests", "8", "--concurrency", "1,4",
            "--peer-requests", "4",
            "--prompt-tokens", "8,24", "--output-tokens", "4,12", "--warmup", "2", "--client-processes", "1",
            "--server-threads", "1", "--prefill-chunk", "8", "--results", str(results)] + ([] if HAS_HF else ["--no-hf"])
    assert bench.main(argv) == 0
    assert (recorded.stat().st_mtime if recorded.exists() else None) == before  # never into benchmarks/results
    records = json.loads(results.read_text())
    one = [r for r in records if r["peer_name"].startswith("ctxkit serve --max-batch 1")]
    hf = [r for r in records if r["peer_name"].startswith("transformers")]
    assert len(one) == 2 and len(hf) == (3 if HAS_HF else 0) and len(records) == len(one) + len(hf)
    for r in records:
        assert r["benchmark"] == "serve_generate" and r["metric"] == "output tokens per second" and r["unit"] == "tokens/s"
        assert r["ctxkit"] > 0 and r["peer"] > 0 and r["speedup"] > 0
        assert r["command"].startswith("ctxkit serve FOLDER --max-batch") and "--device cpu --prefill-chunk 8" in r["command"]
        # how the server ran, from its /health: fp32 on the CPU, no CUDA graphs, the chunk asked for
        assert r["server_precision"] == "fp32" and r["server_cuda_graphs"] is None and r["server_prefill_chunk"] == 8
        assert "served in fp32" in r["case"] and r["server_fast"] == "qkv"
        assert r["benchmark_command"].startswith("python benchmarks/serve_generate.py --preset tiny") and "--results" not in \
            r["benchmark_command"]
        for side in ("", "peer_"):
            assert r[side + "errors"] == 0, r.get(side + "first_error")
            assert 0 < r[side + "ttft_p50_ms"] <= r[side + "ttft_p99_ms"]
            assert 0 < r[side + "itl_p50_ms"] <= r[side + "itl_p99_ms"]
            # every token asked for arrived, unless end-of-text ended a request early
            assert r[side + "output_tokens"] <= r[side + "asked_tokens"]
            assert r[side + "ended_early"] > 0 or r[side + "output_tokens"] == r[side + "asked_tokens"]
            assert 0 < r[side + "events"] <= r[side + "output_tokens"]
    by_conc = {r["case"].split("concurrency ")[1][:1]: r for r in one}
    assert by_conc["1"]["requests"] == 4 and by_conc["4"]["requests"] == 8 and "--max-batch 4" in by_conc["4"]["case"]
    assert by_conc["4"]["target_met"] in (True, False) and by_conc["4"]["itl_p99_ms_one_at_a_time"] == by_conc["4"]["peer_itl_p99_ms"]
    assert by_conc["4"]["mean_rows_per_step"] > 1  # requests shared steps
    if HAS_HF:
        assert all(" cache, float32, one request at a time" in r["peer_name"] for r in hf)  # ctxkit's precision here
        alone = [r for r in hf if "one request at a time (--max-batch 1)" in r["case"]]
        assert len(alone) == 1 and alone[0]["command"] == "ctxkit serve FOLDER --max-batch 1 --device cpu --prefill-chunk 8"


def test_a_slot_left_free_for_a_context_of_steps_does_not_break_the_batcher():
    """Found by this benchmark on a GPU (concurrency 1 on a 64-slot server): every row's position
    advanced at each step, the free ones too, until a free row's indexed past the position table
    (a device assert on a GPU; IndexError on the CPU) and the batcher's thread died."""
    import torch

    from ctxkit.decoding import GenerationConfig, generate
    from ctxkit.decoding.continuous import ContinuousBatcher, Request
    from ctxkit.models.gpt2.model import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(num_layers=1, hidden_size=32, num_heads=2, vocab_size=64, max_position=32, ffn_size=64)).eval()
    batcher = ContinuousBatcher(model, slots=2, plan="reference")
    config = GenerationConfig(max_new_tokens=26)
    want = generate(model, torch.tensor([[1, 2, 3]]), None, config, plan="reference", static=False)[0, 3:].tolist()
    for _ in range(3):  # one request at a time: slot 1 stays free for 78 steps, over twice the context
        got = []
        batcher.submit(Request([1, 2, 3], config, lambda t, why: got.append(t if why is None else why)))
        while batcher.step():
            pass
        assert got == want + ["length"]
