"""Tables of the lectures' "And more" systems (issue 22) and of the distilled student's GPU
speed (issue 21), for benchmarks/make_tables.py (kept apart so each file stays readable)."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _load(name: str) -> list:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else []


def _fmt(x) -> str:
    return f"{x:,.4g}" if isinstance(x, float) else f"{x:,}" if isinstance(x, int) else str(x)


def distill_speed_section() -> list:
    """Teacher vs. student on the paths without Python launch overhead (benchmarks/distill_speed.py)."""
    rows = _load("distill_speed.json")
    if not rows:
        return []
    out = ["\n### Speed on the GPU, measured without launch overhead\n",
           "The eager batches above are partly bound by kernel launches from Python, so their ratio moves between runs. "
           "`benchmarks/distill_speed.py` times the same two architectures (random weights: speed does not depend on "
           "them) on ctxkit's GPU inference path (`GPUEncoder`: bf16 weights, one CUDA graph per shape, what "
           "`--backend gpu` and `ctxkit serve` run) and eagerly, alternating in one process; medians of 100 calls.\n",
           "| case | student | teacher | speed-up | size | device | date |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        case = r["case"].split("), ", 1)[-1]
        out.append(f"| {case} | {_fmt(r['ctxkit'])} ms | {_fmt(r['peer'])} ms | {r['speedup']:.2f}x | 1/{r['size_ratio']:.2f} | "
                   f"{r['device']} | {r['date']} |")
    out.append(f"\nCommand: `{rows[0]['command']}`. On the deployment path the 3-layer student is 1.80x (batch 1), "
               "1.90x (batch 32) and 2.06x (batch 256) faster than its teacher; the ratio cannot reach 2x at small batches "
               "because the embeddings, the head and the host-side work do not shrink with the layers.")
    return out


def quaternion_mt_section() -> list:
    """Quaternion vs. real-valued Transformer translators on Multi30k (benchmarks/quaternion_mt.py)."""
    rows = _load("quaternion_mt.json")
    if not rows:
        return []
    out = ["\n## Quaternion Transformer on Multi30k (issue 22)\n",
           "`translate-train --quaternion` (or a `quaternion_*` preset) replaces every attention projection and FFN "
           "matrix of the encoder and decoder by a `QuaternionLinear` (Tay et al. 2019: four (out/4, in/4) blocks "
           "combined by the Hamilton product, a quarter of the weights); embeddings and the tied output stay real. "
           "Each model trained for the same 2.2 minutes on its own GPU of one machine (dropout 0.2, the recipe of the "
           "translation section), then test2016 with sacreBLEU.\n",
           "| model | metric | test2016 | real-valued reference | parameters | steps | valid BLEU | device | date |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['metric']} | {_fmt(r['value'])} | {_fmt(r['peer_value'])} | {r['parameters'] / 1e6:.2f} M | "
                   f"{r['steps']} | {_fmt(r['valid_bleu'])} | {r['device']} | {r['date']} |")
    out.append("\nCommand: `bash benchmarks/lectures_more.sh 1 CORPUS MULTI30K OUT` then "
               "`python benchmarks/quaternion_mt.py OUT/mt --device 'NVIDIA H200'`. At the same width the quaternion model "
               "keeps 97.9 % of the real model's BLEU (beam 4) with 46 % of its parameters; at about the same parameter "
               "count (width 448) it is 0.3 points ahead, as Tay et al. report for their translation tasks. The quaternion "
               "layers build their (out, in) matrix from the four blocks at every call, so a step costs more: 30 % fewer "
               "steps in the same time.")
    return out


def char_lm_section() -> list:
    """Character-level LMs (benchmarks/char_lm_results.py --collect)."""
    rows = _load("char_lm.json")
    if not rows:
        return []
    out = ["\n## Character-level language modelling with deep self-attention (issue 22)\n",
           "| model | test bpc | valid bpc | parameters | steps | train s | device | date |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {_fmt(r['value'])} | {_fmt(r['valid_value'])} | {r['parameters'] / 1e6:.1f} M | {r['steps']} | "
                   f"{_fmt(r['train_time_s'])} | {r['device']} | {r['date']} |")
    by = {r["model"].split(":")[0]: r for r in rows}
    t12, lstm = by.get("t12"), by.get("lstm")
    if t12 is None:
        return out
    d = {name: r["value"] - t12["value"] for name, r in by.items()}
    out.append(f"\nCommand: `{t12['command']}`. Corpus: `ctxkit char-corpus` over the 64 files of the Wikipedia extract "
               "(text8 rules: lowercase letters and single spaces; 50.9 M / 2.88 M / 2.95 M characters, split by a hash of "
               "the article title); bits per character over the first 1 M characters of valid and test, scored with "
               "sliding windows (Transformers) or statefully (LSTM). Every run is batch 32 x 512 characters on one GPU, "
               "alone. These are short runs (2,500 steps = 41 M characters, under one epoch), so the bpc is far from the "
               "paper's 64-layer 1.13 on text8 after days of training; the comparisons are what they measure.")
    if lstm is not None:
        out.append(f"\n- **Transformer vs LSTM at equal GPU time** ({_fmt(t12['train_time_s'])} s each): T12 "
                   f"({t12['parameters'] / 1e6:.1f} M) {_fmt(t12['value'])} bpc after {t12['steps']} steps, the 2-layer LSTM "
                   f"({lstm['parameters'] / 1e6:.1f} M) {_fmt(lstm['value'])} after {lstm['steps']}: the Transformer is "
                   f"{lstm['value'] - t12['value']:.3f} bpc better, and takes 1.8x more steps in the same time.")
    if all(k in d for k in ("t12_no_aux_positions", "t12_no_aux_layers", "t12_no_second_target")):
        out.append(f"- **Auxiliary-loss ablation** (equal steps): without the loss at every position (only the last "
                   f"character of each segment is a target: 32 targets a step instead of 16,384) +{d['t12_no_aux_positions']:.2f} bpc; "
                   f"without the intermediate-layer losses +{d['t12_no_aux_layers']:.3f}; without the character-after-next "
                   f"loss {d['t12_no_second_target']:+.4f}. At this budget the loss at every position dominates (it is "
                   "most of the training signal), the intermediate layers help, and the second target shows no effect.")
    if "t12_strided" in d and "t12_fixed" in d:
        out.append(f"- **Sparse vs dense attention** (equal steps, context 512, stride / block 32): strided "
                   f"+{d['t12_strided']:.3f} bpc, fixed +{d['t12_fixed']:.3f}. At 512 characters dense attention is cheap "
                   "and sees every earlier character; the sparse patterns pay for what they leave out, and their "
                   "steps run outside CUDA graphs (the block masks are built on first use), about 2.3x longer. Their "
                   "case is long sequences: see the kernel table below (16k tokens: 1.7-2.1x faster than flash attention, forward+backward).")
    if "t12_quaternion" in d and "t12_quaternion_wide" in d:
        q, qw = by["t12_quaternion"], by["t12_quaternion_wide"]
        out.append(f"- **Quaternion layers**: at the same width ({q['parameters'] / 1e6:.1f} M parameters, 31 % of T12's) "
                   f"+{d['t12_quaternion']:.3f} bpc; at about T12's parameters (width 960, {qw['parameters'] / 1e6:.1f} M) "
                   f"+{d['t12_quaternion_wide']:.3f} in {qw['train_time_s'] / t12['train_time_s']:.1f}x the time. On characters "
                   "the real-valued model wins at equal parameters, unlike translation (above), where quaternion layers "
                   "at equal parameters were 0.3 BLEU ahead.")
    return out


def sparse_attention_section() -> list:
    """The block-sparse kernel vs. dense SDPA (benchmarks/sparse_attention.py)."""
    rows = _load("sparse_attention.json")
    if not rows:
        return []
    out = ["\n## Sparse Transformer attention (issue 22)\n",
           "`benchmarks/sparse_attention.py`: one attention call (batch 1, 8 heads x 64, bf16) with the strided and fixed "
           "patterns of Child et al. (l = 128, fixed: c = 8) through FlexAttention block masks "
           "(`ctxkit.layers.SparsePattern`), against dense causal SDPA (flash) and dense SDPA with the pattern as a boolean "
           "mask. The strided pattern is run as two calls (the local band, then the stride set with q/k/v reordered "
           "column-major so that it is block-sparse too), merged exactly through their log-sum-exps; the fixed pattern "
           "as one call over [summary keys, all keys].\n",
           "| case | metric | sparse | dense causal SDPA | speed-up / ratio | all | device | date |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        every = "; ".join(f"{k}: {v}" for k, v in r.get("all", {}).items())
        out.append(f"| {r['case']} | {r['metric']} | {_fmt(r['ctxkit'])} {r['unit']} | {_fmt(r['peer'])} {r['unit']} | "
                   f"{_fmt(r['speedup'])} | {every} | {r['device']} | {r['date']} |")
    out.append(f"\nCommand: `{rows[0]['command']}`. At batch 1 the sparse calls take about 1 ms at every length: launch "
               "overhead, not arithmetic. They overtake the boolean-mask SDPA from 8k tokens (8k: 1.1 vs 2.1 ms forward+backward) "
               "and flash attention's causal kernel at 16k (1.1-1.4 vs 2.3 ms; 2.2-2.9x faster forward); their memory grows "
               "linearly like flash's, while the boolean mask's reaches 609 MiB at 16k.")
    return out


def floor_section() -> list:
    """How far the GPU paths are from their hardware floor (benchmarks/floor.py, issue 24)."""
    everything = _load("floor.json")
    rows = [r for r in everything if "fp8" not in r["case"]]  # fp8 rows compare with bf16, not the floor
    if not rows:
        return []
    out = ["\n## Distance to the hardware floor (issue 24)\n",
           "`benchmarks/floor.py` times, on the same card in the same run, the work a step cannot avoid with the same "
           "shapes: for BERT-base inference (batch 256, seq 128) the 48 Transformer GEMMs and 12 flash-attention calls; "
           "for a pretraining step the same GEMMs forward and backward (each with its own input, weights only: a bias "
           "gradient is a reduction, not GEMM work) plus the MLM head's, flash attention forward and backward, and one "
           "fused AdamW step; for GPT-2 decoding every weight read once per token at the bandwidth a device-to-device "
           "copy reaches. `of floor` is the fraction of the floor's speed ctxkit reaches.\n",
           "| case | ctxkit | floor | of floor | floor parts | ctxkit configuration | device | date |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        parts = "; ".join(f"{k} {v} ms" for k, v in (r.get("floor_ms") or {}).items())
        if "weight_mb" in r:
            parts = (f"{r['weight_mb']} MB at {r['bandwidth_tb_s']} TB/s; measured: {r['kernels_per_token']} kernels, "
                     f"{r['kernel_us_per_token']} us of kernels per token")
        num = (lambda v: f"{v:,.0f}" if v >= 1000 else f"{v:.2f}")  # noqa: E731
        out.append(f"| {r['case']} | {num(r['ctxkit'])} {r['unit']} | {num(r['peer'])} {r['unit']} | {r['speedup']:.1%} | {parts} | "
                   f"{r.get('ctxkit_variant') or r.get('ctxkit_plan', '')} | {r['device']} | {r['date']} |")
    out.append(f"\nCommand: `{rows[0]['command']}` (the first H100 inference and pretraining rows; the H100 decode row "
               "`python benchmarks/floor.py --parts decode`, as the H200 decode row; the H200 rows are from before the "
               "GELU GEMM; the last two rows, from the seventh session, `python benchmarks/floor.py --parts inference "
               "pretrain` and, for the pretraining row with the packed-bit dropout, `python benchmarks/floor.py --parts "
               "pretrain --pretrain-variants graphs+compile-model+bf16res+gelugemm "
               "graphs+compile-model+bf16res+gelugemm+maskdrop`; the two rows of the eighth session, with master weights, "
               "two back-to-back runs of `python benchmarks/floor.py --parts pretrain --steps 30 --pretrain-variants "
               "graphs+compile-model+bf16res+gelugemm+maskdrop graphs+compile-model+bf16res+gelugemm+maskdrop+master`). "
               "The rows of the ninth session: `python benchmarks/floor.py --parts inference --profile --fp8`, two runs "
               "of `python benchmarks/floor.py --parts inference` (floor before/after) with one pretraining run of the "
               "final configuration after them, the Inductor-option experiments `... --pretrain-variants "
               "graphs+compile-model+bf16res+gelugemm+maskdrop+master graphs+compile-model+bf16res+gelugemm+maskdrop+master+nosplit` "
               "and `... graphs+compile-model+bf16res+gelugemm+maskdrop+master+qkvpack` followed by its `+mixsplit32`, "
               "`+mixsplit64`, `+mixsplit128` and `+mixtune` forms, two runs of `... maskdrop+master maskdrop+master+qkvpack`, "
               "and three of the final pair (their commands are in the records). "
               "The rows of the tenth session (the GELU epilogue rewritten for instruction count, below): three runs "
               "of `python benchmarks/floor.py --parts inference` and two of `python benchmarks/floor.py --parts "
               "pretrain --steps 30 --pretrain-variants graphs+compile-model+bf16res+gelugemm+maskdrop+master+qkvpack+mixsplit64` "
               "(the second with `--profile`). "
               "Targets (issue 24): inference >= 90 % of the floor "
               "(met in the tenth session: 92.2 %, 91.6 % and 91.1 % in three runs, 24.0k seq/s against floors of "
               "26.0-26.3k; before, 84.8-87.8 % over seven runs: the last profile at 87.7 % put per batch 3.75 ms in "
               "the GELU GEMMs and 5.07 ms in cuBLAS's other GEMMs, 0.79 ms in attention, 1.08 ms in the 24 residual "
               "+ LayerNorm kernels at their memory traffic and ~0.23 ms between kernels; the GELU GEMM's epilogue "
               "cost 0.073 ms a call over its bias-only twin, and now 0.042), a pretraining step >= 75 % (met: "
               "75.6-77.0 % in five runs of `graphs+compile-model+bf16res+gelugemm+maskdrop+master+qkvpack+mixsplit64` "
               "in the ninth session, 77.8 % and 77.9 % with the tenth session's GELU epilogues, each against the "
               "floor measured in the same run; against transformers' BertForPreTraining in one run of "
               "`benchmarks/pretrain_throughput.py`: 5,932 vs 3,766 seq/s, 1.58x HF compiled and 2.36x HF eager (the "
               "ninth session's 1.54x), just short of the 1.6x the issue expected 75 % to mean), decoding >= 3,500 tokens/s on an H100 (met: 4,077).")
    fp8_rows = [r for r in everything if "fp8" in r["case"]]
    fp8_gemm = _load("ffn_gemm_fp8.json")
    acc = [r for r in _load("inference_gpu_quality.json") if "norm_inputs" in r.get("model", "")]
    if fp8_rows:
        r = fp8_rows[-1]
        text = (f"\n**FP8 inference faster than bf16** (`GPUEncoder(fp8=\"norm_inputs\")`, "
                "`convert_to_fp8(model, \"norm_inputs\")`; a declared precision). Only the products a LayerNorm "
                "feeds run in float8: self-attention's q/k/v (one product) and the FFN's fc1. Their inputs' per-row "
                "scales and e4m3 cast are computed next to the norm, which `torch.compile` fuses into the norm's "
                "kernel (a persistent reduction over the row: no pass of its own), and the product is the Triton "
                "GEMM of `ctxkit.fast.gemm_kernels` with float8 operands, whose epilogue applies both scales, the "
                "bias and (fc1) the exact GELU before one rounding to bf16. The attention output projection and fc2 "
                "stay bf16: quantising their inputs per row would cost a pass of its own (the earlier all-fp8 form "
                "lost to bf16 for that reason, 18.0k vs 22.0k seq/s). "
                f"BERT-base classifier, batch {r['case'].split('batch ')[1]}: **{r['ctxkit']:,.0f} seq/s vs "
                f"{r['peer']:,.0f} for the fastest exact bf16 variant of the same run ({r['speedup']:.3f}x)**, "
                f"{r['device']}, {r['date']}, `{r['command']}`.")
        if fp8_gemm:
            parts = "; ".join(f"{g['case'].split(',')[0]}: {g['ctxkit']} ms vs {g['peer']} ms ({g['speedup']:.2f}x; "
                              f"cuBLAS row-wise fp8 with bias only: {g['all_peers_ms'].get('cuBLAS fp8 row-wise (torch._scaled_mm, bias)')} ms)"
                              for g in fp8_gemm)
            text += f" The products alone (`{fp8_gemm[0]['command']}`, at (32768 x 768) inputs): {parts}."
        if acc:
            text += (" SST-2 dev accuracy of a fine-tuned MiniLM (benchmarks/fp8_accuracy.py): "
                     + "; ".join(f"{a['value']} ({a['device'].split(',')[0]}; the same run in bf16 "
                                 f"{next((b['value'] for b in _load('inference_gpu_quality.json') if b['device'] == a['device'] and b['model'].endswith(', bf16')), '?')}, "
                                 f"in fp32 {a['peer_value']})" for a in acc)
                     + ": no drop against bf16 (target: <= 0.3 points).")
        out.append(text)
    drops = [r for r in everything if "pretraining" in r["case"] and r.get("ctxkit_variant", "").endswith("maskdrop")]
    if drops:
        r = drops[-1]
        out.append("\n**Dropout masks as packed bits** (`TrainConfig(fast_dropout=True)`, `ctxkit.fast.fast_dropout`, "
                   "pretraining option `maskdrop`). An H100 profile of the step put the fused residual + dropout + "
                   "LayerNorm forward at 152 us per call (21 per step) against 79 us without its random numbers: "
                   "Inductor draws one Philox-4x32-10 evaluation per element and keeps one of its four words. "
                   "`MaskDropout` draws the mask outside the compiled graph (`ctxkit.fast.dropout_kernels`: 8 "
                   "16-bit uniforms per Philox evaluation, packed 8 elements per byte, a 3 MB mask for a "
                   "32768 x 768 activation, 16 us) and the graph unpacks it with index arithmetic that Inductor "
                   "fuses into the norm kernels, forward and backward (the multiply is a checkpointed region so "
                   "the backward re-reads the bits instead of a saved byte-per-element mask). Declared: p is "
                   "rounded to a multiple of 2^-16, and the random stream is another than Inductor's. "
                   f"Step {r['ctxkit']} ms against a floor of {r['peer']} ms ({r['speedup']:.1%}); without it "
                   f"{r['all'].get('graphs+compile-model+bf16res+gelugemm', 0):.2f} ms in the same run. "
                   "(PyTorch's Bernoulli kernel as the mask source saved less: its 41 us per mask ate most of "
                   "the 73 us the norm kernel gained.) Still short of 75 %: the remaining non-floor time is "
                   "the norm kernels at their memory traffic (79-97 us per call), the q/k/v gradient "
                   "concatenation (98 us per layer), bias-gradient reductions and gradient clipping.")
    base = "graphs+compile-model+bf16res+gelugemm+maskdrop"
    masters = [r for r in everything if "pretraining" in r["case"] and r.get("ctxkit_variant", "").endswith("+master")
               and base in r.get("all", {})]
    if masters:
        runs = "; ".join(f"{r['ctxkit']} ms vs {r['all'].get(base, 0):.2f} ms without, floor {r['peer']} ms ({r['speedup']:.1%})"
                         for r in masters)
        out.append("\n**bf16 weights with fp32 masters** (`TrainConfig(master_weights=True)`, "
                   "`ctxkit.training.master.MasterAdamW`, pretraining option `master`). Under bf16 autocast every "
                   "`nn.Linear` costs passes over its weights besides the optimiser's: the cast to bf16 in the "
                   "forward, the bf16 gradient converted back to fp32, and clipping's multiply of every fp32 "
                   "gradient. `MasterAdamW` keeps those parameters in bf16 (views into one flat buffer) and their "
                   "fp32 masters and moments in flat buffers; one Triton launch per dtype "
                   "(`ctxkit.fast.adamw_kernels`) reads each bf16 gradient where autograd left it (a table of "
                   "addresses, refilled by kernel arguments so a CUDA graph keeps its own), applies the clipping "
                   "factor, updates the masters as torch's fused AdamW does and writes the rounded bf16 weights; "
                   "a second launch makes the per-block sums of squares for the norm. The numbers are bf16 "
                   "autocast's: autocast rounds the fp32 weight to bf16 just as the master's copy is rounded, and "
                   "hands back the bf16 GEMM's gradient converted to fp32. In a profile the update kernels took "
                   "1.05 ms per step for BERT-base's ~110 M parameters (AdamW's traffic at ~3 TB/s; a first form "
                   "that read the gradients without alignment hints took 1.48 ms) and the sums of squares 0.12 ms. For the default "
                   "optimiser the clipping factor now rides into torch's fused AdamW as `grad_scale` "
                   "(`ctxkit.training.optim.clipped_step`). H100, same runs: " + runs + ".")
    packed = [r for r in everything if "pretraining" in r["case"] and "qkvpack+mixsplit64" in r.get("ctxkit_variant", "")]
    if packed:
        without = base + "+master"
        runs = "; ".join(f"{r['ctxkit']} ms, floor {r['peer']} ms ({r['speedup']:.1%})"
                         + (f", {r['all'][without]:.2f} ms without both in the same run" if without in r["all"] else "")
                         for r in packed)
        out.append("\n**The q/k/v gradients packed in one pass, and fewer partial sums in the norm backward** "
                   "(pretraining options `qkvpack` and `mixsplit64`). Two leftovers of the step's profile, "
                   "per step on an H100: (1) the fused q/k/v projection's backward concatenated the attention's "
                   "`dq`, `dk`, `dv` into the projection's output gradient (98 us per layer) and then summed it "
                   "again for the bias gradient (51 us). `PackedGradQKVAttention` "
                   "(`ctxkit.fast.pack_qkv_grad`, `TrainConfig(packed_qkv_grad=True)`) writes the projection as one "
                   "autograd function whose backward is one Triton kernel (`ctxkit.fast.qkv_kernels`: each "
                   "(128 tokens, head) tile read once, stored packed, its float32 column sums written per tile and "
                   "added in a fixed order) and the two cuBLAS products: 113 us instead of 149, -0.36 ms per step "
                   "in two runs. (2) 46 eager `aten::sum` calls over (2048, 768) float32, 11 us each: Inductor's "
                   "mix-order reduction (the LayerNorm backward and its weight and bias gradients in one kernel) "
                   "leaves partial sums of 16 rows each, 2048 per parameter on an H100 at batch 256, and adds them "
                   "with an eager column sum. `torch._inductor.config.triton.mix_order_reduction_split_size = 64` "
                   "(option `mixsplit64`; `TrainConfig(compile_norm_split=64)`, "
                   "`ctxkit.training.speed.set_norm_grad_split`) leaves 512: -0.19 ms (32 rows: slower; 128: -0.14; Inductor's own "
                   "tuning of the split: slower; no split reductions at all, `nosplit`: +1.4 ms). A Triton "
                   "cross-entropy over the masked positions (online softmax, argmax and the label's logit in one "
                   "read, the gradient in one read and one write) was tried and dropped: its kernels took 0.21 + "
                   "0.29 ms at (5120, 30522), but the compiled loss around them 0.90 ms against 0.66 ms for "
                   "Inductor's own compiled loss forward and backward, and the step did not move. H100 runs of the final configuration: " + runs + ".")
    return out + _floor_rest()


def _floor_rest() -> list:
    out = []
    ffn = _load("ffn_gemm.json")
    if ffn:
        out.append("\n**The exact GELU inside the GEMM** (`ctxkit.fast.gelu_gemm`, `GPUEncoder(gelu_gemm=True)`, "
                   "`TrainConfig(gelu_gemm=True)`). An H100 profile of the compiled batch-256 forward put 1.75 ms of "
                   "its 11.5 ms in Inductor's GELU kernel over the (32768, 3072) activation (cuBLASLt's epilogue "
                   "knows only the tanh GELU) and 1.08 ms in the residual + LayerNorm kernels. "
                   "`ctxkit.fast.gemm_kernels` is a persistent Triton GEMM (TMA descriptors, wgmma, grouped tile "
                   "order, two programs per multiprocessor) whose "
                   "epilogue adds the bias and applies the erf GELU in float32 (erf by Abramowitz-Stegun 7.1.26, "
                   "|error| < 1.5e-7: libdevice's erf made the epilogue compute-bound, 0.372 ms instead of 0.331 with the same tiles), "
                   "and, for training, stores the pre-activation; its backward twin computes "
                   "`(grad_y @ W2) * gelu'(pre)` and the bias gradient's column sums in one kernel. "
                   "`python benchmarks/ffn_gemm.py` (H100, ms):\n")
        out.append("| product | ctxkit (Triton) | peer | peer ms | speedup | error (bf16 steps) |")
        out.append("|---|---|---|---|---|---|")
        for r in ffn:
            out.append(f"| {r['case']} | {r['ctxkit']} | {r.get('peer_name') or ''} | {r['peer']} | {r['speedup']:.2f}x | "
                       f"{r['max_error_bf16_steps']} |")
        out.append("\nWhen the GELU GEMM first landed (sixth session), the plain product was 16 % slower than cuBLAS "
                   "(0.268 vs 0.225 ms) and the GELU epilogue added 0.06-0.07 ms a call to it, not overlapped "
                   "with the products: inference 22.0k -> 23.2k seq/s (84.8 % of the floor), the pretraining step "
                   "47.5 -> 46.8 ms. Triton's warp specialisation (Hopper, `SWEEP_WS`) was slower (0.345-0.50 ms).\n\n"
                   "**The GELU epilogue written for instruction count** (tenth session). What the GELU adds to the "
                   "GEMM is the issue slots of its float32 instructions, about 20 per element, which the two "
                   "programs per multiprocessor did not hide. `_normal_tail` now computes Phi(-|x|) with one "
                   "`rcp.approx.ftz` and one `ex2.approx.ftz` (PTX through `tl.inline_asm_elementwise`: Triton's "
                   "division and `exp` add range fix-ups), the constants folded (p / sqrt 2, the halved "
                   "coefficients, -log2(e) / 2), and the GELU is `relu(x) - |x| Phi(-|x|)`, one multiply-add "
                   "instead of a select, a subtraction and a product; the backward's `gelu'` shares the tail. "
                   "The same formula to float32 rounding (tests/test_fast_gemm.py checks Phi, phi and the GELU "
                   "against float64 on -12..12, on the GPU and in Triton's interpreter). Per call on an H100: GELU "
                   "0.316 -> 0.288 ms (bias only 0.245), GELU backward 0.483 -> 0.412, fp8 fc1 + GELU 0.236 -> 0.203. "
                   "In the model: inference 87.2-87.5 % -> 91.1-92.2 % of the floor, the pretraining step 44.2 -> "
                   "43.2 ms. Tried and dropped in the same session: staggering the two programs of each "
                   "multiprocessor (the second sleeping 0.5-5 us first, so that one's epilogue meets the other's "
                   "products): no change (0.315-0.320 ms); and the residual added by cuBLAS (`addmm` with the "
                   "residual as C, the norm kernel then reading one tensor instead of two): `addmm` copies C into "
                   "its output first (+0.033 ms), and the GEMM kernel alone (what an in-place `addmm_` would run) "
                   "was 0.002 ms slower at K = 768 and 0.026 ms at K = 3072, against about 0.011 ms the norm "
                   "kernel saves per call.\n\n"
                   "**Where the GELU backward's time goes** (H100, the (32768 x 768) @ (768 x 3072) product, one "
                   "program of 128 x 256 per multiprocessor; each line one part of the epilogue removed in a copy "
                   "of the kernel): cuBLAS's plain product 0.228 ms; ours storing the product only 0.240; with the "
                   "column sums of the bias gradient 0.280; with the GELU derivative computed from the product "
                   "(no `pre` read) 0.327, and with the sums too 0.338; with `pre` read and the sums but no "
                   "derivative 0.373; `pre` and the derivative but no sums 0.366; everything 0.412. The parts add "
                   "up: nothing in the epilogue overlaps the products. Tried and slower: loading `pre` before the "
                   "tile's K loop (held in registers: 1.93 ms with 128 x 256 tiles, 0.54 ms with 128 x 128), 128 x "
                   "128 tiles two per multiprocessor (0.55 ms), Triton's warp specialisation (0.45-0.60 ms for the "
                   "backward, 0.35-0.46 ms for the forward with `pre` against 0.32). What is left for the "
                   "pretraining step (1.58x HF compiled at 77.9 % of the floor): an epilogue that runs "
                   "while the next tile's products do (CUTLASS's ping-pong schedule; Triton 3.6 does not express "
                   "it), and the bias gradients of the attention output and fc2 products (22 column-sum kernels "
                   "per step, 19 us each) and Inductor's 46 eager partial-sum reductions (11 us each) folded into "
                   "one hand-written residual + dropout + LayerNorm backward. Also tried and reverted: the "
                   "packed dropout bits laid out in blocks of 8 bit planes of 128 bytes (element i as bit "
                   "(i // 128) % 8 of byte (i // 1024) * 128 + i % 128, so neighbouring elements read "
                   "neighbouring bytes instead of 8 sharing one): in isolation the compiled residual + dropout + "
                   "LayerNorm forward took 80 us instead of 94, but in the pretraining step Inductor's mix-order "
                   "LayerNorm backward that reads the bits took 633 us a call instead of 95 (the step 43.2 -> "
                   "54.3 ms, in two runs; the generated kernel's index arithmetic looked harmless, the cause was not "
                   "found).")
    fp8 = [r for r in _load("fp8_training.json") if r.get("metric") in ("MLM loss", "throughput")]
    if fp8:
        loss = next(r for r in fp8 if r["metric"] == "MLM loss")
        speed = next(r for r in fp8 if r["metric"] == "throughput")
        out.append(f"\n**FP8 training** (`TrainConfig(fp8_training=True)`: torchao's row-wise float8 Linears in "
                   f"the Transformer layers; a declared precision). Convergence check, "
                   f"`{loss['command'].split('  #')[0]}`: BERT-base MLM loss over steps 801-1000 "
                   f"{loss['value']} (fp8) vs {loss['peer_value']} (bf16), {loss['relative_difference']:+.2%} "
                   f"(tolerance 1 %: {loss['verdict']}), {loss['device']}, {loss['date']}. Speed in that run: "
                   f"{speed['ctxkit']:,.0f} vs {speed['peer']:,.0f} seq/s ({speed['speedup']:.2f}x): without "
                   "torch.compile torchao's scaling and casts are separate kernels (and padded token counts); "
                   "the option is for memory and convergence studies until it is compiled and profiled.")
    out.append("\n**Decoding at batch 1.** A token of GPT-2 small ran ~130-140 kernels: cuBLAS GEMMs built for "
               "larger batches (4.2-4.8 us each at one row, where reading a 768 x 2304 matrix takes ~1 us), cuDNN "
               "attention over the cache (6.5 us per layer), and the norms, adds and activations between them: "
               "launch- and latency-bound, not bandwidth-bound (2,222 tokens/s on the H100, 18 % of the floor). "
               "Writing one-row linears as fused float32 reductions (`ctxkit.fast.rows`) gained 8 %. What reached "
               "the target is `ctxkit.fast.decode_layer`: each pre-norm layer's step as five Triton kernels "
               "(`ctxkit.fast.decode_kernels`: LayerNorm + q/k/v product + bias + cache write; attention split "
               "over blocks of cache slots with the last program of each head combining them; output product + "
               "bias + residual; LayerNorm + fc1 + bias + GELU; fc2 + bias + residual), 72 kernels per token in "
               "all. Each step on the way, H100, tokens/s: the kernels inside the compiled step 2,739; with the "
               "whole input row in one tile so the weights' load is issued before the LayerNorm, and the "
               "attention's combine in its last program instead of a second kernel, 2,953; launched with "
               "programmatic dependent launch (each kernel starts reading its weights while the previous one "
               "finishes) 3,560 uncompiled, and **4,077 (33.7 % of the floor)** once the kernels run between the "
               "compiled graph's pieces instead of inside them (Dynamo passes no launch options through). The "
               "profiler's kernel time per token (507 us) exceeds the wall time (245 us) because overlapped "
               "kernels are counted whole. `benchmarks/decode_kernels.py` times each kernel per tile against cuBLAS "
               "with the weights read from memory: 2.9, 1.6, 3.2 and 2.5 us for the four matrices of a layer "
               "against cuBLAS's 4.7, 4.2, 4.9 and 7.6 us. `benchmarks/generate.py --batch 1` (H100): 4,002 "
               "tokens/s, 6.7x HF's compiled static cache (597). H200: 4,275 tokens/s (25.0 % of its higher 17.1k floor). Batch 64 (cuBLAS GEMMs; the fused layers serve "
               "one row): 70,291 tokens/s, 2.5x HF's compiled static cache (28,074).")
    return out
