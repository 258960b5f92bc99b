"""XLNet: parity with transformers.XLNetModel / XLNetLMHeadModel (content and two-stream),
checkpoints both ways with strict keys, permutation masks, causality and preset sizes."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from ctxkit.core.checkpoint import CheckpointMismatchError
from ctxkit.zoo.presets import XLNET_PRESETS, XLNetConfig
from ctxkit.models.xlnet.model import (
    XLNetLMHeadModel,
    XLNetModel,
    load_xlnet,
    sample_permutation_masks,
    save_xlnet,
)
from tolerance import assert_close_to_reference, assert_paths_agree, assert_same_function, cast_like, float64, to64

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=100, d_model=64, n_layer=2, n_head=4, d_inner=128)
# tests/README.md: tolerances from eps, the magnitude, the depth (layers a value went through)
# and the longest reduction k (the 128-wide FFN); hidden states after 2 layers, logits one more.
HIDDEN, LOGITS = dict(depth=2, k=128), dict(depth=3, k=128)


def _hf64(hf):
    """transformers' XLNet in float64. Both implementations build the sinusoid table in float32
    (as the checkpoints expect) and cast it; transformers' two-stream attention omits that
    cast (its content stream has it), so add it here."""
    model = float64(hf)
    body = getattr(model, "transformer", model)
    table = body.relative_positional_encoding
    body.relative_positional_encoding = lambda *args, **kw: table(*args, **kw).double()
    return model


def _assert_same_function(ours, hf, run_ours, run_hf, name, **bound):
    """ctxkit and transformers compute the same function: in float64 to the float64-derived
    bound, and each float32 side within the float32-derived bound of the float64 reference."""
    with torch.no_grad():
        got, expected = run_ours(ours), run_hf(hf)
        got64, expected64 = run_ours(float64(ours)), run_hf(_hf64(hf))
    assert got.shape == expected.shape == expected64.shape
    assert_close_to_reference(got64, expected64, name=f"{name} float64", **bound)
    assert_same_function(got, expected, expected64, name=name, **bound)
    assert got.std() > 0.1  # not vacuous
    return got


def _perturb(model, seed=1):
    """Random values in every parameter (LayerNorms and biases included) for a stronger check."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # right padding
    mask[2, :3] = 0  # left padding
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    types[2, 10:] = 2  # the CLS segment of XLNet's inputs
    return ids, mask, types


@pytest.fixture(scope="module")
def hf_lm(tmp_path_factory):
    torch.manual_seed(0)
    model = _perturb(transformers.XLNetLMHeadModel(transformers.XLNetConfig(**TINY))).eval()
    folder = tmp_path_factory.mktemp("xlnet_lm")
    model.save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def hf_body(tmp_path_factory):
    torch.manual_seed(1)
    model = _perturb(transformers.XLNetModel(transformers.XLNetConfig(**TINY)), seed=2).eval()
    folder = tmp_path_factory.mktemp("xlnet_body")
    model.save_pretrained(folder)
    return folder, model


