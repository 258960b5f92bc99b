# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Static word vectors vs. contextual ones: "retail bank or river bank?"
#
# **Lecture step:** from word vectors to contextual representations (the motivation for
# ELMo and BERT, after the Transformer).
#
# **What you will see.**
#
# 1. word2vec (skip-gram with negative sampling) trained on the Penn Treebank: nearest
#    neighbours and analogies, the classic demonstrations of what a static vector knows;
# 2. fastText's sub-word vectors on the same text: vectors for words never seen in training,
#    and the price of spelling similarity;
# 3. the limit of both: one vector per word *type*, whatever the sentence;
# 4. the pretrained all-MiniLM-L6-v2 Transformer giving "bank" a different vector in every
#    sentence, with the river sense and the money sense pulling apart layer by layer (the
#    `ctxkit demo` experiment, rebuilt step by step).
#
# **Runs in** about a minute on a laptop CPU (full mode: both vector models on the whole
# PTB training set, 0.9M tokens); smoke mode trains on a small slice, whose
# neighbours are mostly noise.

# %% tags=["parameters"]
import os
from pathlib import Path

SMOKE = os.environ.get("CTXKIT_TUTORIAL_SMOKE") == "1"
DATA = Path(os.environ.get("CTXKIT_DATA", "../../shared/data"))
N_SENTENCES = 1500 if SMOKE else None  # PTB training sentences (None: all 42k, 0.9M tokens)
EPOCHS = 1 if SMOKE else 3  # word2vec passes over the corpus
FT_EPOCHS = 1 if SMOKE else 2  # fastText passes (each costs about twice a word2vec pass)
DIM = 50 if SMOKE else 100  # vector size
BUCKETS = 20_000 if SMOKE else 200_000  # fastText n-gram hash buckets (fastText's own default is 2M)
SEED = 0
CHECKPOINT = "all_minilm_l6_v2"

# %%
from itertools import islice

import matplotlib.pyplot as plt
import numpy as np

import ctxkit
from ctxkit.pretraining.word2vec import train_word2vec
from ctxkit.tokenizers import read_lines

# %% [markdown]
# ## 1. The corpus: Penn Treebank
#
# Mikolov's PTB release: Wall Street Journal text, lowercased, numbers replaced by `N`, the
# 10k most frequent words kept and the rest mapped to `<unk>`; one sentence per line, words
# separated by spaces. `read_lines` reads the `.xz` file directly.

# %%
ptb = DATA / "ptb" / "ptb.train.txt.xz"
sentences = [line.split() for line in islice(read_lines(ptb), N_SENTENCES)]
print(f"{len(sentences):,} sentences, {sum(map(len, sentences)):,} tokens")
print(" ".join(sentences[5]))

# %% [markdown]
# ## 2. word2vec: skip-gram with negative sampling
#
# Each word predicts the words within a random window around it. For every (word, context)
# pair the model raises $\sigma(v_w \cdot u_c)$ and lowers it for `negative` words drawn from
# the unigram distribution to the power 3/4. Frequent words are subsampled. Training takes
# under a minute for the whole PTB on one CPU thread.

# %%
w2v = train_word2vec(sentences, model="skipgram", dim=DIM, window=5, negative=5, min_count=5, epochs=EPOCHS,
                     seed=SEED, progress=False)
print(w2v, f"- {w2v.meta['seconds']:.1f} s, loss per epoch {w2v.meta['epoch_losses']}")


def show_neighbours(vectors, words, k=6):
    for word in words:
        if not vectors.has_vector(word):
            print(f"{word:>12}: (no vector)")
            continue
        near = vectors.most_similar(word, k)
        print(f"{word:>12}: " + ", ".join(f"{w} {c:.2f}" for w, c in near))


PROBES = ["monday", "rose", "buy", "president", "bank"]
show_neighbours(w2v, PROBES)

# %% [markdown]
# Words used in the same contexts end up close: days of the week, verbs of price movement
# (*rose, fell, climbed*), *buy/sell*. Note that nearest neighbours mix synonyms with
# antonyms: *rose* and *fell* share their contexts almost exactly.
#
# ### Analogies
#
# `analogy(a, b, c)` returns the words closest to $v_b - v_a + v_c$ (3CosAdd), excluding the
# three inputs: *a is to b as c is to ?*

