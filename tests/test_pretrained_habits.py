"""transformers' loading and saving habits: ``from_pretrained`` / ``save_pretrained`` on
models and tokenizers, ``AutoModel`` / ``AutoTokenizer`` over the zoo, ``num_parameters``,
``batch_decode``; what ctxkit saves transformers loads (same outputs), and back."""

import pytest
import torch

import ctxkit
from ctxkit.core.errors import UserError
from ctxkit.models import BertForPreTraining, BertModel, GPT2LMHeadModel
from ctxkit.models.gpt2.model import GPT2Config
from ctxkit.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer
from tolerance import assert_close_to_reference

transformers = pytest.importorskip("transformers")


def test_bert_save_pretrained_loads_in_transformers_and_back(minilm_dir, tmp_path):
    model = BertModel.from_pretrained(minilm_dir)
    tokenizer = WordPieceTokenizer.from_pretrained(minilm_dir)
    assert model.num_parameters() == transformers.AutoModel.from_pretrained(minilm_dir).num_parameters()
    model.save_pretrained(tmp_path / "saved", tokenizer=tokenizer)
    theirs = transformers.AutoModel.from_pretrained(tmp_path / "saved").eval()
    their_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")
    batch = their_tok(["the river bank", "a retail bank opened"], padding=True, return_tensors="pt")
    assert batch["input_ids"].tolist() == tokenizer(["the river bank", "a retail bank opened"], padding=True)["input_ids"]
    with torch.no_grad():
        reference = theirs.double()(**batch).last_hidden_state
        ours = BertModel.from_pretrained(tmp_path / "saved")(batch["input_ids"], token_type_ids=batch["token_type_ids"],
                                                               attention_mask=batch["attention_mask"]).last_hidden_state
    assert_close_to_reference(ours, reference, depth=7, k=1536, mask=batch["attention_mask"].bool(), name="saved and reloaded")
    assert model.num_parameters(exclude_embeddings=True) < model.num_parameters()


def test_auto_model_and_tokenizer_take_zoo_names_and_run_folders(minilm_dir, tmp_path):
    import shutil

    shutil.copytree(minilm_dir, tmp_path / "run" / "best")
    for name in ("all_minilm_l6_v2", str(minilm_dir), str(tmp_path / "run")):
        assert type(ctxkit.AutoModel.from_pretrained(name)) is BertModel
        assert type(ctxkit.AutoTokenizer.from_pretrained(name)) is WordPieceTokenizer
    assert type(BertModel.from_pretrained(tmp_path / "run")) is BertModel
    with pytest.raises(UserError, match="AutoModel"):
        BertModel.from_pretrained("all_minilm_l6_v2")  # a zoo name: the class entry takes folders and Hub ids
    heads = BertForPreTraining(ctxkit.get_model("bert_2_128_2", pretrained=False)[0].config)
    heads.save_pretrained(tmp_path / "heads")
    assert type(BertForPreTraining.from_pretrained(tmp_path / "heads")) is BertForPreTraining
    with pytest.raises(UserError, match="model_type .bert.; this loader reads .gpt2."):
        GPT2LMHeadModel.from_pretrained(tmp_path / "heads")


def test_gpt2_and_bpe_round_trip_through_transformers(tmp_path, shared_data):
    from ctxkit.data.lines import read_lines

    lines = list(read_lines(shared_data / "wikitext-2" / "wiki.valid.tokens.xz"))[:300]
    tokenizer = ByteLevelBPETokenizer.train(iter(lines), vocab_size=400, show_progress=False)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(num_layers=2, hidden_size=32, num_heads=2, vocab_size=tokenizer.vocab_size,
                                       max_position=64, ffn_size=64)).eval()
    model.save_pretrained(tmp_path / "gpt", tokenizer=tokenizer)
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt").eval()
    assert model.num_parameters() == theirs.num_parameters()
    reloaded_tok = ByteLevelBPETokenizer.from_pretrained(tmp_path / "gpt")
    ids = torch.tensor([list(reloaded_tok.encode("The history of the city"))])
    with torch.no_grad():
        assert_close_to_reference(GPT2LMHeadModel.from_pretrained(tmp_path / "gpt")(ids), theirs.double()(ids).logits, depth=3, k=64,
                                  name="GPT-2 logits")
    their_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "gpt")
    rows = [ids[0].tolist(), list(reloaded_tok.encode("of the"))]
    assert reloaded_tok.batch_decode(rows) == their_tok.batch_decode(rows)


def test_batch_decode_equals_transformers(minilm_dir):
    ours = WordPieceTokenizer.from_pretrained(minilm_dir)
    theirs = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    rows = torch.tensor([[101, 1996, 2314, 2924, 102, 0], [101, 7592, 1010, 2088, 999, 102]])
    for skip in (False, True):
        assert ours.batch_decode(rows, skip_special_tokens=skip) == theirs.batch_decode(rows, skip_special_tokens=skip)
    with pytest.raises(UserError, match="clean_up_tokenization_spaces"):
        ours.batch_decode(rows, clean_up_tokenization_spaces=False)
