"""Decoding speed: ctxkit's generate vs transformers' generate, GPT-2 small (random weights).

    python benchmarks/generate.py --device cpu                 # batch 1, fp32, 2 threads
    python benchmarks/generate.py --device cuda --batch 1 16    # bf16; HF default and static cache

Both sides load the same weights (ctxkit saves them, transformers loads the folder), get
the same prompt (32 tokens) and greedy-decode --new tokens (256) with no early stop;
every measurement follows a warm-up run of the same length. On CUDA ctxkit is timed as the
plain loop, with the step captured in a CUDA graph, and with that step also compiled; the
record keeps the fastest (named in ``ctxkit_variant``) and all three. The peer is timed in
its default configuration (dynamic cache) and its fastest (``cache_implementation=
"static"``, which transformers compiles itself). Tokens per second count new tokens over
the whole batch. The outputs are compared token for token (greedy decoding is
deterministic, so both sides must agree where their numerics do).

Writes speed records to benchmarks/results/generate.json (--results to change).
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from ctxkit.decoding import GenerationConfig, generate  # noqa: E402
from ctxkit.decoding.static_decode import static_generate  # noqa: E402
from ctxkit.models.gpt2 import GPT2LMHeadModel, save_gpt2  # noqa: E402
from ctxkit.models.presets import GPT2_PRESETS  # noqa: E402


def timed(fn, device: str) -> tuple:
    fn()  # warm-up of the same length
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
    parser.add_argument("--autotune", action="store_true", help="CUDA: also try Inductor's max-autotune for the step")
    parser.add_argument("--no-peer", action="store_true", help="skip transformers (quick ctxkit-only runs)")
    parser.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "generate.json"))
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
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder, dtype=dtype).to(args.device).eval()
    ours = ours.to(args.device, dtype)
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU, {args.threads} threads"
    given = argv if argv is not None else sys.argv[1:]
    # Records name no machine path: the --results destination is left out of the command.
    given = [a for i, a in enumerate(given) if a != "--results" and (i == 0 or given[i - 1] != "--results")]
    command = "python benchmarks/generate.py " + " ".join(shlex.quote(a) for a in given)
    config = GenerationConfig(max_new_tokens=args.new)
    records = []
    for batch in args.batch:
        ids = torch.randint(0, ours.config.vocab_size, (batch, args.prompt), generator=torch.Generator().manual_seed(1)).to(args.device)
        mask = torch.ones_like(ids)
        variants = {"plain loop": lambda: generate(ours, ids, mask, config, static=False)}
        if args.device == "cpu":
            variants = {"plain loop, torch (MKL) matrix-vector": lambda: generate(ours, ids, mask, config, cpu_gemv=False),
                        "plain loop, NumPy BLAS matrix-vector": lambda: generate(ours, ids, mask, config, cpu_gemv=True),
                        "static cache + compiled step (frozen weights, Inductor C++ GEMM)":
                            lambda: generate(ours, ids, mask, config, compile=True)}
        if args.device == "cuda":
            variants["CUDA graph"] = lambda: static_generate(ours, ids, mask, config, fused_layers=False)
            variants["CUDA graph + compiled step"] = lambda: static_generate(ours, ids, mask, config, compile_step=True, fused_layers=False)
            if batch == 1:  # the Triton decoding layers serve one row (ctxkit.fast.decode_layer)
                variants["CUDA graph + compiled step + Triton layers"] = lambda: static_generate(
                    ours, ids, mask, config, compile_step=True, fused_layers=True)
            if args.autotune:
                variants["CUDA graph + compiled step (max-autotune)"] = lambda: static_generate(
                    ours, ids, mask, config, compile_step="max-autotune-no-cudagraphs", fused_layers=False)
        ours_rows, ours_out = {}, None
        for name, fn in variants.items():
            try:
                sec, out = timed(fn, args.device)
            except Exception as err:  # a variant that fails (e.g. compile) is reported, not fatal
                print(f"batch {batch}: ctxkit {name} failed: {type(err).__name__}: {err}", flush=True)
                continue
            ours_rows[name] = sec
            if ours_out is None:
                ours_out = out
            elif not torch.equal(out, ours_out):
                print(f"batch {batch}: ctxkit {name} tokens differ from the plain loop in "
                      f"{float((out != ours_out).float().mean()):.1%} of places (bf16 rounding)", flush=True)
        best = min(ours_rows, key=ours_rows.get)
        print(f"batch {batch}: " + ", ".join(f"ctxkit {k} {batch * args.new / v:.0f} tok/s" for k, v in ours_rows.items()), flush=True)
        rows = {"ctxkit": ours_rows[best]}
        peers = {"dynamic cache": {}}
        if args.no_peer:
            peers = {}
        if args.device == "cuda" and not args.no_peer:
            peers["static cache, compiled by transformers"] = {"cache_implementation": "static"}
        same = {}
        for name, extra in peers.items():
            with torch.inference_mode():
                sec, hf_out = timed(lambda: hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.new, min_new_tokens=args.new,
                                                        do_sample=False, pad_token_id=0, **extra), args.device)
            rows[name] = sec
            same[name] = float((hf_out == ours_out).float().mean())
        tps = {k: batch * args.new / v for k, v in rows.items()}
        print(f"batch {batch}: " + ", ".join(f"{k} {v:.0f} tok/s" for k, v in tps.items()), flush=True)
        if not peers:  # --no-peer: a ctxkit-only record, so before/after comparisons still see it
            records.append({
                "benchmark": "generate", "case": f"{args.preset} random weights, prompt {args.prompt}, {args.new} new tokens, greedy, "
                                                 f"batch {batch}, {'bf16' if dtype == torch.bfloat16 else 'fp32'}",
                "metric": "new tokens per second", "unit": "tokens/s", "ctxkit": round(tps["ctxkit"], 1),
                "peer_name": None, "peer": None, "speedup": None, "ctxkit_variant": best,
                "ctxkit_variants": {k: round(batch * args.new / v, 1) for k, v in ours_rows.items()},
                "device": device_name, "date": datetime.date.today().isoformat(), "command": command,
            })
        for name in peers:
            records.append({
                "benchmark": "generate", "case": f"{args.preset} random weights, prompt {args.prompt}, {args.new} new tokens, greedy, "
                                                 f"batch {batch}, {'bf16' if dtype == torch.bfloat16 else 'fp32'}",
                "metric": "new tokens per second", "unit": "tokens/s", "ctxkit": round(tps["ctxkit"], 1),
                "peer_name": f"transformers {transformers.__version__} generate ({name})", "peer": round(tps[name], 1),
                "speedup": round(tps["ctxkit"] / tps[name], 3), "same_tokens_share": round(same[name], 4),
                "ctxkit_variant": best, "ctxkit_variants": {k: round(batch * args.new / v, 1) for k, v in ours_rows.items()},
                "device": device_name, "date": datetime.date.today().isoformat(), "command": command,
            })
    Path(args.results).write_text(json.dumps(records, indent=1) + "\n")
    print(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
