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
# # 02 · The Transformer for translation (Multi30k, German → English)
#
# **Lecture step:** the Transformer (after 01, attention from scratch).
#
# **What you will see.** The whole encoder-decoder recipe on real data, small enough for a
# laptop: a joint byte-level BPE vocabulary learned from both languages, a 2+2-layer
# Transformer trained with teacher forcing and label smoothing on short Multi30k sentence
# pairs, its loss curve, BLEU on held-out sentences, greedy and beam-search translations side
# by side, and the encoder-decoder attention of one sentence drawn as an alignment.
#
# **Runs in** about a minute on a laptop CPU (full mode: 300 training steps, most of the
# time); smoke mode trains for a few steps only, so its translations are gibberish, which
# is expected.
#
# The full-size recipe (`ctxkit translate-train ... --preset transformer_3_512_8`, 60 epochs
# on a GPU, BLEU 40.5 on test2016) is in `docs/results.md`; this is the same code path at
# one thousandth of the compute.

# %% tags=["parameters"]
import os
from pathlib import Path

SMOKE = os.environ.get("CTXKIT_TUTORIAL_SMOKE") == "1"
DATA = Path(os.environ.get("CTXKIT_DATA", "../../shared/data"))
MAX_WORDS = 10  # keep sentence pairs of at most this many words per side: short pairs learn fastest
N_TRAIN = 200 if SMOKE else 10000  # training pairs (Multi30k has 29k)
N_VALID = 8 if SMOKE else 200  # validation pairs for BLEU
STEPS = 4 if SMOKE else 300  # optimiser steps of BATCH_SIZE pairs
BATCH_SIZE = 16 if SMOKE else 64
VOCAB_SIZE = 400 if SMOKE else 1000  # joint byte-level BPE vocabulary
HIDDEN = 128  # model width; 4 heads, FFN 4 x HIDDEN, 2 encoder + 2 decoder layers
LR = 3e-3
BEAMS = 4
DEVICE = "cpu"  # "auto" takes a GPU when there is one
SEED = 0

# %%
import json
import math
import tempfile

import matplotlib.pyplot as plt
import torch
from IPython.display import Image, display

from ctxkit.core.plots import plot_alignment
from ctxkit.models.seq2seq.model import TransformerSeq2Seq
from ctxkit.tasks.translation import SPECIALS, alignment, bleu, load_translator, read_parallel, train_translation, translate
from ctxkit.training import TrainConfig

# ctxkit.core.plots switches matplotlib to its file-only "Agg" backend when imported
# (it writes PNGs, such as the run's curve.png); switch the notebook back to inline figures.
# %matplotlib inline

WORK = Path(tempfile.mkdtemp(prefix="ctxkit-tutorial-02-"))
M30K = DATA / "multi30k"

# %% [markdown]
# ## 1. The data: short German-English pairs
#
# Multi30k pairs one German and one English description of a Flickr photo. The files are
# line-aligned; `read_parallel` checks that (same line count, no empty line on one side
# only). We keep the pairs of at most `MAX_WORDS` words and write the slice to a temporary
# folder, because the trainer reads files (as `ctxkit translate-train` does).

# %%
def short_pairs(split: str, n: int):
    pairs = read_parallel(M30K / f"{split}.de", M30K / f"{split}.en")
    keep = [(de, en) for de, en in pairs if len(de.split()) <= MAX_WORDS and len(en.split()) <= MAX_WORDS]
    return pairs, keep[:n]


