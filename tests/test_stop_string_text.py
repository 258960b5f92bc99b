"""StopStringText: the streamed pieces of a continuation are its text decoded at once.

The pieces are decoded incrementally (a few tokens of context, not the whole continuation), so
the property checked here is the one the generation server and ``ctxkit generate`` rely on:
for any ids and any stop strings, the pieces joined equal ``decode(all ids)`` cut at the first
stop string, and every prefix of the pieces is a prefix of that text (nothing is taken back).
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkit.decoding.streamers import StopStringText
from ctxkit.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer
from ctxkit.tokenizers.char import CharTokenizer

TEXT = ("The café served crème brûlée; naïve coöperation — 日本語のテキスト, ß and emoji 🙂🙃. "
        "Don't stop: it's the end of the line, isn't it? ") * 20


@pytest.fixture(scope="module")
def tokenizers(minilm_dir):
    bpe = ByteLevelBPETokenizer.train(iter([TEXT]), vocab_size=400, min_frequency=2, show_progress=False)
    return {"byte-level BPE": bpe, "WordPiece (MiniLM)": WordPieceTokenizer.from_dir(minilm_dir), "bytes": CharTokenizer(None)}


def stream(tokenizer, ids, stops):
    text = StopStringText(tokenizer, stops)
    pieces = []
    for token in ids:
        pieces.append(text.push(token))
        if text.stopped:
            break
    pieces.append(text.flush())
    return pieces


def expected(tokenizer, ids, stops):
    """What the pieces must join to: every id decoded at once, cut at the first stop string
    (the tokens after the one that completed it are never pushed)."""
    for n in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:n])
        cuts = [text.find(s) for s in stops if s and s in text]
        if cuts:
            return text[: min(cuts)]
    return tokenizer.decode(ids)


@pytest.mark.parametrize("name", ["byte-level BPE", "WordPiece (MiniLM)", "bytes"])
def test_pieces_of_real_text_join_to_the_whole_decode(tokenizers, name):
    tokenizer = tokenizers[name]
    ids = tokenizer.encode(TEXT[:400])
    if name == "WordPiece (MiniLM)":  # the text's pieces, without [CLS], [SEP] and padding
        ids = [i for i in ids.input_ids if i is not None and i not in (0, 101, 102)]
    pieces = stream(tokenizer, ids, [])
    assert "".join(pieces) == tokenizer.decode(ids)
    if name == "bytes":  # one byte a token: a multi-byte character comes out whole, once
        assert "日" in pieces and "🙂" in pieces
    stops = ["isn't", "日本"]
    assert "".join(stream(tokenizer, ids, stops)) == expected(tokenizer, ids, stops)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("name", ["byte-level BPE", "WordPiece (MiniLM)", "bytes"])
def test_any_ids_and_stop_strings_stream_the_text_decoded_at_once(tokenizers, name, data):
    tokenizer = tokenizers[name]
    high = {"byte-level BPE": 400, "WordPiece (MiniLM)": 30522, "bytes": 256}[name]
    ids = data.draw(st.lists(st.integers(0, high - 1), max_size=40), label="ids")
    whole = tokenizer.decode(ids)
    # A stop string is looked for in final text: U+FFFD standing in for a character whose
    # bytes have not all arrived is not text yet (a real U+FFFD is, once the next token came).
    stops = data.draw(st.lists(st.one_of(st.text(max_size=3), st.sampled_from([whole[i:i + 3] for i in range(len(whole))] or [""]))
                               .filter(lambda s: "\ufffd" not in s), max_size=2), label="stops")
    pieces = stream(tokenizer, ids, stops)
    want = expected(tokenizer, ids, stops)
    assert "".join(pieces) == want
    for k in range(len(pieces)):  # never taken back: every prefix of the stream is final
        assert want.startswith("".join(pieces[:k]))
