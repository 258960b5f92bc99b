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
from tolerance import assert_close_to_reference, assert_paths_agree, assert_same_function, float64

transformers = pytest.importorskip("transformers")
# Tolerances follow tests/README.md: each float32 side against a float64 run, bounded by
# growth(depth, k) * eps * max|reference|, with depth = the layers a value went through and
# k = the longest reduction of a layer (the FFN width), never a fixed 1e-5.
MINILM_K = 1536  # all-MiniLM-L6-v2: 6 layers, hidden 384, FFN 1536


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


@pytest.fixture(scope="module")
def minilm64(minilm):
    ours, ref, _ = minilm
    return float64(ours), float64(ref)


def _head(batch, n):
    return {key: value[:n] for key, value in batch.items()}


def _compare(ours_out, ref_out, ours64_out, ref64_out, mask, k, with_pooler=True):
    """ctxkit and transformers compute the same function: in float64 ctxkit is within the
    float64-derived bound of transformers (the strict check, independent of BLAS), and each
    float32 side is within the float32-derived bound of the float64 reference. The float64
    runs may cover the first rows of the batch only (they cost more): the other rows of the
    two float32 runs must then agree within twice the bound (each is within it of the exact
    function). Hidden state i went through i + 1 blocks (the embeddings' LayerNorm counts as
    one), the pooler through one more."""
    outs = [ours_out.hidden_states, ref_out.hidden_states, ours64_out.hidden_states, ref64_out.hidden_states]
    assert len({len(o) for o in outs}) == 1
    if with_pooler:
        outs = [(*o, x.pooler_output) for o, x in zip(outs, (ours_out, ref_out, ours64_out, ref64_out))]
    n = ref64_out.hidden_states[0].size(0)
    for depth, (a, b, a64, b64) in enumerate(zip(*outs), start=1):
        m, name = (mask, f"hidden_states[{depth - 1}]") if a.dim() == 3 else (None, "pooler_output")
        kw = dict(depth=depth, k=k)
        assert_close_to_reference(a64, b64, mask=None if m is None else m[:n], name=f"{name} float64", **kw)
        assert_same_function(a[:n], b[:n], b64, mask=None if m is None else m[:n], name=name, **kw)
        if n < a.size(0):
            assert_paths_agree(a[n:], b[n:], mask=None if m is None else m[n:], name=f"{name} rows past the float64 run", **kw)


def _attention_logit_scale(ref64, hidden_states, mask):
    """Per layer, max |q.k / sqrt(d)| over real keys, from transformers' float64 modules: the
    logits the attention softmax rounds on. For p = softmax(s), |dp_i| = p_i |ds_i - sum_j p_j
    ds_j| <= 2 p_i (1 - p_i) max|ds| <= max|ds| / 2, so a probability's rounding error is
    bounded by that of its logits, whose size is this scale (not max p <= 1)."""
    scales = []
    with torch.no_grad():
        for layer, h in zip(ref64.encoder.layer, hidden_states):
            att = layer.attention.self
            q, k = (f(h).unflatten(-1, (att.num_attention_heads, -1)).transpose(1, 2) for f in (att.query, att.key))
            s = (q @ k.transpose(-1, -2)) * att.scaling
            scales.append(s.masked_fill(~mask[:, None, None, :], 0).abs().max().item())
    return scales


def test_minilm_parity_padded_batch_of_real_sentences(minilm, minilm64, shared_data):
    ours, ref, tok = minilm
    ours64, ref64 = minilm64
    a, b = _pairs(shared_data)
    for batch in (tok(_sentences(shared_data), padding=True, return_tensors="pt"), tok(a, b, padding=True, return_tensors="pt")):
        mask = batch["attention_mask"].bool()
        assert (~mask).any(), "the batch must contain padding"
        head = _head(batch, 4)  # float64 on the first rows (padded ones among them), the rest float32 vs float32
        assert (~mask[:4]).any()
        with torch.no_grad():
            o = ours(batch["input_ids"], batch["attention_mask"], token_type_ids=batch["token_type_ids"], output_hidden_states=True)
            r = ref(**batch, output_hidden_states=True)
            o64 = ours64(head["input_ids"], head["attention_mask"], token_type_ids=head["token_type_ids"], output_hidden_states=True)
            r64 = ref64(**head, output_hidden_states=True)
        assert len(o.hidden_states) == 7
        _compare(o, r, o64, r64, mask, MINILM_K)
        # Not vacuous: the outputs are far from zero and differ between layers.
        assert o.hidden_states[-1][mask].abs().mean() > 0.1
        assert (o.hidden_states[-1] - o.hidden_states[-2])[mask].abs().max() > 0.1


