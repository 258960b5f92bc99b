"""Decoding speed: ctxkit's generate vs transformers' generate, GPT-2 small (random weights).

    python benchmarks/generate.py --device cpu                       # batch 1, fp32, 2 threads
    python benchmarks/generate.py --device cuda --batch 1 16          # bf16; HF default and static cache
    python benchmarks/generate.py --fast auto,reference,graphs+qkv    # several plans, each recorded

Both sides load the same weights (ctxkit saves them, transformers loads the folder), get
the same prompt (32 tokens) and greedy-decode --new tokens (256) with no early stop;
every measurement follows a warm-up run of the same length. The ctxkit side is
``ctxkit bench decode --fast PLAN`` (:func:`ctxkit.decoding.generate` with the plan, what
``ctxkit generate`` runs); each plan is timed and recorded with its command. The peer is
timed in its default configuration (dynamic cache) and, on CUDA, its fastest
(``cache_implementation="static"``, which transformers compiles itself). Tokens per
second count new tokens over the whole batch. The outputs are compared token for token.

Writes speed records to benchmarks/results/generate.json (a rerun replaces the same cases).
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from harness import command_line, device_name, speed_record, write_records

from ctxkit.decoding import GenerationConfig, generate
from ctxkit.models.gpt2.model import GPT2LMHeadModel, save_gpt2
from ctxkit.zoo.presets import GPT2_PRESETS


def timed(fn, device: str) -> tuple:
    fn()  # warm-up of the same length (compiles and captures)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (CPU runs)")
    parser.add_argument("--preset", default="gpt2_117m")
    parser.add_argument("--fast", default="auto", help="ctxkit fast plans, comma-separated (default: auto)")
    parser.add_argument("--no-peer", action="store_true", help="skip transformers (quick ctxkit-only runs)")
    parser.add_argument("--results", default=None)
    args = parser.parse_args(argv)
    import transformers

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    torch.manual_seed(0)
    ours = GPT2LMHeadModel(GPT2_PRESETS[args.preset].replace(dropout=0.0, attention_dropout=0.0)).eval()
    folder = Path(tempfile.mkdtemp())
    atexit.register(shutil.rmtree, folder, True)  # exports and checkpoints are large
    save_gpt2(ours, folder)
    hf = None if args.no_peer else transformers.GPT2LMHeadModel.from_pretrained(folder, dtype=dtype).to(args.device).eval()
    ours = ours.to(args.device, dtype)
    card = device_name(args.device)
    script = command_line("generate.py", argv if argv is not None else sys.argv[1:])
    config = GenerationConfig(max_new_tokens=args.new)
    records = []
    for batch in args.batch:
        ids = torch.randint(0, ours.config.vocab_size, (batch, args.prompt), generator=torch.Generator().manual_seed(1)).to(args.device)
        mask = torch.ones_like(ids)
        peers = {} if args.no_peer else {"dynamic cache": {}}
        if args.device == "cuda" and not args.no_peer:
            peers["static cache, compiled by transformers"] = {"cache_implementation": "static"}
        theirs, hf_out = {}, {}
        for name, extra in peers.items():
            with torch.inference_mode():
                sec, hf_out[name] = timed(lambda: hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.new,
                                                              min_new_tokens=args.new, do_sample=False, pad_token_id=0, **extra), args.device)
            theirs[f"transformers {transformers.__version__} generate ({name})"] = batch * args.new / sec
        case = (f"{args.preset} random weights, prompt {args.prompt}, {args.new} new tokens, greedy, batch {batch}, "
                f"{'bf16' if dtype == torch.bfloat16 else 'fp32'}")
        for plan in args.fast.split(","):
            sec, out = timed(lambda: generate(ours, ids, mask, config, plan=plan), args.device)
            tps = batch * args.new / sec
            same = {k: round(float((v == out).float().mean()), 4) for k, v in hf_out.items()}
            print(f"batch {batch}, --fast {plan}: ctxkit {tps:.0f} tok/s; " + "; ".join(f"{k} {v:.0f}" for k, v in theirs.items())
                  + f"; same tokens {same}", flush=True)
            command = (f"ctxkit bench decode --preset {args.preset} --batch {batch} --prompt {args.prompt} --new {args.new} "
                       f"--device {args.device} --fast {plan}")
            for peer, value in (theirs.items() or [(None, None)]):
                records.append(speed_record("generate", f"{case}, --fast {plan}", "new tokens per second", "tokens/s", tps, peer, value,
                                            command, device=card, benchmark_command=script,
                                            same_tokens_share=same.get(peer.split("(")[-1][:-1]) if peer else None))
            write_records("generate.json", records, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
