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
# # 05 · BERT's pretraining tasks on real text: masked LM and next-sentence pairs
#
# **Lecture step:** BERT (after ELMo).
#
# **What you will see.** The data side of BERT pretraining, on Wikipedia articles, with the
# WordPiece vocabulary of the real all-MiniLM-L6-v2 checkpoint:
#
# 1. raw articles → sentences → `[CLS] A [SEP] B [SEP]` pairs with their next-sentence
#    label (IsNext / NotNext), exactly as `ctxkit pretrain-data` writes them to shards;
# 2. how balanced those labels really are, and why not exactly 50/50;
# 3. masked-LM corruption: 15 % of the tokens chosen, of which 80 % become `[MASK]`,
#    10 % a random token and 10 % stay, counted over many draws and tested against
#    those proportions; whole-word masking;
# 4. what a pretrained encoder makes of the NSP pairs: all-MiniLM-L6-v2 sentence vectors
#    tell most NotNext pairs from IsNext ones by topic alone, the weakness that led RoBERTa
#    to drop NSP and ALBERT to replace it.
#
# (all-MiniLM-L6-v2 was fine-tuned for sentence similarity and ships without BERT's MLM and
# NSP heads, so it cannot fill in a `[MASK]`; we use its tokenizer and its encoder only.)
#
# **Runs in** about 20 seconds on a laptop CPU (full mode).

# %% tags=["parameters"]
import os
from pathlib import Path

SMOKE = os.environ.get("CTXKIT_TUTORIAL_SMOKE") == "1"
DATA = Path(os.environ.get("CTXKIT_DATA", "../../shared/data"))
N_DOCS = 50 if SMOKE else 600  # Wikipedia articles (wiki_00 holds 620 non-empty ones)
MAX_SEQ_LEN = 64  # tokens per pair, [CLS] and both [SEP] included (BERT: 128, then 512)
MASK_BATCHES = 4 if SMOKE else 100  # batches of 32 pairs masked afresh, for the 80/10/10 counts
NSP_PAIRS = 24 if SMOKE else 300  # pairs embedded with MiniLM
SEED = 0
CHECKPOINT = "all_minilm_l6_v2"

# %%
import math
import tempfile
from itertools import islice

import matplotlib.pyplot as plt
import numpy as np
import torch

import ctxkit
from ctxkit.pretraining import (MaskingConfig, MLMCollator, PretrainDataset, build_shards, read_documents,
                                split_sentences)

