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
# # 08 · GPT-2 decoding: greedy, temperature, top-k and top-p
#
# **Lecture step:** GPT-2. A causal language model gives, at every step, a probability for
# each token of its vocabulary; *how the next token is picked* from that distribution changes
# the text as much as the model does.
#
# **What you will see.** No GPT-2 checkpoint is available offline, so we first train a tiny
# GPT-2 (2 layers, width 128, its own byte-level BPE vocabulary) on Jane Austen's *Emma* with
# ctxkit's language-model trainer, the code behind `ctxkit lm-train`. Then, for one prompt:
#
# 1. the next-token distribution, and what temperature, top-k and top-p (nucleus) filtering
#    do to it, as bar plots;
# 2. continuations from greedy decoding and the three sampling methods, side by side;
# 3. checks that each filter keeps exactly the tokens its definition says, and that every
#    sampled token came from its step's kept set.
#
# **Runs in** about a minute on a laptop CPU (full mode; most of it is training: 400 steps).
# A model this small, trained this briefly, writes Austen-flavoured word salad: the point is
# how the decoding methods differ, not the prose.

# %% tags=["parameters"]
import os
from pathlib import Path

SMOKE = os.environ.get("CTXKIT_TUTORIAL_SMOKE") == "1"
DATA = Path(os.environ.get("CTXKIT_DATA", "../../shared/data"))
SEED = 0
PRESET = "gpt2_2_128_2"  # 2 layers, width 128, 2 heads
VOCAB_SIZE = 500 if SMOKE else 4000  # byte-level BPE learned on the training text
BLOCK = 64  # training length = context length, in tokens
PARAGRAPHS = 40 if SMOKE else None  # training paragraphs of Emma (None: all but the validation ones)
VALID_PARAGRAPHS = 8 if SMOKE else None  # validation paragraphs used (None: all of the last 5 %)
EPOCHS = 1 if SMOKE else 2
PROMPT = "Emma was"
NEW_TOKENS = 12 if SMOKE else 40
TEMPERATURES = (0.7, 1.5)
TOP_K = 10
TOP_P = 0.9

# %%
import lzma
import shutil
import tempfile
import time

import matplotlib.pyplot as plt
import pandas as pd
import torch

import ctxkit
import ctxkit.core.plots  # noqa: F401  (the trainer draws curve.png with it; importing it switches matplotlib to "Agg")
from ctxkit.decoding import GenerationConfig, filter_logits, generate
from ctxkit.pretraining.lm import train_lm
from ctxkit.training import TrainConfig

# ... so switch the notebook back to inline figures once, here.
# %matplotlib inline

OUT = Path(tempfile.mkdtemp(prefix="ctxkit-tutorial-08-"))
torch.manual_seed(SEED)
started = time.time()

# %% [markdown]
# ## Train a tiny GPT-2 on *Emma*
#
# The Gutenberg text wraps its lines at 70 characters; we join each paragraph onto one line
# (so that a line break means a new paragraph, not a wrapped line), keep the last 5 % of the
# paragraphs for validation perplexity, and write both to text files, which is what
# `train_lm` (and `ctxkit lm-train --train ... --valid ...`) reads.

# %%
text = lzma.open(DATA / "gutenberg-nltk" / "austen-emma.txt.xz", "rt", encoding="utf-8").read()
paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
n_valid = len(paragraphs) // 20
train_paragraphs, valid_paragraphs = paragraphs[:-n_valid][:PARAGRAPHS], paragraphs[-n_valid:][:VALID_PARAGRAPHS]
(OUT / "train.txt").write_text("\n".join(train_paragraphs) + "\n", encoding="utf-8")
(OUT / "valid.txt").write_text("\n".join(valid_paragraphs) + "\n", encoding="utf-8")
print(f"{len(train_paragraphs)} training paragraphs ({sum(len(p.split()) for p in train_paragraphs):,} words), "
      f"{len(valid_paragraphs)} validation paragraphs")
print(train_paragraphs[3][:300])

