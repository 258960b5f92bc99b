"""``ctxkit ui`` without a browser (issue 40 item 4): the models a user names are sorted into
their panels, a panel without a model says which option adds one, each JSON route answers
what the model it wraps answers (the streamed generation: the tokens ``generate`` gives alone,
greedy and sampled), refused inputs are 422 with the reason, the page's three files ship in the
package and fetch nothing from elsewhere, and the verb serves what it loaded."""

import asyncio
import json
import re
import threading
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from ui_models import NER_TEXT, QA, TAGS, _task_checkpoint, tiny_ui_folders  # noqa: E402

from ctxkit.core.errors import UserError  # noqa: E402
from ctxkit.decoding import GenerationConfig, generate  # noqa: E402
from ctxkit.features.senses import DEMO_WORDS, word_similarities  # noqa: E402
from ctxkit.inference import ui  # noqa: E402
from ctxkit.inference.ui import PANELS, UIModels, create_ui_app, load_ui_models, model_role  # noqa: E402
from ctxkit.models.bert.model import BertModel, save_bert  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tiny_ui_folders(tmp_path_factory.mktemp("ui"))


@pytest.fixture(scope="module")
def models(folders):
    return load_ui_models(str(folders["generator"]), encoder=str(folders["encoder"]), qa=str(folders["qa"]),
                          ner=str(folders["ner"]), device="cpu")


@pytest.fixture(scope="module")
def client(models):
    return TestClient(create_ui_app(models, max_new_tokens=64))


def test_each_model_is_sorted_into_its_role(folders, tmp_path):
    assert {role: model_role(str(path)) for role, path in folders.items()} == {
        "encoder": "encoder", "qa": "qa", "ner": "ner", "generator": "generator"}
    assert model_role("bert-base-uncased") == "encoder"  # a name: nothing fetched to sort it
    head = {"classifier.weight": torch.zeros(2, 32), "classifier.bias": torch.zeros(2)}
    sst = _task_checkpoint(tmp_path / "sst", "BertForSequenceClassification", head, id2label={"0": "neg", "1": "pos"})
    with pytest.raises(UserError, match="is a sequence run; ctxkit ui shows question-answering and NER runs"):
        model_role(str(sst))


def test_the_model_at_hand_fills_its_panels_and_the_others_say_why_not(folders, tmp_path):
    only = load_ui_models(str(folders["encoder"]), device="cpu")
    assert only.encoder is not None and only.fill_mask is not None and only.generator is None
    assert only.message("generator") == ("mlm is an encoder: it does not generate text; start ctxkit ui with --generator GPT2 "
                                         "(an lm-train run, a GPT-2 folder, or gpt2)")
    assert "--qa RUN" in only.message("qa") and "--ner RUN" in only.message("ner")
    gpt = load_ui_models(str(folders["generator"]), device="cpu")
    assert gpt.encoder is None and "gpt is a GPT-2 language model: it is no encoder" in gpt.message("encoder")
    with pytest.raises(UserError, match="MODEL .* is a qa and --qa names"):
        load_ui_models(str(folders["qa"]), qa=str(folders["qa"]), device="cpu")
    with pytest.raises(UserError, match="--generator .*: not a GPT-2"):
        load_ui_models(generator=str(folders["encoder"]), device="cpu")
    # an encoder without the masked-LM head: similarities and attention, and fill-mask says why not
    torch.manual_seed(0)
    bare = save_bert(BertModel(only.encoder[0].config), tmp_path / "bare", only.encoder[1])
    plain = load_ui_models(encoder=str(bare), device="cpu")
    assert plain.encoder is not None and plain.fill_mask is None
    assert plain.message("fill_mask").startswith("bare has no masked-LM head in its checkpoint; start ctxkit ui with --encoder")