WORK = Path(tempfile.mkdtemp(prefix="ctxkit-tutorial-05-"))
WIKI = DATA / "wikipedia-en-extract" / "AA" / "wiki_00.xz"
model, tokenizer = ctxkit.get_model("bert_6_384_12", checkpoint=CHECKPOINT)
tokenizer.save(WORK / "tokenizer")  # the shard builder reads a tokenizer folder, as `ctxkit pretrain-data --tokenizer` does
print(f"WordPiece vocabulary of {tokenizer.vocab_size:,} tokens; specials:",
      {t: tokenizer.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")})

# %% [markdown]
# ## 1. From articles to sentence pairs
#
# The extract is in WikiExtractor's format (`<doc ...>` blocks). `read_documents` yields each
# article as its lines, `split_sentences` cuts lines into sentences with a small rule set
# (abbreviations and initials do not end a sentence):

# %%
article = next(islice(read_documents(WIKI), 3, None))
for sentence in [s for line in article for s in split_sentences(line)][:4]:
    print("•", sentence)

# %% [markdown]
# `build_shards` (the engine of `ctxkit pretrain-data`) tokenizes every sentence and makes
# pairs with BERT's recipe: fill a chunk with consecutive sentences up to the target length,
# cut it at a random sentence boundary into A and B; with probability 0.5 replace B by
# sentences from another article (label 1, NotNext). Pairs are written as memory-mapped
# shards, which `PretrainDataset` reads back.

# %%
meta = build_shards([WIKI], WORK / "tokenizer", WORK / "shards", max_seq_len=MAX_SEQ_LEN, limit_docs=N_DOCS,
                    workers=1, seed=SEED, show_progress=False)
data = PretrainDataset(WORK / "shards")
print(f"{meta['num_documents']} articles -> {len(data):,} pairs, {meta['num_tokens']:,} tokens")


def show_pair(features):
    tokens = tokenizer.convert_ids_to_tokens(features["input_ids"])
    sep = tokens.index("[SEP]")
    label = "NotNext" if features["next_sentence_label"] else "IsNext"
    print(f"{label}:\n  A: {' '.join(tokens[1:sep])}\n  B: {' '.join(tokens[sep + 1:-1])}")


def segment_lengths(features):
    sep = features["input_ids"].index(tokenizer.sep_id)
    return sep - 1, len(features["input_ids"]) - sep - 2


def first_pair(label):  # the first pair with this label whose segments both have 8 tokens or more
    return next(i for i in range(len(data))
                if data[i]["next_sentence_label"] == label and min(segment_lengths(data[i])) >= 8)


is_next, not_next = first_pair(0), first_pair(1)
show_pair(data[is_next])
show_pair(data[not_next])
print("segment ids:", data[is_next]["token_type_ids"])

# %% [markdown]
# ## 2. Is it 50/50?
#
# Not quite. The coin is tossed only for chunks of two or more sentences; a chunk of one
# sentence (a one-sentence article, or the last sentence of one) has no next sentence to
# offer, so it always gets a random one. Google's `create_pretraining_data.py` does the
# same. We count the labels, with a binomial 99.99 % interval around one half, and build the
# same pairs once more with the coin set to never (`nsp_prob=0`): what is left NotNext
# then is exactly the forced part.

# %%
labels = np.array([data[i]["next_sentence_label"] for i in range(len(data))])
share = labels.mean()
sigma = math.sqrt(0.25 / len(labels))  # standard deviation of the share under a fair coin
forced = build_shards([WIKI], WORK / "tokenizer", WORK / "shards_no_coin", max_seq_len=MAX_SEQ_LEN, limit_docs=N_DOCS,
                      workers=1, seed=SEED, nsp_prob=0.0, show_progress=False)
forced_share = forced["num_random_next"] / forced["num_instances"]
print(f"NotNext share {share:.3f} of {len(labels):,} pairs (a fair coin alone: 0.5 ± {4 * sigma:.3f})")
print(f"with nsp_prob=0, {forced_share:.3f} of the pairs are still NotNext: one-sentence chunks")

# %% [markdown]
# The excess over one half is about half the forced share, as it should be: on top of the
# forced pairs, the coin makes half of the others NotNext. A pretraining corpus of long
# documents has fewer one-sentence chunks and comes closer to 50/50.
#
# ## 3. Masked LM: 15 %, then 80/10/10
#
# Masking is not stored in the shards: `MLMCollator` draws it afresh every time a batch is
# made (RoBERTa's dynamic masking). Per sequence, `round(0.15 · n)` of its `n` ordinary
# tokens are chosen (never `[CLS]`, `[SEP]` or `[PAD]`); each chosen token becomes `[MASK]`
# with probability 0.8, a random vocabulary token with 0.1, and stays as it is with 0.1. The
# `labels` hold the original token at chosen positions and -100 (ignored by the loss)
# elsewhere.

# %%
collator = MLMCollator(tokenizer, MaskingConfig(mask_prob=0.15), seed=SEED)
features = [data[i] for i in range(32)]
batch = collator(features)
print({k: tuple(v.shape) for k, v in batch.items()})


def show_masked(row):
    original = features[row]["input_ids"]
    out = []
    for pos, (new, old, label) in enumerate(zip(batch["input_ids"][row].tolist(), original, batch["labels"][row].tolist())):
        if label == -100:
            out.append(tokenizer.id_to_token(new))
        elif new == tokenizer.mask_id:
            out.append(f"[MASK]<{tokenizer.id_to_token(old)}>")
        elif new == old:
            out.append(f"={tokenizer.id_to_token(old)}=")              # chosen but kept
        else:
            out.append(f"~{tokenizer.id_to_token(new)}<{tokenizer.id_to_token(old)}>")  # random replacement
    print(" ".join(out))


show_masked(0)
print("legend: [MASK]<original>, ~random<original>, =kept=")

# %% [markdown]
# Now count over `MASK_BATCHES` batches, each masked afresh, and compare with the recipe.
# The number chosen per sequence is deterministic; the 80/10/10 split is one independent
# draw per chosen token, so each share is binomial and we allow 5 standard deviations
# (for the three shares together, a false alarm about once in half a million runs; the
# collator is seeded, so this notebook gives the same counts every time anyway).

# %%
n_allowed = tokenizer.vocab_size - 4  # random replacements avoid [PAD], [CLS], [SEP], [MASK]
# a random draw may hit the original token: it then counts as kept
expected = {"[MASK]": 0.8, "random": 0.1 * (1 - 1 / n_allowed), "kept": 0.1 + 0.1 / n_allowed}
counts = dict.fromkeys(expected, 0)
chosen_ok = True
special = torch.tensor([tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id])
for b in range(MASK_BATCHES):
    feats = [data[(b * 32 + i) % len(data)] for i in range(32)]
    out = collator(feats)  # a fresh draw every call
    ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(f["input_ids"]) for f in feats], batch_first=True,
                                          padding_value=tokenizer.pad_id)  # the unmasked batch, padded the same way
    chosen = out["labels"] != -100
    n_candidates = (~torch.isin(ids, special)).sum(1)
    chosen_ok &= torch.equal(chosen.sum(1), torch.round(n_candidates * 0.15).long().clamp(min=1))
    new, old = out["input_ids"][chosen], ids[chosen]
    counts["[MASK]"] += int((new == tokenizer.mask_id).sum())
    counts["kept"] += int((new == old).sum())
    counts["random"] += int(((new != old) & (new != tokenizer.mask_id)).sum())
