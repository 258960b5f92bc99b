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
# # 01 · Attention from scratch
#
# **Lecture step:** attention → the Transformer (the first step of the series).
#
# **What you will see.** Each scoring function of the lecture written by hand in a few lines
# of `torch`, then checked against the building block `ctxkit.layers` ships:
#
# 1. additive (Bahdanau) attention, `AdditiveAttention`;
# 2. dot-product attention, `DotProductAttention`;
# 3. scaled dot-product attention, `scaled_dot_product_attention`, and *why* the
#    `1/sqrt(d)` is there (a small experiment);
# 4. multi-head attention, `MultiHeadAttention`, including padding and causal masks;
# 5. the sinusoidal positional encoding, `SinusoidalPositionalEncoding`, and the property
#    that makes it useful (dot products depend only on the distance);
# 6. real attention weights: the pretrained all-MiniLM-L6-v2 checkpoint on a sentence,
#    recomputed by hand from its hidden states, drawn as heatmaps.
#
# **Runs in** about 15 seconds on a laptop CPU (full mode); nothing is trained.

# %% tags=["parameters"]
import os

SMOKE = os.environ.get("CTXKIT_TUTORIAL_SMOKE") == "1"
SEED = 0
N_TRIALS = 100 if SMOKE else 2000  # random query/key draws per width in the "why scale?" experiment
WIDTHS = (4, 16, 64, 256, 1024)  # query/key widths d in that experiment
N_KEYS = 10  # keys per query in that experiment
MAX_LEN, PE_DIM = 100, 64  # size of the positional-encoding table that is drawn
SENTENCE = "The bank approved my loan because it was solid."
CHECKPOINT = "all_minilm_l6_v2"  # the packaged real checkpoint (ctxkit download all_minilm_l6_v2)

# %%
import copy
import math
import tempfile

import matplotlib.pyplot as plt
import torch
from IPython.display import Image, display

import ctxkit
from ctxkit.core.plots import plot_attention  # the heatmap `ctxkit demo` draws
from ctxkit.layers import (
    AdditiveAttention,
    DotProductAttention,
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)

# ctxkit.core.plots switches matplotlib to its file-only "Agg" backend when imported
# (it writes PNGs); switch the notebook back to inline figures.
# %matplotlib inline

torch.manual_seed(SEED)
OUT = tempfile.mkdtemp(prefix="ctxkit-tutorial-01-")
f64 = torch.float64


def same(a, b):
    """Two float64 results of the same formula agree to ~1e-15; 1e-10 leaves ample room for
    any summation order and still catches any real difference (a missing scale, a transpose)."""
    torch.testing.assert_close(a, b, rtol=0.0, atol=1e-10)


# %% [markdown]
# ## 1. Additive attention
#
# Bahdanau et al. score a query $q$ against each key $k_j$ with a one-hidden-layer MLP:
#
# $$\mathrm{score}(q, k_j) = w_v^\top \tanh(W_q q + W_k k_j), \qquad
#   \alpha = \mathrm{softmax}(\mathrm{score}), \qquad \mathrm{out} = \sum_j \alpha_j v_j .$$
#
# Queries and keys may have different sizes (a decoder state against encoder states).
# We compute everything in float64, so "same formula" means agreement to ~1e-15.

# %%
batch, n_queries, n_keys = 1, 2, 5
query = torch.randn(batch, n_queries, 6, dtype=f64)   # (batch, queries, query_size)
keys = torch.randn(batch, n_keys, 4, dtype=f64)       # (batch, keys, key_size)
values = torch.randn(batch, n_keys, 3, dtype=f64)     # (batch, keys, value_size)

additive = AdditiveAttention(query_size=6, key_size=4, hidden_size=8).double()
W_q, W_k, w_v = additive.w_q.weight, additive.w_k.weight, additive.w_v.weight  # (8, 6), (8, 4), (1, 8)

