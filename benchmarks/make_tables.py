"""Render docs/results.md, docs/performance.md and docs/notes/performance-history.md from
the JSON records in benchmarks/results/ (the records are the source of truth; the pages are
views).

    python benchmarks/make_tables.py

performance.md is the reader's page: one table per question (how fast are fine-tuning,
pretraining, inference and decoding, on which card, against which peer, with which command),
the newest record per case only. Every record, the ablations and the hand-written engineering
notes are on notes/performance-history.md (benchmarks/tables_history.py).
"""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from records_io import card, figure, fmt as _fmt, load_records as _load, newest, record_key  # noqa: E402
from tables_history import NOTES_HEADING, history_page, with_kept_notes  # noqa: F401 (docs/hooks.py uses them from here)
from tables_more import char_lm_section, distill_speed_section, quaternion_mt_section  # noqa: E402
from tables_xl import xl_results_section  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

RESULTS_INTRO = """# Results

Every number below is a record in `benchmarks/results/*.json` (with the command, device
and date) and was produced by code in this repository; this page is generated from them by
`python benchmarks/make_tables.py`.

Model: `bert_6_384_12` loaded from the packaged real checkpoint `all_minilm_l6_v2`
(sentence-transformers/all-MiniLM-L6-v2, 22.7M parameters). Fine-tuning uses the
`ctxkit finetune` code path (AdamW, linear warmup 10 % + linear decay, weight decay 0.01,
clipping 1.0, bf16 autocast, whole-step CUDA graphs, best epoch chosen on dev).

Protocols (from `../shared/data/README.md`): GLUE trains on `train.tsv` and reports
`dev.tsv`; CoNLL-2003 picks the epoch on `valid` and reports `valid` and `test`
(entity-level micro F1, conlleval semantics via seqeval). **No SQuAD training set exists
here**: SQuAD v1.1 uses the official dev file split by article in file order (first 38
articles train, last 10 articles = `qa-eval`, 1,988 questions), and SQuAD 2.0 uses the
CS224N dev file split the same way (first 12 articles train, last 4 = `qa-eval`, 1,629
questions). These are article splits, not the official dev sets, and train on ~10x less
data than the anchors.

Small GLUE tasks (MRPC, STS-B, RTE, CoLA) report the best dev score over the learning-rate
grid listed in the row (the usual GLUE dev protocol, as in the MiniLM and BERT papers).
"""

RESULTS_NOTES = """
## Reading the anchors

The anchors are the issue's reference points. The MiniLM paper's numbers are for the
original MiniLM-L6-H384 distilled checkpoint; all-MiniLM-L6-v2 was further trained
contrastively as a sentence embedder, which helps similarity tasks (STS-B 86) and hurts the
syntax- and inference-heavy ones (CoLA 31 vs 47.5, RTE 57 vs 68.8). The CoNLL and SQuAD
anchors are BERT-base (110M parameters, 5x larger; SQuAD trained on the full 88k-question
training set instead of 8.6k questions). They are context, not like-for-like comparisons;
the like-for-like comparison is the ctxkit vs Hugging Face table, where both sides
fine-tune the same checkpoint with the same hyper-parameters on the same GPU.

SQuAD 2.0-style: with 2.2k answerable training questions the model learns the no-answer
decision before it learns spans (HasAns F1 24, NoAns F1 78); `best_f1` is the official
best-threshold F1 on the same split.

## Frozen features + logistic regression

The lectures' feature-extraction demo: the frozen encoder gives one vector per sentence and
scikit-learn's `LogisticRegression` is trained on the full SST-2 train split (67,349
sentences), reported on SST-2 dev (`ctxkit.features.probe.linear_probe`).
"""


