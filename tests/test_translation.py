"""Translation pipeline on real Multi30k pairs (a slice, a few CPU steps): reader errors,
joint BPE with special tokens, training with BLEU per epoch, saved run, CLI with sacreBLEU."""

import json

import pytest
import torch

from ctxkit.tasks.translation import bleu, length_cap, load_translator, read_parallel, translate
from tolerance import assert_close_to_reference


@pytest.fixture(scope="module")
def slice_files(shared_data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("m30k")
    for split, n in (("train", 600), ("val", 40)):
        for lang in ("de", "en"):
            lines = (shared_data / "multi30k" / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (folder / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_reader_checks_alignment(slice_files, tmp_path):
    pairs = read_parallel(slice_files / "val.de", slice_files / "val.en")
    assert len(pairs) == 40 and all(s and t for s, t in pairs)
    (tmp_path / "short.en").write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has 40 lines but .*short.en has 2"):
        read_parallel(slice_files / "val.de", tmp_path / "short.en")
    (tmp_path / "a.de").write_text("eins\n\n", encoding="utf-8")
    (tmp_path / "a.en").write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"a.de:2: empty line"):
        read_parallel(tmp_path / "a.de", tmp_path / "a.en")
    assert bleu(["a cat sat on the mat ."], ["a cat sat on the mat ."]) == pytest.approx(100.0)


def test_length_cap_is_the_sentences_own():
    # 2 x the length rounded up to 8, + 10; never past the model's positions, never below 1
    assert [length_cap(n, 256) for n in (1, 8, 9, 16, 17)] == [26, 26, 42, 42, 58]
    assert length_cap(200, 256) == 255 and length_cap(5, 2) == 1


# The pipeline test's model: two layers a side (the cached decoder keeps one state per layer),
# half the width of the smallest shipped preset (transformer_3_256_8): what is checked is the
# pipeline and that a translation is the sentence's own, not what a wider model learns in 19
# steps; most of the test is step-by-step decoding, whose cost grows with the layers.
SMALL_PRESET = ("transformer_2_128_4", {"num_encoder_layers": 2, "num_decoder_layers": 2, "hidden_size": 128, "num_heads": 4,
                                        "ffn_size": 512})


def test_train_translate_and_cli(slice_files, tmp_path, capsys, monkeypatch):
    from ctxkit.cli import main
    from ctxkit.models.seq2seq.model import SEQ2SEQ_PRESETS

    name, shape = SMALL_PRESET
    monkeypatch.setitem(SEQ2SEQ_PRESETS, name, SEQ2SEQ_PRESETS["transformer_3_256_8"].replace(**shape))
    rc = main(["translate-train", "--train-src", str(slice_files / "train.de"), "--train-tgt", str(slice_files / "train.en"),
               "--valid-src", str(slice_files / "val.de"), "--valid-tgt", str(slice_files / "val.en"), "--out", str(tmp_path / "run"),
               "--preset", name, "--vocab-size", "800", "--epochs", "1", "--batch-size", "32", "--device", "cpu",
               "--no-progress", "--max-length", "48"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["train_pairs"] == 600 and summary["best_epoch"] == 0 and summary["valid_bleu"] is not None
    model, tok = load_translator(tmp_path / "run")
    assert [tok.token_to_id(t) for t in ("<pad>", "<s>", "</s>")] == [0, 1, 2] and tok.vocab_size == 800
    assert (model.config.num_decoder_layers, model.config.hidden_size) == (2, 128)  # the preset asked for
    sources = [s for s, _ in read_parallel(slice_files / "val.de", slice_files / "val.en")][:5]
    greedy = translate(model, tok, sources, num_beams=1, device="cpu")
    assert len(greedy) == 5 and all(isinstance(h, str) for h in greedy)
    # A translation is the sentence's own: alone, in a batch of 5 (above) or of 40 (the CLI below).
    assert [translate(model, tok, [s], num_beams=1, device="cpu")[0] for s in sources] == greedy
    beams = translate(model, tok, sources, num_beams=2, device="cpu")
    assert [translate(model, tok, [s], num_beams=2, device="cpu")[0] for s in sources] == beams
    # The hard case: an untrained model never ends a sentence, so every output runs to its cap.
    torch.manual_seed(0)
    untrained = type(model)(model.config).eval()
    rambling = translate(untrained, tok, sources, num_beams=1, device="cpu")
    assert [translate(untrained, tok, [s], num_beams=1, device="cpu")[0] for s in sources] == rambling
    rc = main(["translate", str(tmp_path / "run"), str(slice_files / "val.de"), "--ref", str(slice_files / "val.en"), "--beams", "1",
               "--device", "cpu"])
    assert rc == 0
    captured = capsys.readouterr()
    hyps = captured.out.splitlines()
    assert len(hyps) == 40 and hyps[:5] == greedy
    refs = (slice_files / "val.en").read_text(encoding="utf-8").splitlines()
    reported = json.loads(captured.err.strip().splitlines()[-1])["bleu"]
    assert reported == pytest.approx(round(bleu(hyps, refs), 2))
    assert reported == pytest.approx(round(summary["valid_bleu"], 2))  # the same greedy decoding as the epoch evaluation
    # The alignment heatmap: rows are distributions over the source tokens.
    from ctxkit.tasks.translation import alignment

    weights, src_tokens, tgt_tokens = alignment(model, tok, sources[0], greedy[0], device="cpu")
    assert weights.shape == (len(tgt_tokens), len(src_tokens)) and src_tokens[-1] == "</s>"
    # a softmax sums to one up to its normalisation's rounding over the source tokens (tests/README.md)
    assert_close_to_reference(weights.sum(-1), torch.ones(len(tgt_tokens), dtype=torch.float64), scale=1.0, depth=2, k=len(src_tokens),
                              name="alignment rows sum to one")
    assert "".join(src_tokens[:-1]) == sources[0]  # byte-level pieces concatenate back to the sentence
    rc = main(["translate", str(tmp_path / "run"), str(slice_files / "val.de"), "--beams", "2", "--device", "cpu",
               "--heatmap", str(tmp_path / "align.png")])
    assert rc == 0 and (tmp_path / "align.png").stat().st_size > 5000


def test_rnn_baseline_through_the_same_pipeline(slice_files, tmp_path):
    from ctxkit.models.seq2seq.model import RNNSeq2Seq
    from ctxkit.tasks.translation import train_translation
    from ctxkit.training import TrainConfig

    config = TrainConfig(epochs=1, batch_size=32, lr=3e-3, device="cpu", progress=False, schedule="inverse_sqrt", warmup_ratio=0.1)
    summary = train_translation((slice_files / "train.de", slice_files / "train.en"), (slice_files / "val.de", slice_files / "val.en"),
                                tmp_path / "rnn", config, preset="rnn_attention_256_512", vocab_size=600, max_length=48,
                                hidden_size=64, embed_size=32, attention_size=64)
    assert summary["best_epoch"] == 0 and summary["valid_bleu"] >= 0
    model, tok = load_translator(tmp_path / "rnn")
    assert isinstance(model, RNNSeq2Seq) and model.config.hidden_size == 64
    assert len(translate(model, tok, ["Ein Hund läuft."], num_beams=2, device="cpu")) == 1
