"""transformers' calling conventions, per family (issue 38, item 1).

Every family's forward takes its positional arguments in transformers' order for that family
and uses transformers' keyword names, so a line written for transformers (``model(ids, mask)``,
``model(ids, mask, types)``) means the same in ctxkit. Two checks per family:

* the signature: ctxkit's positional parameters are a prefix of transformers' (same names, same
  order), and every keyword ctxkit adds that transformers lacks is on a short, named list;
* the values: ctxkit and transformers, loaded from the same random checkpoint, are called with
  the *same positional* arguments and compute the same function (tests/README.md: in float64
  to the float64-derived bound, each float32 side within the float32-derived bound of
  transformers' float64 run).

Transformer-XL (gone from transformers 5) is checked the same way against transformers 4.57 in
tests/test_transformer_xl_hf.py.
"""

import inspect

import pytest
import torch

from ctxkit.models import BertForPreTraining, BertModel, load_bert
from ctxkit.models.gpt2.model import GPT2LMHeadModel, GPT2Model, load_gpt2
from ctxkit.models.xlnet.model import XLNetLMHeadModel, XLNetModel, load_xlnet, sample_permutation_masks
from tolerance import assert_close_to_reference, assert_same_function, float64

transformers = pytest.importorskip("transformers")

# Keywords ctxkit takes that transformers does not (each a documented ctxkit extra).
CTXKIT_EXTRAS = {
    "output_positions",  # BertModel: run the last layer only at these positions (pretraining)
    "masked_positions",  # BertForPreTraining: the MLM head only at the masked positions
}


def positional_names(fn) -> list:
    """Names of the parameters that can be passed by position (``self`` excluded)."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds and p.name != "self"]


def keyword_names(fn) -> set:
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return {p.name for p in inspect.signature(fn).parameters.values() if p.kind not in skip and p.name != "self"}


# transformers' generic keyword arguments (its **kwargs: TransformersKwargs) that ctxkit's encoders name.
HF_KWARGS = {"output_hidden_states", "output_attentions"}

PAIRS = [
    (BertModel, "BertModel"),
    (BertForPreTraining, "BertForPreTraining"),
    (GPT2Model, "GPT2Model"),
    (GPT2LMHeadModel, "GPT2LMHeadModel"),
    (XLNetModel, "XLNetModel"),
    (XLNetLMHeadModel, "XLNetLMHeadModel"),
]


@pytest.mark.parametrize("ours, theirs", PAIRS, ids=[name for _, name in PAIRS])
def test_positional_order_and_keyword_names_are_transformers(ours, theirs):
    hf_forward = getattr(transformers, theirs).forward
    mine, hf = positional_names(ours.forward), positional_names(hf_forward)
    assert len(mine) >= 2, f"{ours.__name__} takes only {mine} by position"
    assert mine == hf[:len(mine)], f"{ours.__name__}{tuple(mine)} is not a prefix of transformers' {tuple(hf)}"
    unknown = keyword_names(ours.forward) - keyword_names(hf_forward) - HF_KWARGS - CTXKIT_EXTRAS
    assert not unknown, f"{ours.__name__} takes keywords transformers does not name: {sorted(unknown)}"


def test_distilbert_order_is_transformers():
    """DistilBERT shares BertModel; transformers' DistilBertModel takes ``(input_ids, attention_mask)``
    by position, which ctxkit's order starts with too."""
    assert positional_names(BertModel.forward)[:2] == positional_names(transformers.DistilBertModel.forward)[:2]


def _batch(vocab, seed=2):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (3, 16), generator=g)
    types = torch.zeros_like(ids)
    types[:, 8:] = 1
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0  # right padding: the rows where a wrong order shows
    mask[2, 5:] = 0
    return ids, types, mask


def _same_function(ours, hf, run, mask, name, out_ours=lambda o: o, out_hf=lambda o: o, hf64=float64, min_std=0.1, **bound):
    """``run`` (the same call, positional arguments and all) on both models, in float32 and on
    float64 copies; real tokens compared."""
    with torch.no_grad():
        got, expected = out_ours(run(ours)), out_hf(run(hf))
        got64, expected64 = out_ours(run(float64(ours))), out_hf(run(hf64(hf)))
    real = None if mask is None else mask.bool()
    assert got.shape == expected.shape
    assert_close_to_reference(got64, expected64, mask=real, name=f"{name} float64", **bound)
    assert_same_function(got, expected, expected64, mask=real, name=name, **bound)
    assert got.std() > min_std  # not vacuous
    return got


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    cfg = transformers.BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=128, max_position_embeddings=64)
    torch.manual_seed(1)
    model = transformers.BertForPreTraining(cfg).eval()
    folder = tmp_path_factory.mktemp("bert")
    model.save_pretrained(folder)
    return folder, model


def test_bert_positional_call_matches_transformers(bert_dir):
    folder, _ = bert_dir
    hf = transformers.BertModel.from_pretrained(folder).eval()
    ours = load_bert(folder)
    ids, types, mask = _batch(300)
    positions = torch.arange(16).flip(0).expand(3, -1)  # not the default, so a misplaced argument shows
    hidden = dict(out_ours=lambda o: o[0], out_hf=lambda o: o[0], depth=3, k=128)
    _same_function(ours, hf, lambda m: m(ids, mask), mask, "BERT (ids, mask)", **hidden)
    _same_function(ours, hf, lambda m: m(ids, mask, types), mask, "BERT (ids, mask, types)", **hidden)
    _same_function(ours, hf, lambda m: m(ids, mask, types, positions), mask, "BERT (ids, mask, types, positions)", **hidden)
    _same_function(ours, hf, lambda m: m(ids, mask, types).pooler_output, None, "BERT pooler", depth=4, k=128)
    _same_function(ours, hf, lambda m: m(input_ids=ids, attention_mask=mask, token_type_ids=types, position_ids=positions),
                   mask, "BERT keywords", **hidden)