def write_pairs(pairs, name: str):
    for side, lang in ((0, "de"), (1, "en")):
        (WORK / f"{name}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
    return WORK / f"{name}.de", WORK / f"{name}.en"


all_train, train_pairs = short_pairs("train", N_TRAIN)
_, valid_pairs = short_pairs("val", N_VALID)
train_files, valid_files = write_pairs(train_pairs, "train"), write_pairs(valid_pairs, "valid")
print(f"{len(all_train)} training pairs in Multi30k; using {len(train_pairs)} of <= {MAX_WORDS} words, "
      f"{len(valid_pairs)} validation pairs")
for de, en in train_pairs[:3]:
    print(f"  {de}\n  -> {en}")

# %% [markdown]
# ## 2. Train
#
# `train_translation` is what `ctxkit translate-train` runs: it learns a joint byte-level
# BPE vocabulary on both sides of the training text (so source and target share one
# embedding matrix, tied with the output projection), builds a `TransformerSeq2Seq` from a
# preset with our overrides, and trains it with the shared `Trainer`: teacher forcing (the
# decoder reads the reference shifted right, under a causal mask), cross-entropy with label
# smoothing 0.1, AdamW, warmup then linear decay. Pre-norm layers (`norm_first=True`) train
# stably at this learning rate without the paper's long warmup.

# %%
config = TrainConfig(
    epochs=STEPS * BATCH_SIZE / len(train_pairs), max_steps=STEPS,  # the schedule spans (about) STEPS steps
    batch_size=BATCH_SIZE, lr=LR, warmup_ratio=0.05, schedule="linear", seed=SEED, device=DEVICE,
    log_every=2 if SMOKE else 10, progress=False,
    eval_each_epoch=False, save_checkpoints=False,  # no per-epoch BLEU or resumable checkpoints: we score once, below
)
summary = train_translation(
    train_files, valid_files, WORK / "run", config, preset="transformer_3_256_8", vocab_size=VOCAB_SIZE, max_length=64,
    num_encoder_layers=2, num_decoder_layers=2, hidden_size=HIDDEN, num_heads=4, ffn_size=4 * HIDDEN, dropout=0.1,
)
print(f"{summary['steps']} steps in {summary['wall_time_s']} s; vocabulary {summary['vocab_size']}")

# %% [markdown]
# The run folder holds `log.jsonl` (a record every `log_every` steps: mean loss, token
# accuracy, learning rate, throughput) and `best/` (the model and its tokenizer, what
# `ctxkit translate` loads). The loss starts near $\ln(\text{vocabulary})$, a uniform guess.

# %%
log = [json.loads(line) for line in (WORK / "run" / "log.jsonl").read_text().splitlines()]
train_log = [r for r in log if r.get("event") == "train"]
losses = [r["loss"] for r in train_log]
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot([r["step"] for r in train_log], losses, "o-", label="training loss (label-smoothed)")
ax.axhline(math.log(summary["vocab_size"]), color="grey", ls=":", label="uniform guess")
ax.set(xlabel="optimiser step", ylabel="cross-entropy (nats)")
ax.legend()
plt.tight_layout()
plt.show()

# %%
model, tokenizer = load_translator(WORK / "run")
assert isinstance(model, TransformerSeq2Seq)
n_params = sum(p.numel() for p in model.parameters())
print(f"{n_params / 1e6:.2f}M parameters; special tokens {[(t, tokenizer.token_to_id(t)) for t in SPECIALS]}")
print("BPE pieces of a source sentence:", [tokenizer.decode([i]) for i in tokenizer.encode(valid_pairs[0][0])])

# %% [markdown]
# ## 3. Decode: greedy vs. beam search
#
# Greedy decoding takes the most probable token at each step. Beam search keeps the
# `BEAMS` most probable partial translations (by total log-probability, with a length
# penalty) and returns the best finished one. Both run with a key/value cache, so each step
# only computes the new position.

# %%
sources = [de for de, _ in valid_pairs]
references = [en for _, en in valid_pairs]
greedy = translate(model, tokenizer, sources, num_beams=1, device=DEVICE)
beam = translate(model, tokenizer, sources, num_beams=BEAMS, device=DEVICE)
scores = {"greedy": bleu(greedy, references), f"beam {BEAMS}": bleu(beam, references)}
print("BLEU on", len(sources), "validation sentences:", {k: round(v, 2) for k, v in scores.items()})
for i in range(5):
    print(f"\nsource    {sources[i]}\nreference {references[i]}\ngreedy    {greedy[i]}\nbeam {BEAMS}    {beam[i]}")

# %% [markdown]
# Beam search does not always win: with a model this small (and, per `docs/results.md`,
# even for the full-size Multi30k Transformers) greedy and beam BLEU are close. Where they
# differ, beam search tends to choose shorter, safer sentences.

# %%
differ = sum(g != b for g, b in zip(greedy, beam))
print(f"greedy and beam search differ on {differ} of {len(sources)} sentences")
lengths = {name: sum(len(h.split()) for h in hyps) / len(hyps) for name, hyps in (("greedy", greedy), ("beam", beam),
                                                                                ("reference", references))}
print("mean length in words:", {k: round(v, 1) for k, v in lengths.items()})

# %% [markdown]
# ## 4. Where did the decoder look? The alignment plot
#
# `alignment` force-decodes a translation (by default the model's own greedy one; here the
# reference, as in training) and returns the last decoder layer's encoder-decoder attention,
# averaged over heads: one row per target token (the row used to *predict* that token), one
# column per source token. `ctxkit translate RUN FILE --heatmap align.png` draws the same
# figure; here `plot_alignment` writes it and we display the PNG.

# %%
pick = next((i for i, de in enumerate(sources) if "Hund" in de), 0)  # a sentence about a dog, if there is one
weights, src_tokens, tgt_tokens = alignment(model, tokenizer, sources[pick], references[pick], device=DEVICE)
print("source:", sources[pick], "\nreference:", references[pick], "\nmodel (greedy):", greedy[pick])
png = plot_alignment(weights, src_tokens, tgt_tokens, WORK / "alignment.png", title="last decoder layer, mean over heads")
display(Image(filename=str(png), width=480))

# %% [markdown]
# In full mode the first rows are sharp: "A" is predicted looking at "Ein", "brown" at
# "braun", "dog" at "Hund", along the diagonal since German and English word order agree
# here. Later rows are diffuse: a one-minute model learns the easy, frequent alignments
# first (the full-size model of `docs/results.md` aligns the whole sentence). The end
# marker `</s>` and the final "." collect attention when there is nothing specific to look at.
#
# ## What we checked

# %%
assert summary["steps"] == STEPS and summary["train_pairs"] == len(train_pairs)
assert losses[-1] < losses[0]                               # training reduced the loss
assert len(greedy) == len(beam) == len(sources) and all(isinstance(h, str) for h in greedy + beam)
assert weights.shape == (len(tgt_tokens), len(src_tokens)) and src_tokens[-1] == tgt_tokens[-1] == "</s>"
torch.testing.assert_close(weights.sum(-1), torch.ones(len(tgt_tokens)))  # every row is a distribution over the source
assert "".join(src_tokens[:-1]) == sources[pick]               # byte-level pieces spell the sentence back
if not SMOKE:
    assert losses[-1] < 4.5                                    # from ~7 (uniform over the vocabulary) at the start
    assert scores["greedy"] > 5 and scores[f"beam {BEAMS}"] > 5  # far from zero: the model translates (about 15 here)
print("all checks passed")
