"""Models by the names users type (issue 20), with no network: tiny random checkpoints of every
family with a Hub format, written in huggingface_hub's cache layout, loaded by Hub id under
HF_HUB_OFFLINE=1, each agreeing with transformers on the same files (tests/README.md's
tolerance policy: each side against a float64 run of transformers)."""

import shutil
from pathlib import Path

import pytest
import torch
import transformers

import ctxkit
from ctxkit import zoo
from ctxkit.core.errors import UnknownNameError, UserError
from ctxkit.core.hub import HubNotCachedError
from ctxkit.core.catalog import GLUON_NAMES, HUB_MODELS, NO_COPY, hub_model
from ctxkit.tokenizers import ByteLevelBPETokenizer
from tolerance import assert_same_function, float64

PINNED_BERT = HUB_MODELS["google-bert/bert-base-uncased"].revision


def put_in_cache(cache: Path, repo_id: str, source: Path, commit: str = "c" * 40, main: bool = True) -> Path:
    """``source``'s files as the snapshot ``commit`` of ``repo_id`` in the cache layout of
    huggingface_hub (``models--org--name/snapshots/<commit>``; ``refs/main`` names it)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    shutil.copytree(source, snapshot)
    if main:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _save(model, folder: Path, vocab_from: Path = None, files=("vocab.txt",)) -> Path:
    model.save_pretrained(folder, safe_serialization=True)
    for f in files:
        shutil.copy(vocab_from / f, folder / f)
    return folder


def _bert_like(kind: str):
    torch.manual_seed(0)
    if kind == "distilbert":
        config = transformers.DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                               max_position_embeddings=64)
        return transformers.DistilBertModel(config).eval()
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    return transformers.BertModel(config).eval()


def _ids(batch=2, seq=9, vocab=30522):
    ids = torch.randint(1000, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return ids, mask


@pytest.mark.parametrize("name,kind,repo", [
    ("bert-base-uncased", "bert", "google-bert/bert-base-uncased"),
    ("google-bert/bert-base-uncased", "bert", "google-bert/bert-base-uncased"),
    ("distilbert-base-uncased", "distilbert", "distilbert/distilbert-base-uncased"),
    ("sentence-transformers/all-MiniLM-L6-v2", "bert", "sentence-transformers/all-MiniLM-L6-v2"),
])
def test_bert_family_by_hub_id_matches_transformers(name, kind, repo, hf_cache, tmp_path, minilm_dir):
    hf = _bert_like(kind)
    commit = hub_model(repo).revision or "d" * 40
    put_in_cache(hf_cache, repo, _save(hf, tmp_path / "src", minilm_dir), commit)
    model, tokenizer = ctxkit.get_model(name)
    assert tokenizer is not None and tokenizer.encode("The river bank.").tokens[:2] == ["[CLS]", "the"]
    ids, mask = _ids()
    with torch.no_grad():
        ours = model(ids, attention_mask=mask)[0]
        theirs = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        reference = float64(hf)(input_ids=ids, attention_mask=mask).last_hidden_state
    assert_same_function(ours, theirs, reference, mask=mask, depth=2, k=64, name=f"{name} hidden states",
                         labels=("ctxkit", "transformers"))


def test_gpt2_by_hub_id_matches_transformers(hf_cache, tmp_path):
    torch.manual_seed(0)
    texts = ["the river bank was steep", "the retail bank opened late"] * 50
    bpe = ByteLevelBPETokenizer.train(iter(texts), vocab_size=300, show_progress=False)
    vocab_dir = bpe.save(tmp_path / "bpe")
    config = transformers.GPT2Config(vocab_size=bpe.vocab_size, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                    bos_token_id=0, eos_token_id=0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    put_in_cache(hf_cache, "openai-community/gpt2", _save(hf, tmp_path / "src", vocab_dir, ("vocab.json", "merges.txt")))
    model, tokenizer = ctxkit.get_model("gpt2")
    ids = torch.tensor([tokenizer.encode("the river bank")])
    with torch.no_grad():
        ours = model(ids)  # ctxkit's GPT-2 LM returns the logits (batch, seq, vocab)
        theirs = hf(ids).logits
        reference = float64(hf)(ids).logits
    assert_same_function(ours, theirs, reference, depth=3, k=128, name="gpt2 logits", labels=("ctxkit", "transformers"))


def test_xlnet_by_hub_id_matches_transformers(hf_cache, tmp_path, minilm_dir):
    torch.manual_seed(0)
    config = transformers.XLNetConfig(vocab_size=30522, d_model=32, n_layer=2, n_head=2, d_inner=64)
    hf = transformers.XLNetModel(config).eval()
    src = tmp_path / "src"
    hf.save_pretrained(src, safe_serialization=True)
    put_in_cache(hf_cache, "xlnet/xlnet-base-cased", src)
    model, tokenizer = ctxkit.get_model("xlnet-base-cased")
    assert tokenizer is None  # xlnet-base-cased's vocabulary is SentencePiece, which ctxkit does not read
    ids = torch.randint(5, 30522, (2, 7), generator=torch.Generator().manual_seed(2))
    segments = torch.zeros_like(ids)
    # get_model gives XLNet as a task encoder (BERT's [CLS]-first layout moved to XLNet's
    # [CLS]-last): compare its XLNet body, which reads the ids as transformers does.
    with torch.no_grad():
        ours = model.body(ids, token_type_ids=segments).content
        theirs = hf(input_ids=ids, token_type_ids=segments).last_hidden_state
        reference = float64(hf)(input_ids=ids, token_type_ids=segments).last_hidden_state
    assert_same_function(ours, theirs, reference, depth=3, k=64, name="xlnet hidden states", labels=("ctxkit", "transformers"))


def test_pinned_revision_first_then_the_cached_default_branch(hf_cache, tmp_path, minilm_dir):
    hf = _bert_like("bert")
    src = _save(hf, tmp_path / "src", minilm_dir)
    put_in_cache(hf_cache, "google-bert/bert-base-uncased", src, commit="e" * 40)  # main moved on; the pin is not cached
    rows = {r["name"]: r for r in zoo.list_models()}
    assert rows["google-bert/bert-base-uncased"]["status"] == "in the HF cache"
    assert ctxkit.get_model("bert-base-uncased")[0].config.hidden_size == 32
    put_in_cache(hf_cache, "google-bert/bert-base-uncased", src, commit=PINNED_BERT, main=False)
    rows = {r["name"]: r for r in zoo.list_models()}
    assert rows["google-bert/bert-base-uncased"]["path"].endswith(PINNED_BERT)  # the pin wins when it is there


def test_offline_and_not_cached_is_one_clear_error(hf_cache):
    with pytest.raises(HubNotCachedError) as err:
        ctxkit.get_model("openai-community/gpt2-medium")
    message = str(err.value)
    assert "openai-community/gpt2-medium" in message and str(hf_cache) in message and "HF_HUB_OFFLINE" in message
    with pytest.raises(HubNotCachedError, match="some-org/some-model"):
        ctxkit.get_model("some-org/some-model")  # any org/name is tried on the Hub
    assert {r["name"]: r for r in zoo.list_models()}["openai-community/gpt2-medium"]["status"] == "downloadable"


def test_presets_are_honest():
    with pytest.raises(UserError, match="pretrained=False") as err:
        ctxkit.get_model("bert_12_768_12")
    assert "google-bert/bert-base-uncased" in str(err.value)  # the checkpoints of that architecture are listed
    model, tokenizer = ctxkit.get_model("bert_2_128_2", pretrained=False)
    assert tokenizer is None and model.config.num_layers == 2 and not model.training
    rows = zoo.list_models()
    preset = next(r for r in rows if r["name"] == "bert_12_768_12")
    assert preset["available"] is False and "pretrained=False" in preset["status"]
    assert "google-bert/bert-base-uncased" in preset["checkpoints"]
    with pytest.raises(UnknownNameError, match="unknown model 'no_such_thing'"):
        ctxkit.get_model("no_such_thing")


def test_gluonnlp_names(hf_cache, tmp_path, minilm_dir):
    assert GLUON_NAMES, "the lecture's GluonNLP names are mapped"
    row = next(g for g in GLUON_NAMES if g.model == "bert_12_768_12" and g.dataset_name == "book_corpus_wiki_en_uncased")
    assert hub_model(row.target).repo_id == "google-bert/bert-base-uncased"
    put_in_cache(hf_cache, "google-bert/bert-base-uncased", _save(_bert_like("bert"), tmp_path / "src", minilm_dir), PINNED_BERT)
    model, tokenizer = ctxkit.get_model("bert_12_768_12", dataset_name="book_corpus_wiki_en_uncased")
    assert model.config.hidden_size == 32 and tokenizer is not None
    with pytest.raises(UnknownNameError, match="book_corpus_wiki_en_cased"):
        ctxkit.get_model("bert_12_768_12", dataset_name="no_such_release")  # the known releases are listed
    for g in GLUON_NAMES:  # every row points at a catalogued checkpoint, or says there is none
        if g.relation == NO_COPY:
            assert g.target is None
        else:
            assert hub_model(g.target) is not None or g.target in ctxkit.core.catalog.URL_MODELS, g


# ---------------------------------------------------------------------------- released ELMo by URL


@pytest.fixture
def elmo_server(tmp_path):
    """A tiny ELMo in bilm-tf's two files, served over HTTP from a local folder."""
    import functools
    import http.server
    import threading

    from ctxkit.models.elmo.model import ElmoBiLM, ElmoConfig
    from ctxkit.models.elmo.io import write_bilm_tf

    pytest.importorskip("h5py")
    pytest.importorskip("pooch")
    root = tmp_path / "served"
    root.mkdir()
    torch.manual_seed(0)
    model = ElmoBiLM(ElmoConfig(filters=((1, 4), (2, 4)), n_highway=1, char_embed_dim=4, cell_size=16, projection_dim=8))
    with torch.no_grad():
        model.char_cnn.char_embedding.weight[1:].normal_()
    write_bilm_tf(model, root / "w.hdf5", root / "o.json")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}", model
    server.shutdown()


