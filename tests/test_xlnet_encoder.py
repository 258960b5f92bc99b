"""XLNet behind ctxkit's task heads: outputs, padding, and a fine-tuning run that learns."""

import json

import pytest
import torch

from ctxkit.zoo.presets import XLNET_PRESETS
from ctxkit.models.xlnet.model import XLNetModel
from ctxkit.models.xlnet.encoder import XLNetEncoder
from ctxkit.tasks import get_task
from ctxkit.training import TrainConfig, Trainer, predict
from tolerance import assert_paths_agree

pytestmark = pytest.mark.usefixtures("one_thread")


def _encoder(dropout=0.0, cls_last=True, vocab_size=40):
    torch.manual_seed(0)
    config = XLNET_PRESETS["xlnet_12_768_12"].replace(vocab_size=vocab_size, d_model=32, n_heads=4, d_inner=64, n_layers=2,
                                                      dropout=dropout)
    return XLNetEncoder(XLNetModel(config), cls_last=cls_last)


def test_summary_is_the_last_real_token_and_padding_changes_nothing():
    enc = _encoder(cls_last=False).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        out = enc(ids, mask)
        alone = enc(ids[1:, :3], mask[1:, :3])
    assert out.last_hidden_state.shape == (2, 5, 32) and out.pooler_output.shape == (2, 32)
    # the same function, run at other shapes (tests/README.md): 2 layers of a 64-wide FFN, the pooler one more
    assert_paths_agree(out.last_hidden_state[1, :3], alone.last_hidden_state[0], depth=2, k=64, name="padded vs alone")
    assert_paths_agree(out.pooler_output[1], alone.pooler_output[0], depth=3, k=64, name="pooler padded vs alone")
    expected = torch.tanh(enc.pooler(out.last_hidden_state[1, 2]))
    assert_paths_agree(out.pooler_output[1], expected, depth=1, k=32, name="pooler of the last real token")


def test_sentence_classification_with_a_task_head_learns(tmp_path):
    """SST-2's task model (ctxkit's head) on XLNet learns "does token 7 occur?" from data."""
    g = torch.Generator().manual_seed(1)
    feats = []
    for i in range(192):
        n = int(torch.randint(4, 12, (1,), generator=g))
        ids = torch.randint(8, 40, (n,), generator=g).tolist()
        label = i % 2
        if label:
            ids[int(torch.randint(0, n, (1,), generator=g))] = 7
        feats.append({"input_ids": ids, "token_type_ids": [0] * n, "attention_mask": [1] * n, "labels": label})
    model = get_task("sst-2").build_model(_encoder(dropout=0.1))
    config = TrainConfig(epochs=6, batch_size=16, lr=2e-3, device="cpu", progress=False, seed=0)
    Trainer(model, feats, config, tmp_path).train()
    logits = predict(model, feats, batch_size=64, device="cpu")
    accuracy = sum(int(l.argmax() == f["labels"]) for l, f in zip(logits, feats)) / len(feats)
    assert accuracy >= 0.95


def test_bert_layout_is_run_in_xlnet_layout_and_mapped_back():
    """[CLS] A [SEP] B [SEP] (types 0 0 0 1 1) runs as A <sep> B <sep> <cls> (types 0 0 1 1 2),
    exactly as pretraining lays it out, and the states come back in the input's positions."""
    enc = _encoder().eval()
    CLS, SEP = 2, 3
    ids = torch.tensor([[CLS, 10, 11, 12, SEP, 13, 14, SEP], [CLS, 20, 21, SEP, 22, SEP, 0, 0]])
    types = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 0, 0]])
    mask = torch.tensor([[1] * 8, [1] * 6 + [0, 0]])
    with torch.no_grad():
        out = enc(ids, mask, token_type_ids=types)
        for row, n in ((0, 8), (1, 6)):
            x_ids = torch.cat([ids[row, 1:n], ids[row, :1]])[None]
            x_types = torch.cat([types[row, 1:n], torch.tensor([2])])[None]
            direct = enc.body(x_ids, token_type_ids=x_types).content[0]
            assert_paths_agree(out.last_hidden_state[row, 1:n], direct[:-1], depth=2, k=64, name=f"row {row} tokens")
            assert_paths_agree(out.last_hidden_state[row, 0], direct[-1], depth=2, k=64, name=f"row {row} <cls> state at [CLS]")
            assert_paths_agree(out.pooler_output[row], torch.tanh(enc.pooler(direct[-1])), depth=3, k=64, name=f"row {row} pooler")
    # The type of <cls> enters through the relative segment term (small at this init, but there).
    with torch.no_grad():
        plain = enc.body(torch.cat([ids[0, 1:], ids[0, :1]])[None], token_type_ids=torch.cat([types[0, 1:], types[0, :1]])[None])
    assert (plain.content[0, -1] - out.last_hidden_state[0, 0]).abs().max() > 1e-6