# %%
config = TrainConfig(epochs=EPOCHS, batch_size=16, lr=2e-3, warmup_ratio=0.05, device="cpu", seed=SEED,
                     progress=False, save_checkpoints=False, log_every=10)
summary = train_lm([OUT / "train.txt"], [OUT / "valid.txt"], PRESET, OUT / "run", config,
                   vocab_size=VOCAB_SIZE, block_size=BLOCK)
print(f"{summary['steps']} steps on {summary['train_tokens']:,} tokens in {summary['wall_time_s']:.0f} s; "
      f"validation perplexity {summary['best_perplexity']:.1f} (vocabulary of {VOCAB_SIZE})")

# %% [markdown]
# The run folder's `best/` is a Hugging Face-format GPT-2 folder with its tokenizer, so
# `ctxkit.get_model` loads it like any checkpoint.

# %%
model, tokenizer = ctxkit.get_model(str(OUT / "run" / "best"))
model.eval()
print(f"{type(model).__name__} with {sum(p.numel() for p in model.parameters()):,} parameters")

# %% [markdown]
# ## The next-token distribution and four ways to reshape it
#
# The model maps the prompt to one logit per vocabulary entry for the next position;
# softmax turns them into probabilities. The decoding methods transform the logits first:
#
# * **temperature** `T` divides the logits: `T < 1` sharpens the distribution, `T > 1` flattens it;
# * **top-k** keeps the `k` most likely tokens and sets the other logits to `-inf`;
# * **top-p** (nucleus) keeps the smallest set of most likely tokens whose probabilities add
#   up to at least `p`: few tokens when the model is sure, many when it is not.
#
# `ctxkit.decoding.filter_logits` is the function both decoding loops use.

# %%
prompt_ids = torch.tensor([tokenizer.encode(PROMPT)])
with torch.no_grad():
    logits = model(prompt_ids)[:, -1].float()  # (1, vocab): the scores of the token after the prompt
probs = logits.softmax(-1)[0]
top = probs.argsort(descending=True)[:20]  # the 20 most likely tokens, most likely first
names = [repr(tokenizer.decode([int(i)])) for i in top]

panels = {"T = 1 (the model)": probs}
for t in TEMPERATURES:
    panels[f"temperature {t}"] = (logits / t).softmax(-1)[0]
panels[f"top-k, k = {TOP_K}"] = filter_logits(logits, top_k=TOP_K).softmax(-1)[0]
panels[f"top-p, p = {TOP_P}"] = filter_logits(logits, top_p=TOP_P).softmax(-1)[0]

fig, axes = plt.subplots(1, len(panels), figsize=(3.1 * len(panels), 3.8), sharey=True)
for ax, (title, p) in zip(axes, panels.items()):
    ax.barh(range(len(top)), probs[top].numpy(), color="lightgray", label="the model (T = 1)")
    ax.barh(range(len(top)), p[top].numpy(), height=0.5, color="tab:blue", label="after the transform")
    ax.set_title(f"{title}\n{int((p > 0).sum())} of {p.numel()} tokens can be drawn", fontsize=9)
    ax.set_xlabel("probability")
axes[0].set_yticks(range(len(top)), names, fontsize=8)
axes[0].invert_yaxis()
axes[-1].legend(fontsize=7, loc="lower right")
fig.suptitle(f"next token after {PROMPT!r} (the 20 most likely of {probs.numel()})", fontsize=10)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Continuations side by side
#
# `ctxkit.decoding.generate` runs the model once over the prompt, then one position at a time
# with a key/value cache. Greedy decoding takes the argmax at every step and tends to loop;
# sampling draws from the (reshaped) distribution, with a seeded generator so that the
# notebook is reproducible.

# %%
strategies = {
    "greedy": GenerationConfig(max_new_tokens=NEW_TOKENS),
    f"sampling, T = {TEMPERATURES[0]}": GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=True, temperature=TEMPERATURES[0]),
    f"top-k = {TOP_K}": GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=True, top_k=TOP_K),
    f"top-p = {TOP_P}": GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=True, top_p=TOP_P),
}
outputs = {}
for name, cfg in strategies.items():
    outputs[name] = generate(model, prompt_ids, config=cfg, generator=torch.Generator().manual_seed(SEED))[0]