with torch.no_grad():
    # every query/key pair: (batch, q, 1, hidden) + (batch, 1, k, hidden)
    hidden = torch.tanh((query @ W_q.T)[:, :, None, :] + (keys @ W_k.T)[:, None, :, :])
    scores = (hidden @ w_v.T).squeeze(-1)                 # (batch, q, k)
    alpha = scores.softmax(dim=-1)
    by_hand = alpha @ values                              # (batch, q, value_size)
    out, weights = additive(query, keys, values)

same(by_hand, out)
same(alpha, weights)
print("additive attention weights (each row sums to 1):\n", weights[0].numpy().round(3))

# %% [markdown]
# ## 2. Dot-product and scaled dot-product attention
#
# Luong's dot product drops the MLP: $\mathrm{score}(q, k) = q^\top k$. The Transformer
# divides by $\sqrt{d}$: $\mathrm{softmax}(QK^\top/\sqrt{d})\,V$.
# `scaled_dot_product_attention` has two paths: with `need_weights=True` the eager maths
# (which returns the weights), otherwise PyTorch's fused SDPA kernel. Both must agree.

# %%
d = 8
Q = torch.randn(batch, 3, d, dtype=f64)
K = torch.randn(batch, n_keys, d, dtype=f64)
V = torch.randn(batch, n_keys, 5, dtype=f64)

with torch.no_grad():
    plain = DotProductAttention(scaled=False)(Q, K, V)
    same(plain[1], (Q @ K.transpose(1, 2)).softmax(-1))

    scaled_by_hand = (Q @ K.transpose(1, 2) / math.sqrt(d)).softmax(-1)
    eager_out, eager_w = scaled_dot_product_attention(Q, K, V, need_weights=True)
    fused_out, no_weights = scaled_dot_product_attention(Q, K, V)  # fast path: no weights returned
    same(eager_w, scaled_by_hand)
    same(eager_out, scaled_by_hand @ V)
    same(fused_out, eager_out)
    same(DotProductAttention(scaled=True)(Q, K, V)[1], scaled_by_hand)
assert no_weights is None
print("max weight per query, unscaled:", plain[1].amax(-1)[0].numpy().round(3))
print("max weight per query, scaled:  ", scaled_by_hand.amax(-1)[0].numpy().round(3))

# %% [markdown]
# ### Why divide by $\sqrt{d}$?
#
# If the components of $q$ and $k$ are independent with variance 1, $q^\top k$ has variance
# $d$. Without the scale the scores grow with the width, the softmax saturates (one weight
# near 1, the rest near 0) and its gradients vanish. We draw random queries and keys for
# several widths and record the largest attention weight and the size of the gradient of
# the weights with respect to the scores.

# %%
def softmax_stats(width: int, scaled: bool):
    q = torch.randn(N_TRIALS, 1, width, dtype=f64)
    k = torch.randn(N_TRIALS, N_KEYS, width, dtype=f64)
    s = (q @ k.transpose(1, 2)).squeeze(1) / (math.sqrt(width) if scaled else 1.0)
    s.requires_grad_(True)
    w = s.softmax(-1)
    # d(max weight)/d(scores): the signal that trains W_q and W_k through this softmax
    (grad,) = torch.autograd.grad(w.amax(-1).sum(), s)
    # the median: a few unlucky draws with near-equal top scores would dominate a mean
    return w.amax(-1).mean().item(), grad.norm(dim=-1).median().item()


stats = {scaled: [softmax_stats(w, scaled) for w in WIDTHS] for scaled in (False, True)}
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
for scaled, label in ((False, "q·k"), (True, "q·k / √d")):
    ax1.plot(WIDTHS, [m for m, _ in stats[scaled]], "o-", label=label)
    ax2.plot(WIDTHS, [g for _, g in stats[scaled]], "o-", label=label)