def test_save_and_load_keep_body_pooler_and_lm_bias(tmp_path):
    from ctxkit.zoo.encoders import encoder_family, load_encoder, save_encoder
    from ctxkit.models.xlnet.model import load_xlnet

    enc = _encoder()
    with torch.no_grad():
        enc.pooler.weight.normal_()
        enc.lm_bias.normal_()
    save_encoder(enc.eval(), tmp_path / "m")
    assert encoder_family(tmp_path / "m") == "xlnet"
    back = load_encoder(tmp_path / "m")
    ids, mask = torch.tensor([[2, 9, 8, 3]]), torch.ones(1, 4, dtype=torch.long)
    with torch.no_grad():
        a, b = enc(ids, mask), back(ids, mask)
    torch.testing.assert_close(b.last_hidden_state, a.last_hidden_state, rtol=0, atol=0)
    torch.testing.assert_close(b.pooler_output, a.pooler_output, rtol=0, atol=0)
    torch.testing.assert_close(load_xlnet(tmp_path / "m").lm_bias, enc.lm_bias, rtol=0, atol=0)
    # A pretrained folder (no summary.safetensors) loads with a fresh pooler.
    (tmp_path / "m" / "summary.safetensors").unlink()
    fresh = load_encoder(tmp_path / "m")
    torch.testing.assert_close(fresh.body.word_embedding.weight, enc.body.word_embedding.weight, rtol=0, atol=0)
    assert not torch.equal(fresh.pooler.weight, enc.pooler.weight)


def test_finetune_selects_an_xlnet_folder(shared_data, minilm_dir, tmp_path):
    """`ctxkit finetune --model XLNET_FOLDER` for a sentence task and for SQuAD: the run folder
    reloads as XLNet and re-scores to the same numbers (mechanics; learning is tested above)."""
    from ctxkit.cli import main
    from ctxkit.tasks import finetune, load_run
    from ctxkit.tokenizers import WordPieceTokenizer

    tok = WordPieceTokenizer.from_dir(minilm_dir)
    _encoder(vocab_size=tok.vocab_size).save(tmp_path / "xlnet", tok)
    assert main(["finetune", "sst-2", "--model", str(tmp_path / "xlnet"), "--data", str(shared_data / "glue" / "SST-2"),
                 "--out", str(tmp_path / "sst2"), "--epochs", "1", "--batch-size", "16", "--lr", "1e-3", "--device", "cpu",
                 "--limit-train", "96", "--limit-eval", "48", "--no-progress"]) == 0
    summary = json.loads((tmp_path / "sst2" / "results.json").read_text())
    sst2, model, sst2_tok, _ = load_run(tmp_path / "sst2", device="cpu")
    assert isinstance(model.encoder, XLNetEncoder)
    again, _ = sst2.evaluate(model, sst2_tok, sst2.load(shared_data / "glue" / "SST-2", "dev")[:48], device="cpu")
    assert round(again["accuracy"], 4) == summary["results"]["dev"]["accuracy"]  # results.json keeps 4 decimals
    # Deployment verbs take an XLNet run too: ONNX export (checked against PyTorch) and int8.
    assert main(["export", str(tmp_path / "sst2"), "--onnx", str(tmp_path / "m.onnx")]) == 0
    assert main(["quantize", str(tmp_path / "sst2"), "--out", str(tmp_path / "q8")]) == 0
    _, q8, _, _ = load_run(tmp_path / "q8", device="cpu")
    int8, _ = sst2.evaluate(q8, sst2_tok, sst2.load(shared_data / "glue" / "SST-2", "dev")[:48], device="cpu")
    assert abs(int8["accuracy"] - again["accuracy"]) <= 100 * 3 / 48  # a tiny model: at most 3 answers flip

    task = get_task("squad", max_seq_len=96, doc_stride=48)
    result = finetune(task, str(tmp_path / "xlnet"), shared_data / "squad_v1.1", tmp_path / "squad",
                      TrainConfig(epochs=1, batch_size=8, lr=1e-3, device="cpu", progress=False),
                      limit_train=24, limit_eval=12)
    metrics = result["results"]["dev"]  # the held-out articles of the article split
    assert 0 <= metrics["f1"] <= 100 and metrics["exact_match"] <= metrics["f1"]
    _, qa_model, qa_tok, _ = load_run(tmp_path / "squad", device="cpu")
    examples = task.load(shared_data / "squad_v1.1", "dev")[:12]
    rescored, preds = task.evaluate(qa_model, qa_tok, examples, device="cpu")
    assert round(rescored["f1"], 4) == metrics["f1"]  # results.json keeps 4 decimals
    assert all(p.text == e.context[p.start_char:p.end_char] for e in examples for p in [preds[e.qid]])
