"""BERT pretraining throughput: ctxkit's Trainer vs transformers.BertForPreTraining, bf16, one GPU.

    python benchmarks/pretrain_throughput.py                                # auto vs HF eager and HF compiled
    python benchmarks/pretrain_throughput.py --fast auto,reference,graphs+compile+qkv+bf16res --no-compile

The ctxkit side is ``ctxkit bench pretrain --fast PLAN`` (:func:`ctxkit.cli.bench.bench_pretrain`):
the Trainer with the plan, its MLM collator masking fixed-length pairs of random tokens in
loader processes (seq 128, 20 masked positions, NSP labels), the figure its log interval
after warm-up. The peers train the same architecture on the same shape of batches, made
once on the GPU (no loader), with bf16 autocast and fused AdamW. MFU uses
``ctxkit.pretraining.train.training_flops_per_token`` for every side and the bf16 peak
measured in the same run. Each plan is recorded against each peer with its ``ctxkit
bench pretrain`` command; a rerun replaces the records of the same case and card.

Writes benchmarks/results/pretrain_throughput.json.
"""

from __future__ import annotations

import argparse
import sys

import torch

from harness import command_line, measured_peak_tflops, seconds_per_call, speed_record, write_records

from ctxkit.cli.bench import bench_pretrain
from ctxkit.models import get_preset
from ctxkit.pretraining.train import training_flops_per_token


def hf_batch(cfg, batch: int, seq: int, n_masked: int, seed: int = 0) -> dict:
    """One MLM + NSP batch in transformers' layout, on the GPU."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, cfg.vocab_size, (batch, seq), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    types = torch.zeros_like(ids)
    types[:, seq // 2:] = 1
    positions = torch.stack([torch.randperm(seq - 2, generator=g)[:n_masked] + 1 for _ in range(batch)])
    labels = torch.full_like(ids, -100).scatter(1, positions, ids.gather(1, positions))
    nsp = torch.randint(0, 2, (batch,), generator=g)
    out = {"input_ids": ids, "token_type_ids": types, "attention_mask": torch.ones_like(ids), "labels": labels, "next_sentence_label": nsp}
    return {k: v.cuda() for k, v in out.items()}


def run_hf(cfg, batch: dict, compiled: bool, steps: int) -> float:
    """Seconds per step of transformers' BertForPreTraining (sdpa), eager or compiled."""
    import transformers

    hf_cfg = transformers.BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                                     num_attention_heads=cfg.num_heads, intermediate_size=cfg.ffn_size, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(hf_cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    fwd = torch.compile(model) if compiled else model

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            loss = fwd(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return seconds_per_call(step, warmup=5 if compiled else 3, reps=steps)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="bert_12_768_12")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--masked", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fast", default="auto", help="ctxkit fast plans to time, comma-separated (default: auto)")
    parser.add_argument("--no-compile", action="store_true", help="skip the HF + torch.compile peer")
    parser.add_argument("--no-peer", action="store_true", help="time ctxkit only")
    parser.add_argument("--results", default=None, help="JSON output (default: benchmarks/results/pretrain_throughput.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a GPU", file=sys.stderr)
        return 2
    import transformers

    script = command_line("pretrain_throughput.py", argv if argv is not None else sys.argv[1:])
    cfg = get_preset(args.preset).config
    peak = measured_peak_tflops()
    flops_per_seq = training_flops_per_token(cfg, args.seq, args.masked / args.seq) * args.seq
    peers = {}
    if not args.no_peer:
        batch = hf_batch(cfg, args.batch, args.seq, args.masked)
        peers[f"transformers {transformers.__version__} BertForPreTraining (sdpa, eager)"] = args.batch / run_hf(cfg, batch, False, args.steps)
        if not args.no_compile:
            peers[f"transformers {transformers.__version__} BertForPreTraining (sdpa, torch.compile)"] = (
                args.batch / run_hf(cfg, batch, True, args.steps))
        del batch
        torch.cuda.empty_cache()
    for name, seq_s in peers.items():
        print(f"{name}: {seq_s:.0f} seq/s, MFU {flops_per_seq * seq_s / peak / 1e12:.2f}", flush=True)
    case = f"{args.preset}, seq {args.seq}, batch {args.batch}, bf16, 1 GPU"
    records = []
    for plan in args.fast.split(","):
        ours = bench_pretrain(args.preset, args.batch, args.seq, args.masked, args.steps, fast=plan, peak_tflops=peak)
        mfu = flops_per_seq * ours["seq_per_s"] / peak / 1e12
        print(f"ctxkit --fast {plan} ({ours['fast']}): {ours['seq_per_s']:.0f} seq/s, MFU {mfu:.2f}, warm-up {ours['warmup_s']:.0f} s",
              flush=True)
        command = (f"ctxkit bench pretrain --preset {args.preset} --batch {args.batch} --seq {args.seq} --masked {args.masked} "
                   f"--steps {args.steps} --fast {plan}")
        common = dict(ctxkit_plan=ours["fast"], ctxkit_mfu=round(mfu, 3), peak_tflops_measured=round(peak, 1),
                      warmup_s=ours["warmup_s"], benchmark_command=script)
        for peer_name, theirs in (peers.items() or [(None, None)]):
            extra = {"peer_mfu": round(flops_per_seq * theirs / peak / 1e12, 3)} if theirs else {}
            records.append(speed_record("pretrain_throughput", f"{case}, --fast {plan}", "sequences per second", "seq/s",
                                        ours["seq_per_s"], peer_name, theirs, command, **common, **extra))
        write_records("pretrain_throughput.json", records, args.results)  # after every plan: a cut run keeps what it measured
    for r in records:
        if r["speedup"]:
            print(f"{r['case']} vs {r['peer_name']}: {r['speedup']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
