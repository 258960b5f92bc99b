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
# # 09 · Transformer-XL's memory and XLNet's permutation masks
#
# **Lecture step:** Transformer-XL and XLNet. Two ideas, both about *which positions may
# attend to which*:
#
# * **Transformer-XL** reads a long text in segments. Each layer keeps the states it computed
#   for the previous segment (its *memory*) and the next segment attends to `[memory; segment]`.
#   Positions are *relative* (the distance `i - j`), so the cached states stay valid when the
#   window moves on, and the context grows by one segment per layer.
# * **XLNet** trains a bidirectional model as an autoregressive one: it samples a
#   *factorisation order* of the tokens and predicts the last ones of that order from the
#   earlier ones. Two attention streams share the weights: the **content stream** sees a
#   token's own word, the **query stream** (which makes the prediction) must not.
#
# **What you will see.** A small, randomly initialised Transformer-XL (ctxkit's
# `TransformerXLModel`) fed segment by segment: the memory tensors it carries, the relative
# distances and attention weights over `[memory; segment]` as heatmaps, a proof that memory
# gives exactly the one-pass result, and how far back each output can see. Then XLNet: a
# sampled factorisation order over a real sentence, the content- and query-stream masks as
# heatmaps (in reading order and in factorisation order), the masks the pretraining collator
# builds, and the two-stream property checked on `XLNetModel`. Nothing is trained: masks and
# memories are properties of the architecture, visible with random weights.
#
# **Runs in** about 10 seconds on a laptop CPU.

# %% tags=["parameters"]
import os
from pathlib import Path

SMOKE = os.environ.get("CTXKIT_TUTORIAL_SMOKE") == "1"
DATA = Path(os.environ.get("CTXKIT_DATA", "../../shared/data"))
SEED = 0
SEGMENT = 6  # Transformer-XL segment length (tgt_len) and memory length (mem_len)
N_SEGMENTS = 4
XL_LAYERS = 3
WIDTH, HEADS = 32, 2  # tiny models: the figures are about masks, not about what is learned
SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
K = 3  # XLNet predicts about 1/K of the tokens of a sequence (the paper uses K = 6 or 7)
CHECKPOINT = "all_minilm_l6_v2"  # only its WordPiece vocabulary is used, to tokenise the sentence

# %%
import dataclasses
import lzma

import matplotlib.pyplot as plt
import numpy as np
import torch

from ctxkit.layers.relative_attention import relative_distance_index
from ctxkit.models.transformer_xl.model import TransformerXLConfig, TransformerXLModel
from ctxkit.models.xlnet.model import XLNetConfig, XLNetModel, sample_permutation_masks
from ctxkit.pretraining.xlnet_pretrain import XLNetCollator
from ctxkit.zoo import get_tokenizer

torch.manual_seed(SEED)
f64 = torch.float64

# %% [markdown]
# ## Transformer-XL: segments and memory
#
# The text: the first words of WikiText-2's validation file, with a word-level vocabulary made
# of just these words (the model is untrained, so only the ids matter).

# %%
with lzma.open(DATA / "wikitext-2" / "wiki.valid.tokens.xz", "rt", encoding="utf-8") as f:
    lines = [line.strip() for line in f.readlines()[:40]]
    words = " ".join(line for line in lines if line and not line.startswith("=")).split()[: SEGMENT * N_SEGMENTS]
vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
ids = torch.tensor([[vocab[w] for w in words]])  # (1, N_SEGMENTS * SEGMENT)
segments = ids.split(SEGMENT, dim=1)
print(" | ".join(" ".join(words[s * SEGMENT:(s + 1) * SEGMENT]) for s in range(N_SEGMENTS)))

config = TransformerXLConfig(vocab_size=len(vocab), d_model=WIDTH, n_heads=HEADS, d_inner=2 * WIDTH, n_layers=XL_LAYERS,
                             mem_len=SEGMENT, tgt_len=SEGMENT, dropout=0.0, cutoffs=())
xl = TransformerXLModel(config).to(f64).eval()  # float64: the equalities below hold to ~1e-15

# %% [markdown]
# Feed the segments one after the other, passing back the memories each call returns. Each
# memory is a list with one tensor per layer, `(batch, mem_len, width)`: what that layer
# received as input for the last `mem_len` positions. The first layer's memory is the previous
# segment's embeddings.