def test_info_and_missing_panels(models):
    info = TestClient(create_ui_app(models)).get("/api/info").json()
    assert {p: s["available"] for p, s in info["panels"].items()} == dict.fromkeys(PANELS, True)
    assert info["panels"]["generate"]["model"] == "gpt" and info["demo_words"] == DEMO_WORDS
    encoder_only = TestClient(create_ui_app(UIModels(encoder=models.encoder, names={"encoder": "mlm"})))
    panels = encoder_only.get("/api/info").json()["panels"]
    assert [p for p, s in panels.items() if s["available"]] == ["similarity", "attention"]
    for route, body, option in (("generate", {"prompt": "x"}, "--generator"), ("qa", {"question": "a", "context": "b"}, "--qa"),
                                ("ner", {"text": "a"}, "--ner"), ("fill-mask", {"text": "[MASK]"}, "--encoder")):
        answer = encoder_only.post(f"/api/{route}", json=body)
        assert answer.status_code == 404 and option in answer.json()["detail"], route


def test_similarity_and_attention_answer_what_the_features_compute(client, models):
    bank = DEMO_WORDS["bank"]
    sentences, senses = bank["river"] + bank["money"], ["river"] * 4 + ["money"] * 4
    got = client.post("/api/similarity", json={"word": "bank", "sentences": sentences, "senses": senses}).json()
    want = word_similarities(*models.encoder, sentences, "bank", senses=senses)
    assert got["labels"] == [f"river#{i}" for i in range(1, 5)] + [f"money#{i}" for i in range(1, 5)]
    for key in ("contextual", "static"):  # the same computation in this process: equal once rounded for the wire
        assert got[key] == ui._plain(want[key])
    assert set(got["mean_contextual"]) == {"river-vs-river", "river-vs-money", "money-vs-money"}
    unsensed = client.post("/api/similarity", json={"word": "bank", "sentences": sentences[:3]}).json()
    assert unsensed["labels"] == ["#1", "#2", "#3"] and unsensed["senses"] is None and "mean_contextual" not in unsensed
    refused = client.post("/api/similarity", json={"word": "crane", "sentences": sentences[:2]})
    assert refused.status_code == 422 and "'crane' occurs 0 time(s)" in refused.json()["detail"]

    att = client.post("/api/attention", json={"text": "the bank raised its rates"}).json()
    net, tokenizer = models.encoder
    assert att["tokens"] == ["[CLS]", "the", "bank", "raised", "its", "rates", "[SEP]"]
    assert (att["layers"], att["heads"]) == (net.config.num_layers, net.config.num_heads)
    weights = torch.tensor(att["weights"])
    # each row sums to 1 up to the wire's rounding: 7 weights of 3 decimals, each off by 0.0005 at most
    assert weights.shape == (2, 2, 7, 7) and float((weights.sum(-1) - 1).abs().max()) <= 7 * 0.0005 + 1e-6
    too_long = client.post("/api/attention", json={"text": " ".join(["the"] * 80)})
    assert too_long.status_code == 422 and "64 at most" in too_long.json()["detail"]


def test_fill_mask_qa_and_ner_answer_as_their_pipelines(client, models):
    text = "john lives in [MASK] ."
    got = client.post("/api/fill-mask", json={"text": text, "top_k": 3}).json()["candidates"]
    assert [c["token_str"] for c in got] == [c["token_str"] for c in models.fill_mask(text, top_k=3)]
    bad = client.post("/api/fill-mask", json={"text": "no mask"})
    assert bad.status_code == 422 and "exactly one [MASK]" in bad.json()["detail"]
    answer = client.post("/api/qa", json={"question": QA[0], "context": QA[1]}).json()
    want = models.qa(question=QA[0], context=QA[1])
    assert (answer["start"], answer["end"], answer["answer"]) == (want["start"], want["end"], want["answer"])
    entities = client.post("/api/ner", json={"text": NER_TEXT}).json()["entities"]
    assert entities and [(e["entity_group"], e["start"], e["end"]) for e in entities] == [
        (e["entity_group"], e["start"], e["end"]) for e in models.ner(NER_TEXT)]
    assert {e["entity_group"] for e in entities} <= {t.split("-")[-1] for t in TAGS.values()}
    too_long = client.post("/api/ner", json={"text": "a" * 5000})
    assert too_long.status_code == 422  # over max_text_chars: pydantic's own message