def test_content_stream_matches_transformers(hf_body):
    folder, hf = hf_body
    ours = load_xlnet(folder)
    ids, mask, types = _batch()
    with torch.no_grad():
        assert ours.transformer(ids, token_type_ids=types, attention_mask=mask).query is None
    _assert_same_function(ours, hf, lambda m: m.transformer(ids, token_type_ids=types, attention_mask=mask).content,
                          lambda m: m(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state, "content", **HIDDEN)
    # no masks at all, no segments
    _assert_same_function(ours, hf, lambda m: m.transformer(ids).content, lambda m: m(input_ids=ids).last_hidden_state,
                          "content without masks", **HIDDEN)


def test_memory_matches_transformers(hf_body):
    folder, hf = hf_body
    ours = load_xlnet(folder)
    ids, _, types = _batch()

    def run_hf(m):
        first = m(input_ids=ids[:, :5], use_mems=True)
        return m(input_ids=ids[:, 5:], token_type_ids=types[:, 5:], mems=first.mems, use_mems=True).last_hidden_state

    def run_ours(m):
        return m.transformer(ids[:, 5:], token_type_ids=types[:, 5:], mems=m.transformer(ids[:, :5]).mems).content

    _assert_same_function(ours, hf, run_ours, run_hf, "content after memory", depth=4, k=128)  # memory: 2 more layers upstream


def test_two_stream_logits_match_transformers(hf_lm):
    folder, hf = hf_lm
    ours = load_xlnet(folder)
    ids, mask, types = _batch()
    masks = sample_permutation_masks(ids, 3, attention_mask=mask, generator=torch.Generator().manual_seed(3))
    kw = dict(token_type_ids=types, attention_mask=mask, perm_mask=masks.perm_mask, target_mapping=masks.target_mapping)
    got = _assert_same_function(ours, hf, lambda m: m(ids, **cast_like(kw, m)), lambda m: m(input_ids=ids, **cast_like(kw, m)).logits,
                                "query-stream logits", **LOGITS)
    assert got.shape == (3, 3, 100)
    # content-stream logits too (no target mapping)
    _assert_same_function(ours, hf, lambda m: m(ids, mask, token_type_ids=types),
                          lambda m: m(input_ids=ids, attention_mask=mask, token_type_ids=types).logits, "content-stream logits", **LOGITS)


def test_save_then_transformers_loads_it(tmp_path):
    torch.manual_seed(5)
    ours = XLNetLMHeadModel(XLNetConfig(vocab_size=100, d_model=64, n_heads=4, d_inner=128, n_layers=2)).eval()
    _perturb(ours, seed=7)
    save_xlnet(ours, tmp_path)
    hf = transformers.XLNetLMHeadModel.from_pretrained(tmp_path).eval()
    ids, mask, types = _batch()
    masks = sample_permutation_masks(ids, 2, attention_mask=mask, generator=torch.Generator().manual_seed(4))
    kw = dict(token_type_ids=types, attention_mask=mask, perm_mask=masks.perm_mask, target_mapping=masks.target_mapping)
    _assert_same_function(ours, hf, lambda m: m(ids, **cast_like(kw, m)), lambda m: m(input_ids=ids, **cast_like(kw, m)).logits, "logits",
                          **LOGITS)
    again = load_xlnet(tmp_path)
    for (k, a), (_, b) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k


def test_mismatching_checkpoint_lists_keys(tmp_path, hf_lm):
    folder, _ = hf_lm
    state = load_file(str(folder / "model.safetensors"))
    del state["transformer.layer.1.rel_attn.seg_embed"]
    state["transformer.layer.0.rel_attn.extra"] = torch.zeros(3)
    state["transformer.layer.0.ff.layer_1.weight"] = torch.zeros(5, 64)
    state["transformer.layer.1.rel_attn.q"] = torch.zeros(32, 4, 16)
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(CheckpointMismatchError) as err:
        load_xlnet(tmp_path)
    msg = str(err.value)
    assert "transformer.layers.1.attn.seg_embed" in msg
    assert "transformer.layer.0.rel_attn.extra" in msg
    assert "transformer.layers.0.ffn.fc1.weight" in msg
    assert "transformer.layers.1.attn.q_proj.weight" in msg


def _tiny_model(seed=0):
    torch.manual_seed(seed)
    return _perturb(XLNetModel(XLNetConfig(vocab_size=100, d_model=32, n_heads=4, d_inner=64, n_layers=2)), seed).eval()


def test_permutation_masks_hide_own_and_later_tokens():
    ids, _, _ = _batch()
    seq = ids.size(1)
    m = sample_permutation_masks(ids, 4, generator=torch.Generator().manual_seed(0))
    assert m.perm_mask.shape == (3, seq, seq) and m.target_mapping.shape == (3, 4, seq)
    rank = m.rank
    is_target = rank >= seq - 4
    for b in range(3):
        # targets are the last four of the order, in order
        assert rank[b, m.target_positions[b]].tolist() == list(range(seq - 4, seq))
        for i in range(seq):
            for j in range(seq):
                blocked = bool(m.perm_mask[b, i, j])
                if is_target[b, j] and rank[b, j] >= rank[b, i]:
                    assert blocked  # own token and later targets hidden
                else:
                    assert not blocked  # context and earlier targets visible
        assert m.perm_mask[b].diagonal()[is_target[b]].all()  # query stream never sees its own token

    model = _tiny_model()
    with torch.no_grad():
        base = model(ids, perm_mask=m.perm_mask, target_mapping=m.target_mapping)
        for b in range(3):
            for k, t in enumerate(m.target_positions[b].tolist()):
                later = [j for j in range(seq) if rank[b, j] >= rank[b, t]]  # t itself and later in the order
                changed = ids.clone()
                changed[b, later] = (changed[b, later] + 17) % 100
                out = model(changed, perm_mask=m.perm_mask, target_mapping=m.target_mapping)
                assert_paths_agree(out.query[b, k], base.query[b, k], depth=2, k=64, name=f"query {b, k} with hidden tokens changed")
                if k > 0:  # an earlier target does see the changes of t
                    earlier = [j for j in range(seq) if rank[b, j] == rank[b, t] - 1]
                    changed = ids.clone()
                    changed[b, earlier] = (changed[b, earlier] + 17) % 100
                    out = model(changed, perm_mask=m.perm_mask, target_mapping=m.target_mapping)
                    assert not torch.allclose(out.query[b, k], base.query[b, k], atol=1e-4)
        # the content stream sees its own token: changing a target changes its content state
        t = m.target_positions[0, 0].item()
        changed = ids.clone()
        changed[0, t] = (changed[0, t] + 17) % 100
        out = model(changed, perm_mask=m.perm_mask, target_mapping=m.target_mapping)
        assert not torch.allclose(out.content[0, t], base.content[0, t], atol=1e-4)


def test_identity_permutation_is_causal():
    ids, _, types = _batch()
    seq = ids.size(1)
    m = sample_permutation_masks(ids, seq - 1, shuffle=False)
    assert torch.equal(m.perm_mask[0].bool(), torch.ones(seq, seq).triu().bool() & (torch.arange(seq) > 0)[None, :])
    causal = torch.ones(seq, seq).triu(1).expand(3, seq, seq)  # may not see later tokens
    model = _tiny_model(1)
    with torch.no_grad():
        base = model(ids, token_type_ids=types, perm_mask=causal).content
        for t in range(seq - 1):
            changed = ids.clone()
            changed[:, t + 1:] = (changed[:, t + 1:] + 31) % 100
            out = model(changed, token_type_ids=types, perm_mask=causal).content
            assert_paths_agree(out[:, :t + 1], base[:, :t + 1], depth=2, k=64, name=f"content up to {t} with later tokens changed")
            assert not torch.allclose(out[:, t + 1], base[:, t + 1], atol=1e-4)


def _count(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name, hf_kwargs", [
    ("xlnet_12_768_12", dict(d_model=768, n_layer=12, n_head=12, d_inner=3072)),  # xlnet-base-cased
    ("xlnet_24_1024_16", {}),  # transformers' defaults are xlnet-large-cased
])
def test_preset_parameter_counts_match_transformers(name, hf_kwargs):
    config = XLNET_PRESETS[name]
    with torch.device("meta"):
        ours_body, ours_lm = XLNetModel(config), XLNetLMHeadModel(config)
        hf_config = transformers.XLNetConfig(**hf_kwargs)
        hf_body, hf_lm = transformers.XLNetModel(hf_config), transformers.XLNetLMHeadModel(hf_config)
    assert _count(ours_body) == _count(hf_body)
    assert _count(ours_lm) == _count(hf_lm)
    if name == "xlnet_12_768_12":
        assert 116e6 < _count(ours_body) < 118e6