# %%
mems, outputs = None, []
with torch.no_grad():
    for s, segment in enumerate(segments):
        previous = mems
        hidden, mems = xl(segment, mems)
        outputs.append(hidden)
        print(f"segment {s}: attends to {0 if previous is None else previous[0].size(1)} memory + {SEGMENT} new positions; "
              f"returns {len(mems)} memories of shape {tuple(mems[0].shape)}")
        assert torch.equal(mems[0], xl.word_emb(segment))  # layer 0's memory = this segment's embeddings
        assert not any(m.requires_grad for m in mems)  # memories are constants for the next segment: no gradient flows back

# %% [markdown]
# ### Memory is exact, and it is also a limit
#
# Segment 1 read with segment 0's memory gives the same outputs as one causal pass over
# segments 0 and 1 together: every state it needs from segment 0 is in the memory, and relative
# positions make them usable unchanged. Segment 2 differs from a one-pass result over segments
# 0-2: a one-pass model would let its first layer look back into segment 0, but the memory
# holds one segment only.

# %%
with torch.no_grad():
    two_at_once, _ = xl(torch.cat(segments[:2], dim=1))
    three_at_once, _ = xl(torch.cat(segments[:3], dim=1))
diff_1 = (outputs[1] - two_at_once[:, SEGMENT:]).abs().max().item()
diff_2 = (outputs[2] - three_at_once[:, 2 * SEGMENT:]).abs().max().item()
print(f"segment 1 with memory vs one pass over segments 0-1: max difference {diff_1:.1e}")
print(f"segment 2 with memory vs one pass over segments 0-2: max difference {diff_2:.1e}")

# %% [markdown]
# ### Relative positions and the attention span
#
# Query `i` of a segment sits at absolute position `mem_len + i` of `[memory; segment]`; its
# score against key `j` uses the encoding of the distance `mem_len + i - j`. Left: those
# distances (future keys are masked). Right: layer 0's attention weights for segment 1 (head
# 0), over its memory and itself, from the model with random weights.

# %%
qlen, klen = SEGMENT, 2 * SEGMENT
distance = (torch.arange(qlen)[:, None] + klen - qlen) - torch.arange(klen)[None, :]
visible = distance >= 0
with torch.no_grad():
    _, _, attentions = xl(segments[1], [m for m in xl(segments[0])[1]], output_attentions=True)
weights = attentions[0][0, 0]  # (qlen, klen): layer 0, batch 0, head 0

fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
shown = np.where(visible.numpy(), distance.numpy(), np.nan)
axes[0].imshow(shown, cmap="viridis")
for i in range(qlen):
    for j in range(klen):
        if visible[i, j]:
            axes[0].text(j, i, int(distance[i, j]), ha="center", va="center", fontsize=7, color="white")
