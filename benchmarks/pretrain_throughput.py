"""BERT pretraining throughput: ctxkit vs transformers.BertForPreTraining, one GPU, bf16.

    python benchmarks/pretrain_throughput.py --preset bert_12_768_12 --batch 256 --seq 128

Every side trains the same architecture on the same random batches (seq 128, 20 masked
positions per sequence, NSP labels) with bf16 autocast and fused AdamW, for --steps timed
steps after --warmup steps. ctxkit: gather-first MLM head + whole-step CUDA graph
(``ctxkit.training.graphs``). Peers: HF eager (sdpa) and HF + torch.compile. MFU uses the
training FLOPs of ``ctxkit.pretraining.train.training_flops_per_token`` for every side
(the same work is credited to all) and the bf16 matmul peak measured in this run.

Writes speed records to benchmarks/results/pretrain_throughput.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
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
    ours = {**common, "masked_positions": positions, "masked_labels": masked_labels, "next_sentence_label": nsp}
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


def run_ctxkit(cfg, batch) -> float:
    torch.manual_seed(0)
    model = PretrainingModel(cfg).cuda().train()
    opt = build_adamw(model, 1e-4, 0.01, capturable=True)
    step = GraphedTrainStep(model, opt, 1.0, lambda: torch.autocast("cuda", torch.bfloat16, cache_enabled=False))
    return time_steps(lambda: step(batch), 3, args_steps)


def run_hf(cfg, batch, compile_model: bool) -> float:
    import transformers

    hf_cfg = transformers.BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                                     num_attention_heads=cfg.num_heads, intermediate_size=cfg.ffn_size, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(hf_cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    fwd = torch.compile(model) if compile_model else model

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            loss = fwd(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return time_steps(step, 5 if compile_model else 3, args_steps)


args_steps = 20


def main(argv=None) -> int:
    global args_steps
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="bert_12_768_12")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--masked", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true", help="skip the HF + torch.compile peer")
    parser.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "pretrain_throughput.json"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a GPU", file=sys.stderr)
        return 2
    import transformers

    args_steps = args.steps
    cfg = get_preset(args.preset).config
    peak = measured_peak_tflops()
    batches = make_batch(cfg, args.batch, args.seq, args.masked)
    flops_per_seq = training_flops_per_token(cfg, args.seq, args.masked / args.seq) * args.seq
    rows = {"ctxkit": run_ctxkit(cfg, batches["ours"])}
    print(f"ctxkit: {args.batch / rows['ctxkit']:.0f} seq/s", flush=True)
    rows["hf_eager"] = run_hf(cfg, batches["hf"], False)
    print(f"HF eager: {args.batch / rows['hf_eager']:.0f} seq/s", flush=True)
    if not args.no_compile:
        rows["hf_compile"] = run_hf(cfg, batches["hf"], True)
        print(f"HF compile: {args.batch / rows['hf_compile']:.0f} seq/s", flush=True)
    device, date = torch.cuda.get_device_name(0), datetime.date.today().isoformat()
    command = "python benchmarks/pretrain_throughput.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    print(f"\nmeasured bf16 matmul peak: {peak:.0f} TFLOP/s on {device}")
    print(f"{'side':<12}{'seq/s':>9}{'tokens/s':>11}{'MFU':>7}")
    for name, sec in rows.items():
        print(f"{name:<12}{args.batch / sec:>9.0f}{args.batch * args.seq / sec:>11.0f}{flops_per_seq * args.batch / sec / peak / 1e12:>7.2f}")
    records = []
    for peer in [k for k in rows if k != "ctxkit"]:
        ours, theirs = args.batch / rows["ctxkit"], args.batch / rows[peer]
        records.append({
            "benchmark": "pretrain_throughput", "case": f"{args.preset}, seq {args.seq}, batch {args.batch}, bf16, 1 GPU",
            "metric": "sequences per second", "unit": "seq/s", "ctxkit": round(ours, 1),
            "peer_name": f"transformers {transformers.__version__} BertForPreTraining (sdpa{', torch.compile' if peer == 'hf_compile' else ', eager'})",
            "peer": round(theirs, 1), "speedup": round(ours / theirs, 3),
            "ctxkit_mfu": round(flops_per_seq * ours / peak / 1e12, 3), "peer_mfu": round(flops_per_seq * theirs / peak / 1e12, 3),
            "peak_tflops_measured": round(peak, 1), "device": device, "date": date, "command": command,
        })
    Path(args.results).write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
