"""Byte-level BPE: ids equal transformers.GPT2TokenizerFast on the same vocab.json /
merges.txt over real text, lossless round trips, clear errors for malformed files."""

import pytest

from ctxkit.tokenizers import END_OF_TEXT, ByteLevelBPETokenizer, read_lines


@pytest.fixture(scope="module")
def trained(shared_data, tmp_path_factory):
    lines = [line for line in read_lines(shared_data / "wikitext-2-raw" / "wiki.valid.raw.xz") if line.strip()]
    tok = ByteLevelBPETokenizer.train(iter(lines), vocab_size=3000, show_progress=False)
    folder = tok.save(tmp_path_factory.mktemp("bpe"))
    return tok, folder, lines


def test_ids_equal_gpt2_tokenizer_fast_and_round_trip(trained, tmp_path):
    import shutil

    transformers = pytest.importorskip("transformers")
    tok, folder, lines = trained
    for name in ("vocab.json", "merges.txt"):  # only GPT-2's own files: HF builds its tokenizer from them
        shutil.copy(folder / name, tmp_path / name)
    hf = transformers.GPT2TokenizerFast.from_pretrained(tmp_path)
    texts = lines[:1500] + ["naïve café — 東京 😀 tabs\tand  double  spaces", " leading space", "", "\n\nnewlines\n"]
    ours = tok.encode_batch(texts)
    assert ours == [hf(t)["input_ids"] for t in texts]
    assert all(tok.decode(ids) == t for ids, t in zip(ours, texts))  # lossless, even for unseen characters
    assert tok.vocab_size == 3000 and tok.eos_id == 2999 and tok.token_to_id(END_OF_TEXT) == 2999
    again = ByteLevelBPETokenizer.from_dir(folder)
    assert again.encode_batch(texts[:50]) == ours[:50]
    assert sum(len(x) for x in ours[:1500]) < 0.5 * sum(len(t.encode()) for t in texts[:1500])  # merges compress


def test_malformed_files_are_named(trained, tmp_path):
    _, folder, _ = trained
    (tmp_path / "vocab.json").write_text((folder / "vocab.json").read_text(encoding="utf-8"), encoding="utf-8")
    merges = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    (tmp_path / "merges.txt").write_text("\n".join(merges[:3] + ["Ġa b c"] + merges[3:]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"merges.txt:4: expected two space-separated tokens"):
        ByteLevelBPETokenizer.from_dir(tmp_path)
    (tmp_path / "vocab.json").write_text('{"a": 1,\n "b": }', encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab.json:2:\d+: malformed JSON"):
        ByteLevelBPETokenizer.from_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="merges.txt"):
        ByteLevelBPETokenizer.from_files(tmp_path / "vocab.json", tmp_path / "missing.txt")
    with pytest.raises(TypeError):
        trained[0].encode(None)
