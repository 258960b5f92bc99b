"""The generated part of docs/notes/performance-history.md: every speed record of
benchmarks/results/*.json (older runs, ablations, the distance to the hardware floor, the
regression checks) with the measurement notes that go with them.

docs/performance.md shows only the newest record per case (benchmarks/make_tables.py:
``performance_page``); this page keeps the rest, so a figure leaves the reader's page without
leaving the documentation. The hand-written engineering notes after :data:`NOTES_HEADING`
are kept by :func:`with_kept_notes` when the page is rewritten.
"""

from __future__ import annotations

from records_io import fmt as _fmt
from records_io import load_records as _load
from tables_more import floor_section, sparse_attention_section
from tables_xl import xl_performance_section

#: where the hand-written part of docs/notes/performance-history.md starts (make_tables and
#: docs/hooks.py keep everything from this heading on)
NOTES_HEADING = "## Engineering notes (moved from architecture.md)"

HISTORY_INTRO = """# Performance history, ablations and negative results

Generated from `benchmarks/results/*.json` by `python benchmarks/make_tables.py`, with the
hand-written engineering notes at the end. [Performance](../performance.md) shows the newest
record per case; this page has every record (older runs, ablations, the distance to the
hardware floor, the regression checks) and what was measured, tried and dropped on the way.
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


def history_page() -> str:
    """The generated part of docs/notes/performance-history.md: every speed record, in file order."""
    speed = [r for r in _load("finetune_vs_hf.json") if "benchmark" in r]
    out = [HISTORY_INTRO]
    out.append("| case | metric | ctxkit (s) | peer | peer (s) | speedup | device | date |")
    out.append("|---|---|---|---|---|---|---|---|")
    for r in speed:
        out.append(f"| {r['case']} | {r['metric']} | {_fmt(r['ctxkit'])} | {r.get('peer_name') or ''} | {_fmt(r['peer'])} | {_fmt(r['speedup'])} | {r['device']} | {r['date']} |")
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
            out.append(f"| {r['case']} | {_fmt(r['ctxkit'])} | {_fmt(r.get('ctxkit_mfu'))} | {r['peer_name'] or ''} | {_fmt(r['peer'])} | "
                       f"{_fmt(r.get('peer_mfu'))} | {_fmt(r['speedup'])} | {r['device']} | {r['date']} |")
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
            out.append(f"| {r['case']} | {_fmt(r['ctxkit'])} | {r.get('peer_name') or ''} | {_fmt(r['peer'])} | {_fmt(r['speedup'])} | "
                       f"{_fmt(r.get('same_tokens_share'))} | {r['device']} | {r['date']} |")
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
            out.append(f"| {r['case']} | {_fmt(r['ctxkit'])} {unit} | {r['ctxkit_backend']} | {_fmt(r['peer'])} {unit} | {r.get('peer_name') or ''} | "
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
            every = "; ".join(f"{k}: {v}" for k, v in (r.get("all") or r.get("peers_all") or {}).items())
            case = r["case"] + (f" ({r['revision']})" if r.get("revision") else "")
            out.append(f"| {case} | {_fmt(r['ctxkit'])} {r['unit']} | {r.get('ctxkit_variant') or r.get('ctxkit_plan', '')} | {_fmt(r['peer'])} {r['unit']} | "
                       f"{r.get('peer_name') or ''} | {_fmt(r['speedup'])} | {every} | {r['device']} | {r['date']} |")
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
    older = [r for r in _load("serve_generate.json") if "benchmark" in r and "served in bf16" not in r["case"]]
    if older:
        out.append("\n## The generation server's first GPU run (issue 40)\n")
        out.append("`benchmarks/serve_generate.py --requests 256 --peer-requests 24`: the server in fp32, without CUDA "
                   "graphs, every step running all 64 slots (the performance page has the run since: bf16, a graph per "
                   "batch width, chunked prefill, 512 requests).\n")
        out.append("| case | metric | ctxkit | peer | peer figure | speedup | device | date |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in older:
            out.append(f"| {r['case']} | {r['metric']} | {_fmt(r['ctxkit'])} {r['unit']} | {r.get('peer_name') or ''} | "
                       f"{_fmt(r['peer'])} | {_fmt(r['speedup'])} | {r['device']} | {r['date']} |")
        out.append("\nCommand: `" + older[0]["command"] + "`.")
    out.extend(xl_performance_section())
    out.extend(sparse_attention_section())
    out.extend(floor_section())
    out.extend(fp8_runs_section())
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


def fp8_runs_section() -> list[str]:
    """Every fp8 ``norm_inputs`` inference run against exact bf16 (benchmarks/floor.py --fp8).

    The floor section names only the newest of these runs in its text, so the older ones are
    listed here; without this table they would be on neither page.
    """
    rows = [r for r in _load("floor.json") if "fp8" in r["case"]]
    if not rows:
        return []
    out = ["\n### FP8 inference against exact bf16, every run\n",
           "| case | fp8 seq/s | exact bf16 seq/s | speedup | device | date |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['case']} | {r['ctxkit']:,.1f} | {r['peer']:,.1f} | {r['speedup']:.3f}x | {r['device']} | {r['date']} |")
    out.append("\nCommands: " + "; ".join(f"`{c}`" for c in dict.fromkeys(r["command"] for r in rows)) + ".")
    return out


def with_kept_notes(generated: str, old: str) -> str:
    """``generated`` followed by the hand-written notes of ``old`` (from :data:`NOTES_HEADING` on).

    Args:
        generated: the page as :func:`history_page` renders it.
        old: the committed page (or the markdown mkdocs read), whose notes are kept verbatim.

    Returns:
        The whole page; just ``generated`` when ``old`` has no notes heading.
    """
    notes = old[old.index(NOTES_HEADING):] if NOTES_HEADING in old else ""
    return generated.rstrip("\n") + ("\n\n" + notes if notes else "\n")
