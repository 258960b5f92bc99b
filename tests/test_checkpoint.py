"""Checkpoint safety: strict loading, clear errors, hashes, atomic writes, the zoo."""

import json
import os
import pickle
import shutil

import pytest
import torch

import ctxkit
from ctxkit import zoo
from ctxkit.core.checkpoint import (
    CheckpointError,
    CheckpointMismatchError,
    atomic_write,
    load_state_dict_strict,
    read_config,
    read_weights,
    save_weights,
    verify_sha256,
)
from ctxkit.models import BertModel, get_preset, load_bert, save_bert

TINY = get_preset("bert_2_128_2").config.replace(vocab_size=100, hidden_size=32, num_heads=2, ffn_size=64, max_position=32)


@pytest.fixture()
def saved(tmp_path):
    model = BertModel(TINY).eval()
    save_bert(model, tmp_path / "ckpt")
    return model, tmp_path / "ckpt"


def test_mismatch_lists_missing_unexpected_and_misshaped(saved):
    _, path = saved
    from safetensors.torch import load_file, save_file

    state = load_file(str(path / "model.safetensors"))
    del state["encoder.layer.1.output.dense.bias"]
    state["encoder.layer.0.attention.self.query.weight"] = torch.zeros(5, 5)
    state["encoder.layer.0.surprise.weight"] = torch.zeros(2)
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError) as err:
        load_bert(path)
    e = err.value
    assert e.missing == ["encoder.layers.1.ffn.fc2.bias"]
    assert e.misshaped == [("encoder.layers.0.self_attn.q_proj.weight", (5, 5), (32, 32))]
    assert e.unexpected == ["<unmapped> encoder.layer.0.surprise.weight"]
    msg = str(e)
    assert "missing keys (1)" in msg and "misshaped key encoder.layers.0.self_attn.q_proj.weight: checkpoint (5, 5) vs model (32, 32)" in msg
    assert str(path) in msg


def test_a_mismatch_of_500_keys_is_one_line_and_twenty_entries():
    # Issue 44 item 7: a checkpoint of another architecture used to print every key, on two lines
    # thousands of characters long; now one line of counts and at most 20 indented keys.
    module = torch.nn.ModuleList(torch.nn.Linear(1, 1) for _ in range(250))  # 500 keys
    with pytest.raises(CheckpointMismatchError) as err:
        load_state_dict_strict(module, {}, source="other.safetensors")
    lines = str(err.value).splitlines()
    assert lines[0] == "checkpoint other.safetensors does not match the model: missing keys (500)"
    assert lines[1:3] == ["  missing key 0.weight", "  missing key 0.bias"]
    assert len(lines) == 1 + 20 + 1 and all(line.startswith("  ") for line in lines[1:])
    assert lines[-1] == "  ... and 480 more"
    assert len(err.value.missing) == 500  # the attribute keeps them all

    # Missing and unexpected keys at once (a prefix): both kinds are shown, 10 each.
    state = {f"bert.{k}": v for k, v in module.state_dict().items()}
    with pytest.raises(CheckpointMismatchError) as err:
        load_state_dict_strict(module, state, source="prefixed")
    lines = str(err.value).splitlines()
    assert lines[0].endswith("does not match the model: missing keys (500), unexpected keys (500)")
    assert [line.split(" key ")[0] for line in lines[1:-1]] == ["  missing"] * 10 + ["  unexpected"] * 10
    assert lines[-1] == "  ... and 980 more"


@pytest.mark.parametrize("where", ["absolute", "parent"])
def test_a_shard_index_may_not_point_outside_its_folder(saved, tmp_path, where):
    # Issue 44 item 4: the weight_map of model.safetensors.index.json named files anywhere (an
    # absolute path, or ../), and loading read them. Valid weights wait outside the folder here.
    from safetensors import safe_open

    _, path = saved
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(path / "model.safetensors", outside / "model.safetensors")
    with safe_open(str(outside / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    shard = str(outside / "model.safetensors") if where == "absolute" else "../elsewhere/model.safetensors"
    index = path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {k: shard for k in keys}}))
    with pytest.raises(CheckpointError) as err:
        load_bert(path)
    msg = str(err.value)
    assert msg == (f"{index}: shard {shard!r} is outside the checkpoint folder; a shard index may name only files "
                   "inside its own folder")

    # The same shard inside the folder loads.
    shutil.move(outside / "model.safetensors", path / "model-00001-of-00001.safetensors")
    index.write_text(json.dumps({"metadata": {}, "weight_map": {k: "model-00001-of-00001.safetensors" for k in keys}}))
    assert isinstance(load_bert(path), BertModel)


def test_truncated_safetensors_is_a_clear_error(saved):
    _, path = saved
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="model.safetensors: could not read weights, the file is corrupted or truncated"):
        load_bert(path)


