"""Render docs/results.md and docs/performance.md from the JSON records in
benchmarks/results/ (the records are the source of truth; the pages are views).

    python benchmarks/make_tables.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from records_io import fmt as _fmt, load_records as _load  # noqa: E402
from tables_more import char_lm_section, distill_speed_section, floor_section, quaternion_mt_section, sparse_attention_section  # noqa: E402
from tables_xl import xl_performance_section, xl_results_section  # noqa: E402

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

PERF_INTRO = """# Performance

Generated from `benchmarks/results/*.json` by `python benchmarks/make_tables.py`.
Speed is benchmarked here, never asserted in tests. `speedup` > 1 means ctxkit is faster.

## Fine-tuning: ctxkit vs Hugging Face transformers

`benchmarks/finetune_vs_hf.py` fine-tunes the same checkpoint (all-MiniLM-L6-v2) with the
same hyper-parameters (epochs, batch size 32, learning rate, warmup, weight decay,
clipping, bf16) on the same GPU in one process. The HF side follows the official example
scripts' logic (`Trainer`, dynamic padding collators, first-sub-word NER labels, run_qa.py
windowing with `padding="max_length"` and n-best post-processing); both sides are scored
by the same metric code. Wall time runs from loading the model to having the dev score
(tokenisation, training, evaluation).