# %%
ANALOGIES = [("japan", "japanese", "germany"), ("he", "his", "she"), ("rose", "fell", "up"),
             ("company", "companies", "bank")]


def show_analogies(vectors):
    answers = {}
    for a, b, c in ANALOGIES:
        if all(vectors.has_vector(w) for w in (a, b, c)):
            top = vectors.analogy(a, b, c, k=3)
            answers[(a, b, c)] = top[0][0]
            print(f"{a} : {b} :: {c} : " + ", ".join(f"{w} ({s:.2f})" for w, s in top))
    return answers


w2v_answers = show_analogies(w2v)

# %% [markdown]
# A picture of a few groups of words, projected from `DIM` dimensions onto the two
# principal directions of their vectors:

# %%
GROUPS = {"days": ["monday", "tuesday", "wednesday", "thursday", "friday"],
          "movement": ["rose", "fell", "climbed", "dropped", "jumped"],
          "people": ["president", "chairman", "executive", "analyst", "director"],
          "numbers": ["million", "billion", "thousand", "hundred"]}
words = [w for group in GROUPS.values() for w in group if w2v.has_vector(w)]
X = np.stack([w2v[w] for w in words])
X = X - X.mean(0)
xy = X @ np.linalg.svd(X, full_matrices=False)[2][:2].T  # (words, 2): the first two principal components
plt.figure(figsize=(5.5, 4))
for name, group in GROUPS.items():
    idx = [i for i, w in enumerate(words) if w in group]
    plt.scatter(xy[idx, 0], xy[idx, 1], label=name)
    for i in idx:
        plt.annotate(words[i], xy[i], fontsize=8)
plt.legend(fontsize=8)
plt.title("word2vec on PTB, 2 principal components")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 3. fastText: vectors from character n-grams
#
# fastText represents a word as its own vector plus the vectors of its character 3- to
# 6-grams (`<st`, `sto`, ..., `ock>`), hashed into `BUCKETS` rows. A word never seen in
# training still gets a vector, the mean of its n-grams. word2vec has none to offer.

# %%
ft = train_word2vec(sentences, model="skipgram", dim=DIM, window=5, negative=5, min_count=5, epochs=FT_EPOCHS,
                    subwords=True, minn=3, maxn=6, buckets=BUCKETS, seed=SEED, progress=False)
print(ft, f"- {ft.meta['seconds']:.1f} s")
UNSEEN = ["stockholder", "investors'", "shareholdings"]  # not in the PTB vocabulary
for word in UNSEEN:
    print(f"{word!r}: in the vocabulary: {word in ft}; word2vec vector: {w2v.has_vector(word)}; "
          f"fastText vector: {ft.has_vector(word)}")
show_neighbours(ft, UNSEEN + ["stock", "million"])


def shares_spelling(word, other, n=4):
    """Whether the two words have a piece of n letters in common."""
    return any(word[i:i + n] in other for i in range(len(word) - n + 1))


spelling_relatives = {w: sum(shares_spelling(w, x) for x, _ in ft.most_similar(w, 5)) for w in UNSEEN}
print("of the 5 nearest neighbours, how many share 4 letters with the word:", spelling_relatives)

# %% [markdown]
# Sub-words help rare and unseen forms: *stockholder*, never seen in training, lands among
# *stockholders* and other *stock* words, *investors'* next to *investors*. They also pull
# in look-alikes: *stock* sits next to *stockholm*, *million* next to *bullion*. Spelling is
# evidence, not meaning.
#
# ## 4. One vector per word type
#
# Whatever the sentence, `w2v["bank"]` is the same vector. In PTB nearly every *bank* is a
# financial institution, so the vector knows that sense; a river bank gets the same vector.
# Contextual models give each *occurrence* its own vector, computed from the sentence.
#
# ## 5. Contextual vectors: "bank" in eight sentences
#
# The pretrained all-MiniLM-L6-v2 (a 6-layer BERT) embeds each sentence; `ctxkit.embed`
# pools sub-words back to words and returns one vector per word from the layers we ask for.
# We take every layer at once (`layers=[0, ..., 6]`, concatenated; layer 0 is the input
# embedding plus the position embedding) and compare the vectors of "bank".

# %%
RIVER = ["He sat on the river bank and watched the water.",
         "The fisherman walked along the bank of the stream.",
         "The boat drifted toward the grassy bank of the river.",
         "We had a picnic on the bank of the river."]