ax1.set(xscale="log", xlabel="width d", ylabel="mean largest weight", title=f"softmax over {N_KEYS} keys")
ax2.set(xscale="log", yscale="log", xlabel="width d", ylabel="median gradient norm", title="gradient through the softmax")
ax1.axhline(1 / N_KEYS, color="grey", ls=":", label="uniform")
ax1.legend()
ax2.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# Unscaled, the largest weight climbs towards 1 and the gradient collapses as $d$ grows;
# scaled, both stay where they were at $d = 4$.

# %% [markdown]
# ## 3. Multi-head attention
#
# Each head $i$ has its own projections $W_q^{(i)}, W_k^{(i)}, W_v^{(i)}$ of width
# $d_{head} = d_{model}/h$; the heads attend independently, their outputs are concatenated
# and mixed by $W_o$. `MultiHeadAttention` stores the projections of all heads as one
# `Linear` per role (the row block $i$ of `q_proj.weight` is $W_q^{(i)}$), which is the same
# maths with one matrix product instead of $h$.

# %%
d_model, n_heads, seq = 16, 4, 6
head_dim = d_model // n_heads
mha = MultiHeadAttention(d_model, n_heads).double().eval()
x = torch.randn(batch, seq, d_model, dtype=f64)


def project(linear, x, head):
    rows = slice(head * head_dim, (head + 1) * head_dim)  # this head's block of rows
    return x @ linear.weight[rows].T + linear.bias[rows]   # (batch, seq, head_dim)


def multi_head_by_hand(x, mask=None):
    outs, maps = [], []
    for h in range(n_heads):
        q, k, v = (project(lin, x, h) for lin in (mha.q_proj, mha.k_proj, mha.v_proj))
        s = q @ k.transpose(1, 2) / math.sqrt(head_dim)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        a = s.softmax(-1)
        outs.append(a @ v)
        maps.append(a)
    concat = torch.cat(outs, dim=-1)                        # (batch, seq, d_model)
    return mha.out_proj(concat), torch.stack(maps, dim=1)   # weights (batch, heads, seq, seq)


with torch.no_grad():
    ours, our_weights = multi_head_by_hand(x)
    theirs, their_weights = mha(x, need_weights=True)
    fast, _ = mha(x)  # SDPA path
same(ours, theirs)
same(our_weights, their_weights)
same(fast, theirs)
print("weights:", tuple(their_weights.shape), "= (batch, heads, query, key)")

# %% [markdown]
# ### Masks
#
# Masks are boolean, `True` = may attend, broadcast against `(batch, heads, query, key)`.
# `padding_mask` hides padded keys; `causal_mask` lets position $i$ see keys $\le i$ only
# (the decoder's self-attention). They combine with `&`.

# %%
lengths = torch.tensor([seq, 4])                      # the second sequence has 2 padded positions
x2 = torch.randn(2, seq, d_model, dtype=f64)
attention_mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()  # (batch, seq) 1 = real token
mask = padding_mask(attention_mask) & causal_mask(seq)  # (batch, 1, 1, seq) & (seq, seq) -> (batch, 1, seq, seq)
with torch.no_grad():
    _, w_masked = mha(x2, mask=mask, need_weights=True)
    by_hand_masked, _ = multi_head_by_hand(x2[1:], mask=mask[1:, 0])
    same(mha(x2, mask=mask)[0][1:], by_hand_masked)
assert torch.all(w_masked.triu(diagonal=1) == 0)      # no query looks ahead
assert torch.all(w_masked[1, :, :, 4:] == 0)          # nobody attends to padding
print("causal + padding weights of head 0, second sequence:\n", w_masked[1, 0].numpy().round(2))

# %% [markdown]
# ## 4. Sinusoidal positional encoding
#
# Attention is blind to order, so the Transformer adds a position vector to each token:
#
# $$P_{t, 2j} = \sin\!\big(t / 10000^{2j/d}\big), \qquad P_{t, 2j+1} = \cos\!\big(t / 10000^{2j/d}\big).$$
#
# Low dimensions oscillate fast, high ones slowly (wavelengths from $2\pi$ to $10000 \cdot 2\pi$).