axes[1].imshow(weights.numpy(), cmap="Blues")
key_labels = words[:klen]
for ax, title in zip(axes, ("relative distance  mem_len + i - j", "attention weights, layer 0, head 0")):
    ax.axvline(SEGMENT - 0.5, color="red", lw=1)
    ax.set_xticks(range(klen), key_labels, rotation=60, fontsize=7)
    ax.set_yticks(range(qlen), words[SEGMENT:klen], fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("keys: memory (left of the red line) | segment 1")
plt.tight_layout()
plt.show()

# %% [markdown]
# ### How far back can each output see?
#
# Change one input word and record which outputs change, for every word: a dependency map of
# the whole text read segment by segment. With memory, each layer reaches one segment further
# back, so the last layer of a 3-layer model sees up to 3 segments back; without memory
# (`mem_len = 0`, the vanilla segment-by-segment model) nothing crosses a segment boundary.

# %%
def dependency_map(model):
    """``(positions, positions)``: True where output i changes when input word p is replaced."""
    model = model.eval()

    def read(sequence):
        mems, out = None, []
        for segment in sequence.split(SEGMENT, dim=1):
            hidden, mems = model(segment, mems)
            out.append(hidden)
        return torch.cat(out, dim=1)[0]

    with torch.no_grad():
        base = read(ids)
        changed = []
        for p in range(ids.size(1)):
            other = ids.clone()
            other[0, p] = (other[0, p] + 1) % len(vocab)
            changed.append(((read(other) - base).abs() > 1e-12).any(-1))
    return torch.stack(changed, dim=1)  # [output i, input p]


no_memory = TransformerXLModel(dataclasses.replace(config, mem_len=0)).to(f64)
no_memory.load_state_dict(xl.state_dict())
maps = {"with memory (mem_len = segment)": dependency_map(xl), "without memory (mem_len = 0)": dependency_map(no_memory)}

fig, axes = plt.subplots(1, 2, figsize=(9, 4))
for ax, (title, m) in zip(axes, maps.items()):
    ax.imshow(m.numpy(), cmap="Greens")
    for b in range(1, N_SEGMENTS):
        ax.axhline(b * SEGMENT - 0.5, color="gray", lw=0.5)
        ax.axvline(b * SEGMENT - 0.5, color="gray", lw=0.5)
    ax.set(title=title, xlabel="input word", ylabel="output position")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## XLNet: a factorisation order and the two attention streams
#
# A real sentence, tokenised with MiniLM's WordPiece vocabulary. `sample_permutation_masks`
# draws a random order of the positions and makes the last `n / K` of that order the
# *targets*: the tokens to predict, each from the context and the targets before it in the
# order. It returns:
#
# * `rank[i]`: the place of position `i` in the factorisation order;
# * `perm_mask[i, j] = 1`: query `i` may **not** attend to key `j` (Hugging Face's convention);
# * `target_mapping`: one one-hot row per target, in factorisation order.
#
# Inside `XLNetModel`, the query stream attends where `perm_mask` is 0; the content stream
# additionally sees its own position.

# %%
tokenizer = get_tokenizer(CHECKPOINT)
tokens = tokenizer.tokenize(SENTENCE)
x_ids = torch.tensor([tokenizer.convert_tokens_to_ids(tokens)])
n = len(tokens)
num_predict = max(1, round(n / K))
masks = sample_permutation_masks(x_ids, num_predict, generator=torch.Generator().manual_seed(SEED))
rank = masks.rank[0]
order = rank.argsort()  # order[r] = the position at place r
targets = masks.target_positions[0]
blocked = masks.perm_mask[0].bool()
query_sees = ~blocked  # (query, key): may attend
content_sees = ~blocked | torch.eye(n, dtype=torch.bool)
print("factorisation order:", " -> ".join(tokens[i] for i in order))
print("targets (predicted, in this order):", [tokens[i] for i in targets])

# %%
labels_order = [f"{tokens[i]} ({int(rank[i])})" for i in range(n)]
fig, axes = plt.subplots(2, 2, figsize=(10, 9))
for row, (view, idx) in enumerate((("reading order", torch.arange(n)), ("factorisation order", order))):
    for col, (title, m) in enumerate((("content stream", content_sees), ("query stream", query_sees))):
        ax = axes[row, col]
        ax.imshow(m[idx][:, idx].numpy(), cmap="Greens", vmin=0, vmax=1)
        names = [labels_order[i] + (" *" if i in targets else "") for i in idx.tolist()]
        ax.set_xticks(range(n), names, rotation=70, fontsize=7)
        ax.set_yticks(range(n), names, fontsize=7)
        ax.set_title(f"{title}, {view}", fontsize=9)
        ax.set_xlabel("key (may be attended to: green)", fontsize=8)
fig.suptitle("XLNet masks: token (place in the order), * = target", fontsize=10)
plt.tight_layout()
plt.show()

# %% [markdown]
# In factorisation order the targets' rows form a triangle: each target sees the context (all
# non-targets) and the targets *before* it, the query stream strictly before (its own word is
# what it predicts), the content stream including itself. Non-targets see each other in both
# directions and no target.
#
# ### The masks the pretraining collator builds
#
# `ctxkit pretrain-xlnet` gets its batches from `XLNetCollator`: each instance goes into
# XLNet's layout `A <sep> <cls>` (here the WordPiece `[SEP]` and `[CLS]` stand in for them), is
# padded, and gets its own factorisation order over its *content* tokens only: the special
# tokens and the padding are context for everyone and never targets.

# %%
collate = XLNetCollator(pad_id=tokenizer.convert_tokens_to_ids("[PAD]"), cls_id=tokenizer.convert_tokens_to_ids("[CLS]"),
                        sep_id=tokenizer.convert_tokens_to_ids("[SEP]"), K=K, seed=SEED)
short = tokenizer.convert_tokens_to_ids(tokenizer.tokenize("The river bank was muddy."))
batch = collate([x_ids[0].tolist(), short])
for row in range(2):
    picked = batch["target_mapping"][row].argmax(-1)[batch["labels"][row] != -100]
    print(f"row {row}: {tokenizer.convert_ids_to_tokens(batch['input_ids'][row].tolist())}")
    print(f"        predicts {tokenizer.convert_ids_to_tokens(batch['input_ids'][row, picked].tolist())}")
{k: tuple(v.shape) for k, v in batch.items()}

# %% [markdown]
# ### The two-stream property, on the model
#
# A small random `XLNetModel` (float64, no dropout) with these masks. The query stream's output
# for a target must not depend on that target's own word (otherwise predicting it would be
# trivial), while the content stream's output at that position does; and the prediction does
# depend on the context words.

# %%
xlnet = XLNetModel(XLNetConfig(vocab_size=tokenizer.vocab_size, d_model=WIDTH, n_heads=HEADS, d_inner=2 * WIDTH,
                               n_layers=2, dropout=0.0)).to(f64).eval()
t = int(targets[0])  # the first target in the factorisation order
context = int(order[0])  # a non-target position
swap = tokenizer.convert_tokens_to_ids("cat")


def run(input_ids):
    with torch.no_grad():
        out = xlnet(input_ids, perm_mask=masks.perm_mask.to(f64), target_mapping=masks.target_mapping.to(f64))
    return out.query[0], out.content[0]


query, content = run(x_ids)
changed_target = x_ids.clone()
changed_target[0, t] = swap
query_t, content_t = run(changed_target)
changed_context = x_ids.clone()
changed_context[0, context] = swap
query_c, _ = run(changed_context)
effect = {
    f"query stream at target {tokens[t]!r} when {tokens[t]!r} -> 'cat'": (query_t[0] - query[0]).abs().max().item(),
    f"content stream at {tokens[t]!r} when {tokens[t]!r} -> 'cat'": (content_t[t] - content[t]).abs().max().item(),
    f"query stream at target {tokens[t]!r} when context {tokens[context]!r} -> 'cat'": (query_c[0] - query[0]).abs().max().item(),
}
for what, value in effect.items():
    print(f"{value:9.2e}  {what}")

# %% [markdown]
# ## Checks
#
# The properties that define each mechanism, asserted on what was shown above.

# %%
# Transformer-XL: memory reproduces the one-pass result exactly, and limits the context.
assert diff_1 < 1e-12 and diff_2 > 1e-6, (diff_1, diff_2)
# relative_distance_index (the row of the distance table each score uses) agrees with the picture.
assert torch.equal(relative_distance_index(qlen, klen)[visible], (klen - 1 - distance)[visible])
assert torch.all(weights[~visible] == 0) and torch.allclose(weights.sum(-1), torch.ones(qlen, dtype=f64))
positions = torch.arange(ids.size(1))
seg = positions // SEGMENT
causal = positions[None, :] <= positions[:, None]  # [i, p]: p not after i
reach = seg[None, :] >= seg[:, None] - XL_LAYERS  # p at most XL_LAYERS segments back
with_mem, without = maps["with memory (mem_len = segment)"], maps["without memory (mem_len = 0)"]
assert not (with_mem & ~(causal & reach)).any()  # nothing from the future, nothing beyond n_layers segments
assert with_mem[-1, (N_SEGMENTS - 1 - XL_LAYERS) * SEGMENT] if N_SEGMENTS > XL_LAYERS else True  # ... and that far indeed
assert torch.equal(without, causal & (seg[None, :] == seg[:, None]))  # no memory: within the segment only

# XLNet masks, position by position (i = query, j = key).
is_target = rank >= n - num_predict
assert int(is_target.sum()) == num_predict and set(targets.tolist()) == set(is_target.nonzero().flatten().tolist())
expected_query = ~is_target[None, :] | (rank[None, :] < rank[:, None])
assert torch.equal(query_sees, expected_query)
assert not query_sees[targets, targets].any() and content_sees.diagonal().all()  # own word: content yes, query no
assert not query_sees[~is_target][:, is_target].any()  # the context never sees a target
in_order = query_sees[order][:, order][is_target[order]][:, is_target[order]]
assert torch.equal(in_order, torch.ones_like(in_order).tril(-1))  # targets: strictly causal in factorisation order
assert torch.equal(masks.target_mapping[0].argmax(-1), targets) and torch.all(masks.target_mapping.sum(-1) == 1)
assert torch.equal(rank[targets], torch.arange(n - num_predict, n))  # the last places of the order, in order

# The collator: the same rules per row, special tokens and padding never predicted.
special = torch.tensor(tokenizer.convert_tokens_to_ids(["[PAD]", "[CLS]", "[SEP]"]))
for row in range(2):
    valid = batch["labels"][row] != -100
    picked = batch["target_mapping"][row][valid].argmax(-1)
    assert not torch.isin(batch["input_ids"][row, picked], special).any()
    assert torch.equal(batch["labels"][row][valid], batch["input_ids"][row, picked])
    assert torch.all(batch["perm_mask"][row][picked, picked] == 1)  # a target never sees itself
    assert int(valid.sum()) == collate.num_predict(int((~torch.isin(batch["input_ids"][row], special)).sum()))

# Two streams.
values = list(effect.values())
assert values[0] < 1e-12 and values[1] > 1e-6 and values[2] > 1e-6, effect