def _events(client, body) -> list:
    with client.stream("POST", "/api/generate", json=body) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        lines = [line[len("data: "):] for line in answer.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_generation_streams_the_tokens_generate_gives_alone(client, models, temperature):
    model, tokenizer = models.generator
    body = {"prompt": "the river bank", "max_new_tokens": 20, "temperature": temperature, "top_k": 50, "top_p": 0.9, "seed": 5}
    events = _events(client, body)
    done = events[-1]
    assert done["done"] and done["finish_reason"] == "length" and done["completion_tokens"] == 20
    pieces = events[:-1]
    assert [e["index"] for e in pieces] == list(range(len(pieces))) and len(pieces) >= 20  # one event per token at least
    ids = tokenizer.encode(body["prompt"])
    config = GenerationConfig(max_new_tokens=20, do_sample=temperature > 0, temperature=temperature or 1.0, top_k=50, top_p=0.9,
                              eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.eos_id)
    want = generate(model, torch.tensor([ids]), None, config, generator=torch.Generator().manual_seed(5))[0, len(ids):]
    assert "".join(e["text"] for e in pieces) == done["text"] == tokenizer.decode(want.tolist())
    assert _events(client, body)[-1]["text"] == done["text"]  # the seed makes it again


def test_generation_refuses_what_cannot_run(client):
    too_many = client.post("/api/generate", json={"prompt": "the", "max_new_tokens": 65})
    assert too_many.status_code == 422  # over the app's --max-new-tokens
    long_prompt = client.post("/api/generate", json={"prompt": "the river " * 60, "max_new_tokens": 64})
    assert long_prompt.status_code == 422 and "exceed the model's context of 128 tokens" in long_prompt.json()["detail"]
    assert client.post("/api/generate", json={"prompt": "x", "top_p": 0}).status_code == 422


def test_a_client_that_goes_away_ends_its_generation(models):
    model, tokenizer = models.generator
    body = ui._request_models(100, 100)[4](prompt="the river bank", max_new_tokens=100, temperature=0.0)

    async def first_piece():
        request = ui._GenerationRequest(model, tokenizer, body, asyncio.get_running_loop())
        worker = threading.Thread(target=request.work, args=(threading.Lock(),))
        events = request.events()
        worker.start()
        first = await events.__anext__()
        await events.aclose()  # the client went away after one token
        await asyncio.get_running_loop().run_in_executor(None, worker.join, 30)
        return first, request

    first, request = asyncio.run(first_piece())
    assert first.startswith("data: ") and request.reason == "cancelled" and request.count < 100


def test_the_page_ships_in_the_package_and_fetches_nothing_elsewhere(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert client.get("/static/ui.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/static/ui.css").headers["content-type"].startswith("text/css")
    assert client.get("/static/index.html").status_code == 404 and client.get("/static/../ui.py").status_code == 404
    assert client.get("/docs").status_code == 404 and "/api/generate" in client.get("/openapi.json").json()["paths"]
    for name in ("index.html", "ui.js", "ui.css"):
        text = (ui.ASSETS / name).read_text(encoding="utf-8")
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text, re.I), name  # no CDN, no font service
    assert re.findall(r'(?:src|href)="([^"]+)"', page.text) == ["data:,", "static/ui.css", "static/ui.js"]
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '"inference/ui_assets/*"' in pyproject  # package data: the wheel carries the page


def test_the_verb_serves_the_models_it_loaded(folders, monkeypatch, capsys):
    from ctxkit.cli import main
    from ctxkit.cli import ui as ui_verb

    served = {}
    monkeypatch.setattr(ui_verb, "run_ui", lambda app, host, port: served.update(app=app, host=host, port=port))
    assert main(["ui", str(folders["generator"]), "--encoder", str(folders["encoder"]), "--port", "8123", "--device", "cpu"]) == 0
    assert served["port"] == 8123 and served["host"] == "127.0.0.1"
    panels = TestClient(served["app"]).get("/api/info").json()["panels"]
    assert [p for p, s in panels.items() if not s["available"]] == ["qa", "ner"]
    assert "http://localhost:8123/ (similarity, attention, fill-mask, generate)" in capsys.readouterr().err
    assert main(["ui", str(folders["qa"]), "--qa", str(folders["qa"])]) == 2
    assert "is a qa and --qa names" in capsys.readouterr().err
