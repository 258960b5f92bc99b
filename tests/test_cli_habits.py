"""Small habits of a command line and a model zoo: ``ctxkit --version``, the ``datasets``
spellings of task names, and "did you mean" for a mistyped verb, task or model name."""

import pytest

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