def test_minilm_eager_attention_weights_match_reference(minilm, minilm64, shared_data):
    ours, ref, tok = minilm
    ours64, ref64 = minilm64
    batch = tok(_sentences(shared_data, 6), padding=True, return_tensors="pt")
    args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    with torch.no_grad():
        o = ours(*args, output_attentions=True, output_hidden_states=True)
        r = ref(**batch, output_attentions=True, output_hidden_states=True)
        fast = ours(*args, output_hidden_states=True)
        o64 = ours64(*args, output_attentions=True, output_hidden_states=True)
        r64 = ref64(**batch, output_attentions=True, output_hidden_states=True)
    mask = batch["attention_mask"].bool()
    scales = _attention_logit_scale(ref64, r64.hidden_states, mask)
    assert len(o.attentions) == len(r.attentions) == len(scales) == 6
    for i, (a, b, a64, b64, scale) in enumerate(zip(o.attentions, r.attentions, o64.attentions, r64.attentions, scales)):
        kw = dict(scale=scale, depth=i + 2, k=MINILM_K)  # layer i's logits come from hidden_states[i] (depth i + 1) and one more GEMM
        assert_close_to_reference(a64, b64, name=f"attentions[{i}] float64", **kw)
        assert_same_function(a, b, b64, name=f"attentions[{i}]", **kw)
    for i, (a, b64) in enumerate(zip(fast.hidden_states, r64.hidden_states)):  # the sdpa path computes it too
        assert_close_to_reference(a, b64, mask=mask, depth=i + 1, k=MINILM_K, name=f"sdpa hidden_states[{i}]")
    assert max(a[mask].std().item() for a in o.hidden_states) > 0.1  # not vacuous


def test_padded_equals_unpadded_real_tokens(minilm, shared_data):
    ours, _, tok = minilm
    texts = _sentences(shared_data, 5)
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        padded = ours(batch["input_ids"], batch["attention_mask"], token_type_ids=batch["token_type_ids"]).last_hidden_state
        for i, text in enumerate(texts):
            one = tok(text, return_tensors="pt")
            alone = ours(one["input_ids"], one["attention_mask"], token_type_ids=one["token_type_ids"]).last_hidden_state[0]
            n = alone.size(0)
            # two float32 runs of one function (another GEMM shape): within twice the derived bound
            assert_paths_agree(padded[i, :n], alone, depth=7, k=MINILM_K, name=f"sentence {i} padded vs alone")


def test_packed_sequences_equal_padded_batch_and_reference(minilm, minilm64, shared_data):
    """No compute on padding: the packed path (real tokens only, attention kept within each
    sentence) gives the reference outputs at every real token, on pairs with segments too."""
    from ctxkit.layers import PackedSequences

    ours, ref, tok = minilm
    ours64, ref64 = minilm64
    a, b = _pairs(shared_data, 6)
    for batch in (tok(_sentences(shared_data, 12), padding=True, return_tensors="pt"), tok(a, b, padding=True, return_tensors="pt")):
        mask = batch["attention_mask"].bool()
        packed = PackedSequences(batch["attention_mask"])
        assert packed.total == int(mask.sum()) < mask.numel()
        head = _head(batch, 3)  # float64 on the first rows (padded ones among them)
        assert (~mask[:3]).any()
        with torch.no_grad():
            o = ours(batch["input_ids"], packed, token_type_ids=batch["token_type_ids"], output_hidden_states=True)
            r = ref(**batch, output_hidden_states=True)
            o64 = ours64(head["input_ids"], PackedSequences(head["attention_mask"]), token_type_ids=head["token_type_ids"], output_hidden_states=True)
            r64 = ref64(**head, output_hidden_states=True)
        _compare(o, r, o64, r64, mask, MINILM_K)
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
    model.train()  # attention dropout runs inside the packed kernel (per sequence on a CPU)
    torch.manual_seed(0)
    assert torch.isfinite(model(torch.ones(2, 3, dtype=torch.long), attention_mask=p).last_hidden_state).all()
    attention = model.encoder.layers[0].self_attn
    with pytest.raises(ValueError, match="cu_seqlens_q"):  # keys of another row: not a packed self-attention
        attention(torch.zeros(1, 5, 128), torch.zeros(1, 5, 128), mask=p)


