"""What models and collators declare (ctxkit.core.capabilities): the protocols the training,
inference and decoding code asks through ``declares`` instead of ``getattr`` defaults."""

import torch

from ctxkit.core.capabilities import (ComputesAtPositions, GraphCapturable, KeyedCollator, StaticCacheDecoder,
                                      TakesHostInputs, declared_precision, declares)
from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead
from ctxkit.inference.gpu import GPUTaskModel
from ctxkit.models import BertModel, get_preset
from ctxkit.models.gpt2 import GPT2Config, GPT2LMHeadModel
from ctxkit.models.seq2seq.model import RNNSeq2Seq, RNNSeq2SeqConfig
from ctxkit.pretraining.masking import MaskingIds, MLMCollator
from ctxkit.pretraining.xlnet_pretrain import XLNetCollator


def test_a_flag_must_be_present_and_true():
    class Says:
        supports_static_cache = True

    class SaysNo:
        supports_static_cache = False

    assert declares(Says(), StaticCacheDecoder)
    assert not declares(SaysNo(), StaticCacheDecoder) and not declares(object(), StaticCacheDecoder)
    assert isinstance(SaysNo(), StaticCacheDecoder)  # present: the protocol matches, its flag says no

    class Keyed:  # a keyed collate function needs the flag and a __call__
        keyed = True

    assert not declares(Keyed(), KeyedCollator) and not declares(len, KeyedCollator)


def test_the_library_s_classes_declare_what_they_do():
    bert = BertModel(get_preset("bert_2_128_2").config)
    assert declares(bert, ComputesAtPositions)
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=50, max_position=16, hidden_size=16, num_layers=1, num_heads=2))
    assert declares(gpt, StaticCacheDecoder) and not declares(bert, StaticCacheDecoder)
    ids = MaskingIds(vocab_size=300, mask_id=3, special_ids=frozenset({0, 1, 2, 3}), pad_id=0)
    assert declares(MLMCollator(ids), KeyedCollator)
    assert XLNetCollator.keyed is True and callable(XLNetCollator)
    # the GPU backend's task model (built on a GPU only): copies host batches itself, warms up before a server's first request
    assert GPUTaskModel.takes_host_inputs is True and callable(GPUTaskModel.warm_up)
    rnn = RNNSeq2Seq(RNNSeq2SeqConfig(vocab_size=20, embed_size=8, hidden_size=8, attention_size=8))
    assert isinstance(rnn, GraphCapturable) and not rnn.cuda_graph_safe  # packed sequences keep lengths on the host
    assert not isinstance(bert, GraphCapturable)  # says nothing: capturable
    assert declared_precision(bert) is None and not declares(bert, TakesHostInputs)


def test_a_sentence_head_asks_for_cls_alone_only_when_the_encoder_declares_it():
    torch.manual_seed(0)
    cfg = get_preset("bert_2_128_2").config
    bert = BertModel(cfg)
    with_positions = EncoderWithHead(bert, SequenceClassificationHead(cfg.hidden_size, 2), cls_only=True).eval()
    assert with_positions._at_positions

    class Plain(torch.nn.Module):  # an encoder that declares nothing gets no output_positions
        config = cfg

        def __init__(self):
            super().__init__()
            self.inner = bert

        def forward(self, input_ids, attention_mask=None, token_type_ids=None):
            return self.inner(input_ids, attention_mask, token_type_ids=token_type_ids)

    plain = EncoderWithHead(Plain(), with_positions.head, cls_only=True).eval()
    assert not plain._at_positions
    ids = torch.randint(5, 100, (3, 9))
    with torch.no_grad():
        torch.testing.assert_close(plain(ids)["logits"], with_positions(ids)["logits"], rtol=1e-5, atol=1e-5)