def _elmo_section() -> list:
    """Issue 7: context-free vectors vs ELMo vs fine-tuned MiniLM."""
    elmo, static = _load("elmo.json"), _load("static_vectors.json")
    if not elmo and not static:
        return []
    out = ["\n## Context-free vectors vs ELMo vs BERT (issue 7)\n",
           "Everything here was trained in this repository on WikiText-2 train (2.1M tokens): skip-gram vectors "
           "(`benchmarks/static_baselines.py`, CPU) and an ELMo biLM (`ctxkit pretrain-elmo`, 400 s on an H100); the "
           "task models (`benchmarks/elmo_results.py`: a BiLSTM tagger / sentence encoder over frozen features, the ELMo "
           "scalar mix learned with the task) see the same data. The point is the ordering, static < ELMo < fine-tuned "
           "BERT, on corpora 400x smaller than the ELMo paper's 1B words; the paper's numbers are given as anchors only. "
           "The same biLM recipe was also pretrained on PTB (300 s) and on the Wikipedia extract (`ctxkit lm-corpus`: "
           "sentence split, punctuation split off, cased; files wiki_00-61 train = 10.4M words, wiki_62 valid, wiki_63 "
           "test; 100k-word vocabulary with a sampled softmax of 8,192 candidates; 360 s, 1.1 epochs); the task "
           "models use the WikiText-2 biLM.\n"]
    lm = [r for r in elmo if r["task"].endswith("language modelling")]
    if lm:
        out.append("| corpus | split | metric | value | anchor | device | date |")
        out.append("|---|---|---|---|---|---|---|")
        for r in lm:
            anchor = f"{_fmt(r['peer_value'])} ({r['peer_name']})" if r.get("peer_value") else ""
            out.append(f"| {r['task'].split()[0]} | {r['split']} | {r['metric']} | {_fmt(r['value'])} | {anchor} | {r['device']} | {r['date']} |")
        for corpus in dict.fromkeys(r["task"] for r in lm):
            first = next(r for r in lm if r["task"] == corpus)
            out.append(f"\n{corpus.split()[0]} biLM: {first['model']}. Command: `{first['command']}`.")
        out.append("")
    tasks = [r for r in elmo if not r["task"].endswith("language modelling")]
    if tasks or static:
        out.append("| task | split | metric | features | value | comparison | comparison value | device | date |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in tasks:
            out.append(f"| {r['task']} | {r['split']} | {r['metric']} | {r.get('features', '')} | {_fmt(r['value'])} | "
                       f"{r['peer_name']} | {_fmt(r['peer_value'])} | {r['device']} | {r['date']} |")
        for r in static:
            if r["task"] == "sst-2":
                out.append(f"| {r['task']} | {r['split']} | {r['metric']} | bag of embeddings: {r['model'].split(';')[0]} | "
                           f"{_fmt(r['value'])} | | | {r['device']} | {r['date']} |")
        if tasks:
            out.append(f"\nCommand: `{tasks[0]['command']}` (the biLM run above, the skip-gram vectors of "
                       "`benchmarks/static_baselines.py`).")
        out.append("\nReading: on CoNLL-2003 the same tagger gains 10.2 F1 from ELMo over the lowercased skip-gram vectors "
                   "(71.4 -> 81.6) and 2.8 over those vectors plus casing features (78.8); fine-tuned MiniLM reaches 87.2 test F1 "
                   "(91.7 dev; table above). On SST-2, ELMo features beat the static vectors in the same BiLSTM by 1.2 points "
                   "(72.6 -> 73.7) and the averaged bag of frozen static vectors by 10.7; fine-tuned MiniLM has 90.0. The "
                   "biLM's test perplexity is 116 (forward and backward alike); the paper's 39.7 is on the 1B Word "
                   "Benchmark with a 4096-cell model trained for weeks. A bag of *fine-tuned* vectors reaches 80.6 on "
                   "SST-2 (and the same with random initial vectors, 81.1): with 67k labelled sentences the task can learn "
                   "its own word vectors, so only the frozen rows compare representations. Task models ran 8 (NER) and 3 "
                   "(SST-2) epochs and were still improving on dev.")
        out.append("\nThe bank demo with an ELMo column (`ctxkit demo --elmo RUN/final`, full output in "
                   "`benchmarks/results/logs/demo_elmo.txt`; this biLM was a small one trained for 18 minutes on the 2-core "
                   "CPU, valid perplexity 283, since the GPU one stayed on the GPU machine). Mean cosine similarity of the "
                   "ambiguous word across senses vs within each sense: static vectors 1.00 everywhere; ELMo bank 0.801 < "
                   "0.933 / 0.804, bat 0.866 < 0.949 / 0.954, crane 0.879 vs 0.898 / 0.746 (not separated); MiniLM's last "
                   "layer bank 0.747 < 0.909 / 0.854, bat 0.816 < 0.923 / 0.888, crane 0.845 < 0.920 / 0.889. ELMo moves "
                   "\"bank\" and \"bat\" by sense, less cleanly than BERT; a static vector cannot.")
    return out


def _drop_table(records, value_header: str) -> list:
    """Rows of a lower-precision accuracy next to the fp32 run's (quality records with ``drop``)."""
    rows = [f"| task | split | metric | {value_header} | fp32 | drop | model | device | date |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        rows.append(f"| {r['task']} | {r['split']} | {r['metric']} | {_fmt(r['value'])} | {_fmt(r['peer_value'])} | {_fmt(r['drop'])} | "
                    f"{r['model']} | {r['device']} | {r['date']} |")
    return rows


def distill_section() -> list:
    """Task-specific distillation (issue 21): teacher, distilled student, undistilled student."""
    rows = _load("distill.json")
    quality = [r for r in rows if "task" in r]
    speed = {r["case"].split(":")[0]: r for r in rows if "benchmark" in r and "bf16" in r["case"]}
    cpu = {r["case"].split(":")[0]: r for r in rows if "benchmark" in r and "CPU" in r["case"]}
    if not quality:
        return []
    out = ["\n## Distillation: a 3-layer student of fine-tuned all-MiniLM-L6-v2 (issue 21)\n",
           "`ctxkit distill TEACHER_RUN` (task-specific, DistilBERT's recipe): the student keeps the fine-tuned "
           "teacher's layers 0, 2, 4 and its head and trains on T^2 KL to the teacher's logits (T = 2, computed once and "
           "cached) plus the task loss (alpha = 0.5); the baseline is the same student, data, steps and hyper-parameters "
           "with alpha = 0. Latency: median forward pass of the same batch, GPU bf16 batch 32 x 128 (eager), CPU fp32 "
           "batch 1 x 128.\n",
           "| task | split | metric | teacher (6 layers) | distilled student | student without distillation | kept of teacher | "
           "GPU speed-up | CPU speed-up | size | device | date |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in quality:
        g, c = speed.get(r["task"]), cpu.get(r["task"])
        seeds = r.get("per_seed")
        d = f"{_fmt(r['value'])}" + (f" (mean of {', '.join(map(str, seeds['distilled']))})" if seeds else "")
        u = f"{_fmt(r['peer_value'])}" + (f" (mean of {', '.join(map(str, seeds['plain']))})" if seeds else "")
        out.append(f"| {r['task']} | {r['split']} | {r['metric']} | {_fmt(r['teacher_value'])} | {d} | "
                   f"{u} | {100 * r['retained_of_teacher']:.1f} % | {g['speedup'] if g else ''}x | "
                   f"{c['speedup'] if c else ''}x | 1/{r['size_ratio']:.2f} | {r['device']} | {r['date']} |")
    out.append("\nCommands: " + "; ".join(f"`{c}`" for c in sorted({r['command'] for r in quality})) +
               ". Log: `benchmarks/results/logs/distill_2026-11-27.log`. SST-2 and CoNLL-2003: students of seeds 42, 43, "
               "44 (the distilled one is ahead or level on every seed); MRPC and SQuAD: seed 42. The GPU speed-up is of "
               "eager batches of 32 x 128, 2-5 ms each and partly bound by kernel launches, so it moves between runs "
               "(SST-2: 2.22x in the first run, 1.67x in the seeds run); the CPU speed-up (batch 1, compute-bound) is "
               "1.9-2.6x.")
    for r in _load("distill_agnostic.json"):
        out.append("\n### Task-agnostic: MiniLM -> 3 layers on the Wikipedia extract, then SST-2\n")
        out.append("| task | split | metric | distilled, then fine-tuned | same layers, no distillation | teacher | distillation "
                   "| last losses (soft / MLM / cosine) | device | date |")
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        losses = r["last_losses"]
        out.append(f"| {r['task']} | {r['split']} | {r['metric']} | {_fmt(r['value'])} | {_fmt(r['peer_value'])} | "
                   f"{_fmt(r['teacher_value'])} | {r['distill_steps']} steps, {r['distill_minutes']} min | "
                   f"{losses['soft_loss']:.3f} / {losses['mlm_loss']:.2f} / {losses['cos_loss']:.3f} | {r['device']} | {r['date']} |")
        out.append(f"\nCommand: `{r['command']}`. Log: `benchmarks/results/logs/distill_agnostic_2026-11-27.log`. "
                   "**Distillation did not help here** (-0.7 points). all-MiniLM-L6-v2 is released without its masked-LM "
                   "head, so the head was fitted first with the body frozen (600 steps: MLM loss 6.7, far from a trained "
                   "BERT's ~2): the soft targets come from a weak distribution, while the student's own MLM loss fell to 3.0. "
                   "The corpus was 20 files of the extract (48k sequences), read 58 times in 6 minutes. What to try next: "
                   "a teacher with its pretrained MLM head (bert-base-uncased by Hub id), or the head fitted for longer, "
                   "and a larger share of the extract.")
    out.extend(distill_speed_section())
    return out


def pretrain_long_section() -> list:
    """BERT-base pretraining for 8 minutes, ctxkit against the HF Trainer (pretrain_long.json)."""
    records = _load("pretrain_long.json")
    speed = [r for r in records if "benchmark" in r]
    quality = [r for r in records if "task" in r]
    if not speed or not quality:
        return []
    s = speed[-1]
    sequences = f"{s['train_sequences']:,}" if s.get("train_sequences") else "about 150,000"
    ran = f"ctxkit ran {s['steps']:,} steps"
    if s.get("wall_s") and s["wall_s"] < 8 * 60 - 10:  # the 20-epoch schedule ended before the budget
        ran = f"ctxkit finished the whole 20-epoch schedule ({s['steps']:,} steps) in {s['wall_s'] / 60:.1f} minutes"
    intervals = s.get("interval_medians") or {}
    where = "; ".join(f"{name.replace('_', ' ')} intervals {v['tokens_per_s']:,} tokens/s ({v['intervals']})"
                      for name, v in intervals.items())
    out = ["\n## BERT-base pretraining for 8 minutes on the Wikipedia extract\n",
           f"`ctxkit pretrain --preset bert_12_768_12` (plan `{s['ctxkit_plan']}`) for 8 minutes over 63 files of the extract "
           f"({sequences} sequences of <= 128 tokens; vocabulary and shards from `pretrain-vocab` / `pretrain-data`, the 64th "
           f"file held out), against transformers' `Trainer` with `BertForPreTraining` (bf16, `torch_compile`, 4 loader "
           f"workers, the same sequences, lr and schedule of 20 epochs) for the same minutes on the same kind of card (the two "
           f"sides ran in separate calls). Both "
           f"checkpoint every 1,000 steps and evaluate the held-out file every epoch. {ran}; the peer ran "
           f"{s['peer_steps']:,} steps in 8 minutes. Tokens/s over the run {s['ctxkit']:,.0f} against {s['peer']:,.0f} ({s['speedup']:g}x), "
           f"the last quarter at {s['last_quarter_over_first']:.3f} of the first."
           + (f" Median tokens/s of the 50-step log intervals: {where}." if where else "") + "\n",
           "| task | split | metric | ctxkit | transformers Trainer | steps (ctxkit / peer) | device | date |",
           "|---|---|---|---|---|---|---|---|"]
    for r in quality:
        out.append(f"| {r['task']} | {r['split']} | {r['metric']} | {_fmt(r['value'])} | {_fmt(r['peer_value'])} | "
                   f"{r['steps']:,} / {r['peer_steps']:,} | {r['device']} | {r['date']} |")
    notes = [r["note"] for r in quality if r.get("note")]
    if notes:
        out.append("\n" + " ".join(f"Note: {n}." for n in notes))
    out.append(f"\nCommand: `{s['command']}` (both sides: `{s['benchmark_command']}`). "
               "Curves (tokens/s, loss, MLM accuracy): ![8 minutes of pretraining](pretrain_long.png)\n")
    return out


def results_page() -> str:
    rows = _load("finetune_minilm.json")
    vs = [r for r in _load("finetune_vs_hf.json") if "task" in r]
    out = [RESULTS_INTRO, "## Fine-tuned all-MiniLM-L6-v2\n"]
    out.append("| task | split | metric | ctxkit | anchor | anchor source | lr (grid) | epochs | train s | device | date |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "frozen" in r["task"]:
            continue
        grid = ", ".join(f"{x:g}" for x in r.get("lr_grid", [])) if r.get("lr_grid") else ""
        out.append(f"| {r['task']} | {r['split']} | {r['metric']} | {_fmt(r['value'])} | {_fmt(r['peer_value'])} | {r['peer_name'] or ''} | "
                   f"{r.get('lr', '')} ({grid}) | {r.get('epochs', '')} | {_fmt(r.get('train_time_s'))} | {r['device']} | {r['date']} |")
    commands = sorted({r["command"] for r in rows})
    out.append("\nCommand: " + "; ".join(f"`{c}`" for c in commands))
    out.append(RESULTS_NOTES)
    out.append("| task | split | metric | value | model | train examples | wall s | device | date |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "frozen" in r["task"]:
            out.append(f"| {r['task']} | {r['split']} | {r['metric']} | {_fmt(r['value'])} | {r['model']} | {r.get('train_examples', '')} | {_fmt(r.get('wall_s'))} | {r['device']} | {r['date']} |")
    if vs:
        out.append("\n## Same fine-tuning, ctxkit vs Hugging Face (quality)\n")
        out.append("| task | split | metric | ctxkit | transformers | hyper-parameters | device | date |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in vs:
            hp = ", ".join(f"{k} {v}" for k, v in r["hyper"].items())
            out.append(f"| {r['task']} | {r['split']} | {r['metric']} | {_fmt(r['value'])} | {_fmt(r['peer_value'])} | {hp} | {r['device']} | {r['date']} |")
        out.append("\nCommand: `" + vs[0]["command"] + "`. Wall times are in [performance.md](performance.md).")
    out.extend(distill_section())
    scratch = _load("pretrain_from_scratch.json")
    if scratch:
        out.append("\n## Pretraining from scratch, then SST-2 (issue 4, partial)\n")
        out.append("`bert_4_256_4` (11M parameters, uncased BERT vocabulary) pretrained with MLM + NSP on the Wikipedia "
                   "extract + WikiText-2 train (555k instances of <= 128 tokens, dupe factor 3; the Gutenberg files were left "
                   "out because one has Latin-1 bytes, which the reader reports as invalid UTF-8 at file:line), then fine-tuned "
                   "on SST-2 (3 epochs, batch 32, lr 1e-4) next to the same architecture from random initialisation. The "
                   "budget was 5.5 minutes of pretraining, not the issue's 25 (the session's GPU time ran out); the run "
                   "stopped on its time budget at step 19,531 of a 40,000-step schedule.\n")
        out.append("| task | split | metric | pretrained | random init | pretraining | device | date |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in scratch:
            p = r["pretrain"]
            out.append(f"| {r['task']} | {r['split']} | {r['metric']} | {_fmt(r['value'])} | {_fmt(r['peer_value'])} | "
                       f"{p['steps']} steps x 256, MLM acc {p['mlm_acc']:.3f}, NSP acc {p['nsp_acc']:.3f}, {p['seq_per_s']:.0f} seq/s | "
                       f"{r['device']} | {r['date']} |")
        out.append("\nAnchors: BERT-Small 89.7 on SST-2 with full pretraining; Cramming reaches GLUE 80.7 after 24 h on one GPU. "
                   "Command: `" + scratch[0]["command"] + "`. Pretraining curve: ![pretraining](pretrain_curve.png)\n")
    out.extend(pretrain_long_section())
    mt = _load("translation.json")
    if mt:
        out.append("\n## Machine translation: Multi30k de->en (issue 5)\n")
        out.append("`ctxkit translate-train` (joint byte-level BPE, label smoothing 0.1, inverse-square-root schedule, lr 1e-3, "
                   "batch 128, bf16, validation BLEU each epoch, best epoch kept) then `ctxkit translate` on test2016 "
                   "(sacreBLEU, detokenised and cased). The two Transformers and the GPT run below shared one H100 "
                   "(four concurrent runs); each Transformer's whole training took under 6 minutes of wall time. The model "
                   "was chosen by validation BLEU (transformer_3_512_8: 41.6 vs 41.3), not by test.\n")
        out.append("| model | metric | test2016 | anchor | valid BLEU (greedy) | epochs | train s | device | date |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in mt:
            out.append(f"| {r['model']} | {r['metric']} | {_fmt(r['value'])} | {r['anchor_range']} ({r['peer_name'].split(': ', 1)[-1]}) | "
                       f"{_fmt(r['valid_bleu_greedy'])} | {r['epochs_run']} | {_fmt(r['train_time_s'])} | {r['device']} | {r['date']} |")
        out.append("\nCommands: " + "; ".join(f"`{c}`" for c in sorted({r['command'] for r in mt if 'beam 4' in r['metric']})))
        out.append("\nBeam search (4 beams, length penalty 1.0) did not beat greedy decoding for the Transformers here "
                   "(40.5 vs 40.8, 39.4 vs 40.0); it did for the RNN (38.0 vs 36.6). The RNN baseline is far above the lectures' "
                   "28.6-29.0 because it gets the same recipe (BPE, label smoothing, 17 epochs, dropout 0.3).\n")
        out.append("Encoder-decoder attention of `transformer_3_512_8` (last decoder layer, mean over heads) for test sentence 5 "
                   "(`ctxkit translate RUN --heatmap align.png`), and the RNN's additive attention for the same sentence:\n")
        out.append("![alignment](multi30k_alignment.png) ![RNN alignment](multi30k_alignment_rnn.png)\n")
        out.append("Training curve of `transformer_3_512_8`: ![Multi30k](multi30k_curve.png)\n")
    lm = _load("lm_wikitext2.json")
    if lm:
        out.append("\n## GPT language model on WikiText-2 (issue 5)\n")
        out.append("`ctxkit lm-train` (GPT-2 architecture `gpt2_6_512_8`, 19M non-embedding parameters, byte-level BPE of 8k "
                   "trained on the corpus, blocks of 128 tokens, AdamW lr 1e-3, bf16), then `ctxkit perplexity` with a "
                   "sliding window. Word-level perplexity divides the same total log-likelihood by the words (+1 end of line "
                   "per line), the WikiText convention, so it compares across vocabularies. The model overfits WikiText-2's "
                   "2M words quickly (validation perplexity is best at epoch 8 of 37 and rises after; see the curve).\n")
        out.append("| model | split | metric | value | train s | device | date |")
        out.append("|---|---|---|---|---|---|---|")
        for r in lm:
            out.append(f"| {r['model']} | {r['split']} | {r['metric']} | {_fmt(r['value'])} | {_fmt(r['train_time_s'])} | {r['device']} | {r['date']} |")
        out.append("\nCommand: `" + lm[0]["command"] + "`. ![WikiText-2 GPT](wikitext2_gpt_curve.png)\n")
    q8 = [r for r in _load("inference_cpu.json") if r.get("task")]
    if q8:
        out.append("\n## int8 quantisation accuracy (issue 6)\n")
        out.extend(_drop_table(q8, "int8"))
        out.append("\nCommand: `" + q8[0]["command"] + "`.\n")
    fp8 = _load("inference_gpu_quality.json")
    if fp8:
        out.append("\n## bf16 and fp8 inference accuracy (issue 6, GPU precisions)\n")
        out.append("The GPU backend's precisions on a fine-tuned run: bf16 weights, and fp8 (float8 e4m3 matrix products in "
                   "the Transformer layers with per-row activation and per-channel weight scales, `ctxkit.inference.fp8`). "
                   "`fp8 norm_inputs` converts only q/k/v and fc1 (`convert_to_fp8(model, \"norm_inputs\")`, scales, bias "
                   "and GELU in the GEMM epilogue; the fastest GPU form, see performance.md). On the CPU rows the fp8 "
                   "arithmetic is emulated (`torch._scaled_mm`'s, and float32 sums of the exact e4m3 products); the "
                   "H100 rows run the GPU kernels (the run's weights carried to the GPU in bf16, so its fp32 row is "
                   "the bf16 weights in fp32).\n")
        out.extend(_drop_table(fp8, "value"))
        out.append("\nCommand: `" + fp8[0]["command"] + "`.\n")
    out.extend(_elmo_section())
    out.extend(xl_results_section())
    out.extend(quaternion_mt_section())
    out.extend(char_lm_section())
    out.append("\nTraining curves (loss per step, dev metric per epoch), from the run folders' `curve.png`:\n")
    out.append("![SST-2](sst2_curve.png) ![CoNLL-2003](conll_curve.png)\n")
    return "\n".join(out) + "\n"


PERF_INTRO = """# Performance

How fast ctxkit is against the usual alternative, one table per question. Generated from the
records in `benchmarks/results/*.json` by `python benchmarks/make_tables.py`; each table shows
the newest record per case and peer, and under it the command that measured it.
Speed is benchmarked here, never asserted in tests. `speedup` > 1 means ctxkit is faster.
"""

#: the last line of the reader's page
PERF_HISTORY_LINK = ("Older runs, ablations, the distance to the hardware floor, the regression checks and the "
                     "negative results: [Performance history](notes/performance-history.md).")

_CTXKIT_VARIANT = re.compile(r" \(ctxkit [^)]*\)$")


@dataclass(frozen=True)
class ReaderTable:
    """One table of docs/performance.md: which records of which file, and how a row reads.

    Attributes:
        name: the records' file in benchmarks/results/.
        keep: which records of the file belong in the table (before keeping the newest).
        key: what makes two records the same measurement (:func:`records_io.record_key`).
        case: the row's case as the reader sees it (shared prefixes are in the intro).
        unit: the unit to print instead of the record's (None: the record's).
    """

    name: str
    keep: Callable[[dict], bool] = lambda r: "benchmark" in r
    key: Callable[[dict], tuple] = record_key
    case: Callable[[dict], str] = lambda r: r["case"]
    unit: str | None = None

    def records(self) -> list:
        """The newest product figure per case and peer (a record whose command is one ``ctxkit``
        command a reader can run), in the order the cases first appear in the file."""
        return newest([r for r in _load(self.name) if self.keep(r) and is_product(r)], self.key)


def is_product(r: dict) -> bool:
    """A figure a user reproduces with one ``ctxkit`` command (older records name a benchmark
    script: they are on the history page)."""
    return str(r.get("command", "")).startswith("ctxkit ")


def _strip(prefix: str) -> Callable[[dict], str]:
    """A ``case`` function that drops a prefix the section's intro already states."""
    return lambda r: r["case"].removeprefix(prefix)


def _pretrain_key(r: dict) -> tuple:
    # ctxkit's configuration is part of the case string; a newer configuration measures the
    # same workload, so it replaces the older one instead of adding a row
    return r.get("benchmark"), _CTXKIT_VARIANT.sub("", r["case"]), r.get("metric"), r.get("peer_name")


def _scaling_case(r: dict) -> str:
    grads = "bf16 gradients (`--grad-reduce-dtype bfloat16`)" if "+bf16grad" in r["case"] else "exact fp32 gradients"
    return f"2 GPUs vs 1, {grads}"


def _user_scaling(r: dict) -> bool:
    # the configurations `ctxkit pretrain` runs; overlap experiments and diagnostics (ranks that
    # never communicate) are negative results and live on the history page
    return r["case"].endswith(("(graphs+compile-model+bf16res)", "(graphs+compile-model+bf16res+bf16grad)")) \
        and not r.get("diagnostic")


FINETUNE = ReaderTable("finetune_vs_hf.json")
PRETRAIN = ReaderTable("pretrain_throughput.json", key=_pretrain_key, case=lambda r: _CTXKIT_VARIANT.sub("", r["case"]))
SCALING = ReaderTable("pretrain_scaling.json", keep=_user_scaling, case=_scaling_case, unit="x")
GPU = ReaderTable("inference_gpu.json",
                  case=lambda r: _strip("BERT-base classifier, ")(r).replace(" (872 sentences, 21943 tokens)", ""))
FLOOR = ReaderTable("floor.json", keep=lambda r: r["case"].startswith("BERT-base classifier inference"),
                    case=_strip("BERT-base classifier inference, "))
CPU = ReaderTable("inference_cpu.json", keep=lambda r: r.get("benchmark") == "inference_cpu" and r.get("speedup") is not None,
                  case=_strip("BERT-base classifier, "))
PREDICT = ReaderTable("predict_gpu.json", case=lambda r: r["case"].removeprefix("ctxkit predict --backend gpu, ").replace(
    "BERT-base SST-2 classifier (random weights), ", ""))
SERVE_GPU = ReaderTable("serve_gpu.json", case=lambda r: r["case"].split(" on the GPU, ")[-1])
REAL = ReaderTable("pretrain_real.json", case=lambda r: r["case"].split(", --fast")[0].split("batch 256, ")[-1])
LONG = ReaderTable("pretrain_long.json", case=lambda r: r["case"].split(", --fast")[0].replace("bert_12_768_12, seq <= 128, batch 256, ", ""))
# the newest run only: the first one (fp32, no graphs, 256 requests) measured other cases; it stays on the history page
SERVE_GENERATE = ReaderTable("serve_generate.json", keep=lambda r: "benchmark" in r and "served in bf16" in r["case"],
                             case=lambda r: r["case"].split("streamed over HTTP (loopback), ")[-1])
DECODE = ReaderTable("generate.json", case=_strip("gpt2_117m random weights, prompt 32, 256 new tokens, greedy, "))
XL = ReaderTable("transformer_xl.json", key=lambda r: record_key(r) + (r.get("task"),),  # one run per corpus
                 case=lambda r: f"{r['task'].split()[0]}, {r['case'].split(', bf16 autocast')[0]}")
SPARSE = ReaderTable("sparse_attention.json", keep=lambda r: "time" in r["metric"],  # memory is not speed: history page
                     case=lambda r: f"{r['case'].replace(', batch 1, 8 heads x 64, bf16', '')}: {r['metric']}")
DISTILL = ReaderTable("distill_speed.json", case=_strip("3-layer student vs 6-layer teacher (MiniLM shapes), "))

#: (heading, intro, tables) of docs/performance.md, in the order a reader asks
READER_SECTIONS = [
    ("## How fast is fine-tuning?",
     ("Wall time from loading all-MiniLM-L6-v2 to having its dev score (tokenisation, training, evaluation): `ctxkit "
      "finetune` against the Hugging Face `Trainer` with the same hyper-parameters, on the same GPU in one process. Both "
      "sides reach the same scores ([results](results.md))."), [FINETUNE]),
    ("## How fast is pretraining?",
     ("BERT-base MLM + NSP steps (seq 128, batch 256, bf16 autocast, the same random batches on both sides), sequences "
      "per second on one GPU against transformers' `BertForPreTraining`, eager and compiled, in the same run. The ctxkit "
      "side is the Trainer with the plan of `--fast`, its loader masking the batches."), [PRETRAIN]),
    ("### On real text, end to end",
     ("`ctxkit pretrain` on shards that `pretrain-vocab` and `pretrain-data` built from Wikipedia text (`benchmarks/"
      "pretrain_real.py`, BERT-base, batch 256, sequences of at most 128 tokens): real tokens per second after warm-up "
      "against the synthetic figure of the same plan (fixed 128-token rows, target 0.9) and against transformers' "
      "`Trainer` (bf16, `torch_compile`, padded to 128, 4 loader workers) on the same sequences, target 2x "
      "([notes](notes/fast-plan.md), [profile](notes/pretrain-profile.md)). The plan's `pack` puts each batch's "
      "sequences one after another in one row (no padding; batches dealt to equal token counts): one shape, so one "
      "compile (~40 s cold on the H200) and one CUDA graph; without it (`--fast auto-pack`) batches are padded to "
      "two length buckets (two compiles, 0.862x of synthetic in the record before)."), [REAL]),
    ("### Eight minutes on real text",
     ("The same command for 8 minutes over the whole Wikipedia extract (`benchmarks/pretrain_long.py`): tokens per "
      "second over the run after its first minute, checkpoints every 1,000 steps, an epoch boundary with a held-out "
      "evaluation every ~30 s, against transformers' `Trainer` doing the same for the same minutes on the same card. The "
      "loss and accuracy curves are in [results](results.md#bert-base-pretraining-for-8-minutes-on-the-wikipedia-extract)."),
     [LONG]),
    ("### On two GPUs of one host",
     ("Weak scaling, 256 sequences per GPU: `ctxkit` is the 2-GPU over the 1-GPU throughput, the peer's the same for "
      "transformers + DDP, and `speedup` the ratio of the two (rows without a peer ran ctxkit alone)."), [SCALING]),
    ("## How fast is inference on a GPU?",
     ("A BERT-base sentence classifier (random weights, the same on both sides, bf16) on one GPU against transformers "
      "in the same run: batch-1 latency with the host-to-device copy, full batches of 256 x 128, and the 872 SST-2 dev "
      "sentences in file order. fp8 and tanh-GELU rows are declared approximations."), [GPU]),
    ("### Against the hardware floor",
     ("The floor is the same GEMMs and attention calls timed alone on the same card in the same run; the fp8 row "
      "(`--fast infer+fp8norm`) is compared with ctxkit's exact bf16 of the same run."), [FLOOR]),
    ("### As a user runs it: `ctxkit predict` on a GPU",
     ("The same BERT-base SST-2 classifier (random weights) as a run folder: `ctxkit predict` over a file (tokenizing, "
      "batching and writing included; the first batch, which compiles, apart) against the run's GPU encoder alone on "
      "the same batches, already tokenized and pinned. `speedup` is the share of the encoder's speed a user gets (target "
      "0.95). Tokenizing on the card's 16 host cores bounds it: `predict` over the same tokens made beforehand runs at "
      "99 % of the encoder, while the tokenizer alone did 13-22k of these lines per second, depending on the host (both "
      "figures are in the record)."), [PREDICT]),
    ("### As a user runs it: `ctxkit serve` on a GPU",
     ("The same classifier served over loopback HTTP to 64 concurrent clients (4 client processes) sending 16 SST-2 "
      "sentences per request, against the run's GPU encoder alone on the same texts in batches of 256. Far from the 0.95 "
      "target: the server's one model thread alone (tokenizing, batching, the answers) does 18 % of the encoder "
      "([notes](notes/gpu-serving.md))."), [SERVE_GPU]),
    ("## How fast is inference on a CPU?",
     ("The same BERT-base classifier on 2 CPU threads: batch-1 latency per precision, and SST-2 dev throughput at batch "
      "32, ctxkit's fastest backend against the fastest peer. The throughput peer is fed either ctxkit's length-sorted "
      "batches (model code alone) or file-order batches padded to their longest (a plain loop)."), [CPU]),
    ("## How fast is decoding?",
     ("GPT-2 small (random weights, the same on both sides): a 32-token prompt, 256 greedy new tokens after a warm-up, "
      "new tokens per second against transformers' `generate` with its dynamic cache and with its static cache compiled "
      "by transformers."), [DECODE]),
    ("### Served: `ctxkit serve` on a GPT-2",
     ("The generation server (continuous batching over 64 KV-cache slots, a CUDA graph per batch width, bf16, prompts "
      "prefilled in chunks of 256 tokens, tokens streamed as server-sent events) under a mix of prompts of 16-512 and "
      "outputs of 16-256 tokens (GPT-2 small, random weights, sampled), against the same server with one slot and against "
      "transformers' `generate` with its static cache behind the same HTTP front (`benchmarks/serve_generate.py`). One "
      "request at a time ctxkit is 3.7x the peer (a token every 0.79 ms against 2.57, median). Target at concurrency 64: "
      "5x the one-at-a-time throughput (met: 5.09x) with a p99 inter-token latency at most 3x its (not met: 31.8 ms "
      "against 1.15; the median gap there, one step of 43 rows, is already 4.4 ms of mostly host work per row; "
      "[notes](notes/gpu-serving.md))."),
     [SERVE_GENERATE]),
    ("## Other models",
     ("The systems beside BERT and GPT-2, each against the closest thing it replaces."), []),
    ("### Transformer-XL",
     ("Tokens per second inside the Transformer-XL runs (training; test at twice the training memory) against ctxkit's "
      "vanilla Transformer LM of the same size, batch 64 x 64 tokens, bf16: below 1 is the cost of the memory."), [XL]),
    ("### Sparse attention",
     ("One attention call (batch 1, 8 heads x 64, bf16) with the Sparse Transformer's strided and fixed patterns, against "
      "dense causal flash attention: the sparse calls overtake it at 8k tokens (forward) and 16k (forward+backward)."), [SPARSE]),
    ("### Distilled student",
     ("A 3-layer student of all-MiniLM-L6-v2 against its 6-layer teacher on the same path (eager bf16, or ctxkit's GPU "
      "inference path), median of 100 calls."), [DISTILL]),
]


def _speedup(r: dict) -> str:
    if r.get("speedup") is None:
        return "-"
    if str(r.get("peer_name", "")).startswith("floor"):
        return f"{r['speedup']:.1%} of the floor"
    return f"{r['speedup']:g}x"  # as recorded: the history page and the notes quote the same digits


def reader_cells(table: ReaderTable, r: dict) -> list[str]:
    """The cells of a record's row: case, ctxkit, peer, peer figure, speedup, card, date."""
    unit = table.unit if table.unit is not None else r.get("unit", "")
    return [table.case(r), figure(r["ctxkit"], unit), r.get("peer_name") or "-", figure(r.get("peer"), unit),
            _speedup(r), card(r["device"]), r["date"]]


def reader_row(table: ReaderTable, r: dict, cmd: int | None = None) -> str:
    """One row of a reader's table; ``cmd`` numbers the command when the table has several."""
    cells = reader_cells(table, r) + ([str(cmd)] if cmd is not None else [])
    return "| " + " | ".join(cells) + " |"


def reader_table(table: ReaderTable) -> list[str]:
    """The table of the newest records, then the command(s) they carry."""
    rows = table.records()
    if not rows:
        return []
    commands = list(dict.fromkeys(r["command"] for r in rows))
    several = len(commands) > 1
    out = ["| case | ctxkit | peer | peer figure | speedup | card | date |" + (" cmd |" if several else ""),
           "|---|---|---|---|---|---|---|" + ("---|" if several else "")]
    out += [reader_row(table, r, commands.index(r["command"]) + 1 if several else None) for r in rows]
    if several:
        out += ["", "Commands (the `cmd` column):", ""] + [f"{i}. `{c}`" for i, c in enumerate(commands, 1)]
    else:
        out += ["", f"Command: `{commands[0]}`"]
    return out


#: what a question without a product figure yet says
NOT_YET = ("Not measured through a `ctxkit` command yet; the earlier figures (benchmark scripts) are on the "
           "[history page](notes/performance-history.md).")


def performance_page() -> str:
    """docs/performance.md: one short section per question, each with the newest figures and their commands."""
    sections = []  # (heading, lines, has figures)
    for heading, intro, tables in READER_SECTIONS:
        body = []
        for table in tables:
            lines = reader_table(table)
            body += ([""] if body and lines else []) + lines  # a blank line between two tables
        if tables and not body:
            if not heading.startswith("## "):
                continue  # a sub-question without product figures yet
            body = [NOT_YET]
        # intros are wrapped like hand-written Markdown; only table rows and commands run long
        lines = [heading, "", textwrap.fill(intro, 100, break_on_hyphens=False), ""] + body + ([""] if body else [])
        sections.append((heading, lines, bool(tables)))
    out = [PERF_INTRO]
    for i, (heading, lines, has_tables) in enumerate(sections):
        if not has_tables:  # a group heading: only with a sub-question under it
            following = [s for s in sections[i + 1:]]
            if not following or following[0][0].startswith("## "):
                continue
        out += lines
    out.append(PERF_HISTORY_LINK)
    return "\n".join(out) + "\n"


def main() -> None:
    """Write docs/results.md, docs/performance.md and docs/notes/performance-history.md."""
    docs = REPO / "docs"
    (docs / "results.md").write_text(results_page(), encoding="utf-8")
    (docs / "performance.md").write_text(performance_page(), encoding="utf-8")
    # The hand-written engineering notes at the end of the history page (measurements, findings
    # and plans) are kept as they are; only the generated tables above them are rewritten.
    history = docs / "notes" / "performance-history.md"
    history.parent.mkdir(exist_ok=True)
    old = history.read_text(encoding="utf-8") if history.is_file() else ""
    history.write_text(with_kept_notes(history_page(), old), encoding="utf-8")
    print("wrote docs/results.md, docs/performance.md and docs/notes/performance-history.md")


if __name__ == "__main__":
    main()
