"""GPT-2: parity with transformers.GPT2LMHeadModel from the same checkpoint (both ways),
strict loading, and the presets' sizes."""

import json

import pytest
import torch

from ctxkit.core.checkpoint import CheckpointError, CheckpointMismatchError
from ctxkit.models.gpt2.model import GPT2_PRESETS, GPT2Config, GPT2LMHeadModel, load_gpt2, save_gpt2
from tolerance import assert_close_to_reference, assert_same_function, float64

transformers = pytest.importorskip("transformers")

TINY = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0)
# Logits went through the embeddings, 2 layers and the final LayerNorm + tied head; the longest
# reduction is the 256-wide FFN (tests/README.md: tolerances from eps, magnitude, depth and k).
LOGITS = dict(depth=4, k=256)


def _assert_same_logits(ours, hf, ids, mask, name):
    """ctxkit and transformers compute the same logits: in float64 to the float64-derived bound,
    and each float32 side within the float32-derived bound of the float64 reference (real
    tokens only). Returns ctxkit's float32 logits."""
    real = mask.bool()
    with torch.no_grad():
        got, expected = ours(ids, attention_mask=mask), hf(input_ids=ids, attention_mask=mask).logits
        got64, expected64 = float64(ours)(ids, attention_mask=mask), float64(hf)(input_ids=ids, attention_mask=mask).logits
    assert got.shape == expected.shape == expected64.shape
    assert_close_to_reference(got64, expected64, mask=real, name=f"{name} float64", **LOGITS)
    assert_same_function(got, expected, expected64, mask=real, name=name, **LOGITS)
    return got, expected64


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (3, 20), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0  # right padding
    mask[2, 7:] = 0
    return ids, mask


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**TINY)).eval()
    folder = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(folder)
    return folder, model


def test_logits_match_transformers(hf_dir):
    folder, hf = hf_dir
    ours = load_gpt2(folder)
    ids, mask = _batch()
    got, expected64 = _assert_same_logits(ours, hf, ids, mask, "logits")
    assert got.shape == (3, 20, 100)
    assert torch.isfinite(got).all()  # padded positions stay finite too
    assert got.std() > 0.1  # not vacuous
    # Unpadded rows need no mask at all.
    with torch.no_grad():
        assert_close_to_reference(ours(ids[:1]), expected64[:1], name="logits without a mask", **LOGITS)


def test_saved_model_loads_in_transformers_with_equal_logits(tmp_path):
    torch.manual_seed(1)
    ours = GPT2LMHeadModel(GPT2Config(num_layers=2, hidden_size=64, num_heads=4, vocab_size=100, max_position=32, ffn_size=256)).eval()
    save_gpt2(ours, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ids, mask = _batch()
    _assert_same_logits(ours, hf, ids, mask, "logits")
    again = load_gpt2(tmp_path)
    for (k, a), b in zip(ours.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k


def test_strict_loading_names_the_problem(hf_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    folder, _ = hf_dir
    state = load_file(folder / "model.safetensors")
    del state["transformer.h.1.mlp.c_fc.bias"]
    state["transformer.h.0.extra.weight"] = torch.zeros(2)
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointMismatchError) as err:
        load_gpt2(tmp_path)
    assert "encoder.layers.1.ffn.fc1.bias" in str(err.value) and "transformer.h.0.extra.weight" in str(err.value)
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    with pytest.raises(CheckpointError, match="model_type 'bert'"):
        load_gpt2(tmp_path)


def test_presets_have_the_published_sizes():
    # 124M / 355M / 774M / 1.558B parameters (the tied output layer counted once).
    expected = {"gpt2_117m": 124_439_808, "gpt2_345m": 354_823_168, "gpt2_774m": 774_030_080, "gpt2_1558m": 1_557_611_200}
    for name, config in GPT2_PRESETS.items():
        if name not in expected:
            continue
        with torch.device("meta"):
            model = GPT2LMHeadModel(config)
        assert sum(p.numel() for p in model.parameters()) == expected[name], name


def test_zoo_builds_gpt2_presets_and_loads_gpt2_folders(tmp_path, capsys):
    from ctxkit.cli import main
    from ctxkit.tokenizers import ByteLevelBPETokenizer
    from ctxkit.zoo import get_model, list_models

    names = {r["name"]: r for r in list_models()}
    assert names["gpt2_117m"]["kind"] == "preset (GPT-2)" and "transformer_base" in names and "rnn_attention_256_512" in names
    model, tok = get_model("gpt2_2_128_2", pretrained=False)
    assert isinstance(model, GPT2LMHeadModel) and tok is None and model.config.num_layers == 2
    tokenizer = ByteLevelBPETokenizer.train(iter(["a small corpus for a small vocabulary"] * 20), vocab_size=300, show_progress=False)
    torch.manual_seed(0)
    save_gpt2(GPT2LMHeadModel(GPT2_PRESETS["gpt2_2_128_2"].replace(vocab_size=300, max_position=64)), tmp_path)
    tokenizer.save(tmp_path)
    loaded, loaded_tok = get_model(str(tmp_path))
    assert isinstance(loaded, GPT2LMHeadModel) and loaded_tok.encode("a small corpus") == tokenizer.encode("a small corpus")
    assert main(["list-models"]) == 0 and "gpt2_1558m" in capsys.readouterr().out