def test_bin_checkpoint_loads_with_weights_only_and_refuses_code(saved, tmp_path):
    model, path = saved
    from safetensors.torch import load_file

    state = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    torch.save(state, path / "pytorch_model.bin")
    again = load_bert(path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    with open(path / "pytorch_model.bin", "wb") as f:
        pickle.dump({"x": Evil()}, f)
    with pytest.raises(CheckpointError, match="pytorch_model.bin: refused for safety: the file holds pickled objects") as err:
        read_weights(path)
    assert not (tmp_path / "pwned").exists()
    # A refusal is not called corruption, and torch's advice to retry unsafely is not relayed.
    assert "corrupt" not in str(err.value) and "weights_only set to False" not in str(err.value)
    assert "safetensors" in str(err.value)
    (path / "pytorch_model.bin").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(CheckpointError, match="pytorch_model.bin: could not read weights, the file is corrupted or truncated"):
        read_weights(path)


def test_missing_weights_and_malformed_config(tmp_path):
    (tmp_path / "config.json").write_text('{\n  "model_type": "bert",\n  "hidden_size": 32,,\n}')
    with pytest.raises(CheckpointError, match=r"config.json:3:\d+: malformed JSON"):
        read_config(tmp_path)
    with pytest.raises(CheckpointError, match="no weight file"):
        read_weights(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match="model_type 'gpt2'"):
        load_bert(tmp_path)
    with pytest.raises(CheckpointError, match="no config.json"):
        read_config(tmp_path / "nowhere")


def test_sha256_mismatch_lists_files(saved):
    _, path = saved
    with pytest.raises(CheckpointError) as err:
        verify_sha256(path, {"model.safetensors": "0" * 64, "vocab.txt": "1" * 64})
    assert "model.safetensors: sha256" in str(err.value) and "vocab.txt: missing" in str(err.value)


def test_crash_mid_save_keeps_last_good_file(saved):
    model, path = saved
    weights = path / "model.safetensors"
    before = weights.read_bytes()

    def crash(tmp):
        with open(tmp, "wb") as f:
            f.write(b"half a file")
        raise KeyboardInterrupt  # the process dies mid-write

    with pytest.raises(KeyboardInterrupt):
        atomic_write(weights, crash)
    assert weights.read_bytes() == before
    assert [p.name for p in path.iterdir() if p.name.startswith(".")] == []  # no temp litter
    load_bert(path)
    save_weights({"a": torch.ones(2)}, path / "other.safetensors")
    assert torch.equal(read_weights_file(path / "other.safetensors")["a"], torch.ones(2))


def read_weights_file(path):
    from safetensors.torch import load_file

    return load_file(str(path))


def test_get_model_packaged_checkpoint_by_preset_and_by_name(minilm_dir):
    model, tok = ctxkit.get_model("bert_6_384_12", checkpoint="all_minilm_l6_v2")
    assert isinstance(model, BertModel) and not model.training
    assert model.config.num_layers == 6 and tok.vocab_size == 30522
    ids = tok.encode("the river bank").input_ids
    assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id and len(ids) == 5
    model2, _ = ctxkit.get_model("all_minilm_l6_v2")
    assert torch.equal(model.pooler.dense.weight, model2.pooler.dense.weight)
    with pytest.raises(ValueError, match="num_layers: preset has 12, checkpoint has 6"):
        ctxkit.get_model("bert_12_768_12", checkpoint="all_minilm_l6_v2")


def test_get_model_random_and_unknown_names():
    with pytest.raises(ValueError, match="pretrained=False"):
        ctxkit.get_model("bert_2_128_2")  # a preset gives random weights only when asked
    model, tok = ctxkit.get_model("bert_2_128_2", pretrained=False)
    assert tok is None and model.config.hidden_size == 128
    with pytest.raises(KeyError, match="unknown model 'bert_3_3_3'"):
        ctxkit.get_model("bert_3_3_3")
    with pytest.raises(CheckpointError, match="unknown checkpoint 'nope'"):
        ctxkit.get_model("bert_2_128_2", checkpoint="nope")


def test_registered_checkpoint_is_cached_hashed_and_verified(tmp_path, monkeypatch, minilm_dir):
    monkeypatch.setenv("CTXKIT_HOME", str(tmp_path / "home"))
    src = tmp_path / "src"
    shutil.copytree(minilm_dir, src)
    entry = zoo.register_checkpoint("my_minilm", src)
    assert entry.preset == "bert_6_384_12"
    assert entry.sha256["model.safetensors"] == zoo.CHECKPOINTS["all_minilm_l6_v2"].sha256["model.safetensors"]
    names = {row["name"]: row for row in ctxkit.list_models()}
    assert names["my_minilm"]["available"] and names["all_minilm_l6_v2"]["available"]
    model, tok = ctxkit.get_model("my_minilm")
    assert model.config.hidden_size == 384
    cached = tmp_path / "home" / "checkpoints" / "my_minilm" / "vocab.txt"
    cached.write_text(cached.read_text() + "extra\n")
    zoo._verified.clear()
    with pytest.raises(CheckpointError, match="vocab.txt: sha256"):
        ctxkit.get_model("my_minilm")


def test_not_installed_checkpoint_says_how_to_install(monkeypatch):
    entry = zoo.CHECKPOINTS["all_minilm_l6_v2"]
    monkeypatch.setitem(zoo.CHECKPOINTS, "all_minilm_l6_v2", entry.__class__(**{**entry.__dict__, "locate": lambda: None}))
    with pytest.raises(CheckpointError, match=r"not installed; fetch it with: ctxkit download all_minilm_l6_v2 "):
        ctxkit.get_model("all_minilm_l6_v2")