table = pd.DataFrame({"continuation of " + repr(PROMPT): [tokenizer.decode(o[prompt_ids.size(1):].tolist())
                                                            for o in outputs.values()]}, index=list(outputs))
pd.set_option("display.max_colwidth", None)  # show whole continuations
table

# %% [markdown]
# ## Checks
#
# **The filters keep exactly the right tokens.** Top-k: the `k` largest logits. Top-p: sort
# the probabilities in decreasing order and keep the shortest prefix whose sum reaches `p`,
# so the kept mass is at least `p` and would fall below `p` without the last kept token.
# Temperature never changes the order of the tokens, and lower temperature means lower entropy.

# %%
order = probs.argsort(descending=True)
kept_k = torch.isfinite(filter_logits(logits, top_k=TOP_K))[0]
assert set(kept_k.nonzero().flatten().tolist()) == set(order[:TOP_K].tolist())

kept_p = torch.isfinite(filter_logits(logits, top_p=TOP_P))[0]
cumulative = probs[order].cumsum(0)
n_nucleus = int((cumulative < TOP_P).sum()) + 1  # the first prefix that reaches p
assert set(kept_p.nonzero().flatten().tolist()) == set(order[:n_nucleus].tolist())
assert probs[kept_p].sum() >= TOP_P - 1e-6
assert n_nucleus == 1 or cumulative[n_nucleus - 2] < TOP_P

entropy = {t: float(-(p * p.clamp_min(1e-30).log()).sum()) for t, p in
           ((t, (logits / t).softmax(-1)[0]) for t in (min(TEMPERATURES), 1.0, max(TEMPERATURES)))}
assert entropy[min(TEMPERATURES)] < entropy[1.0] < entropy[max(TEMPERATURES)], entropy
for t in TEMPERATURES:
    assert int((logits / t).argmax()) == int(logits.argmax())
print("filters:", f"top-k kept {int(kept_k.sum())}, top-p kept {n_nucleus} tokens;", "entropies", entropy)

# %% [markdown]
# **Every generated token came from its step's kept set.** Run the model once over each whole
# generated sequence (no cache) and look up each new token's rank: greedy tokens are the argmax
# at their step, top-k tokens are among the `k` best, and top-p tokens lie inside their step's
# nucleus. (A tiny tolerance covers the rounding difference between cached and uncached
# computation.) And sampling with `top_k=1` is greedy decoding.

# %%
def step_distributions(sequence):
    """Logits of every generated position, recomputed in one pass: (new tokens, vocab)."""
    with torch.no_grad():
        return model(sequence[None])[0, prompt_ids.size(1) - 1:-1].float()


for name, sequence in outputs.items():
    new = sequence[prompt_ids.size(1):]
    step_logits = step_distributions(sequence)
    chosen = step_logits.gather(1, new[:, None])[:, 0]
    if name == "greedy":
        assert torch.all(chosen >= step_logits.max(-1).values - 1e-4), name
    elif name.startswith("top-k"):
        kth = step_logits.topk(TOP_K, dim=-1).values[:, -1]
        assert torch.all(chosen >= kth - 1e-4), name
    elif name.startswith("top-p"):
        p = step_logits.softmax(-1)
        mass_before = (p * (p > p.gather(1, new[:, None]))).sum(-1)  # probability of the tokens ranked above it
        assert torch.all(mass_before < TOP_P + 1e-4), name
one_best = generate(model, prompt_ids, config=GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=True, top_k=1),
                    generator=torch.Generator().manual_seed(SEED + 1))[0]
assert torch.equal(one_best, outputs["greedy"])
assert all(len(o) == prompt_ids.size(1) + NEW_TOKENS for o in outputs.values())
assert summary["best_perplexity"] < VOCAB_SIZE  # better than a uniform guess over the vocabulary
print(f"whole notebook: {time.time() - started:.0f} s")
shutil.rmtree(OUT, ignore_errors=True)  # the run folder: nothing is left behind
