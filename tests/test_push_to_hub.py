"""push_to_hub and ``ctxkit push`` through huggingface_hub's upload API, against the local
stand-in Hub (tests/hub_server.py; issue 38 item 4): what is pushed downloads again and
loads to the same weights and predictions."""

import json

import pytest
import torch

from ctxkit import AutoModel, AutoTokenizer
from ctxkit.cli import main
from ctxkit.core.errors import UserError
from ctxkit.models.bert.model import BertModel
from ctxkit.tokenizers import WordPieceTokenizer
from hub_server import HubServer, use_hub


@pytest.fixture
def hub(tmp_path, monkeypatch):
    with HubServer() as server:
        use_hub(monkeypatch, server.url, tmp_path / "hf")
        yield server


def test_model_and_tokenizer_push_then_load_back(hub, tiny_bert_dir):
    model = BertModel.from_pretrained(tiny_bert_dir)
    tokenizer = WordPieceTokenizer.from_pretrained(tiny_bert_dir)
    url = model.push_to_hub("me/tiny-bert", tokenizer=tokenizer, commit_message="first")
    repo = hub.repos["me/tiny-bert"]
    assert url.endswith(repo["commit"]) and repo["message"] == "first"
    assert {"config.json", "model.safetensors", "vocab.txt"} <= set(repo["files"])
    again = AutoModel.from_pretrained("me/tiny-bert")
    for (k, a), (_, b) in zip(sorted(model.state_dict().items()), sorted(again.state_dict().items())):
        assert torch.equal(a, b), k
    assert AutoTokenizer.from_pretrained("me/tiny-bert")("a fine film").input_ids == tokenizer("a fine film").input_ids
    tokenizer.push_to_hub("me/tok-only")
    assert "vocab.txt" in hub.repos["me/tok-only"]["files"] and "config.json" not in hub.repos["me/tok-only"]["files"]


def test_ctxkit_push_a_run_then_predict_from_the_hub(hub, tiny_bert_dir, sst_table, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["finetune", "table", "--model", str(tiny_bert_dir), "--data", str(sst_table), "--out", str(run), "--epochs", "1",
                 "--batch-size", "8", "--max-length", "32", "--lr", "1e-3", "--device", "cpu", "--no-progress"]) == 0
    capsys.readouterr()
    (tmp_path / "in.txt").write_text("a wonderful , moving film\nthe worst mess of the year\n")
    assert main(["predict", str(run), str(tmp_path / "in.txt"), "--device", "cpu", "--backend", "pytorch"]) == 0
    local = capsys.readouterr().out
    assert main(["push", str(run), "me/sst-run"]) == 0
    files = hub.repos["me/sst-run"]["files"]
    assert {"task.json", "head.safetensors", "README.md", "results.json", "model.safetensors"} <= set(files)
    assert "MANIFEST.json" not in files and b"model-index" in files["README.md"]
    assert main(["predict", "me/sst-run", str(tmp_path / "in.txt"), "--device", "cpu", "--backend", "pytorch"]) == 0
    assert [json.loads(r) for r in capsys.readouterr().out.splitlines()] == [json.loads(r) for r in local.splitlines()]


def test_push_refuses_what_it_cannot_push(hub, tmp_path, capsys):
    from ctxkit.core.hub import push_folder

    assert main(["push", str(tmp_path), "me/x"]) == 2
    assert "not a ctxkit run folder" in capsys.readouterr().err and "me/x" not in hub.repos
    with pytest.raises(UserError, match="is not a Hub repository id"):
        push_folder(tmp_path, "not a repo id")
