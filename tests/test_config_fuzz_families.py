"""Malformed GPT-2, XLNet and Transformer-XL folders get one line (issue 39 item 5, the
families beside BERT's in test_config_fuzz.py): config.json values of the wrong type or
range, sizes that disagree with each other (width and heads) or with the weights
(vocabulary, width, layers) are refused as a UserError naming the file and the field before
a model is built; a property test mutates (or deletes) a field of a real tiny folder and
expects success or a UserError, never another exception."""

import json
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from ctxkit.core.errors import UserError
from ctxkit.models.gpt2.model import GPT2Config, GPT2LMHeadModel, load_gpt2, save_gpt2
from ctxkit.models.transformer_xl.model import TransformerXLConfig, TransformerXLLMHeadModel
from ctxkit.models.transformer_xl.io import load_transformer_xl
from ctxkit.models.xlnet.model import XLNetConfig, XLNetLMHeadModel, load_xlnet, save_xlnet

DELETE = object()  # the mutation that removes the field
VALUES = st.one_of(st.integers(-3, 10**12), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.none(),
                   st.booleans(), st.lists(st.integers(-2, 60), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                   st.just(DELETE))

GPT2_FIELDS = ("n_layer", "n_embd", "n_head", "vocab_size", "n_positions", "n_inner", "resid_pdrop", "embd_pdrop", "attn_pdrop",
               "activation_function", "layer_norm_epsilon", "model_type", "scale_attn_by_inverse_layer_idx",
               "reorder_and_upcast_attn", "add_cross_attention")
XLNET_FIELDS = ("vocab_size", "d_model", "n_layer", "n_head", "d_head", "d_inner", "ff_activation", "attn_type", "dropout",
                "layer_norm_eps", "clamp_len", "mem_len", "bi_data", "same_length", "model_type")
TXL_FIELDS = ("vocab_size", "d_model", "d_embed", "n_head", "d_head", "d_inner", "n_layer", "cutoffs", "div_val", "tie_projs",
              "mem_len", "tgt_len", "clamp_len", "untie_r", "pre_lnorm", "same_length", "attn_type", "sample_softmax", "dropout",
              "dropatt", "layer_norm_epsilon", "tie_word_embeddings", "model_type")


def _write_hf_transformer_xl(folder):
    """A tiny Transformer-XL in transformers' TransfoXLLMHeadModel layout (div_val 1, one
    cutoff, untied r biases), written from a ctxkit model: transformers 5 has no Transformer-XL
    to write one (test_transformer_xl_hf.py checks the layout against transformers 4.57)."""
    torch.manual_seed(0)
    model = TransformerXLLMHeadModel(TransformerXLConfig(vocab_size=40, d_model=16, n_heads=2, d_inner=24, n_layers=2, cutoffs=(20,),
                                                         div_val=1, mem_len=4, tgt_len=4))
    ours = model.state_dict()
    state = {"transformer.word_emb.emb_layers.0.weight": ours["transformer.word_emb.emb_layers.0.weight"]}
    for i in range(2):
        layer = f"transformer.layers.{i}"  # the same prefix in both layouts
        attn = f"{layer}.self_attn"
        state[f"{layer}.dec_attn.qkv_net.weight"] = torch.cat([ours[f"{attn}.{p}_proj.weight"] for p in "qkv"])
        state[f"{layer}.dec_attn.r_net.weight"] = ours[f"{attn}.r_proj.weight"]  # column order: any, for these tests
        state[f"{layer}.dec_attn.o_net.weight"] = ours[f"{attn}.out_proj.weight"]
        state[f"{layer}.dec_attn.r_w_bias"], state[f"{layer}.dec_attn.r_r_bias"] = ours[f"{attn}.u"], ours[f"{attn}.v"]
        for p in ("weight", "bias"):
            state[f"{layer}.dec_attn.layer_norm.{p}"] = ours[f"{layer}.self_attn_res.norm.{p}"]
            state[f"{layer}.pos_ff.CoreNet.0.{p}"] = ours[f"{layer}.ffn.fc1.{p}"]
            state[f"{layer}.pos_ff.CoreNet.3.{p}"] = ours[f"{layer}.ffn.fc2.{p}"]
            state[f"{layer}.pos_ff.layer_norm.{p}"] = ours[f"{layer}.ffn_res.norm.{p}"]
    head = ours["crit.head.weight"]
    state.update({"crit.out_layers.0.weight": torch.cat([head[:20], ours["crit.tail.0.1.weight"]]),
                  "crit.out_layers.0.bias": torch.zeros(40), "crit.cluster_weight": head[20:], "crit.cluster_bias": torch.zeros(1)})
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    config = {"model_type": "transfo-xl", "vocab_size": 40, "d_model": 16, "d_embed": 16, "n_head": 2, "d_head": 8, "d_inner": 24,
              "n_layer": 2, "cutoffs": [20], "div_val": 1, "tie_projs": [False], "mem_len": 4, "tgt_len": 4, "clamp_len": 1000,
              "untie_r": True, "pre_lnorm": False, "same_length": True, "attn_type": 0, "sample_softmax": -1, "dropout": 0.1,
              "dropatt": 0.0, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One tiny HF-format folder per family: ``{name: (folder, loader)}``."""
    root = tmp_path_factory.mktemp("families")
    torch.manual_seed(0)
    save_gpt2(GPT2LMHeadModel(GPT2Config(num_layers=2, hidden_size=32, num_heads=2, vocab_size=50, max_position=16, ffn_size=64)),
              root / "gpt2")
    save_xlnet(XLNetLMHeadModel(XLNetConfig(vocab_size=50, d_model=32, n_heads=2, d_inner=64, n_layers=2)), root / "xlnet")
    return {"gpt2": (root / "gpt2", load_gpt2), "xlnet": (root / "xlnet", load_xlnet),
            "transfo-xl": (_write_hf_transformer_xl(root / "transfo-xl"), load_transformer_xl)}


def _copy(src, dst, **changes):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    for name, value in changes.items():
        if value is DELETE:
            config.pop(name, None)
        else:
            config[name] = value
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_the_tiny_folders_load(folders):
    for folder, load in folders.values():
        load(folder)


@pytest.mark.parametrize("family, field, value, says", [
    ("gpt2", "n_head", 0, "'n_head' is 0; expected a positive integer"),
    ("gpt2", "n_embd", "32", "'n_embd' is '32'; expected an integer"),
    ("gpt2", "n_head", 3, "n_embd 32 is not a multiple of n_head 3"),
    ("gpt2", "n_layer", 10_000_000, "'n_layer' is 10000000: 10000000 layers, but the weights hold 2"),
    ("gpt2", "vocab_size", 10**9, "'vocab_size' is 1000000000, but the weights hold 50"),
    ("gpt2", "n_embd", 2**30, "'n_embd' is 1073741824, but the weights hold 32"),
    ("gpt2", "resid_pdrop", 1.5, "'resid_pdrop' is 1.5; expected a number in [0, 1)"),
    ("gpt2", "activation_function", ["gelu"], "'activation_function' is ['gelu']; expected a string"),
    ("gpt2", "n_embd", DELETE, "no field 'n_embd'"),
    ("xlnet", "d_model", -1, "'d_model' is -1; expected a positive integer"),
    ("xlnet", "n_head", 3, "d_model 32 is not a multiple of n_head 3"),
    ("xlnet", "d_head", 8, "d_head 8 * n_head 2 is not d_model 32"),
    ("xlnet", "n_layer", 10_000_000, "10000000 layers, but the weights hold 2"),
    ("xlnet", "vocab_size", 2**31, "'vocab_size' is 2147483648, but the weights hold 50"),
    ("xlnet", "clamp_len", "none", "'clamp_len' is 'none'; expected an integer"),
    ("xlnet", "mem_len", -5, "'mem_len' is -5; expected an integer >= 0"),
    ("transfo-xl", "n_head", 0, "'n_head' is 0; expected a positive integer"),
    ("transfo-xl", "d_inner", 2**31, "'d_inner' is 2147483648, but the weights hold 24"),
    ("transfo-xl", "n_layer", 10_000_000, "10000000 layers, but the weights hold 2"),
    ("transfo-xl", "vocab_size", 10**9, "'vocab_size' is 1000000000, but the weights hold 40"),
    ("transfo-xl", "cutoffs", [30, 10], "'cutoffs' is [30, 10]; expected increasing integers between 0 and vocab_size 40"),
    ("transfo-xl", "cutoffs", 7, "'cutoffs' is 7; expected a list of integers"),
    ("transfo-xl", "sample_softmax", "yes", "'sample_softmax' is 'yes'; expected an integer"),
    ("transfo-xl", "untie_r", "no", "'untie_r' is 'no'; expected true or false"),
    ("transfo-xl", "layer_norm_epsilon", "1e-5", "'layer_norm_epsilon' is '1e-5'; expected a number"),
])
def test_bad_config_values_are_one_line(folders, tmp_path, family, field, value, says):
    source, load = folders[family]
    folder = _copy(source, tmp_path / "bad", **{field: value})
    with pytest.raises(UserError) as caught:
        load(folder)
    message = str(caught.value)
    assert says in message and "config.json" in message and "\n" not in message, message


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("family, fields", [("gpt2", GPT2_FIELDS), ("xlnet", XLNET_FIELDS), ("transfo-xl", TXL_FIELDS)])
def test_any_config_mutation_loads_or_is_a_user_error(folders, tmp_path_factory, family, fields, data):
    source, load = folders[family]
    changes = data.draw(st.dictionaries(st.sampled_from(fields), VALUES, min_size=1, max_size=2), label="changes")
    folder = _copy(source, tmp_path_factory.mktemp("fuzz") / "m", **changes)
    try:
        load(folder)
    except UserError:
        pass