Where the time goes: on this hardware a MiniLM training step is bound by kernel launches
(~20 ms per step eager for both frameworks, ~700 launches), not by arithmetic. ctxkit
captures the whole step — forward, loss, backward, clipping and the fused AdamW update —
as one CUDA graph per padded shape (`ctxkit.training.graphs`), and batches by length so
few shapes occur; a replay costs about as much as one launch. The graphed path is checked
against the eager path on the GPU (`tests/test_cuda_graphs.py`, losses and weights equal
within bf16 tolerance; skipped on CPU-only CI).
"""


#: where the hand-written part of docs/performance.md starts (make_tables keeps it)
NOTES_HEADING = "## Engineering notes (moved from architecture.md)"

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


def performance_page() -> str:
    speed = [r for r in _load("finetune_vs_hf.json") if "benchmark" in r]
    out = [PERF_INTRO]
    out.append("| case | metric | ctxkit (s) | peer | peer (s) | speedup | device | date |")
    out.append("|---|---|---|---|---|---|---|---|")
    for r in speed:
        out.append(f"| {r['case']} | {r['metric']} | {_fmt(r['ctxkit'])} | {r['peer_name']} | {_fmt(r['peer'])} | {_fmt(r['speedup'])} | {r['device']} | {r['date']} |")
    if speed:
        out.append("\nCommand: `" + speed[0]["command"] + "`.")
    eager = _load("finetune_vs_hf_eager.json")
    if eager:
        out.append("\n### Ablation: the same benchmark with eager ctxkit steps (earlier revision)\n")
        out.append("| case | ctxkit eager (s) | peer (s) | speedup | device | date |")
        out.append("|---|---|---|---|---|---|")
        for r in eager:
            out.append(f"| {r['case']} | {_fmt(r['ctxkit'])} | {_fmt(r['peer'])} | {_fmt(r['speedup'])} | {r['device']} | {r['date']} |")
        out.append("\nWithout graphs ctxkit is launch-bound like the Trainer (about 20 ms per step for both on "
                   "SST-2). The eager SQuAD run was slower than the Trainer; it was not profiled further once the "
                   "graphed path replaced it (its phase timings were not recorded in that revision).")
    pre = _load("pretrain_throughput.json")
    if pre:
        out.append("\n## BERT pretraining throughput (issue 4)\n")
        out.append("`benchmarks/pretrain_throughput.py`: the same random MLM+NSP batches (BERT-base, seq 128, 20 masked "
                   "positions per sequence, no padding), bf16 autocast, fused AdamW, one GPU, peers measured in the same run; "
                   "MFU against the bf16 matmul peak measured in that run, with the same FLOPs (ctxkit's gather-first count) "
                   "credited to every side. ctxkit runs whole-step CUDA graphs, a compiled model, the sparse last layer "
                   "(only [CLS] and the masked positions), fused q/k/v, mask-free flash/cuDNN attention and a bf16 residual "
                   "stream (`--compile --bf16-residual` of `ctxkit pretrain`).\n")
        out.append("| case | ctxkit seq/s | ctxkit MFU | peer | peer seq/s | peer MFU | speedup | device | date |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in pre:
            out.append(f"| {r['case']} | {_fmt(r['ctxkit'])} | {_fmt(r['ctxkit_mfu'])} | {r['peer_name']} | {_fmt(r['peer'])} | "
                       f"{_fmt(r['peer_mfu'])} | {_fmt(r['speedup'])} | {r['device']} | {r['date']} |")
        out.append("\nAgainst the issue's targets: >= 2.0x HF eager is met on both cards (2.12x H100, 2.04x H200); "
                   ">= 1.6x HF + torch.compile is not (1.43x H100, 1.41x H200). What the remaining time goes to is in "
                   "[Engineering notes: pretraining status](#pretraining-status-issue-4-in-progress) below.")
    ablation = _load("pretrain_ablation.json")
    if ablation:
        out.append("\n### Where the speed comes from (ablation)\n")
        out.append("| ctxkit configuration | seq/s | HF eager, same run | ratio | device | revision |")
        out.append("|---|---|---|---|---|---|")
        for r in ablation:
            out.append(f"| {r['case'].split(': ctxkit ', 1)[-1]} | {_fmt(r['ctxkit'])} | {_fmt(r['peer'])} | {_fmt(r['speedup'])} | {r['device']} | {r['revision']} |")
    scaling = _load("pretrain_scaling.json")
    if scaling:
        out.append("\n### Two GPUs of one host (weak scaling, 256 sequences per GPU)\n")
        out.append("`torchrun --nproc_per_node 2 benchmarks/pretrain_throughput.py --scaling --hf-scaling-peer`: rank 0 alone "
                   "first, then both ranks with the gradient average as one flat all-reduce inside the CUDA graph; the peer "
                   "is HF with DDP.\n")
        out.append("| case | gradient average | ctxkit scaling | ctxkit seq/s (1 -> 2 GPUs) | peer | peer scaling | peer seq/s | device | date |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in scaling:
            one, two = r["ctxkit_seq_per_s"]
            p1, p2 = r.get("peer_seq_per_s", ["-", "-"])
            peer = f"{r['peer']:.3f}x" if r.get("peer") else "-"
            out.append(f"| {r['case']} | {r.get('all_reduce', '-')} | {r['ctxkit']:.3f}x | {_fmt(one)} -> {_fmt(two)} | "
                       f"{r.get('peer_name') or '-'} | {peer} | {_fmt(p1)} -> {_fmt(p2)} | {r['device']} | {r['date']} |")
        out.append("\nRows in file order (older first). The issue's >= 1.9x is met with bf16 gradient communication "
                   "(`--grad-reduce-dtype bfloat16`, the rounding of DDP's `bf16_compress_hook`): 1.905x and 1.915x in two "
                   "runs. With exact fp32 gradients the flat all-reduce then (copying the sums back) scaled 1.88-1.90x (HF + DDP 1.92x in the same "
                   "run): borderline, not met. What the step pays on 2 H100s (diagnostic rows): ranks that never communicate "
                   "scale 1.987x; all-reducing one number per step 1.972x (waiting for the slower rank, ~1.5 %); the 440 MB "
                   "fp32 all-reduce alone takes 1.43 ms at 307 GB/s bus bandwidth (bf16: 0.74 ms; `torchrun --nproc_per_node 2 "
                   "benchmarks/nccl_allreduce.py`), exposed after a ~47 ms step. Packing the gradients with multi-tensor "
                   "copies instead of one copy kernel per parameter and dividing the loss instead of the gradients by the "
                   "world size took the flat fp32 path from 1.84-1.87x to 1.88-1.90x. Overlapping the all-reduce with the "
                   "backward pass (model compiled as 2 or 4 segments so upper-layer gradients arrive early, buckets sent from "
                   "gradient hooks) gave 1.85-1.87x: NCCL's kernels take SMs from the backward kernels they run beside. More "
                   "NCCL channels (`NCCL_MIN_NCHANNELS=32`) changed nothing. Latest revision (last three rows): the summed "
                   "flat buffer becomes the gradients (each `p.grad` a view of it, as DDP's `gradient_as_bucket_view`), so "
                   "the copy back is gone: fp32 gradients scaled 1.904x, 1.907x and 1.905x (HF + DDP 1.929x in the first "
                   "run), at the >= 1.9x target in all three runs, by a margin of under 0.5 %.")
    gen = _load("generate.json")
    if gen:
        out.append("\n## Decoding speed (issue 5)\n")
        out.append("`benchmarks/generate.py`: GPT-2 small with random weights (the same weights on both sides), a 32-token "
                   "prompt, 256 greedy new tokens, after a warm-up run of the same length; `same tokens` is the share of "
                   "output tokens both sides agree on.\n")
        out.append("| case | ctxkit tokens/s | peer | peer tokens/s | speedup | same tokens | device | date |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in gen:
            out.append(f"| {r['case']} | {_fmt(r['ctxkit'])} | {r['peer_name']} | {_fmt(r['peer'])} | {_fmt(r['speedup'])} | "
                       f"{_fmt(r['same_tokens_share'])} | {r['device']} | {r['date']} |")
        out.append("\nctxkit's fastest variant per row is named in `ctxkit_variant` of each record (all variants are in "
                   "`ctxkit_variants`). GPU: the one-token step runs over a static KV cache with fixed shapes and is "
                   "replayed as one CUDA graph per token (`ctxkit.decoding.static_decode`, used by `generate` on CUDA); "
                   "compiling that step fuses the elementwise work between GEMMs; the prompt pass is captured too (once "
                   "per prompt length), each layer writes its new key and value with one kernel (one buffer per layer), "
                   "and greedy argmax over the 50k logits runs in two stages (batch 1: plain loop 188, CUDA graph 1,448, "
                   "graph + compiled step 2,044 tokens/s; batch 16: 4,070 / 18,662 / 26,223). Against the targets: batch 1 "
                   "is 2,044 tokens/s (target 2,000, met; 3.6x HF's static cache; ~480 us per step for 129 kernels, the "
                   "weights alone need ~85 us of HBM time, so launch latency still dominates) and batch 16 is 3.0x HF's "
                   "static cache (target 1.5x, met). An earlier revision (before the three changes above) measured "
                   "1,882 / 1,907 tokens/s at batch 1. Since 2026-11-27 a batch-1 compiled step computes each one-row "
                   "product as a fused multiply + sum reduction (`ctxkit.fast.rows`; cuBLAS's GEMM kernels take 4-5 us "
                   "per matrix at one row): batch 1 2,206 tokens/s on the H100 (+7 % on 2,058 measured the day before, "
                   "same greedy tokens); batch 16 is unchanged (more than one row keeps the GEMMs). `same tokens` below 1 on the GPU "
                   "is bf16 rounding: random weights give near-flat logits, so argmax ties break differently as soon as "
                   "the kernels differ (ctxkit's own plain loop and graph agree with each other to the same degree); in "
                   "fp32 the graph path equals the plain loop token for token (`tests/test_cuda_graphs.py`).\n")
        out.append("CPU (fp32, 2 threads): decoding one token reads every weight once (~500 MB), and PyTorch's MKL "
                   "matrix-vector product reads at ~13 GB/s on this AMD CPU, where NumPy's OpenBLAS reaches ~28 GB/s. "
                   "`generate` routes one- and two-row products to NumPy (`ctxkit.decoding.cpu_gemv`: 45 tokens/s, no "
                   "compilation); `generate(..., compile=True)` / `ctxkit generate --compile` compiles the static-cache step "
                   "with frozen weights and Inductor's C++ GEMM templates (59 tokens/s = 2.15x HF, target 2x met; about 20 s "
                   "to compile once per shape).")
    inf = [r for r in _load("inference_cpu.json") if r.get("benchmark") == "inference_cpu"]
    if inf:
        out.append("\n## CPU inference and deployment (issue 6, in progress)\n")
        out.append("`benchmarks/inference_cpu.py`: a BERT-base sentence classifier (random weights, the same encoder on both "
                   "sides), 2 threads. Latency is the median of batch-1 runs; for each precision ctxkit's fastest backend "
                   "(named) against the fastest peer (named); `all backends` lists every measurement. Throughput runs the "
                   "872 real SST-2 dev sentences at batch 32: ctxkit batches by length (its `predict`), and each precision "
                   "has two peer rows from the same timed rounds: the peer fed the very batches `predict` runs (same "
                   "sentences, boundaries and padding: `peer on ctxkit's length-sorted batches`, which compares model code "
                   "alone) and the peer fed file-order batches padded to their longest (`peer in file order`, as a plain "
                   "loop would). Each throughput figure is the median of interleaved rounds (ctxkit and peer passes "
                   "alternating, the order rotated each round, same threads; `statistic` in each record).\n")
        out.append("| case | ctxkit | ctxkit backend | peer | peer name | speedup | all backends | device | date |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in inf:
            every = "; ".join(f"{side} {k}: {v}" for side, values in (r.get("all_ms") or r.get("all_sentences_per_s") or {}).items()
                              for k, v in values.items())
            unit = r["unit"]
            if r["metric"].startswith("int8 / fp32"):
                out.append(f"| {r['case']} | {_fmt(r['ctxkit'])} {unit} | ONNX int8 vs fp32 safetensors | | | | "
                           f"{r['sizes_mb']} MB | {r['device']} | {r['date']} |")
                continue
            out.append(f"| {r['case']} | {_fmt(r['ctxkit'])} {unit} | {r['ctxkit_backend']} | {_fmt(r['peer'])} {unit} | {r['peer_name']} | "
                       f"{_fmt(r['speedup'])} | {every} | {r['device']} | {r['date']} |")
        out.append("\nCommand: `" + inf[0]["command"] + "`.")
        out.append("\nAgainst the issue's targets (this run): SST-2 dev throughput is 1.92x (fp32) and 1.87x (int8) the best "
                   "peer (target 1.5x, met: length bucketing removes the padding the peers compute); int8 is 0.25x the fp32 "
                   "size (target <= 0.3x, met) and loses 0.11 points on SST-2 dev (target <= 0.5, met; results.md; measured "
                   "before the change below, which is exact in fp32). bf16: the compiled backend (`ctxkit.inference.cpu_compile`: "
                   "frozen weights, Inductor C++ GEMMs, fused elementwise work) is 1.44x / 1.29x faster than transformers' bf16 "
                   "autocast at seq 128 / 256 (met). fp32 and int8: ctxkit's best backend and the best peer run the same ONNX "
                   "Runtime kernels, so until this revision they sat at parity within run-to-run noise (earlier runs: fp32 "
                   "1.23x / 1.02x, then 0.89x / 1.05x; int8 1.01x / 0.98x, then 1.25x / 1.00x). A sentence classifier reads only "
                   "[CLS], so ctxkit now runs the last encoder layer at [CLS] alone (keys and values still from every token; "
                   "exact, tested), ~7 % fewer FLOPs: fp32 1.04x / 1.07x and int8 1.05x / 1.08x the fastest peer (ONNX Runtime "
                   "on the HF export) at seq 128 / 256 in this run, and 1.04x / 1.07x, 1.06x / 1.08x in a repeat run right after "
                   "(`benchmarks/results/logs/inference_cpu_repeat_2026-11-26.json`): **met in relative terms, by a margin "
                   "that matches the skipped work**. The absolute thresholds (fp32 <= 55 ms, int8 <= 20 ms at seq 128) are not "
                   "reachable on this machine: the peers themselves run 2-2.5x slower here than in the issue's measurements "
                   "(ORT fp32 138 vs 54.8 ms, ORT int8 41 vs 20.4 ms).")
    gpu = _load("inference_gpu.json")
    if gpu:
        out.append("\n## GPU inference (issue 6)\n")
        out.append("`benchmarks/inference_gpu.py`: a BERT-base sentence classifier with random weights (the same weights and "
                   "head on both sides), bf16 weights, one GPU, peers measured in the same run. Batch-1 latency is the median "
                   "of synchronised calls including the host-to-device copy of the inputs; throughput runs full rows (batch "
                   "256, seq 128) or the 872 real SST-2 dev sentences in file order, 256 at a time, padded to each batch's "
                   "longest and fed identically to both sides. ctxkit is `ctxkit.inference.gpu.GPUEncoder` "
                   "(`--backend gpu`): CUDA graphs for full rows, packed rows (flash attention's variable-length kernel, no "
                   "compute on padding) otherwise; `all` lists every variant.\n")
        out.append("| case | ctxkit | ctxkit variant | peer | peer name | speedup | all | device | date |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in gpu:
            every = "; ".join(f"{k}: {v}" for k, v in r["all"].items())
            case = r["case"] + (f" ({r['revision']})" if r.get("revision") else "")
            out.append(f"| {case} | {_fmt(r['ctxkit'])} {r['unit']} | {r['ctxkit_variant']} | {_fmt(r['peer'])} {r['unit']} | "
                       f"{r['peer_name']} | {_fmt(r['speedup'])} | {every} | {r['device']} | {r['date']} |")
        out.append("\nCommand: `" + gpu[0]["command"] + "` (with the repository's copy of the tokenizer and SST-2 on the GPU "
                   "machine). Against the issue's targets (latest runs, in file order last): batch 1 takes 0.49-0.51 ms "
                   "(target <= 1.5 ms, met). Batch 256, exact bf16: 1.13x the faster HF mode. With BERT's GELU computed in "
                   "tanh form inside the fc1 GEMM's cuBLASLt epilogue (`GPUEncoder(gelu_epilogue=True)`, a declared "
                   "approximation: |gelu_erf - gelu_tanh| < 5e-4, below bf16's rounding; SST-2 dev accuracy 90.48, equal to "
                   "fp32, in results.md): 24.2-24.7k seq/s, 1.26x the higher and 1.38x the lower HF-compiled measurement of "
                   "the same run (HF compiled varied 17.5-19.5k between cases). Target 1.5x: **not met**, and out of reach "
                   "with cuBLAS and cuDNN kernels: `benchmarks/fp8_gemm.py` times BERT-base's four GEMMs at batch 256 x 128 at "
                   "0.183 + 0.073 + 0.229 + 0.217 = 0.70 ms per layer and the profile shows cuDNN attention at 0.07 ms; "
                   "twelve layers of those alone take 9.3 ms per batch, 27.7k seq/s = 1.42x HF compiled's 19.5k even if every "
                   "LayerNorm, residual add and activation were free. Variable lengths: packed batches now replay from "
                   "bucketed CUDA graphs (`GPUEncoder`: the token count rounded up by at most 1/8 with filler rows, one graph "
                   "per bucket), which took SST-2 dev from 46.2k sentences/s (the same packed work launched from Python) to "
                   "64.6k, 1.81x HF compiled, and 78.1k (2.19x) with the GELU epilogue; `benchmarks/packed_overhead.py` "
                   "shows the per-batch wall time falling from 4.4 to 3.9 ms against 3.2-3.4 ms of GPU kernels. FP8 (q/k/v "
                   "as one fp8 GEMM): 18.0k vs 22.0k seq/s for bf16, still slower. `benchmarks/fp8_gemm.py --profile` says "
                   "why: quantising the fc2 input per row (GELU, a row maximum over 3,072 values and the cast, which "
                   "Inductor emits as a looped reduction) takes 459 us per layer against 156 us for the bf16 GELU, and "
                   "row-scaled fp8 GEMMs run only 1.1-1.4x faster than bf16 at these shapes (tensor-scaled: 1.3-1.5x). "
                   "Calibrated per-tensor scales would remove both costs, but the estimate (tensor-scaled GEMMs 0.49 ms "
                   "per layer plus the norms, GELU and attention) is ~0.79 ms per layer against ~0.86 ms for bf16 with the "
                   "GELU epilogue: ~8 %; not done. (Since then: fp8 for the norm-fed products only, with the "
                   "quantisation inside the norm's kernel and the bias and GELU in a Triton epilogue, is 1.145x faster "
                   "than exact bf16: `GPUEncoder(fp8=\"norm_inputs\")`, in the hardware-floor section below.)")
    out.extend(xl_performance_section())
    out.extend(sparse_attention_section())
    out.extend(floor_section())
    out.extend(regression_section())
    return "\n".join(out) + "\n"


def regression_section() -> list[str]:
    """Before/after figures of a structural change (benchmarks/gpu_regression.sh and .py)."""
    rows = _load("refactor_regression.json")
    if not rows:
        return []
    out = ["\n## No regression from structural changes (issue 19)\n",
           "`benchmarks/gpu_regression.sh` runs the four GPU benchmarks (pretrain_throughput, inference_gpu, generate, "
           "finetune_vs_hf) on the tree before a change and on the tree after it, back to back on one card; "
           "`benchmarks/gpu_regression.py` compares ctxkit's figures and fails when one is more than 3 % worse. "
           f"Change: {rows[0].get('change', '')}.\n",
           "| benchmark | case | metric | before | after | unit | after vs before | device | date |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['benchmark']} | {r['case']} | {r['metric']} | {_fmt(r['peer'])} | {_fmt(r['ctxkit'])} | {r['unit']} | "
                   f"x{r['speedup']:.3f} | {r['device']} | {r['date']} |")
    out.append("\nCommand: `" + rows[0]["command"] + "`.")
    return out


def main() -> None:
    (REPO / "docs" / "results.md").write_text(results_page(), encoding="utf-8")
    # The hand-written engineering notes at the end of performance.md (measurements, findings
    # and plans) are kept as they are; only the generated tables above them are rewritten.
    perf = REPO / "docs" / "performance.md"
    old = perf.read_text(encoding="utf-8") if perf.is_file() else ""
    notes = old[old.index(NOTES_HEADING):] if NOTES_HEADING in old else ""
    perf.write_text(performance_page().rstrip("\n") + ("\n\n" + notes if notes else "\n"), encoding="utf-8")
    print("wrote docs/results.md and docs/performance.md")


if __name__ == "__main__":
    main()
