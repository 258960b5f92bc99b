"""Transformer-XL parity with the reference implementation in transformers.

transformers 5 dropped Transformer-XL; 4.57 is the last release that ships it (under
``transformers.models.deprecated``). It cannot share a process with transformers 5, so
it is installed into its own folder (once, cached) and run in a subprocess
(``tests/helpers/hf_transfo_xl.py``), which writes an HF checkpoint of a random model and
its outputs on two consecutive segments, in float32 and from a float64 copy; ctxkit loads
that checkpoint and must agree (tests/README.md: in float64 to the float64-derived bound, and
each float32 side within the float32-derived bound of transformers' float64 outputs).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ctxkit.core.checkpoint import CheckpointError
from ctxkit.models.transformer_xl.io import load_transformer_xl
from ctxkit.zoo import get_model
from tolerance import assert_close_to_reference, assert_same_function

LEGACY = ["transformers==4.57.6", "tokenizers==0.22.1", "huggingface_hub<1.0", "requests", "urllib3", "charset-normalizer", "idna",
          "certifi"]
HELPER = Path(__file__).resolve().parent / "helpers" / "hf_transfo_xl.py"
# The helper's model: 3 layers whose longest reduction is the 64-wide FFN; hidden states went
# through the embeddings and those layers (the memories too), log-probabilities one more.
HIDDEN, LOG_PROBS = dict(depth=4, k=64), dict(depth=5, k=64)


def _exact_position_table(n: int, d: int) -> torch.Tensor:
    """The sinusoid table in float64, unrounded. Both implementations round theirs to float32
    (transformers its frequencies, ctxkit the table), differently, by ~6e-8: in float32 runs
    that is within the bound, but the float64 runs take the exact table (the helper sets
    transformers' frequencies to the exact ones likewise)."""
    angles = torch.arange(n, dtype=torch.float64)[:, None] / torch.pow(10000.0, torch.arange(0, d, 2, dtype=torch.float64) / d)
    table = torch.zeros(n, d, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = angles.sin(), angles.cos()
    return table


def _load_float64(folder: Path, out: Path):
    """ctxkit's loader run in float64: on a float64 copy of the checkpoint, with float64 the
    default dtype. The loader folds the head projection into the softmax matrix; run on the
    float32 model that product is rounded to float32 (~1e-9 on the log-probabilities, within
    the float32 bound but far outside the float64 one), so the float64 leg folds it exactly."""
    out.mkdir()
    shutil.copy(folder / "config.json", out / "config.json")
    save_file({k: v.double() for k, v in load_file(str(folder / "model.safetensors")).items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = load_transformer_xl(out)
    finally:
        torch.set_default_dtype(before)
    assert model.crit.head.weight.dtype == torch.float64
    model.transformer.pos_table = _exact_position_table(64, model.config.d_model)
    return model


@pytest.fixture(scope="session")
def legacy_transformers() -> Path:
    """A folder holding transformers 4.57.6 (installed with pip --target on first use)."""
    root = Path(os.environ.get("CTXKIT_TEST_CACHE", Path.home() / ".cache" / "ctxkit-tests")) / "transformers-4.57.6"
    if not (root / ".complete").exists():
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                               "--upgrade", "--target", str(root), *LEGACY], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            pytest.skip(f"could not install transformers 4.57.6 for the Transformer-XL reference: {proc.stderr[-500:]}")
        (root / ".complete").write_text("ok\n")
    return root


@pytest.fixture(scope="module")
def references(legacy_transformers, tmp_path_factory) -> dict:
    """The helper's checkpoints and reference outputs for ``div_val`` 2 and 1, written by one
    process: starting Python, torch and transformers 4.57 costs more than both tiny models, and
    the helper seeds each model itself, so a folder is the same whichever test asked first."""
    root = tmp_path_factory.mktemp("transfo_xl_reference")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(legacy_transformers), os.environ.get("PYTHONPATH", "")]),
           "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "OMP_NUM_THREADS": "1"}
    folders = {div_val: root / f"div_val{div_val}" for div_val in (2, 1)}
    argv = [a for div_val, folder in folders.items() for a in (str(folder), str(div_val), "1")]
    proc = subprocess.run([sys.executable, str(HELPER), *argv], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folders


def _reference(references: dict, out: Path, div_val: int) -> dict:
    """A copy of the reference folder for ``div_val`` in ``out`` (a test may change its copy)."""
    shutil.copytree(references[div_val], out, dirs_exist_ok=True)
    return load_file(str(out / "reference.safetensors"))


@pytest.mark.parametrize("div_val", [2, 1])
def test_hidden_states_and_log_probs_match_transformers_over_two_segments(references, tmp_path, div_val):
    ref = _reference(references, tmp_path, div_val)
    model = load_transformer_xl(tmp_path)
    zoo_model, tokenizer = get_model(str(tmp_path))  # the zoo recognises the folder too
    assert tokenizer is None and torch.equal(zoo_model.crit.head.weight, model.crit.head.weight)
    assert model.config.same_length and model.config.mem_len == 5
    # transformers starts a text with mem_len zero vectors as memory (ctxkit with none):
    # give ctxkit the same zeros for the first segment, then each side its own memory.
    model64 = _load_float64(tmp_path, tmp_path / "float64")
    mems = [torch.zeros(2, 5, model.config.d_model) for _ in range(model.config.n_layers)]
    mems64 = [m.double() for m in mems]
    for s, segment in enumerate(ref["input_ids"].split(7, dim=1)):
        with torch.no_grad():
            hidden, new_mems = model.transformer(segment, mems)
            log_probs = model(segment, mems).log_probs  # transformers' positional order, as the helper calls it
            hidden64, new_mems64 = model64.transformer(segment, mems64)
            # TransformerXLLMHeadModel.forward casts the hidden states to float32 for its softmax
            # (meant for bf16 autocast), which a float64 copy cannot take: apply the same
            # adaptive softmax module to the float64 hidden states directly.
            log_probs64 = model64.crit.log_prob(hidden64.reshape(-1, hidden64.size(-1))).view(*hidden64.shape[:2], -1)
        for name, ours, ours64, bound in (("hidden", hidden, hidden64, HIDDEN), ("log_probs", log_probs, log_probs64, LOG_PROBS)):
            theirs, theirs64 = ref[f"{name}_{s}"], ref[f"{name}64_{s}"]
            assert theirs64.dtype == torch.float64
            assert_close_to_reference(ours64, theirs64, name=f"segment {s} {name} float64", **bound)
            assert_same_function(ours, theirs, theirs64, name=f"segment {s} {name}", **bound)
        # probabilities sum to one: a log-probability's error is its probability's relative error
        assert_close_to_reference(log_probs.exp().sum(-1), torch.ones(2, 7, dtype=torch.float64), scale=log_probs.abs().max().item(),
                                  name=f"segment {s} sum of probabilities", **LOG_PROBS)
        assert ref[f"hidden_{s}"].abs().mean() > 0.1
        mems, mems64 = new_mems, new_mems64


def test_positional_order_is_transformers(references, tmp_path):
    """ctxkit's Transformer-XL takes by position what transformers 4.57's does, in its order
    (issue 38: a line written for transformers means the same here)."""
    import inspect
    import json

    from ctxkit.models.transformer_xl.model import TransformerXLLMHeadModel, TransformerXLModel

    _reference(references, tmp_path, 1)
    theirs = json.loads((tmp_path / "signatures.json").read_text())
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for ours, name in ((TransformerXLModel, "TransfoXLModel"), (TransformerXLLMHeadModel, "TransfoXLLMHeadModel")):
        mine = [p.name for p in inspect.signature(ours.forward).parameters.values() if p.kind in kinds][1:]
        assert mine == ["input_ids", "mems"] == theirs[name][:2], (mine, theirs[name])


def test_non_zero_softmax_biases_are_refused_by_name(references, tmp_path):
    from safetensors.torch import save_file

    _reference(references, tmp_path, 2)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["crit.out_layers.1.bias"] = state["crit.out_layers.1.bias"] + 0.5
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"crit\.out_layers\.1\.bias"):
        load_transformer_xl(tmp_path)


def test_loaded_by_hub_id_from_the_hf_cache(references, tmp_path, monkeypatch):
    """``get_model("transfo-xl-wt103")`` reads the Hugging Face cache (offline here): the same
    model as the folder the parity test above checks against transformers."""
    from test_zoo_names import put_in_cache

    _reference(references, tmp_path / "ckpt", 1)
    cache = tmp_path / "hf"
    put_in_cache(cache, "transfo-xl/transfo-xl-wt103", tmp_path / "ckpt")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = get_model("transfo-xl-wt103")
    expected = load_transformer_xl(tmp_path / "ckpt").state_dict()
    assert tokenizer is None and list(model.state_dict()) == list(expected)
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