def _hf_random_bert(tmp_path, cls="BertModel"):
    cfg = transformers.BertConfig(
        vocab_size=300, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, max_position_embeddings=64
    )
    torch.manual_seed(1)
    model = getattr(transformers, cls)(cfg).eval()
    model.save_pretrained(tmp_path)
    return model


def _parity(ours, ref, run_ours, run_ref, mask, k, with_pooler=True):
    """Run both models in float32 and (copies) in float64 and check they compute the same
    function (see ``_compare``); returns ctxkit's float32 outputs."""
    with torch.no_grad():
        outs = [run_ours(ours), run_ref(ref), run_ours(float64(ours)), run_ref(float64(ref))]
    _compare(*outs, mask, k, with_pooler)
    return outs[0]


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
    _parity(ours, ref, lambda m: m(ids, mask, token_type_ids=types, output_hidden_states=True),
            lambda m: m(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True), mask.bool(), k=512)
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
    _parity(ours, ref, lambda m: m(ids, attention_mask=mask, output_hidden_states=True),
            lambda m: m(input_ids=ids, attention_mask=mask, output_hidden_states=True), mask.bool(), k=200, with_pooler=False)


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
    _parity(model, ref, lambda m: m(ids, attention_mask=mask, output_hidden_states=True, **kwargs),
            lambda m: m(input_ids=ids, attention_mask=mask, output_hidden_states=True, **kwargs), mask.bool(), k=128,
            with_pooler=family == "bert")


def test_pretraining_heads_parity_and_round_trip(tmp_path):
    ref = _hf_random_bert(tmp_path, "BertForPreTraining")
    ours = load_bert(tmp_path, with_heads=True)
    assert isinstance(ours, BertForPreTraining)
    ids, types, mask = _random_batch()
    with torch.no_grad():
        mlm, nsp = ours(ids, mask, token_type_ids=types)
        r = ref(input_ids=ids, token_type_ids=types, attention_mask=mask)
        mlm64, nsp64 = float64(ours)(ids, mask, token_type_ids=types)
        r64 = float64(ref)(input_ids=ids, token_type_ids=types, attention_mask=mask)
        # 2 layers after the embeddings, then the pooler (NSP) or the MLM transform and decoder
        for name, a, b, a64, b64, depth in (("mlm logits", mlm, r.prediction_logits, mlm64, r64.prediction_logits, 5),
                                            ("nsp logits", nsp, r.seq_relationship_logits, nsp64, r64.seq_relationship_logits, 4)):
            assert_close_to_reference(a64, b64, depth=depth, k=512, name=f"{name} float64")
            assert_same_function(a, b, b64, depth=depth, k=512, name=name)
        positions = torch.tensor([[1, 4], [0, 2], [3, 5]])
        gathered, _ = ours(ids, mask, token_type_ids=types, masked_positions=positions)
        # the MLM head on the gathered rows only (another GEMM shape): the transform and decoder may round differently
        assert_paths_agree(gathered, mlm.gather(1, positions[..., None].expand(-1, -1, mlm.size(-1))), depth=2, k=128,
                           name="gathered mlm logits")
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


def _parameter_count(config) -> int:
    with torch.device("meta"):  # shapes only: no memory, no random initialisation
        return sum(p.numel() for p in BertModel(config).parameters())


def test_presets_have_documented_sizes():
    sizes = {name: _parameter_count(get_preset(name).config) for name in ("bert_2_128_2", "bert_6_384_12")}
    assert 4.3e6 < sizes["bert_2_128_2"] < 4.5e6
    assert 22.5e6 < sizes["bert_6_384_12"] < 22.8e6
    base = get_preset("bert_12_768_12").config
    n_base = 30522 * 768 + 512 * 768 + 2 * 768 + 2 * 768 + 12 * (4 * (768 * 768 + 768) + 2 * (768 * 3072) + 3072 + 768 + 4 * 768) + 768 * 768 + 768
    assert abs(n_base - 109.48e6) < 0.01e6
    assert _parameter_count(base) == n_base
