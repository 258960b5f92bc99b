"""``ctxkit serve``'s /embed within a work budget (issue 44 item 1).

/embed embeds a long text window by window (/classify cuts it), so a request's cost follows
its tokens: the audit's body, 64 texts of "一二" * 5000 (1.9 MB, within every other limit),
is 64 x 26 windows of 512 tokens; it held the model thread for over ten minutes, a
concurrent /classify waiting all along. Now such a request is counted before any forward
pass and refused (413, naming --max-windows) within a second; one within the budget runs
its windows a batch at a time, other requests' batches between them, and gets the vectors
of offline ``embed``. The runs are all-MiniLM-L6-v2 cut to 2 layers with a seeded head, as in
test_serve.py.
"""

import asyncio
import time

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
from fastapi.testclient import TestClient  # noqa: E402

from ctxkit.cli.deploy import add_serve_command  # noqa: E402
from ctxkit.core.errors import UserError  # noqa: E402
from ctxkit.features.embed import embed  # noqa: E402
from ctxkit.inference.serve import create_app  # noqa: E402
from ctxkit.inference.serve_embed import release_memory  # noqa: E402
from ctxkit.models.bert.model import load_bert  # noqa: E402
from ctxkit.tasks import get_task  # noqa: E402
from ctxkit.tokenizers import WordPieceTokenizer  # noqa: E402
from tolerance import assert_paths_agree  # noqa: E402
from servers import running  # noqa: E402

LAYERS = 2
AUDIT_BODY = {"texts": ["一二" * 5000] * 64}  # the audit's request, byte for byte


@pytest.fixture(scope="module")
def loaded(minilm_layers):
    """``(task, model, tokenizer, info)`` of a classification run on MiniLM's first 2 layers."""
    folder = minilm_layers(LAYERS)
    task = get_task("table", labels=["negative", "positive"], regression=False)
    torch.manual_seed(0)
    model = task.build_model(load_bert(folder)).eval()
    return task, model, WordPieceTokenizer.from_dir(folder), {"task": task.name, "options": task.options()}


def test_the_audit_request_is_refused_in_a_second_naming_the_limit(loaded):
    with TestClient(create_app(loaded, max_wait_ms=0)) as client:
        started = time.perf_counter()
        r = client.post("/embed", json=AUDIT_BODY)
        seconds = time.perf_counter() - started
        stats = client.get("/health").json()
    assert r.status_code == 413, r.text
    message = r.json()["error"]
    # 26 windows a text: over the default 128 (2 x --max-items 64) at the fifth text, where counting stops
    assert message == ("/embed embeds long texts window by window, each window a forward pass of 512 tokens: texts[0] to "
                       "texts[4] alone need 130 windows; the limit is 128 windows per request (--max-windows); send fewer "
                       "or shorter texts, or raise --max-windows"), message
    assert seconds < 5, seconds  # over ten minutes before
    assert stats["limits"]["max_windows"] == 128 and stats["stats"]["embed"]["requests"] == 0  # no forward pass ran


def test_the_budget_counts_windows_as_embed_runs_them(loaded):
    _, model, tokenizer, _ = loaded
    texts = ["一二" * 2000, "a short one", "word " * 900]
    assert embed(texts, (model.encoder, tokenizer), pooling="mean").num_windows == [11, 1, 3]
    with TestClient(create_app(loaded, max_wait_ms=0, max_windows=14)) as client:
        r = client.post("/embed", json={"texts": texts})
        assert r.status_code == 413 and "texts[0] to texts[2] alone need 15 windows; the limit is 14" in r.json()["error"]
        r = client.post("/embed", json={"text": "一二" * 2000})
        assert r.status_code == 200 and r.json()["dim"] == 384  # 11 windows: within 14
    with pytest.raises(UserError, match="--max-windows must be an integer >= 1, got 0"):
        create_app(loaded, max_windows=0)


def test_a_request_within_the_budget_gets_the_offline_vectors(loaded):
    _, model, tokenizer, _ = loaded
    # windowed texts (3 and 6 windows), short ones, CJK, and a text of one character
    texts = ["The river bank flooded after the storm. " * 60, "a loan from the bank", "一二三" * 400, "x"]
    for pooling in ("mean", "cls"):
        want = embed(texts, (model.encoder, tokenizer), pooling=pooling, batch_size=4)
        assert max(want.num_windows) > 2
        with TestClient(create_app(loaded, max_wait_ms=0, max_batch=4, pooling=pooling)) as client:
            listed = client.post("/embed", json={"texts": texts}).json()
            single = client.post("/embed", json={"text": texts[0]}).json()
        got = np.array(listed["embeddings"], dtype=np.float32)
        assert got.shape == (len(texts), 384)
        # the same windows in the same batches, on the server's model thread (its own torch
        # thread count: another GEMM blocking): all-MiniLM's embeddings and 2 layers, then a
        # mean over up to a window's tokens (tests/README.md)
        assert_paths_agree(got, np.asarray(want), k=(1536,) * (1 + LAYERS) + (512,), name=f"served vs offline ({pooling})")
        assert_paths_agree(np.array(single["embedding"], dtype=np.float32), np.asarray(want)[0],
                           k=(1536,) * (1 + LAYERS) + (512,), name=f"one text ({pooling})")


_running = running  # tests/servers.py


def test_a_long_embed_request_does_not_hold_the_model_thread(loaded):
    """A /classify sent while a long /embed runs is answered between its forward passes."""
    long_texts = [" ".join(f"w{i}x{j}" for i in range(250)) for j in range(6)]  # 6 texts of 4 windows each
    finished = {}

    async def scenario(base):
        async with httpx.AsyncClient(base_url=base, timeout=120) as client:
            async def timed(name, path, body):
                r = await client.post(path, json=body)
                finished[name] = time.perf_counter()
                return r

            embedding = asyncio.create_task(timed("embed", "/embed", {"texts": long_texts}))
            await asyncio.sleep(0.3)  # the embed request is running its passes by now
            classified = await timed("classify", "/classify", {"text": "a gripping film"})
            return await embedding, classified, (await client.get("/health")).json()

    with _running(create_app(loaded, max_batch=2, max_wait_ms=0, max_windows=1000)) as base:
        embedded, classified, health = asyncio.run(asyncio.wait_for(scenario(base), 170))
    assert embedded.status_code == 200 and classified.status_code == 200, (embedded.text, classified.text)
    assert finished["classify"] < finished["embed"], finished  # not after all of the embed request's 12 passes
    assert health["limits"]["max_windows"] == 1000
    assert health["stats"]["embed"]["requests"] == 1 and health["stats"]["classify"]["requests"] == 1


def test_release_memory_runs_anywhere():
    release_memory()  # gc, then glibc's malloc_trim where there is one; a no-op elsewhere


def test_serve_command_max_windows_option(capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="ctxkit")
    add_serve_command(parser.add_subparsers(dest="verb"))
    assert parser.parse_args(["serve", "RUN"]).max_windows is None  # 2 x --max-items, at startup
    assert parser.parse_args(["serve", "RUN", "--max-windows", "500"]).max_windows == 500
    for bad in ("0", "-3", "many", "1.5"):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(["serve", "RUN", "--max-windows", bad])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == f"ctxkit serve: error: argument --max-windows: must be an integer >= 1, got '{bad}'", err