total = sum(counts.values())
observed = {k: v / total for k, v in counts.items()}
z = {k: (observed[k] - p) / math.sqrt(p * (1 - p) / total) for k, p in expected.items()}
for k in expected:
    print(f"{k:>7}: observed {observed[k]:.4f}, expected {expected[k]:.4f}, z = {z[k]:+.2f}")
print(f"{total:,} chosen tokens; every sequence had exactly round(0.15 n) chosen: {chosen_ok}")

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
names = list(expected)
ax1.bar(names, [observed[k] for k in names], yerr=[5 * math.sqrt(expected[k] * (1 - expected[k]) / total) for k in names],
        capsize=6, label="observed ± 5σ")
ax1.scatter(names, [expected[k] for k in names], color="C3", zorder=3, label="recipe")
ax1.set(ylabel="share of chosen tokens", title=f"masked-LM corruption, {total:,} tokens")
ax1.legend()
ax2.bar(["IsNext", "NotNext"], [1 - share, share])
ax2.axhline(0.5, color="grey", ls=":")
ax2.set(ylabel="share of pairs", title=f"next-sentence labels, {len(labels):,} pairs")
plt.tight_layout()
plt.show()

# %% [markdown]
# ### Whole-word masking
#
# WordPiece splits rare words (`##` marks a continuation). Masking one piece of a word leaves
# the rest as a strong hint; whole-word masking (`whole_word=True`, used by the later BERT
# releases) chooses whole words and masks all their pieces together.

# %%
row = next(i for i, f in enumerate(features) if any(t.startswith("##") for t in tokenizer.convert_ids_to_tokens(f["input_ids"])))
wwm = MLMCollator(tokenizer, MaskingConfig(mask_prob=0.3, whole_word=True), seed=SEED)([features[row]])
tokens = tokenizer.convert_ids_to_tokens(features[row]["input_ids"])
chosen = (wwm["labels"][0] != -100).tolist()
print(" ".join(f"[{t}]" if c else t for t, c in zip(tokens, chosen)))
# a chosen continuation piece always comes with the piece before it
assert all(chosen[i - 1] for i, t in enumerate(tokens) if t.startswith("##") and chosen[i])

# %% [markdown]
# ## 4. What does a pretrained encoder see in the NSP pairs?
#
# A NotNext B comes from another article, so it is usually about something else. Mean-pooled
# all-MiniLM-L6-v2 vectors of A and B, compared by cosine, separate the two labels without
# any training on NSP: the task can be solved by topic, without modelling what follows what.
# That is why RoBERTa found NSP unnecessary and ALBERT replaced it with sentence-order
# prediction (both segments from the same text, only the order swapped).

# %%
pairs = [data[i] for i in range(min(NSP_PAIRS, len(data)))]


def segments(features):
    ids = features["input_ids"]
    sep = ids.index(tokenizer.sep_id)
    return tokenizer.decode(ids[1:sep]), tokenizer.decode(ids[sep + 1:-1])


a_texts, b_texts = zip(*(segments(f) for f in pairs))
vec_a = ctxkit.embed(list(a_texts), model=(model, tokenizer), pooling="mean")
vec_b = ctxkit.embed(list(b_texts), model=(model, tokenizer), pooling="mean")
cosine = (vec_a * vec_b).sum(1) / (np.linalg.norm(vec_a, axis=1) * np.linalg.norm(vec_b, axis=1))
y = np.array([f["next_sentence_label"] for f in pairs])
# AUC: the chance that a random IsNext pair is more similar than a random NotNext pair
auc = (cosine[y == 0][:, None] > cosine[y == 1][None, :]).mean()
print(f"{len(pairs)} pairs: mean cosine IsNext {cosine[y == 0].mean():.2f}, NotNext {cosine[y == 1].mean():.2f}; AUC {auc:.3f}")

plt.figure(figsize=(5.5, 3))
bins = np.linspace(-0.2, 1, 25)
plt.hist(cosine[y == 0], bins=bins, alpha=0.6, label="IsNext")
plt.hist(cosine[y == 1], bins=bins, alpha=0.6, label="NotNext")
plt.xlabel("cosine(A, B), MiniLM mean-pooled vectors")
plt.ylabel("pairs")
plt.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## What we checked

# %%
assert all(data[i]["input_ids"][0] == tokenizer.cls_id and data[i]["input_ids"][-1] == tokenizer.sep_id
           for i in range(len(data)))
assert max(len(data[i]["input_ids"]) for i in range(len(data))) <= MAX_SEQ_LEN
assert chosen_ok                                             # exactly round(15 %) per sequence
assert all(abs(v) < 5 for v in z.values()), z                # 80/10/10 within 5 standard deviations
assert forced_share > 0                                      # one-sentence chunks are always NotNext
assert -4 * sigma < share - 0.5 < forced_share + 4 * sigma   # a fair coin plus (at most) the forced part
assert auc > 0.75                                            # topic alone gives most NSP labels away
print("all checks passed")