def test_the_issue_case_mask_second_is_the_mask(bert_dir):
    """The report: ``model(input_ids, attention_mask)`` used to read the mask as token types.
    The padded row must now equal the same sentence run alone, unpadded."""
    folder, _ = bert_dir
    ours = load_bert(folder)
    ids, _, mask = _batch(300)
    with torch.no_grad():
        padded = ours(ids, mask)[0][1, :11]
        alone = float64(ours)(ids[1:2, :11])[0][0]
    assert_close_to_reference(padded, alone, depth=3, k=128, name="padded row vs the row alone")


def test_the_old_order_is_caught_not_computed(bert_dir):
    """Code written for ctxkit's earlier order, ``model(ids, types, mask)``, now hands token
    types to the mask slot: a clear error, not a silently different answer."""
    from ctxkit.core.errors import UserError

    folder, _ = bert_dir
    ours = load_bert(folder)
    ids, types, mask = _batch(300)
    with pytest.raises(UserError, match=r"token_type_ids\?"):
        ours(ids, types, mask)
    with pytest.raises(UserError, match="transformers' \\(input_ids, attention_mask, token_type_ids\\)"):
        ours(ids, torch.zeros_like(ids))  # single sentences: all-zero token types
    with torch.no_grad():  # a left-padded batch is still a mask (its longest row starts real)
        left = torch.ones_like(mask)
        left[1, :4] = 0
        assert ours(ids, left)[0].shape == (3, 16, 64)


def test_bert_pretraining_heads_positional_call_matches_transformers(bert_dir):
    folder, hf = bert_dir
    ours = load_bert(folder, with_heads=True)
    ids, types, mask = _batch(300)
    _same_function(ours, hf, lambda m: m(ids, mask, types), mask, "MLM logits",
                   out_ours=lambda o: o[0], out_hf=lambda o: o.prediction_logits, depth=5, k=128)
    _same_function(ours, hf, lambda m: m(ids, mask, types), None, "NSP logits",
                   out_ours=lambda o: o[1], out_hf=lambda o: o.seq_relationship_logits, min_std=0.01, depth=4, k=128)


def test_distilbert_positional_call_matches_transformers(tmp_path):
    cfg = transformers.DistilBertConfig(vocab_size=300, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64)
    torch.manual_seed(3)
    hf = transformers.DistilBertModel(cfg).eval()
    hf.save_pretrained(tmp_path)
    ours = load_bert(tmp_path)
    ids, _, mask = _batch(300)
    _same_function(ours, hf, lambda m: m(ids, mask), mask, "DistilBERT (ids, mask)",
                   out_ours=lambda o: o[0], out_hf=lambda o: o[0], depth=3, k=128)


def test_gpt2_positional_call_matches_transformers(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32)
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(tmp_path)
    ours = load_gpt2(tmp_path)
    ids, types, mask = _batch(100)
    positions = (torch.arange(16) + 3).expand(3, -1)
    logits = dict(out_hf=lambda o: o.logits, depth=4, k=256)
    _same_function(ours, hf, lambda m: m(ids, None, mask), mask, "GPT-2 (ids, cache, mask)", **logits)
    _same_function(ours, hf, lambda m: m(ids, None, mask, types, positions), mask, "GPT-2 (ids, cache, mask, types, positions)",
                   **logits)
    _same_function(ours, hf, lambda m: m(input_ids=ids, attention_mask=mask, token_type_ids=types, position_ids=positions),
                   mask, "GPT-2 keywords", **logits)


def test_gpt2_mask_in_the_cache_slot_is_a_clear_error(tmp_path):
    """``model(ids, mask)`` is a cache in transformers' GPT-2 order: say so instead of failing deep inside."""
    from ctxkit.models.gpt2.model import GPT2Config

    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2, ffn_size=64, max_position=16))
    ids = torch.randint(0, 50, (2, 5))
    with pytest.raises(TypeError, match=r"attention_mask="):
        model(ids, torch.ones_like(ids))


def test_xlnet_positional_call_matches_transformers(tmp_path):
    torch.manual_seed(0)
    hf = transformers.XLNetLMHeadModel(transformers.XLNetConfig(vocab_size=100, d_model=64, n_layer=2, n_head=4, d_inner=128)).eval()
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in hf.parameters():  # every parameter counts, biases included
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    hf.save_pretrained(tmp_path)
    ours = load_xlnet(tmp_path)
    ids, types, mask = _batch(100)
    masks = sample_permutation_masks(ids, 3, attention_mask=mask, generator=torch.Generator().manual_seed(3))
    perm, target = masks.perm_mask.float(), masks.target_mapping.float()

    def cast(m, t):  # the float64 copy takes float64 masks
        return t.to(next(m.parameters()).dtype)

    from test_xlnet import _hf64  # transformers' XLNet in float64 (its two-stream table cast added)

    logits = dict(out_hf=lambda o: o.logits, hf64=_hf64, depth=3, k=128)
    _same_function(ours, hf, lambda m: m(ids, cast(m, mask)), mask, "XLNet (ids, mask)", **logits)
    _same_function(ours, hf, lambda m: m(ids, cast(m, mask), None, cast(m, perm), cast(m, target), types), None,
                   "XLNet (ids, mask, mems, perm_mask, target_mapping, types)", **logits)
