"""Small habits of a command line and a model zoo: ``ctxkit --version``, the ``datasets``
spellings of task names, and "did you mean" for a mistyped verb, task or model name."""

import pytest
import torch

from ctxkit.cli import main
from ctxkit.core.errors import UnknownNameError
from ctxkit.core.version import __version__
from ctxkit.tasks import get_task


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"ctxkit {__version__}"


def test_a_mistyped_verb_gets_the_closest(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["finetun", "sst-2"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "unknown verb 'finetun' (did you mean finetune?)" in err and "predict" in err


@pytest.mark.parametrize("alias, name", [("sst2", "sst-2"), ("SST2", "sst-2"), ("stsb", "sts-b"), ("glue/mrpc", "mrpc"),
                                         ("squad_v2", "squad2"), ("conll2003", "conll2003")])
def test_datasets_spellings_of_tasks(alias, name):
    assert get_task(alias).name == get_task(name).name


def test_a_mistyped_task_gets_the_closest(capsys):
    with pytest.raises(UnknownNameError, match=r"unknown task 'sts2' \(did you mean .*sst2.*\); known tasks: sst-2"):
        get_task("sts2")
    assert main(["finetune", "sst-22", "--data", "d", "--out", "o"]) == 2
    assert "did you mean" in capsys.readouterr().err


@pytest.mark.parametrize("typo, suggestion", [("bert_12_768_1", "bert_12_768_12"), ("all_minilm_l6_v3", "all_minilm_l6_v2"),
                                              ("gpt2-mediu", "gpt2-medium")])
def test_a_mistyped_model_gets_the_closest(typo, suggestion, monkeypatch):
    import ctxkit

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing is looked up: the name is not on any list
    with pytest.raises(UnknownNameError, match=rf"unknown model '{typo}' \(did you mean {suggestion}"):
        ctxkit.get_model(typo)


def test_gluonnlp_call_with_its_keywords(tmp_path):
    """The lecture's GluonNLP line: get_model(name, dataset_name=..., pretrained=..., ctx=...,
    use_pooler=..., use_decoder=..., use_classifier=...), with GluonNLP's meaning. The keywords
    mean the same for every BERT preset, so they are checked on the smallest one: the lecture's
    bert_12_768_12 with pretrained=False is ~10 s of random weight initialisation per model on
    one CPU thread, and its name resolves in test_zoo_names.py."""
    import ctxkit
    from ctxkit.core.errors import UserError
    from ctxkit.models.bert.model import BertForPreTraining, BertModel

    class Context:  # what mx.cpu() looks like to ctxkit
        device_type, device_id = "cpu", 0

    model, tokenizer = ctxkit.get_model("bert_2_128_2", pretrained=False, ctx=Context(), use_pooler=False, use_decoder=False,
                                        use_classifier=False, root="~/.mxnet/models")
    assert type(model) is BertModel and model.pooler is None and tokenizer is None
    out = model(torch.tensor([[101, 2023, 102]]))
    assert out.pooler_output is None and out.last_hidden_state.shape == (1, 3, 128)
    heads, _ = ctxkit.get_model("bert_2_128_2", pretrained=False, use_decoder=True, use_classifier=True, ctx="cpu")
    assert type(heads) is BertForPreTraining
    for bad, message in ((dict(use_decoder=True, use_classifier=False), "together"),
                         (dict(use_pooler=False, use_classifier=True, use_decoder=True), "reads the pooler"),
                         (dict(root=str(tmp_path)), "HF_HOME"),
                         (dict(ctx="cuda:1", device="cuda:0"), "two devices")):
        with pytest.raises(UserError, match=message):
            ctxkit.get_model("bert_12_768_12", pretrained=False, **bad)


def test_no_network_is_said_at_once_with_the_offline_advice(tmp_path, monkeypatch):
    """A Hub id not in the cache, HF_HUB_OFFLINE unset, and the Hub unreachable (here: a closed
    port): one clear error within 2 s, no retry storm, naming what to do instead."""
    import socket
    import time

    import ctxkit
    from ctxkit.core.hub import HubNotCachedError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    start = time.perf_counter()
    with pytest.raises(HubNotCachedError, match=r"cannot be reached \(127\.0\.0\.1:\d+: .*\): download it where the Hub is "
                                               r"reachable \(ctxkit download .*HF_HOME.*local model folder; HF_HUB_OFFLINE=1"):
        ctxkit.get_model("distilbert/distilbert-base-uncased")
    assert time.perf_counter() - start < 2.0


def test_list_models_fits_100_columns_and_long_shows_all(capsys):
    assert main(["list-models"]) == 0
    short = capsys.readouterr().out.splitlines()
    assert max(map(len, short)) <= 100 and "--long" in short[-1]
    assert main(["list-models", "--long"]) == 0
    whole = capsys.readouterr().out.splitlines()
    assert max(map(len, whole)) > 100 and len(whole) == len(short) - 2  # the same rows, uncut, without the note


def test_download_of_an_installed_checkpoint_says_so(minilm_dir, capsys):
    import json

    assert main(["download", "all_minilm_l6_v2"]) == 0
    captured = capsys.readouterr()
    assert "is already installed" in captured.err and json.loads(captured.out)["already_installed"] is True


def test_a_run_folder_names_its_model(minilm_dir, tmp_path):
    """get_model (and so embed --model, pipeline-style calls) takes runs/x where the model is
    runs/x/best, as predict, evaluate and serve do."""
    import shutil

    import ctxkit

    run = tmp_path / "runs" / "x"
    shutil.copytree(minilm_dir, run / "best")
    (run / "task.json").write_text("{}", encoding="utf-8")
    model, tokenizer = ctxkit.get_model(str(run))
    direct, _ = ctxkit.get_model(str(run / "best"))
    ids = torch.tensor([tokenizer.encode("a run folder").input_ids])
    with torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, direct(ids).last_hidden_state)
