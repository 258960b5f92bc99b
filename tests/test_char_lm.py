"""Character-level LMs (issue 22.1): the text8 corpus, the character tokenizer, the deep
causal Transformer with Al-Rfou et al.'s auxiliary losses, the LSTM baseline, bits per
character, save/load and the CLI."""

import collections
import json
import math
import zlib

import pytest
import torch
import torch.nn.functional as F

from ctxkit.cli import main
from ctxkit.core.errors import UserError
from ctxkit.models.char_lm.model import CHAR_PRESETS, CharLSTMLM, CharTransformerLM, load_char_lm, save_char_lm
from ctxkit.pretraining.char_corpus import build_char_corpus, split_of, text8_normalize
from ctxkit.pretraining.char_lm import CharLMObjective, bits_per_character
from ctxkit.tokenizers.char import TEXT8_ALPHABET, CharTokenizer

from ctxkit.layers import flex_attention_available
from tolerance import assert_close_to_reference, assert_paths_agree

TINY = CHAR_PRESETS["char_t_tiny"]

# Tiny models: a second thread only adds synchronisation on a shared CPU.
pytestmark = pytest.mark.usefixtures("one_thread")


def test_text8_rules():
    assert text8_normalize("In 1990, Émile's café!") == "in one nine nine zero mile s caf"
    assert text8_normalize("  A--b\n\tC  ") == "a b c"
    assert text8_normalize("2") == "two"


def test_split_rule_is_the_titles_crc_and_about_90_5_5():
    titles = [f"Article {i}" for i in range(20000)]
    counts = collections.Counter(split_of(t) for t in titles)
    for t in titles[:50]:
        bucket = zlib.crc32(t.encode()) % 100
        assert split_of(t) == ("train" if bucket < 90 else "valid" if bucket < 95 else "test")
    # Binomial(20000, p): 5 standard deviations either side.
    for split, p in (("train", 0.9), ("valid", 0.05), ("test", 0.05)):
        sd = math.sqrt(20000 * p * (1 - p))
        assert abs(counts[split] - 20000 * p) < 5 * sd, counts


def test_corpus_from_the_wikipedia_extract(tmp_path, shared_data):
    files = sorted((shared_data / "wikipedia-en-extract" / "AA").glob("wiki_0[01].xz"))
    meta = build_char_corpus(files, tmp_path / "a", show_progress=False)
    text = {s: (tmp_path / "a" / f"{s}.txt").read_text() for s in ("train", "valid", "test")}
    for split, body in text.items():
        assert set(body) <= set(TEXT8_ALPHABET) and "  " not in body and body == body.strip()
        assert meta[split]["characters"] == len(body) > 1000
    assert meta["train"]["characters"] > 10 * meta["valid"]["characters"]
    # The split follows the titles, not the files' order: reversed input, same documents per split.
    build_char_corpus(files[::-1], tmp_path / "b", show_progress=False)
    for split in text:
        again = (tmp_path / "b" / f"{split}.txt").read_text()
        assert sorted(again.split(" ")) == sorted(text[split].split(" "))
    info = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert info["format"] == "text8" and info["sources"] == [f.name for f in files]
    raw = build_char_corpus(files, tmp_path / "c", format="bytes", show_progress=False)
    body = (tmp_path / "c" / "valid.txt").read_text()
    # The same documents, their text kept: capitals, digits and punctuation stay.
    assert all(raw[s]["documents"] == meta[s]["documents"] for s in text)
    assert any(c.isupper() for c in body) and any(c.isdigit() for c in body) and "\n\n" in body


def test_char_tokenizer(tmp_path):
    tok = CharTokenizer()
    assert tok.vocab_size == 27 and tok.encode(" az") == [0, 1, 26]
    assert tok.decode(tok.encode("hello world")) == "hello world"
    with pytest.raises(UserError, match=r"'\\n' at offset 5"):
        tok.encode("hello\nworld")
    with pytest.raises(UserError, match="'B' at offset 1"):
        tok.encode("aBc")
    byte = CharTokenizer(None)
    assert byte.vocab_size == 256 and byte.encode("é") == [0xC3, 0xA9] and byte.decode([0xC3, 0xA9]) == "é"
    for t in (tok, byte):
        assert repr(CharTokenizer.from_dir(t.save(tmp_path / repr(t)))) == repr(t)


