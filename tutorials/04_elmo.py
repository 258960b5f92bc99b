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
# # 04 · ELMo: character CNN, highway layers, a biLM and the scalar mix
#
# **Lecture step:** ELMo (after static vectors, before BERT).
#
# **What you will see.** Every part of ELMo on a model small enough to train on a laptop:
#
# 1. how a word becomes 50 character ids (so any word, seen or not, has an input);
# 2. the character CNN: convolutions of several widths, max-pooled over the characters,
#    then highway layers and a projection, written by hand and checked against ctxkit's;
# 3. a tiny bidirectional language model (biLM) trained for about a minute on Wikipedia text:
#    a forward LSTM LM and a backward one sharing the token encoder and the softmax;
# 4. the representation layers: layer 0 is context-free, the LSTM layers are not;
# 5. the scalar mix $\gamma \sum_j s_j h_j$ (softmax-normalised $s_j$) learned by a small
#    task (chunking on CoNLL-2003) over frozen biLM layers, and which layers it picks.
#
# **Runs in** about a minute on a laptop CPU (full mode; most of it is biLM training).
# Smoke mode trains for a few steps, so its numbers mean little.
#
# The released ELMo is the same architecture at 93.6M parameters trained for weeks
# (`ctxkit.get_model("allennlp/elmo_2x4096_512_2048cnn_2xhighway")` loads it, if you can
# download it); `ctxkit pretrain-elmo` is the command-line trainer used below.

# %% tags=["parameters"]
import os
from pathlib import Path

SMOKE = os.environ.get("CTXKIT_TUTORIAL_SMOKE") == "1"
DATA = Path(os.environ.get("CTXKIT_DATA", "../../shared/data"))
TRAIN_DOCS = 4 if SMOKE else 300  # Wikipedia articles for biLM training (300: ~80k words)
VALID_DOCS = 0 if SMOKE else 30  # articles for validation perplexity (0: none)
BILM_STEPS = 6 if SMOKE else 200  # optimiser steps of BATCH x UNROLL tokens
BATCH, UNROLL = (16, 10) if SMOKE else (32, 20)
CELL, PROJ = 256, 64  # LSTM cell size and projection (representations are 2 x PROJ wide)
PROBE_TRAIN, PROBE_DEV = (60, 30) if SMOKE else (1000, 300)  # CoNLL-2003 sentences for the chunking probe
PROBE_EPOCHS = 30 if SMOKE else 60  # full-batch steps of the probe (cheap: the features are computed once)
SEED = 0

# %%
import tempfile
from itertools import islice

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from ctxkit.data.conll import read_conll
from ctxkit.models.elmo.model import CharCNN, ElmoConfig, ScalarMix, elmo_embed
from ctxkit.models.elmo.chars import word_to_char_ids
from ctxkit.models.elmo.io import load_elmo_lm
from ctxkit.pretraining.bilm import BiLMTrainConfig, train_bilm
from ctxkit.pretraining.corpus import read_documents, split_sentences, word_tokenize

torch.manual_seed(SEED)
WORK = Path(tempfile.mkdtemp(prefix="ctxkit-tutorial-04-"))

# %% [markdown]
# ## 1. Characters in, so no word is out of vocabulary
#
# ELMo's token encoder reads bytes, not a word list. Every token becomes `max_chars` = 50
# ids: begin-of-word, the UTF-8 bytes, end-of-word, padding, all shifted by one so that 0
# can mean "no token here" in a padded batch.

# %%
for word in ["bank", "Zürich", "<S>"]:
    ids = word_to_char_ids(word)
    print(f"{word!r:>9}: {ids[:10]} ... ({len(ids)} ids)")
ids = word_to_char_ids("bank")
assert ids[0] == 258 + 1 and ids[1:5] == [b + 1 for b in b"bank"] and ids[5] == 259 + 1 and ids[6:] == [261] * 44

# %% [markdown]
# ## 2. The character CNN, by hand
#
# A small configuration: character embeddings of 16, convolutions of widths 1-5 with
# 32-128 filters each (the released model has widths 1-7 and 2048 filters), max-pooled over
# the 50 positions, ReLU, two highway layers, a projection to `PROJ`. A highway layer
# computes $g \odot \mathrm{relu}(W_t x) + (1 - g) \odot x$ with a gate
# $g = \sigma(W_c x)$; its bias starts at $-2$, so a fresh layer mostly passes its input
# through, which is what lets the stack train.

# %%
arch = ElmoConfig(filters=((1, 32), (2, 32), (3, 64), (4, 128), (5, 128)), n_highway=2, char_embed_dim=16,
                  cell_size=CELL, projection_dim=PROJ, num_layers=2, dropout=0.1)
cnn = CharCNN(arch).double().eval()
chars = torch.tensor([word_to_char_ids(w) for w in ["bank", "banks", "river"]])  # (3 words, 50)

