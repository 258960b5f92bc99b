"""BERT and DistilBERT: numerical parity with transformers, round trips, invariances."""

import csv

import pytest
import torch

from ctxkit.models import (
    BertForPreTraining,
    BertModel,
    get_preset,
    load_bert,
    save_bert,
)

transformers = pytest.importorskip("transformers")
TOL = 1e-5


def _sentences(shared_data, n=24):
    with open(shared_data / "glue" / "SST-2" / "dev.tsv", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return [r[0] for r in rows[:n]]


def _pairs(shared_data, n=8):
    with open(shared_data / "glue" / "MRPC" / "dev.tsv", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return [r[3] for r in rows[:n]], [r[4] for r in rows[:n]]


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    ours = load_bert(minilm_dir)
    ref = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    tok = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    return ours, ref, tok


def _compare(ours_out, ref_out, mask, with_pooler=True):
    assert len(ours_out.hidden_states) == len(ref_out.hidden_states)
    worst = 0.0
    for a, b in zip(ours_out.hidden_states, ref_out.hidden_states):
        worst = max(worst, (a - b)[mask].abs().max().item())
    if with_pooler:
        worst = max(worst, (ours_out.pooler_output - ref_out.pooler_output).abs().max().item())
    return worst


def test_minilm_parity_padded_batch_of_real_sentences(minilm, shared_data):
    ours, ref, tok = minilm
    a, b = _pairs(shared_data)
    for batch in (tok(_sentences(shared_data), padding=True, return_tensors="pt"), tok(a, b, padding=True, return_tensors="pt")):
        mask = batch["attention_mask"].bool()
        assert (~mask).any(), "the batch must contain padding"
        with torch.no_grad():
            o = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], output_hidden_states=True)
            r = ref(**batch, output_hidden_states=True)
        assert len(o.hidden_states) == 7
        assert _compare(o, r, mask) <= TOL
        # Not vacuous: the outputs are far from zero and differ between layers.
        assert o.hidden_states[-1][mask].abs().mean() > 0.1
        assert (o.hidden_states[-1] - o.hidden_states[-2])[mask].abs().max() > 0.1


def test_minilm_eager_attention_weights_match_reference(minilm, shared_data):
    ours, ref, tok = minilm
    batch = tok(_sentences(shared_data, 6), padding=True, return_tensors="pt")
    with torch.no_grad():
        o = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], output_attentions=True, output_hidden_states=True)
        r = ref(**batch, output_attentions=True, output_hidden_states=True)
        fast = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], output_hidden_states=True)
    for a, b in zip(o.attentions, r.attentions):
        assert (a - b).abs().max().item() <= TOL
    mask = batch["attention_mask"].bool()
    for a, b in zip(o.hidden_states, fast.hidden_states):  # eager path == sdpa path
        assert (a - b)[mask].abs().max().item() <= TOL


def test_padded_equals_unpadded_real_tokens(minilm, shared_data):
    ours, _, tok = minilm
    texts = _sentences(shared_data, 5)
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        padded = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).last_hidden_state
        for i, text in enumerate(texts):
            one = tok(text, return_tensors="pt")
            alone = ours(one["input_ids"], one["token_type_ids"], one["attention_mask"]).last_hidden_state[0]
            n = alone.size(0)
            assert (padded[i, :n] - alone).abs().max().item() <= TOL


def test_packed_sequences_equal_padded_batch_and_reference(minilm, shared_data):
    """No compute on padding: the packed path (real tokens only, attention kept within each
    sentence) gives the reference outputs at every real token, on pairs with segments too."""
    from ctxkit.layers import PackedSequences

    ours, ref, tok = minilm
    a, b = _pairs(shared_data, 6)
    for batch in (tok(_sentences(shared_data, 12), padding=True, return_tensors="pt"), tok(a, b, padding=True, return_tensors="pt")):
        mask = batch["attention_mask"].bool()
        packed = PackedSequences(batch["attention_mask"])
        assert packed.total == int(mask.sum()) < mask.numel()
        with torch.no_grad():
            o = ours(batch["input_ids"], batch["token_type_ids"], packed, output_hidden_states=True)
            r = ref(**batch, output_hidden_states=True)
        assert _compare(o, r, mask) <= TOL
        assert o.last_hidden_state[~mask].abs().max() == 0  # padding rows come back as zeros
        assert o.last_hidden_state[mask].abs().mean() > 0.1


def test_packed_sequences_reject_left_padding_and_unsupported_options():
    from ctxkit.layers import PackedSequences

    with pytest.raises(ValueError, match="right-padded"):
        PackedSequences(torch.tensor([[0, 1, 1], [1, 1, 1]]))
    p = PackedSequences(torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert p.lengths == [2, 3] and p.cu_seqlens.tolist() == [0, 2, 5] and p.positions().tolist() == [[0, 1, 0, 1, 2]]
    x = torch.arange(6.0).view(2, 3, 1)
    assert p.unpack(p.pack(x)).squeeze(-1).tolist() == [[0.0, 1.0, 0.0], [3.0, 4.0, 5.0]]
    model = BertModel(get_preset("bert_2_128_2").config.replace(vocab_size=50)).eval()
    with pytest.raises(ValueError, match="output_attentions"):
        model(torch.ones(2, 3, dtype=torch.long), attention_mask=p, output_attentions=True)
    model.train()
    with pytest.raises(ValueError, match="attention dropout"):
        model(torch.ones(2, 3, dtype=torch.long), attention_mask=p)


def _hf_random_bert(tmp_path, cls="BertModel"):
    cfg = transformers.BertConfig(
        vocab_size=300, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, max_position_embeddings=64
    )
    torch.manual_seed(1)
    model = getattr(transformers, cls)(cfg).eval()
    model.save_pretrained(tmp_path)
    return model


def _random_batch(vocab=300, seed=2):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (3, 20), generator=g)
    types = torch.zeros_like(ids)
    types[:, 10:] = 1
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0
    mask[2, 6:] = 0
    return ids, types, mask