# %%
t = torch.arange(MAX_LEN, dtype=f64)[:, None]
two_j = torch.arange(0, PE_DIM, 2, dtype=f64)
angles = t / 10000 ** (two_j / PE_DIM)
P = torch.zeros(MAX_LEN, PE_DIM, dtype=f64)
P[:, 0::2], P[:, 1::2] = torch.sin(angles), torch.cos(angles)

table = SinusoidalPositionalEncoding(PE_DIM, max_len=MAX_LEN)(MAX_LEN)  # (MAX_LEN, PE_DIM) float32
# ctxkit computes in float64 and rounds once to float32: at most half an ulp of 1 apart
assert (table.double() - P).abs().max() <= torch.finfo(torch.float32).eps / 2

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2), gridspec_kw={"width_ratios": [1.2, 1]})
im = ax1.imshow(table, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
ax1.set(xlabel="encoding dimension", ylabel="position", title=f"sinusoidal encoding ({MAX_LEN} x {PE_DIM})")
fig.colorbar(im, ax=ax1, fraction=0.046)
for dim in (4, 5, 12, 20, 40):
    ax2.plot(table[:, dim], label=f"dim {dim} ({'sin' if dim % 2 == 0 else 'cos'})")
ax2.set(xlabel="position", ylabel="value", title="selected dimensions")
ax2.legend(fontsize=8, loc="lower right")
plt.tight_layout()
plt.show()

# %% [markdown]
# **Why sinusoids?** $P_{t+k}$ is a rotation of $P_t$ (each sin/cos pair turns by a fixed
# angle), so $P_t \cdot P_{t+k} = \sum_j \cos(k\,\omega_j)$ depends only on the distance
# $k$, not on $t$: the matrix of dot products is constant along its diagonals and peaks on
# the main one.

# %%
gram = P @ P.T                                     # (MAX_LEN, MAX_LEN)
for k in (1, 5, 30):
    diagonal = torch.diagonal(gram, offset=k)
    assert diagonal.max() - diagonal.min() < 1e-9  # the same for every t
assert torch.all(gram.argmax(dim=1) == torch.arange(MAX_LEN))  # each position is closest to itself

plt.figure(figsize=(4, 3.4))
plt.imshow(gram, cmap="viridis", interpolation="nearest")
plt.colorbar(label="P_s · P_t")
plt.title("dot products of position vectors")
plt.xlabel("position t")
plt.ylabel("position s")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 5. Real attention: all-MiniLM-L6-v2 on a sentence
#
# `ctxkit.get_model` loads the packaged pretrained checkpoint (6 layers, 12 heads, width
# 384). `output_attentions=True` returns every layer's weights `(batch, heads, query, key)`,
# computed by the eager path of the very `MultiHeadAttention` we just rebuilt; the layer's
# input is `hidden_states[layer]`.

# %%
model, tokenizer = ctxkit.get_model("bert_6_384_12", checkpoint=CHECKPOINT)
enc = tokenizer.encode(SENTENCE)
tokens = enc.tokens
ids = torch.tensor([enc.input_ids])
with torch.no_grad():
    out = model(ids, output_attentions=True, output_hidden_states=True)
print(tokens)
print(len(out.attentions), "layers of", tuple(out.attentions[0].shape))

# %% [markdown]
# Recompute layer 2's weights by hand, in float64, from its input. The model ran in float32,
# so the two differ by rounding only: a probability moves by at most about half the largest
# change of its logits, and the logits' rounding error grows like $\sqrt{k}\cdot\varepsilon$
# for a $k$-term dot product (the bound ctxkit's own tests use: `tests/tolerance.py`).

# %%
LAYER = 2
layer = model.encoder.layers[LAYER].self_attn          # a MultiHeadAttention
h64 = out.hidden_states[LAYER].double()                # (1, seq, 384): this layer's input
hd = layer.head_dim
with torch.no_grad():
    attn64 = copy.deepcopy(layer).double()
    q, k = (lin(h64).view(1, -1, layer.num_heads, hd).transpose(1, 2) for lin in (attn64.q_proj, attn64.k_proj))
    logits = q @ k.transpose(-1, -2) / math.sqrt(hd)   # (1, heads, seq, seq)
    by_hand = logits.softmax(-1)

eps32 = torch.finfo(torch.float32).eps
bound = 2 * 2 * math.sqrt(model.config.hidden_size) * eps32 * logits.abs().max().item()  # 2 * depth * sqrt(k) * eps * scale
error = (out.attentions[LAYER].double() - by_hand).abs().max().item()
print(f"largest difference {error:.2e}, rounding bound {bound:.2e}")
assert error <= bound
torch.testing.assert_close(out.attentions[LAYER].sum(-1), torch.ones(1, 12, len(tokens)))  # rows are distributions

# %% [markdown]
# One head per layer, drawn as heatmaps (row = the token attending, column = the token
# attended to). Heads differ: some spread their weight, some pick out one particular token,
# and many park most of it on `[CLS]` when they have nothing better to do, a well-documented
# habit of BERT-style models (Clark et al. 2019, *What does BERT look at?*).

# %%
HEAD = 0
fig, axes = plt.subplots(2, 3, figsize=(10, 6.8))
for L, ax in enumerate(axes.flat):
    w = out.attentions[L][0, HEAD].numpy()
    ax.imshow(w, cmap="viridis", vmin=0, vmax=w.max())
    ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=7)
    ax.set_yticks(range(len(tokens)), tokens, fontsize=7)
    ax.set_title(f"layer {L}, head {HEAD}", fontsize=9)
