"""A checkpoint's config is held against its weights before anything is built (issue 44
item 3): ten million layers, or a vocabulary of 10**8, next to a tiny weight file is one
UserError naming the file and the field, in milliseconds and without the allocation (it
used to build for minutes, gigabytes deep); and a tokenizer with more tokens than the
embedding table has rows is refused when the folder loads, naming both numbers and both
files, instead of an IndexError on the first text with a high id."""

import json
import resource
import shutil
import time

import pytest
import torch

from ctxkit.core.build_guard import bounded_build
from ctxkit.core.errors import UserError
from ctxkit.models.bert.model import BertModel, save_bert
from ctxkit.models.char_lm.model import CharLSTMConfig, CharTransformerConfig, build_char_lm, save_char_lm
from ctxkit.models.elmo.model import ElmoConfig, ElmoLanguageModel
from ctxkit.models.elmo.io import load_bilm, save_elmo_lm
from ctxkit.zoo.presets import BertConfig
from ctxkit.models.seq2seq.model import RNNSeq2Seq, RNNSeq2SeqConfig, Seq2SeqConfig, TransformerSeq2Seq, save_seq2seq
from ctxkit.models.transformer_xl.model import TransformerXLConfig, TransformerXLLMHeadModel
from ctxkit.models.transformer_xl.io import save_transformer_xl_lm
from ctxkit.tasks import get_task, load_run, save_run_model
from ctxkit.core.checkpoint import write_json
from ctxkit.tokenizers import WordPieceTokenizer
from ctxkit.zoo import get_model

BIG = 10_000_000


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One tiny saved folder per family whose loader builds on the device (not on meta)."""
    root = tmp_path_factory.mktemp("families")
    torch.manual_seed(0)
    save_seq2seq(TransformerSeq2Seq(Seq2SeqConfig(2, 2, 32, 2, 64, vocab_size=50, max_position=32)), root / "seq2seq")
    save_seq2seq(RNNSeq2Seq(RNNSeq2SeqConfig(16, 32, 2, 16, vocab_size=50)), root / "rnn_seq2seq")
    save_char_lm(build_char_lm(CharTransformerConfig(vocab_size=27, num_layers=2, hidden_size=32, num_heads=2, ffn_size=64,
                                                     context=32)), root / "char_transformer")
    save_char_lm(build_char_lm(CharLSTMConfig(vocab_size=27, embedding_size=16, hidden_size=32, num_layers=2, context=32)),
                 root / "char_lstm")
    save_transformer_xl_lm(TransformerXLLMHeadModel(TransformerXLConfig(vocab_size=40, d_model=16, n_heads=2, d_inner=24, n_layers=2,
                                                                        cutoffs=(20,), mem_len=4, tgt_len=4)),
                           root / "transformer_xl", [f"w{i}" for i in range(40)])
    elmo = ElmoConfig(filters=((1, 4), (2, 8)), n_highway=1, char_embed_dim=4, cell_size=16, projection_dim=8, num_layers=2)
    save_elmo_lm(ElmoLanguageModel(elmo, 20, softmax="full"), root / "elmo", [f"w{i}" for i in range(20)])
    return root


def _mutate(src, dst, file="config.json", **changes):
    shutil.copytree(src, dst)
    config = json.loads((dst / file).read_text())
    for path, value in changes.items():
        node = config
        *parents, last = path.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    (dst / file).write_text(json.dumps(config))
    return dst


def _refused(load, folder):
    """The UserError ``load(folder)`` raises, its time, and how far the peak memory grew."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    with pytest.raises(UserError) as caught:
        load(folder)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024  # kB on Linux
    return str(caught.value), time.perf_counter() - started, grown_mb