def test_random_bert_2_128_2_parity_and_preset_check(tmp_path):
    ref = _hf_random_bert(tmp_path)
    ours = load_bert(tmp_path, config=get_preset("bert_2_128_2").config)
    ids, types, mask = _random_batch()
    with torch.no_grad():
        o = ours(ids, types, mask, output_hidden_states=True)
        r = ref(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
    assert _compare(o, r, mask.bool()) <= TOL
    assert ours.config.vocab_size == 300 and ours.config.max_position == 64  # taken from the checkpoint
    with pytest.raises(ValueError) as err:
        load_bert(tmp_path, config=get_preset("bert_12_768_12").config)
    assert "num_layers: preset has 12, checkpoint has 2" in str(err.value)
    assert "hidden_size: preset has 768, checkpoint has 128" in str(err.value)


def test_random_distilbert_parity(tmp_path):
    cfg = transformers.DistilBertConfig(vocab_size=300, dim=96, n_layers=2, n_heads=4, hidden_dim=200, max_position_embeddings=64)
    torch.manual_seed(3)
    ref = transformers.DistilBertModel(cfg).eval()
    ref.save_pretrained(tmp_path)
    ours = load_bert(tmp_path)
    assert ours.pooler is None and ours.embeddings.token_type_embeddings is None
    ids, _, mask = _random_batch()
    with torch.no_grad():
        o = ours(ids, attention_mask=mask, output_hidden_states=True)
        r = ref(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert _compare(o, r, mask.bool(), with_pooler=False) <= TOL


def test_distilbert_preset_loads_hf_distilbert_checkpoint(tmp_path):
    cfg = transformers.DistilBertConfig(vocab_size=120)  # distilbert-base architecture
    transformers.DistilBertModel(cfg).save_pretrained(tmp_path)
    model = load_bert(tmp_path, config=get_preset("distilbert_6_768_12").config)
    assert model.config.family == "distilbert" and len(model.encoder.layers) == 6


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_save_load_round_trip_is_exact_and_readable_by_transformers(tmp_path, family):
    preset = "bert_2_128_2" if family == "bert" else "distilbert_6_768_12"
    config = get_preset(preset).config.replace(vocab_size=200, num_layers=2, hidden_size=64, num_heads=2, ffn_size=128)
    model = BertModel(config).eval()
    save_bert(model, tmp_path)
    again = load_bert(tmp_path)
    for (k, a), (k2, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    ids, types, mask = _random_batch(vocab=200)
    kwargs = {"token_type_ids": types} if family == "bert" else {}
    ref = transformers.AutoModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        o = model(ids, attention_mask=mask, output_hidden_states=True, **kwargs)
        r = ref(input_ids=ids, attention_mask=mask, output_hidden_states=True, **kwargs)
    assert _compare(o, r, mask.bool(), with_pooler=family == "bert") <= TOL


def test_pretraining_heads_parity_and_round_trip(tmp_path):
    ref = _hf_random_bert(tmp_path, "BertForPreTraining")
    ours = load_bert(tmp_path, with_heads=True)
    assert isinstance(ours, BertForPreTraining)
    ids, types, mask = _random_batch()
    with torch.no_grad():
        mlm, nsp = ours(ids, types, mask)
        r = ref(input_ids=ids, token_type_ids=types, attention_mask=mask)
        assert (mlm - r.prediction_logits).abs().max().item() <= TOL
        assert (nsp - r.seq_relationship_logits).abs().max().item() <= TOL
        positions = torch.tensor([[1, 4], [0, 2], [3, 5]])
        gathered, _ = ours(ids, types, mask, masked_positions=positions)
        assert torch.allclose(gathered, mlm.gather(1, positions[..., None].expand(-1, -1, mlm.size(-1))), atol=1e-6)
    # Tied: the MLM projection is the input embedding itself.
    assert ours.mlm.bias.shape == (300,)
    save_bert(ours, tmp_path / "again")
    back = load_bert(tmp_path / "again", with_heads=True)
    for a, b in zip(ours.state_dict().values(), back.state_dict().values()):
        assert torch.equal(a, b)
    encoder_only = load_bert(tmp_path)  # heads are reported and skipped for the encoder
    assert torch.equal(encoder_only.embeddings.word_embeddings.weight, ours.bert.embeddings.word_embeddings.weight)


def test_too_long_input_is_an_explicit_error():
    model = BertModel(get_preset("bert_2_128_2").config.replace(max_position=16)).eval()
    with pytest.raises(ValueError, match="17 tokens but this model has 16 positions"):
        model(torch.ones(1, 17, dtype=torch.long))


def test_presets_have_documented_sizes():
    sizes = {name: sum(p.numel() for p in BertModel(get_preset(name).config).parameters()) for name in ("bert_2_128_2", "bert_6_384_12")}
    assert 4.3e6 < sizes["bert_2_128_2"] < 4.5e6
    assert 22.5e6 < sizes["bert_6_384_12"] < 22.8e6
    base = get_preset("bert_12_768_12").config
    n_base = 30522 * 768 + 512 * 768 + 2 * 768 + 2 * 768 + 12 * (4 * (768 * 768 + 768) + 2 * (768 * 3072) + 3072 + 768 + 4 * 768) + 768 * 768 + 768
    assert abs(n_base - 109.48e6) < 0.01e6
    assert sum(p.numel() for p in BertModel(base).parameters()) == n_base
