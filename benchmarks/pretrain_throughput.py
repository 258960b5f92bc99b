"""BERT pretraining throughput: ctxkit vs transformers.BertForPreTraining, bf16.

    python benchmarks/pretrain_throughput.py                       # 1 GPU: ctxkit vs HF eager and HF compiled
    python benchmarks/pretrain_throughput.py --variants graphs,graphs+compile-model+bf16res --profile graphs+compile
    torchrun --nproc_per_node 2 benchmarks/pretrain_throughput.py --scaling --hf-scaling-peer

Every side trains the same architecture (BERT-base by default) on the same random batches
(seq 128, no padding, 20 masked positions per sequence, NSP labels) with bf16 autocast
and fused AdamW, for --steps timed steps after warm-up steps. ctxkit configurations are
named "graphs+option+..." (see OPTIONS below; all use whole-step CUDA graphs, the sparse
last layer and fused q/k/v); the fastest one with dropout is recorded against each peer.
MFU uses the training FLOPs of ``ctxkit.pretraining.train.training_flops_per_token`` for
every side (the same work is credited to all) and the bf16 matmul peak measured in the
same run. --scaling (under torchrun) times one rank alone, then all ranks with the
gradient all-reduce, and writes a ``scaling`` record.

Writes benchmarks/results/pretrain_throughput.json (or pretrain_scaling.json).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from ctxkit.models import get_preset  # noqa: E402
from ctxkit.pretraining.train import PretrainingModel, training_flops_per_token  # noqa: E402
from ctxkit.training import build_adamw  # noqa: E402
from ctxkit.training.graphs import GraphedTrainStep  # noqa: E402
from ctxkit.training.reducer import OverlappedGradReducer  # noqa: E402
from ctxkit.fast import fuse_qkv  # noqa: E402
from ctxkit.training.speed import (FlatGradAllReduce, compile_blocks, compile_model, set_norm_grad_split,  # noqa: E402
                                   set_stream_dtype)


def measured_peak_tflops(n: int = 8192, reps: int = 20) -> float:
    a, b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16), torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e12


def make_batch(cfg, batch: int, seq: int, n_masked: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, cfg.vocab_size, (batch, seq), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    types = torch.zeros_like(ids)
    types[:, seq // 2 :] = 1
    positions = torch.stack([torch.randperm(seq - 2, generator=g)[:n_masked] + 1 for _ in range(batch)]).sort(-1).values
    masked_labels = ids.gather(1, positions)
    labels = torch.full_like(ids, -100).scatter(1, positions, masked_labels)
    nsp = torch.randint(0, 2, (batch,), generator=g)
    common = {"input_ids": ids, "token_type_ids": types, "attention_mask": torch.ones_like(ids)}
    # ctxkit's collator leaves the mask out of batches without padding (HF drops an
    # all-ones mask itself in eager mode); both then run mask-free flash attention.
    ours = {"input_ids": ids, "token_type_ids": types, "masked_positions": positions, "masked_labels": masked_labels, "next_sentence_label": nsp}
    hf = {**common, "labels": labels, "next_sentence_label": nsp}
    return {k: {n: t.cuda() for n, t in v.items()} for k, v in (("ours", ours), ("hf", hf))}


def time_steps(step, warmup: int, steps: int) -> float:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps


# A ctxkit configuration is "graphs" plus options joined by "+":
#   compile        torch.compile each Transformer layer (what `--compile` of the trainer does)
#   compile-model  torch.compile the whole model (embeddings, heads and losses fused too)
#   bf16res        bf16 residual stream under autocast (ctxkit.training.speed.set_stream_dtype)
#   flash|cudnn|efficient  force one SDPA backend (default: PyTorch's choice)
#   nodrop         dropout off -- diagnostic only, never recorded against the peers
#   coordesc       with compile: Inductor's coordinate-descent tuning of its Triton kernels
#   autotune       with compile-model: mode="max-autotune-no-cudagraphs" (GEMM templates with
#                  fused epilogues compete with cuBLAS; minutes of autotuning)
#   bf16grad       with --scaling: all-reduce the gradients in bf16 (TrainConfig.grad_reduce_dtype)
#   overlap        with --scaling: bucketed all-reduce during backward (OverlappedGradReducer;
#                  pair with "compile" (per layer) or "compile-model+segN")
#   seg2|seg3|seg4 with compile-model: the encoder compiled as N graphs, so gradients of the
#                  upper layers are complete before the lower layers' backward runs
#   aggrfuse       with compile: Inductor's aggressive_fusion (fuse kernels that share no reads)
#   combo          with compile: Inductor's combo_kernels (independent small kernels launched as one)
#   maskdrop       dropout masks from PyTorch's Bernoulli kernel outside the compiled graph
#                  (ctxkit.fast.fast_dropout; TrainConfig.fast_dropout)
#   master         nn.Linear weights in bf16 with fp32 masters in a flat AdamW (clipping inside its
#                  update kernel; ctxkit.training.master.MasterAdamW; TrainConfig.master_weights)
#   unfusedqkv     q, k and v as three GEMMs (no gradient concatenation in the backward)
#   qkvpack        q/k/v gradients packed and the bias gradient summed in one Triton pass
#                  (ctxkit.fast.pack_qkv_grad; TrainConfig.packed_qkv_grad)
#   mixsplit32|mixsplit64|mixsplit128  Inductor's mix-order reductions (norm backward + its
#                  parameter gradients in one kernel) with this many rows per partial sum
#                  (default: a heuristic, 16 rows on an H100 at batch 256: 2048 partial rows,
#                  then one eager column sum per parameter; TrainConfig.compile_norm_split)
#   mixtune        Inductor benchmarks the mix-order split size per kernel
#   nosplit        Inductor without split reductions (each bias/norm-parameter gradient one reduction)
#   tma            with compile-model+autotune: Hopper TMA persistent matmul templates in the autotuning
#   nosync         with --scaling: no gradient all-reduce at all -- diagnostic only (what
#                  running N GPUs at once costs without communication)
#   synconly       with --scaling: all-reduce one number per step instead of the gradients --
#                  diagnostic only (what waiting for the slower rank costs)
OPTIONS = ("compile", "compile-model", "bf16res", "flash", "cudnn", "efficient", "nodrop", "coordesc", "autotune", "bf16grad",
           "overlap", "seg2", "seg3", "seg4", "nosync", "synconly",
           "aggrfuse", "combo", "tma", "gelugemm", "maskdrop", "master", "unfusedqkv", "nosplit", "qkvpack",
           "mixsplit32", "mixsplit64", "mixsplit128", "mixtune")


def parse_variant(name: str) -> set:
    head, *opts = name.split("+")
    if head != "graphs" or any(o not in OPTIONS for o in opts):
        raise SystemExit(f"unknown variant {name!r}: 'graphs' then '+'-joined options from {OPTIONS}")
    return set(opts)


def build_ctxkit(cfg, variant: str, grad_sync=None):
    opts = parse_variant(variant)
    if "nodrop" in opts:
        cfg = cfg.replace(dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = PretrainingModel(cfg).cuda().train()
    if "unfusedqkv" not in opts:
        fuse_qkv(model)  # q/k/v in one GEMM, as the Trainer runs it (ctxkit.training.speed.apply_speed_options)
    if "bf16res" in opts:
        set_stream_dtype(model, torch.bfloat16)
    if "qkvpack" in opts:
        from ctxkit.fast import pack_qkv_grad

        pack_qkv_grad(model)
    if "gelugemm" in opts:  # the exact GELU and its derivative inside Triton GEMM epilogues
        from ctxkit.fast import fuse_gelu_gemm

        fuse_gelu_gemm(model)
    if "maskdrop" in opts:  # Bernoulli masks from PyTorch's kernel instead of per-element Philox in the fused norms
        from ctxkit.fast import fast_dropout

        fast_dropout(model)
    torch._inductor.config.coordinate_descent_tuning = "coordesc" in opts
    torch._inductor.config.aggressive_fusion = "aggrfuse" in opts
    torch._inductor.config.combo_kernels = "combo" in opts
    torch._inductor.config.triton.enable_persistent_tma_matmul = "tma" in opts
    torch._inductor.config.split_reductions = "nosplit" not in opts
    mix = [int(o[8:]) for o in opts if o.startswith("mixsplit")]
    if set_norm_grad_split(mix[0] if mix else None):  # TrainConfig.compile_norm_split; torch >= 2.10
        torch._inductor.config.triton.mix_order_reduction_autotune_split_size = "mixtune" in opts
    if "compile" in opts:
        compile_blocks(model)
    elif "compile-model" in opts:
        segments = max([int(o[3:]) for o in opts if o.startswith("seg")] or [1])
        compile_model(model, segments=segments, mode="max-autotune-no-cudagraphs" if "autotune" in opts else "default")
    if "master" in opts:
        from ctxkit.training.master import build_master_adamw

        opt = build_master_adamw(model, 1e-4, 0.01, capturable=True)
    else:
        opt = build_adamw(model, 1e-4, 0.01, capturable=True)
    return GraphedTrainStep(model, opt, 1.0, lambda: torch.autocast("cuda", torch.bfloat16, cache_enabled=False), grad_sync=grad_sync)


def sdpa_backend(variant: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = parse_variant(variant) & {"flash", "cudnn", "efficient"}
    names = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
    return sdpa_kernel([names[c] for c in chosen]) if chosen else contextlib.nullcontext()


def run_ctxkit(cfg, batch, variant: str = "graphs") -> float:
    with sdpa_backend(variant):
        step = build_ctxkit(cfg, variant)
        return time_steps(lambda: step(batch), 3, args_steps)


def profile_ctxkit(cfg, batch, variant: str, rows: int = 45) -> str:
    """Kernel time table of eager (un-graphed) steps, to see where a step goes."""
    from torch.profiler import ProfilerActivity, profile

    step = build_ctxkit(cfg, variant)
    for _ in range(3):  # (the SDPA backend is PyTorch's choice here)
        step.eager(batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step.eager(batch)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=90)


def run_hf(cfg, batch, compiled: bool, ddp: bool = False) -> float:
    import transformers

    hf_cfg = transformers.BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                                     num_attention_heads=cfg.num_heads, intermediate_size=cfg.ffn_size, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(hf_cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    fwd = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    fwd = torch.compile(fwd) if compiled else fwd

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            loss = fwd(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return time_steps(step, 5 if compiled else 3, args_steps)


args_steps = 20


def scaling(cfg, args, command: str) -> int:
    """Under torchrun: 1-GPU throughput on rank 0, then all ranks with the gradient all-reduce
    (weak scaling: --batch sequences per GPU). Writes one ``scaling`` record."""
    import torch.distributed as dist
    import transformers

    from ctxkit.training.distributed import setup

    rank, world = setup("cuda")
    batch = make_batch(cfg, args.batch, args.seq, args.masked, seed=rank)
    measured = {}
    for side in ("ctxkit", "hf") if args.hf_scaling_peer else ("ctxkit",):
        if rank == 0:
            one = run_ctxkit(cfg, batch["ours"], args.scaling_variant) if side == "ctxkit" else run_hf(cfg, batch["hf"], False)
            print(f"{side} 1 GPU: {args.batch / one:.0f} seq/s", flush=True)
        dist.barrier()
        if side == "ctxkit":
            backend = sdpa_backend(args.scaling_variant)
            backend.__enter__()
            opts = parse_variant(args.scaling_variant)
            reduce_dtype = torch.bfloat16 if "bf16grad" in opts else None
            step = build_ctxkit(cfg, args.scaling_variant)
            step.grad_sync = FlatGradAllReduce(step.model, reduce_dtype)  # what the trainer uses
            if "overlap" in opts:
                step.grad_sync = OverlappedGradReducer(step.model, reduce_dtype=reduce_dtype)
            if "nosync" in opts:
                step.grad_sync = None
            if "synconly" in opts:
                token = torch.zeros(1, device="cuda")
                step.grad_sync = lambda: dist.all_reduce(token)
            many = time_steps(lambda: step(batch["ours"]), 3, args_steps)
            backend.__exit__(None, None, None)
        else:
            many = run_hf(cfg, batch["hf"], False, ddp=True)
        if rank == 0:
            measured[side] = (args.batch / one, world * args.batch / many)
            print(f"{side} {world} GPUs: {world * args.batch / many:.0f} seq/s ({measured[side][1] / measured[side][0]:.3f}x)", flush=True)
        dist.barrier()
    if rank == 0:
        ours = measured["ctxkit"][1] / measured["ctxkit"][0]
        record = {
            "benchmark": "pretrain_scaling", "case": f"{args.preset}, seq {args.seq}, {args.batch} seq per GPU, bf16, {world} GPUs vs 1 ({args.scaling_variant})",
            "metric": "scaling", "unit": "x (N-GPU / 1-GPU seq/s)", "ctxkit": round(ours, 3),
            "ctxkit_seq_per_s": [round(v, 1) for v in measured["ctxkit"]],
            "device": f"{world}x {torch.cuda.get_device_name(0)}", "date": datetime.date.today().isoformat(), "command": command,
        }
        if "hf" in measured:
            theirs = measured["hf"][1] / measured["hf"][0]
            record.update(peer_name=f"transformers {transformers.__version__} BertForPreTraining + DDP (sdpa, eager)", peer=round(theirs, 3),
                          speedup=round(ours / theirs, 3), peer_seq_per_s=[round(v, 1) for v in measured["hf"]])
        print(json.dumps(record, indent=1))
        Path(args.results).write_text(json.dumps([record], indent=1) + "\n")
    dist.barrier()
    # destroy_process_group() hung here once the communicator had been used inside CUDA
    # graphs that are still alive; everything is written, so leave at once.
    sys.stdout.flush()
    os._exit(0)


def main(argv=None) -> int:
    global args_steps
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="bert_12_768_12")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--masked", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true", help="skip the HF + torch.compile peer")
    parser.add_argument("--variants", default="graphs,graphs+compile-model+bf16res",
                        help="ctxkit configurations to time, comma-separated (see OPTIONS); the fastest one with "
                             "dropout is recorded against the peers")
    parser.add_argument("--profile", default=None, metavar="VARIANT", help="also print a kernel-time table for this variant")
    parser.add_argument("--scaling", action="store_true", help="under torchrun: N-GPU vs 1-GPU scaling record instead")
    parser.add_argument("--scaling-variant", default="graphs+compile-model+bf16res")
    parser.add_argument("--hf-scaling-peer", action="store_true", help="with --scaling: also measure HF + DDP scaling")
    parser.add_argument("--results", default=None, help="JSON output (default: benchmarks/results/pretrain_{throughput,scaling}.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a GPU", file=sys.stderr)
        return 2
    import transformers

    args_steps = args.steps
    cfg = get_preset(args.preset).config
    given = argv if argv is not None else sys.argv[1:]
    # Records name no machine path: the --results destination is left out of the command.
    given = [a for i, a in enumerate(given) if a != "--results" and (i == 0 or given[i - 1] != "--results")]
    command = "python benchmarks/pretrain_throughput.py " + " ".join(shlex.quote(a) for a in given)
    if args.scaling:
        args.results = args.results or str(REPO / "benchmarks" / "results" / "pretrain_scaling.json")
        return scaling(cfg, args, command.replace("python ", "torchrun --nproc_per_node N ", 1))
    args.results = args.results or str(REPO / "benchmarks" / "results" / "pretrain_throughput.json")
    peak = measured_peak_tflops()
    batches = make_batch(cfg, args.batch, args.seq, args.masked)
    flops_per_seq = training_flops_per_token(cfg, args.seq, args.masked / args.seq) * args.seq
    # Peers first, then each ctxkit variant; the table and records are rewritten after every
    # variant, so a run cut short (e.g. by a slow autotuning compile) keeps what it measured.
    rows = {"hf_eager": run_hf(cfg, batches["hf"], False)}
    print(f"HF eager: {args.batch / rows['hf_eager']:.0f} seq/s", flush=True)
    if not args.no_compile:
        rows["hf_compile"] = run_hf(cfg, batches["hf"], True)
        print(f"HF compile: {args.batch / rows['hf_compile']:.0f} seq/s", flush=True)
    for variant in args.variants.split(","):
        rows[f"ctxkit {variant}"] = run_ctxkit(cfg, batches["ours"], variant)
        print(f"ctxkit {variant}: {args.batch / rows[f'ctxkit {variant}']:.0f} seq/s", flush=True)
        report(rows, args, peak, flops_per_seq, command, transformers.__version__)
    if args.profile:
        print(profile_ctxkit(cfg, batches["ours"], args.profile), flush=True)
    return 0


def report(rows: dict, args, peak: float, flops_per_seq: float, command: str, hf_version: str) -> None:
    """Print the table and write one record per peer for the fastest eligible variant."""
    device, date = torch.cuda.get_device_name(0), datetime.date.today().isoformat()
    print(f"\nmeasured bf16 matmul peak: {peak:.0f} TFLOP/s on {device}")
    print(f"{'side':<50}{'seq/s':>9}{'tokens/s':>11}{'MFU':>7}")
    for name, sec in rows.items():
        print(f"{name:<50}{args.batch / sec:>9.0f}{args.batch * args.seq / sec:>11.0f}{flops_per_seq * args.batch / sec / peak / 1e12:>7.2f}")
    eligible = [k for k in rows if k.startswith("ctxkit ") and "nodrop" not in parse_variant(k[len("ctxkit "):])]
    if not eligible:
        return
    best = min(eligible, key=rows.get)
    records = []
    for peer in [k for k in rows if k.startswith("hf_")]:
        ours, theirs = args.batch / rows[best], args.batch / rows[peer]
        print(f"{best} / {peer}: {ours / theirs:.2f}x")
        records.append({
            "benchmark": "pretrain_throughput", "case": f"{args.preset}, seq {args.seq}, batch {args.batch}, bf16, 1 GPU ({best})",
            "metric": "sequences per second", "unit": "seq/s", "ctxkit": round(ours, 1),
            "peer_name": f"transformers {hf_version} BertForPreTraining (sdpa{', torch.compile' if peer == 'hf_compile' else ', eager'})",
            "peer": round(theirs, 1), "speedup": round(ours / theirs, 3),
            "ctxkit_mfu": round(flops_per_seq * ours / peak / 1e12, 3), "peer_mfu": round(flops_per_seq * theirs / peak / 1e12, 3),
            "peak_tflops_measured": round(peak, 1), "device": device, "date": date, "command": command,
        })
    Path(args.results).write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
