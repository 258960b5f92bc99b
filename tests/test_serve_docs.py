"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) on every app ``ctxkit serve`` builds (issue 40
item 3): the pages and every script, stylesheet and icon they load come from the server
itself (fastapi-offline's copies, in the serve extra), so they work on a machine without
network access; and the request schemas carry examples the pages show (and that the server
answers)."""

import re

import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from ctxkit.inference.serve import create_app  # noqa: E402
from ctxkit.inference.serve_generate import create_generation_app  # noqa: E402
from ctxkit.models.bert.model import load_bert  # noqa: E402
from ctxkit.models.gpt2.model import GPT2Config, GPT2LMHeadModel  # noqa: E402
from ctxkit.tasks import get_task  # noqa: E402
from ctxkit.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer  # noqa: E402

CONLL_TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
TASKS = {"classify": lambda: get_task("table", labels=["negative", "positive"], regression=False),
         "ner": lambda: get_task("conll2003", labels=CONLL_TAGS), "qa": lambda: get_task("squad")}


@pytest.fixture(scope="module")
def encoder(minilm_layers):
    folder = minilm_layers(1)
    return load_bert(folder), WordPieceTokenizer.from_dir(folder)


def _encoder_app(kind, encoder):
    task = TASKS[kind]()
    torch.manual_seed(0)
    model = task.build_model(encoder[0]).eval()
    return create_app((task, model, encoder[1], {"task": task.name, "options": task.options()}), max_wait_ms=0)


@pytest.fixture(scope="module")
def generation_app():
    tokenizer = ByteLevelBPETokenizer.train(iter([""]), vocab_size=257, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = GPT2Config(num_layers=1, hidden_size=32, num_heads=2, vocab_size=tokenizer.vocab_size, max_position=64, ffn_size=64)
    return create_generation_app(GPT2LMHeadModel(config).eval(), tokenizer, name="tiny-gpt2", slots=2, fast="reference")


def _check_pages(client) -> None:
    """Both pages: HTML whose every URL is a path of this server, each of which answers."""
    for page, needs in (("/docs", ("swagger-ui-bundle.js", "swagger-ui.css")), ("/redoc", ("redoc.standalone.js",))):
        r = client.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), (page, r.text[:200])
        html = r.text
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}", html, re.I), (page, html)  # no other host, no CDN
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html) + re.findall(r"""url: ?['"]([^'"]+)['"]""", html) + \
            re.findall(r"""spec-url=["']([^"']+)["']""", html)
        assert all(u.startswith("/") for u in urls) and "/openapi.json" in urls, (page, urls)
        assert all(any(u.endswith(n) for u in urls) for n in needs), (page, urls)
        for url in urls:
            asset = client.get(url)
            assert asset.status_code == 200, (page, url)
            kind = asset.headers["content-type"]
            if url.endswith(".js"):
                assert "javascript" in kind and len(asset.content) > 100_000, (url, kind)  # the real bundle
            elif url.endswith(".css"):
                assert kind.startswith("text/css") and len(asset.content) > 10_000, (url, kind)
            elif url.endswith(".png"):
                assert kind == "image/png", (url, kind)
    assert client.get("/docs-assets/no-such-file.js").status_code == 404


@pytest.mark.parametrize("kind", sorted(TASKS))
def test_encoder_server_docs_are_self_hosted_and_show_examples(kind, encoder):
    with TestClient(_encoder_app(kind, encoder)) as client:
        _check_pages(client)
        schema = client.get("/openapi.json").json()
        health = client.get("/health").json()
        bodies = {path: op["post"]["requestBody"]["content"]["application/json"]["schema"]
                  for path, op in schema["paths"].items() if "post" in op}
        assert set(bodies) == {f"/{kind}", "/embed"}
        for path, ref in bodies.items():
            body = schema["components"]["schemas"][ref["$ref"].rsplit("/", 1)[-1]]
            assert len(body["examples"]) >= 2, (path, body)
            # every example is a body the server answers
            for example in body["examples"]:
                r = client.post(path, json=example)
                assert r.status_code == 200, (path, example, r.text)
        assert {"GET /docs", "GET /redoc"} <= set(health["endpoints"])
        assert "/docs" not in schema["paths"] and "/docs-assets" not in str(schema["paths"])  # pages stay out of the schema


def test_generation_server_docs_are_self_hosted_and_show_examples(generation_app):
    with TestClient(generation_app) as client:
        _check_pages(client)
        schema = client.get("/openapi.json").json()
        for path, name in (("/generate", "GenerateRequest"), ("/v1/completions", "CompletionRequest")):
            body = schema["components"]["schemas"][name]
            assert len(body["examples"]) >= 2 and body["properties"]["prompt"]["examples"], body
            ref = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/" + name)
            for example in body["examples"]:
                r = client.post(path, json={**example, "max_new_tokens" if path == "/generate" else "max_tokens": 2})
                assert r.status_code == 200, (path, example, r.text)


def test_docs_work_behind_a_path_prefix(encoder):
    """Under a proxy's root_path the pages name their files under that prefix."""
    with TestClient(_encoder_app("classify", encoder), root_path="/api") as client:
        html = client.get("/docs").text
        assert "/api/docs-assets/swagger-ui-bundle.js" in html and "'/api/openapi.json'" in html
