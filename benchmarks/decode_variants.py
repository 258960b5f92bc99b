"""Batch-1 GPT-2 decoding: which change to the compiled, graph-captured step moves it towards
its weight-read floor (issue 24, item 3). An experiment, not a record: it prints tokens/s per
variant and the share of greedy tokens equal to the baseline's.

    python benchmarks/decode_variants.py                     # every variant below
    python benchmarks/decode_variants.py baseline gemv       # some of them

Variants (each compiled afresh; the step is ``ctxkit.decoding.static_decode``'s, run with
the fast plan ``--plan``, default ``decode`` = graphs+compile+qkv+decodelayers+rows, what
``static_generate(compile_step=True)`` ran on a GPU at batch 1 before the fast plan):

* ``baseline``: ``static_generate(plan="decode")`` as shipped.
* ``gemv``: every single-row linear written as a broadcast multiply and a sum over the input
  features, so Inductor emits one bandwidth-bound reduction kernel per matrix (and can fuse
  the bias, GELU and the following residual add into it) instead of a cuBLAS GEMM kernel
  tuned for larger M.
* ``attn=efficient|math``: the SDPA backend for the one-query attention over the static cache.
* ``coordesc``: Inductor's coordinate-descent tuning of its Triton kernels' launch settings.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import torch
import torch.nn.functional as F

from harness import seconds_per_call

from ctxkit.decoding import GenerationConfig
from ctxkit.decoding.static_decode import static_generate
from ctxkit.models.gpt2.model import GPT2_PRESETS, GPT2LMHeadModel

VARIANTS = ["baseline", "attn=efficient", "attn=math", "gemv", "gemv+attn=math", "gemv+attn=efficient", "gemv+coordesc",
            "gemv+attn=math+coordesc"]

_LINEAR = F.linear


def gemv_linear(x, weight, bias=None):
    """``F.linear`` for one row as multiply + sum (a reduction Inductor fuses); else the GEMM."""
    if x.shape[:-1].numel() == 1:
        out = (x.unsqueeze(-2) * weight).sum(-1, dtype=torch.float32).to(x.dtype)
        return out + bias if bias is not None else out
    return _LINEAR(x, weight, bias)


@contextlib.contextmanager
def variant(options: set):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    saved = torch._inductor.config.coordinate_descent_tuning
    torch._inductor.config.coordinate_descent_tuning = "coordesc" in options
    if "gemv" in options:
        F.linear = gemv_linear
    backends = {"attn=efficient": SDPBackend.EFFICIENT_ATTENTION, "attn=math": SDPBackend.MATH, "attn=cudnn": SDPBackend.CUDNN_ATTENTION}
    chosen = [backends[o] for o in options if o in backends]
    try:
        with sdpa_kernel(chosen) if chosen else contextlib.nullcontext():
            yield
    finally:
        F.linear = _LINEAR
        torch._inductor.config.coordinate_descent_tuning = saved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="*", default=VARIANTS, help="variants to time (default: all)")
    parser.add_argument("--plan", default="decode", help="the fast plan of every variant's static_generate (default: decode)")
    parser.add_argument("--reps", type=int, default=5, help="timed decoding calls per variant")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("decode_variants.py times CUDA decoding: no CUDA device here", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2_PRESETS["gpt2_117m"].replace(dropout=0.0, attention_dropout=0.0)).eval().cuda().to(torch.bfloat16)
    new, reps = 256, args.reps
    ids = torch.randint(0, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(1)).cuda()
    mask = torch.ones_like(ids)
    config = GenerationConfig(max_new_tokens=new)
    base_tokens = None
    for name in args.variants:
        options = set(name.split("+")) - {"baseline"}
        model.__dict__.pop("_ctxkit_static_decoders", None)
        torch._dynamo.reset()
        try:
            with variant(options):
                t0 = time.perf_counter()
                out = static_generate(model, ids, mask, config, plan=args.plan)
                torch.cuda.synchronize()
                build = time.perf_counter() - t0
                tps = new / seconds_per_call(lambda: static_generate(model, ids, mask, config, plan=args.plan), warmup=1, reps=reps)
        except Exception as err:  # one variant's failure leaves the others
            print(f"{name}: FAILED {type(err).__name__}: {str(err)[:300]}", flush=True)
            continue
        tokens = out[0, 32:]
        base_tokens = tokens if base_tokens is None else base_tokens
        same = float((tokens == base_tokens).float().mean())
        print(f"{name}: {tps:,.0f} tokens/s ({1e6 / tps:.0f} us/token), first call {build:.0f} s, "
              f"greedy tokens equal to the first variant's: {same:.1%}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