with torch.no_grad():
    x = cnn.char_embedding(chars).transpose(1, 2)                          # (words, 16, 50)
    features = torch.cat([F.relu(conv(x).amax(dim=-1)) for conv in cnn.convolutions], dim=-1)  # max over positions
    h = features                                                           # (words, 384)
    gates = []
    for hw in cnn.highways:
        g = torch.sigmoid(hw.carry(h))
        gates.append(g.mean().item())
        h = g * F.relu(hw.transform(h)) + (1 - g) * h
    by_hand = cnn.projection(h)                                            # (words, PROJ)
    torch.testing.assert_close(by_hand, cnn(chars), rtol=0.0, atol=1e-10)  # float64: the same formula
print(f"{arch.n_filters} convolution features -> highway x{arch.n_highway} -> projection {PROJ}")
print("mean highway gate at initialisation:", [round(g, 3) for g in gates], "(sigmoid(-2) = 0.119)")

# %% [markdown]
# ## 3. Train a tiny biLM on Wikipedia text
#
# The corpus: whole articles from the Wikipedia extract, split into sentences and words
# with ctxkit's rule-based splitter (what `ctxkit lm-corpus` writes for `ctxkit pretrain-elmo`),
# one sentence per line.
#
# The recipe (`train_bilm`): the forward LM predicts each next word, the backward LM each
# previous one, both from the shared character CNN and through a shared softmax (sampled
# during training). The text is one stream cut into `BATCH` rows read `UNROLL` words at a
# time; LSTM states carry from one chunk to the next (truncated back-propagation).

# %%
def write_corpus(name: str, source: str, skip: int, n_docs: int) -> Path:
    path = WORK / name
    with open(path, "w", encoding="utf-8") as f:
        for doc in islice(read_documents(DATA / "wikipedia-en-extract" / "AA" / source), skip, skip + n_docs):
            for line in doc:
                for sentence in split_sentences(line):
                    f.write(" ".join(word_tokenize(sentence)) + "\n")
    return path


train_file = write_corpus("train.txt", "wiki_00.xz", 0, TRAIN_DOCS)
valid_files = [write_corpus("valid.txt", "wiki_01.xz", 0, VALID_DOCS)] if VALID_DOCS else []
print(train_file.read_text(encoding="utf-8")[:300])

config = BiLMTrainConfig(batch_size=BATCH, unroll=UNROLL, epochs=100, max_steps=BILM_STEPS, lr=2e-3, softmax="sampled",
                         num_samples=1024, log_every=10, save_every=10**9, device="cpu", seed=SEED, progress=False)
summary = train_bilm([train_file], valid_files, WORK / "bilm", arch, config)
print(f"{summary['parameters'] / 1e6:.1f}M parameters, vocabulary {summary['vocab_size']:,} words, "
      f"{summary['train_tokens']:,} training tokens, {summary['steps']} steps in {summary['train_time_s']} s")
if summary["valid"]:
    print("validation perplexity (forward / backward):",
          round(summary["valid"]["forward_perplexity"]), "/", round(summary["valid"]["backward_perplexity"]))

losses = summary["losses"]
plt.figure(figsize=(5.5, 3))
plt.plot(range(1, len(losses) + 1), losses)
plt.xlabel("step")
plt.ylabel("loss (mean of both LMs)")
plt.title("biLM training (sampled softmax)")
plt.tight_layout()
plt.show()

# %% [markdown]
# The validation perplexity is high, as it must be after a minute on 80k words (the
# released ELMo reaches about 40 on a billion words); the loss curve still shows the model
# learning. `final/` holds the model; `load_elmo_lm` reads it back.
#
# ## 4. Representation layers: context-free at the bottom
#
# `elmo_embed` runs both LSTM stacks over whole sentences and returns, per word, layer 0
# (the character-CNN encoding, duplicated to match the width) and one layer per LSTM layer
# (forward and backward outputs concatenated).

# %%
lm, vocab = load_elmo_lm(WORK / "bilm" / "final")
bilm = lm.bilm
SENTENCES = [s.split() for s in [
    "He sat on the river bank and watched the water .",
    "The fisherman walked along the bank of the stream .",
    "She deposited the check at the bank .",
    "The bank approved my loan application ."]]
emb = elmo_embed(bilm, SENTENCES)
print("layers:", tuple(emb.layers.shape), "= (sentences, layers, words, 2 x PROJ)")
bank = torch.stack([emb.layers[i, :, s.index("bank")] for i, s in enumerate(SENTENCES)], dim=1)  # (layers, 4, dim)
unit = F.normalize(bank, dim=-1)
cos = unit @ unit.transpose(1, 2)                                    # (layers, 4, 4)
off = ~torch.eye(len(SENTENCES), dtype=torch.bool)
bank_cos = [cos[layer][off].mean().item() for layer in range(bilm.num_representation_layers)]
for layer, c in enumerate(bank_cos):
    print(f"layer {layer}: mean cosine between the four 'bank' vectors {c:.4f}")