def _url_model(base, options_sha, weights_sha):
    from ctxkit.core.catalog import UrlModel

    return UrlModel(name="elmo_tiny_test", family="elmo", preset="elmo_2x1024_128_2048cnn_1xhighway", description="test",
                    files={"options.json": (f"{base}/o.json", options_sha), "weights.hdf5": (f"{base}/w.hdf5", weights_sha)})


def test_released_elmo_by_url_is_sha256_checked(elmo_server, tmp_path, monkeypatch):
    import hashlib

    from ctxkit.core import catalog

    root, base, model = elmo_server
    monkeypatch.setenv("CTXKIT_HOME", str(tmp_path / "home"))
    digest = {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in ("o.json", "w.hdf5")}
    monkeypatch.setitem(catalog.URL_MODELS, "elmo_tiny_test", _url_model(base, digest["o.json"], "0" * 64))
    with pytest.raises(UserError, match="w.hdf5"):
        ctxkit.get_model("elmo_tiny_test", progress=False)
    folder = tmp_path / "home" / "url" / "elmo_tiny_test"
    assert not (folder / "weights.hdf5").exists()  # the corrupted download left nothing in its place
    monkeypatch.setitem(catalog.URL_MODELS, "elmo_tiny_test", _url_model(base, digest["o.json"], digest["w.hdf5"]))
    loaded, tokenizer = ctxkit.get_model("elmo_tiny_test", progress=False)
    assert tokenizer is None
    for key, value in model.state_dict().items():  # bilm-tf's float32 file holds the weights exactly (the LSTM bias: +-1.0)
        if not key.endswith("state_linearity.bias"):
            assert torch.equal(value, loaded.state_dict()[key]), key
    assert {r["name"]: r for r in zoo.list_models()}["elmo_tiny_test"]["status"] == "installed"