MONEY = ["She deposited the check at the bank.",
         "The bank approved my loan application.",
         "The bank raised its interest rates again.",
         "I withdrew cash from the bank this morning."]
texts, senses = RIVER + MONEY, ["river"] * len(RIVER) + ["money"] * len(MONEY)

model, tokenizer = ctxkit.get_model("bert_6_384_12", checkpoint=CHECKPOINT)
n_layers, hidden = model.config.num_layers + 1, model.config.hidden_size
words = ctxkit.embed(texts, model=(model, tokenizer), layers=list(range(n_layers)))
bank = np.stack([w.vectors[[x.lower() for x in w.words].index("bank")] for w in words])  # (8, 7 * 384)
bank = bank.reshape(len(texts), n_layers, hidden).transpose(1, 0, 2)                       # (layer, sentence, 384)
print(words[0].words, "->", words[0].vectors.shape)


def cosine_matrix(v):
    v = v / np.linalg.norm(v, axis=-1, keepdims=True)
    return v @ v.swapaxes(-1, -2)


labels = np.array(senses)
same_sense = (labels[:, None] == labels[None, :]) & ~np.eye(len(labels), dtype=bool)
other_sense = labels[:, None] != labels[None, :]
sims = cosine_matrix(bank)                                    # (layer, 8, 8)
within = np.array([s[same_sense].mean() for s in sims])
across = np.array([s[other_sense].mean() for s in sims])
for layer in range(n_layers):
    print(f"layer {layer}: within a sense {within[layer]:.3f}, across senses {across[layer]:.3f}")

# %% [markdown]
# For comparison, the model's own *static* vector of "bank": its row of the input
# word-embedding table, the same in every sentence (what `ctxkit demo` prints beside the
# contextual matrix).

# %%
row = model.embeddings.word_embeddings.weight[tokenizer.token_to_id("bank")].detach().numpy()
static = cosine_matrix(np.stack([row] * len(texts)))
short = [f"{s[:3]}{i % 4 + 1}" for i, s in enumerate(senses)]
fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), layout="constrained")
for ax, matrix, title in ((axes[0], static, "static: embedding-table row"), (axes[1], sims[-1], "contextual: last layer")):
    im = ax.imshow(matrix, vmin=0.5, vmax=1.0, cmap="viridis")
    ax.set_xticks(range(len(short)), short, rotation=90, fontsize=8)
    ax.set_yticks(range(len(short)), short, fontsize=8)
    ax.set_title(f"cos(bank, bank), {title}", fontsize=9)
fig.colorbar(im, ax=axes[1], label="cosine")
axes[2].plot(within, "o-", label="same sense")
axes[2].plot(across, "o-", label="different senses")
axes[2].set(xlabel="layer (0 = embeddings)", ylabel="mean cosine", title="bank vs bank, by layer")
axes[2].legend()
plt.show()

# %% [markdown]
# At layer 0 the eight "bank" vectors differ only by their position embeddings, so all are
# nearly identical. From the first Transformer layer on, the river banks stay close to each
# other and move away from the money banks: the context has been mixed in. (The command
# line version: `ctxkit demo`, which also runs "bat" and "crane".)
#
# ## What we checked

# %%
assert np.allclose(static, 1.0)                                 # one static vector: every pair has cosine 1
assert np.all(within[1:] > across[1:])                          # every Transformer layer separates the senses
assert (within - across)[-1] > 5 * (within - across)[0]         # and far more than the input layer does
assert words[1].words[:3] == ["The", "fisherman", "walked"] and bank.shape == (n_layers, len(texts), hidden)
assert not w2v.has_vector("stockholder") and ft.has_vector("stockholder")  # fastText covers unseen words
assert len(w2v.most_similar("bank", 5)) == 5
if not SMOKE:
    # facts of the whole PTB (seed 0), each with a wide margin over the runner-up
    assert {"tuesday", "thursday", "wednesday", "friday"} & {w for w, _ in w2v.most_similar("monday", 3)}
    assert w2v.most_similar("rose", 1)[0][0] == "fell"
    assert w2v_answers[("japan", "japanese", "germany")] == "german"
    assert w2v_answers[("he", "his", "she")] == "her"
    assert all(n >= 2 for n in spelling_relatives.values())  # unseen words land among their spelling relatives
    assert "investors" in {w for w, _ in ft.most_similar("investors'", 3)}
print("all checks passed")