def test_identity_permutation_without_query_stream_is_a_causal_transformer_xl():
    """XLNet's layer with the content stream only, under the identity order (each token sees
    the memory and the tokens up to itself), computes exactly a Transformer-XL layer with
    the same weights: the segment term vanishes without token types and, for keys not
    later than the query, the bidirectional distance encodings are Transformer-XL's."""
    from ctxkit.models.transformer_xl.model import TransformerXLLayer
    from ctxkit.models.xlnet.model import XLNetLayer, bidirectional_position_encoding

    torch.manual_seed(0)
    d, heads, inner, batch, mlen, qlen = 32, 4, 64, 2, 3, 6
    cfg = XLNetConfig(vocab_size=100, d_model=d, n_heads=heads, d_inner=inner, n_layers=2, activation="relu", dropout=0.0,
                      layer_norm_eps=1e-5)
    ours = [XLNetLayer(cfg).eval() for _ in range(2)]
    xl = [TransformerXLLayer(d, heads, inner, dropout=0.0, eps=1e-5).eval() for _ in range(2)]
    for a, b in zip(ours, xl):
        with torch.no_grad():
            for p in a.parameters():  # non-zero u, v and norms, so every term counts
                p.normal_(0.0, 0.3)
        missing, unexpected = b.self_attn.load_state_dict(a.attn.state_dict(), strict=False)
        assert missing == [] and sorted(unexpected) == ["s_bias", "seg_embed"]
        for name in ("ffn", "ffn_res"):
            getattr(b, name).load_state_dict(getattr(a, name).state_dict())
        b.self_attn_res.load_state_dict(a.attn_res.state_dict())
    klen = mlen + qlen
    pos = bidirectional_position_encoding(qlen, klen, d)  # distances klen-1 .. -(qlen-1)
    causal = torch.ones(qlen, klen, dtype=torch.bool).tril(mlen)  # key j visible iff j <= mlen + i
    h = torch.randn(batch, qlen, d)
    mems = [torch.randn(batch, mlen, d) for _ in ours]
    def run(xlnet_layers, xl_layers, h, pos, mems):
        x = y = full = h
        with torch.no_grad():
            for a, b, mem in zip(xlnet_layers, xl_layers, mems):
                x, g = a(x, None, pos, None, causal.expand(batch, 1, qlen, klen), None, memory=mem)
                y, _ = b(y, pos[:klen], memory=mem, mask=causal)  # Transformer-XL's distances klen-1 .. 0
                full, _ = a(full, None, pos, None, None, None, memory=mem)
        assert g is None
        return x, y, full

    x, y, full = run(ours, xl, h, pos, mems)
    x64, y64, _ = run([float64(a) for a in ours], [float64(b) for b in xl], *to64((h, pos, mems)))
    # the same function: exactly so in float64 (float64-derived bound), and each float32 path near it
    assert_close_to_reference(x64, y64, depth=2, k=64, name="XLNet layers vs Transformer-XL layers, float64")
    assert_same_function(x, y, y64, depth=2, k=64, name="causal layers", labels=("XLNet", "Transformer-XL"))
    assert not torch.allclose(full, y, atol=1e-3)  # the mask matters: bidirectional XLNet differs