plt.tight_layout()
plt.show()

# %% [markdown]
# Where does "it" look? Averaged over the heads of each layer. From layer 3 on, the
# content word it attends to most is "loan", the noun it refers to (no one taught the
# model coreference; it is a by-product of pretraining).

# %%
q_it = tokens.index("it")
top_per_layer = []
for L, w in enumerate(out.attentions):
    mean = w[0, :, q_it].mean(0)                         # (seq,) average over heads
    top = mean.argsort(descending=True)[:3].tolist()
    top_per_layer.append([tokens[i] for i in top])
    print(f"layer {L}: " + ", ".join(f"{tokens[i]} {mean[i]:.2f}" for i in top))

# %% [markdown]
# `ctxkit demo --layer 3 --head 5` draws the same kind of figure with
# `ctxkit.core.plots.plot_attention`, which writes a PNG:

# %%
png = plot_attention(out.attentions[3][0, 5], tokens, os.path.join(OUT, "attention_L3_H5.png"),
                     title=f"{CHECKPOINT}: layer 3, head 5")
display(Image(filename=str(png), width=420))

# %% [markdown]
# ## What we checked
#
# Every hand-written formula above matched the ctxkit module to float64 precision, the fused
# SDPA path matched the eager one, masks zeroed what they should, the positional encoding has
# its distance-only dot products, and MiniLM's reported attention is exactly the softmax of
# its own queries and keys. The final asserts restate what the figures showed.

# %%
scaled_max = [m for m, _ in stats[True]]
unscaled_max = [m for m, _ in stats[False]]
assert unscaled_max[-1] > 0.9 > 0.5 > max(scaled_max)  # unscaled saturates at d = 1024, scaled never does
assert stats[False][-1][1] < stats[True][-1][1] / 100  # and its gradient has all but vanished
assert len(out.attentions) == 6 and out.attentions[0].shape == (1, 12, len(tokens), len(tokens))
assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "bank" in tokens
assert all(len(top) == 3 for top in top_per_layer)
assert "loan" in top_per_layer[3] and "loan" in top_per_layer[4]  # "it" -> "loan" in the upper layers
print("all checks passed")