# %% [markdown]
# Layer 0 gives "bank" the same vector in every sentence (it only sees the characters);
# the LSTM layers see the sentence, so the vectors differ. Whether they separate the senses
# depends on how well the biLM is trained: this one is not trained well enough, the
# released ELMo is (and MiniLM in tutorial 03 is).
#
# ## 5. The scalar mix, learned by a task
#
# A downstream task does not pick one layer: ELMo's task vector is
# $\gamma \sum_j \mathrm{softmax}(s)_j\, h_j$ with $s$ and $\gamma$ learned by the task while
# the biLM stays frozen. We learn it for chunking (CoNLL-2003's third column: `B-NP`, `I-VP`,
# ...): a `ScalarMix` over the three layers and a linear classifier per word.

# %%
conll = DATA / "conll2003"
train_sents = read_conll(conll / "train.txt", tag_column=2)[:PROBE_TRAIN]
dev_sents = read_conll(conll / "valid.txt", tag_column=2)[:PROBE_DEV]
tags = sorted({t for s in train_sents for t in s.tags})
tag_id = {t: i for i, t in enumerate(tags)}


def features(sents):
    e = elmo_embed(bilm, [s.words for s in sents])
    layers = e.layers.transpose(0, 1)[:, e.mask]                # (3, words in all sentences, dim)
    labels = torch.tensor([tag_id.get(t, -100) for s in sents for t in s.tags])  # tags unseen in training: ignored
    return layers, labels


X_train, y_train = features(train_sents)
X_dev, y_dev = features(dev_sents)
majority = (y_dev == torch.bincount(y_train).argmax()).float().mean().item()
print(f"{len(tags)} chunk tags; {len(y_train):,} training and {len(y_dev):,} dev words; "
      f"majority tag accuracy {majority:.3f}")

# %%
def train_probe(layers_to_mix):
    torch.manual_seed(SEED)
    mix = ScalarMix(len(layers_to_mix))
    head = torch.nn.Linear(X_train.shape[-1], len(tags))
    opt = torch.optim.Adam([*mix.parameters(), *head.parameters()], lr=1e-2)
    for _ in range(PROBE_EPOCHS):  # full-batch gradient steps: a few thousand words fit at once
        loss = F.cross_entropy(head(mix(list(X_train[layers_to_mix]))), y_train, ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = head(mix(list(X_dev[layers_to_mix]))).argmax(-1)
    keep = y_dev >= 0
    return mix, (pred[keep] == y_dev[keep]).float().mean().item()


mix, mixed_acc = train_probe([0, 1, 2])
single = {layer: train_probe([layer])[1] for layer in range(3)}
weights = mix.weights().detach()
print("learned layer weights softmax(s):", weights.numpy().round(3), " gamma:", round(mix.gamma.item(), 3))
print("dev accuracy: mix", round(mixed_acc, 3), "| single layers", {k: round(v, 3) for k, v in single.items()})

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
ax1.bar(["layer 0\n(char CNN)", "layer 1\n(LSTM)", "layer 2\n(LSTM)"], weights.numpy())
ax1.axhline(1 / 3, color="grey", ls=":", label="start (equal)")
ax1.set(ylabel="softmax(s)", title="scalar-mix weights for chunking")
ax1.legend()
ax2.bar(["majority", "layer 0", "layer 1", "layer 2", "mix"], [majority, *single.values(), mixed_acc],
        color=["grey", "C0", "C0", "C0", "C1"])
ax2.set(ylabel="dev accuracy", ylim=(0, 1), title="chunking probe")
plt.tight_layout()
plt.show()

# %% [markdown]
# Even after a minute of pretraining, the LSTM layers beat the character layer on their own
# (in full mode, about 0.7 against 0.6 dev accuracy): the context a biLM reads in helps to
# tell `B-NP` from `I-NP`. The task moved the mix weights off their equal start towards the
# LSTM layers, and the first LSTM layer alone does about as well as the mix, in line with
# Peters et al. (2018), who found syntactic tasks favour the lower biLSTM layer. (In smoke
# mode the biLM has barely trained, so the picture is different.)
#
# ## What we checked

# %%
assert emb.layers.shape[:2] == (len(SENTENCES), 3) and emb.layers.shape[-1] == 2 * PROJ
assert bank_cos[0] > 1 - 1e-6                      # layer 0 is context-free: one vector for every "bank"
assert max(bank_cos[1:]) < 0.999                   # the LSTM layers are not
torch.testing.assert_close(weights.sum(), torch.tensor(1.0))
assert summary["steps"] == BILM_STEPS and losses[-1] < losses[0]
assert mixed_acc > majority + 0.05                 # the frozen features carry chunk information
if not SMOKE:
    assert mixed_acc > majority + 0.3 and min(single.values()) > majority + 0.1
print("all checks passed")