def test_transformer_is_causal_and_layers_read_per_layer_positions():
    torch.manual_seed(0)
    model = CharTransformerLM(TINY).eval()
    x = torch.randint(0, 27, (2, 40))
    y = x.clone()
    y[:, 25:] = torch.randint(0, 27, (2, 15))
    a, b = model(x), model(y)
    assert torch.equal(a[:, :25], b[:, :25]) and not torch.equal(a[:, 25:], b[:, 25:])
    # hidden_states of a lower layer equals running the first layers by hand, positions added per layer.
    h = model.embed(x)
    for i in range(2):
        h, _ = model.layers[i](h + model.positions[i, :40], mask=model.mask(40, x.device))
        if i == 0:
            first = model.final_norm(h)
    assert torch.equal(model.hidden_states(x, [0])[0], first)
    with pytest.raises(UserError, match="longer than the model's context 64"):
        model(torch.zeros(1, 65, dtype=torch.long))


def _hand_loss(model, ids, weights, positions):
    """The objective written out: mean of the active layers' next-character losses, plus 0.5 x
    the character-after-next loss of the last layer."""
    inputs, targets = ids[:, :-1], ids[:, 1:]
    hidden = model.hidden_states(inputs, [0, 1])
    ces = [F.cross_entropy(model.head(hidden[i][:, positions]).flatten(0, 1), targets[:, positions].flatten()) for i in (0, 1)]
    loss = sum(w * c for w, c in zip(weights, ces)) / sum(weights)
    h = hidden[1][:, :-1][:, positions]
    after = ids[:, 2:][:, positions] if positions == slice(None) else ids[:, -1:]
    return loss + 0.5 * F.cross_entropy(model.second_head(h).flatten(0, 1), after.flatten())


def test_auxiliary_losses_and_their_schedule():
    torch.manual_seed(0)
    model = CharTransformerLM(TINY).double().eval()  # eval: no dropout, the step counter still only moves in training
    ids = torch.randint(0, 27, (3, 65))
    obj = CharLMObjective(model).double().eval()
    obj.set_schedule(100)
    # Layer 1 of 2 stops after 1/4 of the steps; the last layer never stops.
    assert obj.cutoffs.tolist() == [25, torch.iinfo(torch.long).max]
    assert torch.allclose(obj(ids)["loss"], _hand_loss(model, ids, [1.0, 1.0], slice(None)), rtol=1e-12, atol=0)
    obj.step.fill_(25)
    assert obj.layer_weights().tolist() == [0.0, 1.0]
    assert torch.allclose(obj(ids)["loss"], _hand_loss(model, ids, [0.0, 1.0], slice(None)), rtol=1e-12, atol=0)
    last_only = CharLMObjective(model, aux_positions=False, aux_layers=False).double().eval()
    assert torch.allclose(last_only(ids)["loss"], _hand_loss(model, ids, [0.0, 1.0], slice(-1, None)), rtol=1e-12, atol=0)
    obj.train()
    obj(ids)
    assert int(obj.step) == 26  # the training forward advances the schedule, on the device
    assert "step" in obj.state_dict() and "cutoffs" in obj.state_dict()  # resumed runs continue it


def test_lstm_bpc_is_stateful_across_segments():
    torch.manual_seed(0)
    model = CharLSTMLM(CHAR_PRESETS["char_lstm_tiny"].replace(context=16)).double().eval()
    ids = torch.randint(0, 27, (200,))
    got = bits_per_character(model, ids, batch_size=1, device="cpu")
    logits = model(ids[None, :-1])  # one pass over the whole stream
    nll = F.cross_entropy(logits[0], ids[1:], reduction="sum") / 199
    assert got["characters"] == 199
    assert_close_to_reference(torch.tensor(got["nll"], dtype=torch.float64), nll, dtype=torch.float64, depth=199, k=32)
    assert got["bpc"] == pytest.approx(got["nll"] / math.log(2), rel=1e-12)


def test_transformer_bpc_scores_every_character_once():
    torch.manual_seed(0)
    model = CharTransformerLM(TINY).eval()
    ids = torch.randint(0, 27, (300,))
    out = bits_per_character(model, ids, stride=16, device="cpu")
    assert out["characters"] == 299
    # With stride == context the windows do not overlap: score them by hand.
    flat = bits_per_character(model, ids, stride=64, device="cpu")
    total, n = 0.0, 0
    for b in range(0, 300, 64):
        w = ids[b : b + 64]
        if len(w) < 2:
            continue
        total += F.cross_entropy(model(w[None])[0, :-1].double(), w[1:], reduction="sum").item()
        n += len(w) - 1
    assert flat["characters"] == n
    assert flat["nll"] == pytest.approx(total / n, rel=1e-5)