@pytest.mark.parametrize("family, file, field, value, says", [
    ("seq2seq", "config.json", "num_decoder_layers", BIG, "field 'num_decoder_layers' is 10000000: 10000000 layers, but the weights hold 2"),
    ("seq2seq", "config.json", "num_encoder_layers", BIG, "field 'num_encoder_layers' is 10000000: 10000000 layers, but the weights hold 2"),
    ("seq2seq", "config.json", "vocab_size", 10**8, "field 'vocab_size' is 100000000, but no weight in"),
    ("rnn_seq2seq", "config.json", "num_layers", BIG, "field 'num_layers' is 10000000: 10000000 layers, but the weights hold 2"),
    ("rnn_seq2seq", "config.json", "hidden_size", BIG, "field 'hidden_size' is 10000000, but no weight in"),
    ("char_transformer", "config.json", "num_layers", BIG, "field 'num_layers' is 10000000: 10000000 layers, but the weights hold 2"),
    ("char_transformer", "config.json", "context", 10**8, "field 'context' is 100000000, but no weight in"),
    ("char_lstm", "config.json", "num_layers", BIG, "field 'num_layers' is 10000000: 10000000 layers, but the weights hold 2"),
    ("transformer_xl", "config.json", "config__n_layers", BIG, "field 'n_layers' is 10000000: 10000000 layers, but the weights hold 2"),
    ("elmo", "options.json", "lstm__n_layers", BIG, "field 'lstm.n_layers' is 10000000: 10000000 layers, but the weights hold 2"),
    ("elmo", "options.json", "char_cnn__n_highway", BIG, "field 'char_cnn.n_highway' is 10000000: 10000000 layers, but the weights hold 1"),
])
def test_config_sizes_the_weights_do_not_hold_are_refused_before_building(folders, tmp_path, family, file, field, value, says):
    folder = _mutate(folders / family, tmp_path / family, file, **{field: value})
    load = (lambda f: load_bilm(f)) if family == "elmo" else (lambda f: get_model(str(f)))
    message, seconds, grown_mb = _refused(load, folder)
    assert says in message and file in message and "\n" not in message, message
    assert seconds < 2 and grown_mb < 200, (seconds, grown_mb)  # it took minutes and gigabytes


def test_the_unmutated_folders_load(folders):
    for family in ("seq2seq", "rnn_seq2seq", "char_transformer", "char_lstm", "transformer_xl"):
        get_model(str(folders / family))
    load_bilm(folders / "elmo")


def test_bounded_build_refuses_the_allocation_that_would_pass_the_budget():
    config = {"vocab_size": 10**9, "hidden_size": 8}
    state = {"embed.weight": torch.zeros(10, 8)}
    with pytest.raises(UserError, match="field 'vocab_size' is 1000000000, but no weight in w.safetensors has a dimension over 10"):
        with bounded_build(config, "config.json", "w.safetensors", 80, state):
            torch.nn.Embedding(10**9, 8)  # 32 GB if it were allocated
    with bounded_build(config, "config.json", "w.safetensors", 80, state):  # within the budget: built as usual
        assert torch.nn.Embedding(10, 8).weight.shape == (10, 8)


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory):
    """A BERT folder whose tokenizer (61 tokens) is another model's: its table has 30 rows."""
    texts = ["the cat sat on the mat", "a dog barked loudly at night"] * 50
    tokenizer = WordPieceTokenizer.train(iter(texts), vocab_size=120, show_progress=False)
    torch.manual_seed(0)
    model = BertModel(BertConfig(num_layers=2, hidden_size=32, num_heads=2, ffn_size=64, vocab_size=30, max_position=64))
    return save_bert(model, tmp_path_factory.mktemp("mixed") / "m", tokenizer), tokenizer.vocab_size


def test_a_tokenizer_larger_than_the_embedding_table_is_refused_at_load(mixed_folder, tmp_path):
    folder, tokens = mixed_folder
    says = (f"tokenizer.json: the tokenizer has {tokens} tokens, but the embedding table in {folder / 'model.safetensors'} "
            f"has 30 rows (vocab_size 30)")
    with pytest.raises(UserError) as caught:  # get_model: also what `ctxkit embed --model FOLDER` loads with
        get_model(str(folder))
    assert says in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    # A fine-tuned run whose best/ holds the same mix: refused by load_run too (predict, serve).
    model = BertModel.from_pretrained(folder)  # the weights alone load: the mix is the pair
    task = get_task("table", labels=["a", "b"], regression=False)
    run = tmp_path / "run"
    save_run_model(task.build_model(model), WordPieceTokenizer.from_dir(folder), run / "best")
    write_json({"task": task.name, "options": task.options(), "model": str(folder)}, run / "task.json")
    with pytest.raises(UserError, match=f"the tokenizer has {tokens} tokens, but the embedding table in .*best.* has 30 rows"):
        load_run(run, "cpu")
