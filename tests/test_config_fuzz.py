"""Malformed checkpoint folders get one line (issue 39 item 5): config.json values of the
wrong type or range, nested too deeply, or inconsistent with the weights, and shard indexes
of the wrong shape, are refused as a UserError naming the file and field before a model is
built; a property test mutates a real config and expects success or a UserError, never
another exception."""

import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkit.core.errors import UserError
from ctxkit.models.bert.model import load_bert

FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
          "max_position_embeddings", "type_vocab_size", "hidden_dropout_prob", "attention_probs_dropout_prob",
          "hidden_act", "layer_norm_eps", "pad_token_id", "model_type", "position_embedding_type")
VALUES = st.one_of(st.integers(-3, 10**12), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.none(),
                   st.booleans(), st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _copy(src, dst, **changes):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("field, value, says", [
    ("num_attention_heads", 0, "'num_attention_heads' is 0; expected a positive integer"),
    ("hidden_size", -4, "'hidden_size' is -4; expected a positive integer"),
    ("hidden_size", "32", "'hidden_size' is '32'; expected an integer"),
    ("hidden_size", 32.0, "expected an integer"),
    ("hidden_size", None, "expected an integer"),
    ("hidden_act", ["gelu"], "'hidden_act' is ['gelu']; expected a string"),
    ("layer_norm_eps", "1e-12", "expected a number"),
    ("pad_token_id", 10**9, "pad_token_id 1000000000 is outside the vocabulary"),
    ("num_hidden_layers", 10_000_000, "10000000 layers, but the weights hold 2"),
    ("num_attention_heads", 3, "not a multiple of the 3 attention heads"),
])
def test_bad_config_values_are_one_line(tiny_bert_dir, tmp_path, field, value, says):
    folder = _copy(tiny_bert_dir, tmp_path / "bad", **{field: value})
    with pytest.raises(UserError, match=says.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        load_bert(folder)


def test_nested_json_and_bad_indexes(tiny_bert_dir, tmp_path):
    folder = _copy(tiny_bert_dir, tmp_path / "deep")
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="config.json"):
        load_bert(folder)
    for weight_map, says in (([], "'weight_map' must map"), ({"a": 1}, "'weight_map' must map")):
        folder = _copy(tiny_bert_dir, tmp_path / f"index{len(str(weight_map))}")
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        with pytest.raises(UserError, match=says):
            load_bert(folder)
    (folder / "model.safetensors.index.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="malformed shard index"):
        load_bert(folder)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=VALUES)
def test_any_config_mutation_loads_or_is_a_user_error(tiny_bert_dir, tmp_path_factory, field, value):
    folder = _copy(tiny_bert_dir, tmp_path_factory.mktemp("fuzz") / "m", **{field: value})
    try:
        load_bert(folder)
    except UserError:
        pass


@pytest.mark.parametrize("dtype", ["int64", "bool"])
def test_weights_that_are_not_floating_point_are_one_line(tiny_bert_dir, tmp_path, dtype):
    import torch
    from safetensors.torch import load_file, save_file

    folder = _copy(tiny_bert_dir, tmp_path / dtype)
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v.to(getattr(torch, dtype)) for k, v in state.items()}, str(folder / "model.safetensors"))
    with pytest.raises(UserError, match=rf"tensor\(s\) are not floating point where weights are: .*\(torch.{dtype}\)"):
        load_bert(folder)


def test_tokenizer_settings_of_the_wrong_type_are_one_line(tiny_bert_dir, tmp_path):
    from ctxkit.tokenizers import WordPieceTokenizer

    folder = _copy(tiny_bert_dir, tmp_path / "tok")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": "yes"}))
    with pytest.raises(UserError, match=r"tokenizer_config.json: do_lower_case must be true or false, got 'yes'"):
        WordPieceTokenizer.from_dir(folder)