def test_save_load_round_trip(tmp_path):
    for name in ("char_t_tiny", "char_lstm_tiny"):
        torch.manual_seed(0)
        model = (CharLSTMLM if "lstm" in name else CharTransformerLM)(CHAR_PRESETS[name]).eval()
        back = load_char_lm(save_char_lm(model, tmp_path / name))
        x = torch.randint(0, 27, (2, 30))
        assert torch.equal(model(x), back(x))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(Exception, match="not a character LM"):
        load_char_lm(tmp_path / "bad")


def test_cli_char_corpus_and_training(tmp_path, shared_data, capsys):
    wiki = shared_data / "wikipedia-en-extract" / "AA" / "wiki_00.xz"
    assert main(["char-corpus", str(wiki), "--out", str(tmp_path / "c"), "--no-progress"]) == 0
    capsys.readouterr()
    c = tmp_path / "c"
    args = ["lm-train", "--char", "--preset", "char_t_tiny", "--train", str(c / "train.txt"), "--valid", str(c / "valid.txt"),
            "--test", str(c / "test.txt"), "--out", str(tmp_path / "run"), "--max-steps", "60", "--batch-size", "16",
            "--lr", "3e-3", "--device", "cpu", "--no-progress", "--max-eval-chars", "20000"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    # 60 steps of a 2 x 32 model: beyond the uniform 4.75 bits and the unigram ~4.1 bits of English letters.
    assert summary["valid"]["bpc"] < 3.9 and summary["test"]["bpc"] < 3.9
    assert summary["steps"] == 60 and summary["aux_layers"] and summary["aux_positions"]
    model = load_char_lm(tmp_path / "run" / "best")
    assert isinstance(model, CharTransformerLM) and CharTokenizer.from_dir(tmp_path / "run" / "best").vocab_size == 27
    assert main(["lm-train", "--preset", "char_lstm_tiny", "--quaternion", "--train", str(c / "train.txt"), "--valid",
                 str(c / "valid.txt"), "--out", str(tmp_path / "x")]) == 2
    assert "Transformer options" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["strided", "fixed"])
def test_sparse_char_model_equals_the_dense_mask_of_its_pattern(kind):
    if not flex_attention_available():
        pytest.skip("FlexAttention needs torch >= 2.5")
    torch.manual_seed(0)
    sparse = CharTransformerLM(TINY.replace(attention=kind, sparse_stride=8, sparse_summary=2)).double().eval()
    x = torch.randint(0, 27, (2, 50))
    dense = CharTransformerLM(TINY).double().eval()
    dense.load_state_dict(sparse.state_dict())
    dense.mask = lambda seq, device: sparse.pattern.dense(seq, device)  # the same pattern as a boolean matrix
    assert not sparse.cuda_graph_safe
    assert_paths_agree(sparse(x), dense(x), dtype=torch.float64, depth=2, k=64)


def test_quaternion_char_model_has_a_quarter_of_the_layer_weights():
    real = CharTransformerLM(TINY)
    quat = CharTransformerLM(TINY.replace(quaternion=True))
    # Per layer: 4 projections of 32 x 32 and the FFN's 32 x 64 twice lose 3/4 of their weights.
    weights = 4 * 32 * 32 + 2 * 32 * 64
    assert sum(p.numel() for p in real.parameters()) - sum(p.numel() for p in quat.parameters()) == 2 * weights * 3 // 4
    assert quat(torch.randint(0, 27, (1, 20))).shape == (1, 20, 27)


def test_padding_to_a_multiple_is_cut_off(tmp_path):
    """The CUDA-graph training path pads batches to a multiple of 16 (65 -> 80 columns here);
    the objective scores exactly the block's characters all the same."""
    torch.manual_seed(0)
    model = CharTransformerLM(TINY).eval()
    obj = CharLMObjective(model).eval()
    ids = torch.randint(0, 27, (2, 65))
    padded = torch.cat([ids, torch.zeros(2, 15, dtype=torch.long)], 1)
    assert torch.equal(obj(padded)["loss"], obj(ids)["loss"])
