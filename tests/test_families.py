"""The family registry (ctxkit.zoo.families): one record per family, round trips, exclusive
detection, list-models generated from it, common config names."""

import dataclasses

import numpy as np
import pytest
import torch

from ctxkit import zoo
from ctxkit.cli import main
from ctxkit.core.errors import UnknownNameError, UserError
from ctxkit.zoo import families
from ctxkit.models.bert.model import BertConfig
from ctxkit.models.char_lm.model import CHAR_PRESETS
from ctxkit.models.common import Preset
from ctxkit.models.elmo.model import ElmoConfig
from ctxkit.zoo.families import FAMILIES, Family, family_of, find_family, get_family
from ctxkit.models.gpt2.model import GPT2Config
from ctxkit.models.seq2seq.model import RNNSeq2SeqConfig, Seq2SeqConfig
from ctxkit.models.static.vectors import WordVectors
from ctxkit.models.static.io import StaticVectorsConfig
from ctxkit.models.transformer_xl.model import TransformerXLConfig
from ctxkit.models.xlnet.model import XLNetConfig


TINY = {
    "bert": BertConfig(num_layers=1, hidden_size=16, num_heads=2, ffn_size=32, vocab_size=40, max_position=16),
    "gpt2": GPT2Config(num_layers=1, hidden_size=16, num_heads=2, ffn_size=32, vocab_size=40, max_position=16),
    "seq2seq": Seq2SeqConfig(1, 1, 16, 2, 32, vocab_size=40, max_position=16),
    "rnn_seq2seq": RNNSeq2SeqConfig(embed_size=8, hidden_size=8, attention_size=8, vocab_size=40),
    "elmo": ElmoConfig(filters=((1, 4), (2, 4)), n_highway=1, char_embed_dim=4, cell_size=16, projection_dim=8),
    "static": StaticVectorsConfig(dim=4),
    "transformer_xl": TransformerXLConfig(vocab_size=40, d_model=16, n_heads=2, d_inner=32, n_layers=1, mem_len=4, tgt_len=4,
                                          cutoffs=()),
    "xlnet": XLNetConfig(vocab_size=40, d_model=16, n_heads=2, d_inner=32, n_layers=1),
    "char_transformer": CHAR_PRESETS["char_t_tiny"].replace(quaternion=True),
    "char_lstm": CHAR_PRESETS["char_lstm_tiny"],
}
EXPECTED = {"bert", "gpt2", "seq2seq", "rnn_seq2seq", "elmo", "static", "transformer_xl", "xlnet", "char_transformer", "char_lstm"}


def _state(model):
    if isinstance(model, WordVectors):
        return {"words": model.words, "vectors": torch.from_numpy(model.vectors)}
    return model.state_dict()


def test_every_family_is_registered_once_with_described_presets():
    assert set(FAMILIES) == EXPECTED and len(FAMILIES) == len(EXPECTED)
    seen = set()
    for name, family in FAMILIES.items():
        assert family.name == name and get_family(name) is family and family.description
        assert len(family.presets) >= 1
        for preset_name, preset in family.presets.items():
            assert isinstance(preset, Preset) and preset.name == preset_name and preset.description.strip()
            assert "\n" not in preset.description and isinstance(preset.config, family.config_class)
            assert preset_name not in seen  # one name, one family
            seen.add(preset_name)
        assert families.preset_family(next(iter(family.presets))) is family
    with pytest.raises(UnknownNameError, match="known: bert, gpt2"):
        get_family("no_such_family")


WORDS = [f"w{i}" for i in range(40)]  # a word-level Transformer-XL's vocabulary is part of the model


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_build_save_detect_load_round_trip(name, tmp_path):
    family = FAMILIES[name]
    torch.manual_seed(0)
    model = family.build(TINY[name])
    assert family_of(model) is family
    if name == "static":
        assert model.dim == 4 and len(model) == 0
        model = WordVectors(["a", "b", "c"], np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32))
    else:
        with torch.no_grad():  # every tensor random, so a mixed-up tensor cannot go unnoticed
            for p in model.parameters():
                p.normal_()
            if name == "elmo":  # the padding character's embedding is zero by construction (bilm-tf stores no row for it)
                model.char_cnn.char_embedding.weight[0].zero_()
    out = family.save(model, tmp_path / name, WORDS) if name == "transformer_xl" else family.save(model, tmp_path / name)
    detected = [f.name for f in FAMILIES.values() if f.detect(out)]
    assert detected == [name]  # exclusive
    assert family_of(out) is family and family_of(str(out)) is family
    loaded, tokenizer = family.load(out)
    assert tokenizer == (WORDS if name == "transformer_xl" else None) and family_of(loaded) is family
    before, after = _state(model), _state(loaded)
    assert list(before) == list(after)
    for key in before:
        if name == "elmo" and key.endswith("state_linearity.bias"):
            # bilm-tf stores the LSTM bias with the forget gate's +1.0 folded in (tests/README.md:
            # a bias shifted by 1.0 and back, two roundings of size |value| + 1).
            bound = 2 * torch.finfo(torch.float32).eps * (before[key].abs() + 1.0)
            assert ((before[key] - after[key]).abs() <= bound).all(), key
        elif isinstance(before[key], torch.Tensor):
            assert torch.equal(before[key], after[key]), key
        else:
            assert before[key] == after[key], key