def test_released_elmo_without_a_published_checksum_is_recorded_then_checked(elmo_server, tmp_path, monkeypatch):
    from ctxkit.core.fetch import RECORD
    from ctxkit.core import catalog

    root, base, _ = elmo_server
    monkeypatch.setenv("CTXKIT_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(catalog.URL_MODELS, "elmo_tiny_test", _url_model(base, None, None))
    ctxkit.get_model("elmo_tiny_test", progress=False)
    folder = tmp_path / "home" / "url" / "elmo_tiny_test"
    assert sorted(line.split()[1] for line in (folder / RECORD).read_text().splitlines()) == ["options.json", "weights.hdf5"]
    (root / "w.hdf5").write_bytes(b"not the same file")  # the server changes its copy ...
    (folder / "weights.hdf5").write_bytes(b"tampered")  # ... and ours is damaged: the record catches both
    with pytest.raises(UserError, match="w.hdf5"):
        ctxkit.get_model("elmo_tiny_test", progress=False)


def test_demo_takes_a_hub_id(hf_cache, tmp_path, minilm_dir):
    from ctxkit.cli import main

    put_in_cache(hf_cache, "google-bert/bert-base-uncased", _save(_bert_like("bert"), tmp_path / "src", minilm_dir), PINNED_BERT)
    assert main(["demo", "--model", "bert-base-uncased", "--out", str(tmp_path / "demo")]) == 0
    assert (tmp_path / "demo" / "attention.png").is_file() or any((tmp_path / "demo").glob("*.png"))
