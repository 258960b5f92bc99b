"""Transformer-XL parity with the reference implementation in transformers.

transformers 5 dropped Transformer-XL; 4.57 is the last release that ships it (under
``transformers.models.deprecated``). It cannot share a process with transformers 5, so
it is installed into its own folder (once, cached) and run in a subprocess
(``tests/helpers/hf_transfo_xl.py``), which writes an HF checkpoint of a random model and
its outputs on two consecutive segments; ctxkit loads that checkpoint and must agree.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ctxkit.checkpoint import CheckpointError
from ctxkit.models.transformer_xl_io import load_transformer_xl
from ctxkit.zoo import get_model

LEGACY = ["transformers==4.57.6", "tokenizers==0.22.1", "huggingface_hub<1.0", "requests", "urllib3", "charset-normalizer", "idna",
          "certifi"]
HELPER = Path(__file__).resolve().parent / "helpers" / "hf_transfo_xl.py"


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


def _reference(legacy: Path, out: Path, div_val: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(legacy), os.environ.get("PYTHONPATH", "")]),
           "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(HELPER), str(out), str(div_val), "1"], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_file(str(out / "reference.safetensors"))


@pytest.mark.parametrize("div_val", [2, 1])
def test_hidden_states_and_log_probs_match_transformers_over_two_segments(legacy_transformers, tmp_path, div_val):
    ref = _reference(legacy_transformers, tmp_path, div_val)
    model = load_transformer_xl(tmp_path)
    zoo_model, tokenizer = get_model(str(tmp_path))  # the zoo recognises the folder too
    assert tokenizer is None and torch.equal(zoo_model.crit.head.weight, model.crit.head.weight)
    assert model.config.same_length and model.config.mem_len == 5
    # transformers starts a text with mem_len zero vectors as memory (ctxkit with none):
    # give ctxkit the same zeros for the first segment, then each side its own memory.
    mems = [torch.zeros(2, 5, model.config.d_model) for _ in range(model.config.n_layers)]
    for s, segment in enumerate(ref["input_ids"].split(7, dim=1)):
        with torch.no_grad():
            hidden, new_mems = model.transformer(segment, mems)
            log_probs = model(segment, mems=mems).log_probs
        torch.testing.assert_close(hidden, ref[f"hidden_{s}"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(log_probs, ref[f"log_probs_{s}"], atol=1e-5, rtol=1e-5)
        assert ref[f"hidden_{s}"].abs().mean() > 0.1 and log_probs.exp().sum(-1).sub(1).abs().max() < 1e-4
        mems = new_mems


def test_non_zero_softmax_biases_are_refused_by_name(legacy_transformers, tmp_path):
    from safetensors.torch import save_file

    _reference(legacy_transformers, tmp_path, 2)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["crit.out_layers.1.bias"] = state["crit.out_layers.1.bias"] + 0.5
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"crit\.out_layers\.1\.bias"):
        load_transformer_xl(tmp_path)