def test_transformer_xl_folders_ctxkit_and_earlier(tmp_path):
    """ctxkit's own Transformer-XL folders (train-transformer-xl's final/) go through the family;
    saving needs the word list; final/ folders of earlier versions (no model_type) still load."""
    import json

    family = FAMILIES["transformer_xl"]
    model = family.build(TINY["transformer_xl"])
    with pytest.raises(UserError, match="needs its vocabulary"):
        family.save(model, tmp_path / "x")
    out = family.save(model, tmp_path / "x", WORDS)
    meta = json.loads((out / "config.json").read_text())
    assert meta["model_type"] == "ctxkit-transformer-xl" and meta["kind"] == "xl"
    del meta["model_type"]  # the layout written before the family had a save
    (out / "config.json").write_text(json.dumps(meta))
    assert family_of(out) is family
    loaded, words = family.load(out)
    assert words == WORDS and all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


def test_detection_is_exclusive_and_unknown_folders_are_reported(tmp_path):
    (tmp_path / "hf_gpt2").mkdir()
    (tmp_path / "hf_gpt2" / "config.json").write_text('{"model_type": "gpt2"}')
    (tmp_path / "hf_txl").mkdir()
    (tmp_path / "hf_txl" / "config.json").write_text('{"model_type": "transfo-xl"}')
    (tmp_path / "vectors.vec").write_text("1 2\na 0.5 0.5\n")
    for folder, name in (("hf_gpt2", "gpt2"), ("hf_txl", "transformer_xl"), ("vectors.vec", "static")):
        assert [f.name for f in FAMILIES.values() if f.detect(tmp_path / folder)] == [name]
    (tmp_path / "empty").mkdir()
    assert find_family(tmp_path / "empty") is None and find_family(tmp_path / "missing") is None
    with pytest.raises(UserError, match="no model of a known family"):
        family_of(tmp_path / "empty")
    with pytest.raises(UserError, match="a object is no model"):
        family_of(object())


def test_list_models_is_generated_from_the_registry(monkeypatch, capsys):
    rows = {r["name"]: r for r in zoo.list_models()}
    for family in FAMILIES.values():
        for preset in family.presets.values():
            assert rows[preset.name]["kind"] == family.list_kind and rows[preset.name]["description"] == preset.description
    fake = Family(name="fake", description="a family added in a test", list_kind="preset (fake)", config_class=dict,
                  presets={"fake_1_2_3": Preset("fake_1_2_3", {}, "a fake preset, one line")}, build=lambda c: None,
                  load=lambda folder: (None, None), save=None, detect=lambda folder: False)
    monkeypatch.setitem(FAMILIES, "fake", fake)  # the one registry dict, however a module imported it
    assert main(["list-models", "--long"]) == 0
    out = capsys.readouterr().out.split("CHECKPOINTS:")[0]  # the presets' table comes first
    lines = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    assert "preset (fake)" in lines["fake_1_2_3"] and lines["fake_1_2_3"].endswith("a fake preset, one line")
    for family in FAMILIES.values():
        for preset in family.presets.values():
            assert lines[preset.name].endswith(preset.description)


def test_zoo_builds_every_familys_presets():
    for name in ("gpt2_2_128_2", "transformer_3_256_8", "rnn_attention_256_512", "xlnet_4_256_4", "word2vec_cbow_100"):
        model, tok = zoo.get_model(name, pretrained=False)
        assert family_of(model) is families.preset_family(name) and tok is None


def test_common_names_agree_with_the_stored_fields():
    for family in FAMILIES.values():
        for preset in family.presets.values():
            c = preset.config
            fields = {f.name for f in dataclasses.fields(c)}
            assert "hidden_size" in fields or hasattr(type(c), "hidden_size"), family.name
            for common, stored in (("hidden_size", "d_model"), ("num_layers", "n_layers"), ("num_heads", "n_heads"),
                                   ("ffn_size", "d_inner"), ("hidden_size", "dim")):
                if stored in fields:
                    assert getattr(c, common) == getattr(c, stored), (family.name, common)
                    assert common not in fields  # a view, not a second stored field
            if family.name == "elmo":
                assert c.hidden_size == 2 * c.projection_dim == c.output_dim
    xl = TINY["xlnet"]
    assert (xl.hidden_size, xl.num_layers, xl.num_heads, xl.ffn_size, xl.vocab_size) == (16, 1, 2, 32, 40)
    assert "hidden_size" not in dataclasses.asdict(xl)  # checkpoint config formats unchanged
    with pytest.raises(dataclasses.FrozenInstanceError):
        xl.hidden_size = 3
