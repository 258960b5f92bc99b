"""The feed-forward GEMMs with the exact GELU in their epilogue (ctxkit.fast.gemm_kernels)
against cuBLAS plus a separate GELU pass, at BERT-base's batch 256 x 128 (issue 24).

    python benchmarks/ffn_gemm.py                 # the default tiling, writes benchmarks/results/ffn_gemm.json
    python benchmarks/ffn_gemm.py --sweep         # also every tiling in SWEEP (an experiment: printed, not recorded)
    python benchmarks/ffn_gemm.py --fp8 [--sweep] # float8 q/k/v and fc1 + GELU vs the exact bf16 kernels

Three products, each timed (CUDA events, mean of --reps calls) as ctxkit's Triton kernel and
as the peer, PyTorch's kernels for the same work:

* ``gelu``: ``gelu_erf(x @ W1.T + b1)``, x (32768, 768), W1 (3072, 768). Peer: cuBLAS with
  the bias in its epilogue, then the GELU compiled by Inductor (the same kernels
  ``torch.compile`` emits for the layer).
* ``gelu + pre``: the same, also storing ``x @ W1.T + b1`` (the training forward).
  Peer: the same two kernels (the GEMM's output is the stored pre-activation).
* ``gelu_grad``: ``(g @ W2) * gelu_erf'(pre)`` and its column sums (the training
  backward's input gradient of the second product through the GELU, and the first
  product's bias gradient), g (32768, 768), W2 (768, 3072). Peer: cuBLAS, then Inductor's
  compiled GELU backward and column sum.
* ``bias``: ``x @ W1.T + b1`` alone, against cuBLAS: how close the GEMM itself is.

Every ctxkit result is checked against a float32 computation of the same bf16 inputs
(the error printed in units of bf16's rounding of the largest output). A rerun replaces the
records of the same cases and card (``harness.write_records``). The kernels serve the fast
plan option ``gelugemm``.

Engineering measurement of a kernel, not a product figure (the product figures come from ctxkit bench).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch
import torch.nn.functional as F

from harness import command_line, seconds_per_call, write_records

# (block_m, block_n, block_k, group_m, stages, warps, epi_split, flatten)
SWEEP = [  # GemmConfig fields: block_m, block_n, block_k, group_m, stages, warps, epi_split, flatten, ctas_per_sm
    (128, 256, 64, 8, 3, 8, 2, True, 1), (128, 256, 64, 8, 3, 8, 2, False, 1), (128, 256, 64, 8, 2, 8, 2, True, 1),
    (128, 128, 64, 8, 4, 8, 1, True, 1), (128, 128, 64, 8, 4, 8, 2, True, 1), (256, 128, 64, 8, 3, 8, 2, True, 1),
    (128, 128, 64, 8, 2, 8, 1, True, 2), (128, 128, 64, 8, 3, 8, 2, True, 2), (128, 128, 64, 8, 3, 4, 2, True, 2),
    (128, 128, 64, 8, 2, 4, 1, True, 2), (64, 256, 64, 8, 3, 4, 2, True, 2), (128, 64, 64, 8, 4, 4, 1, True, 2),
]
# Warp-specialised variants (Triton's producer/consumer partitions; on Hopper without flatten).
SWEEP_WS = [
    (128, 256, 64, 8, 3, 8, 2, False, 1, True), (128, 128, 64, 8, 3, 8, 2, False, 1, True),
    (128, 128, 64, 8, 4, 4, 2, False, 1, True), (128, 256, 64, 8, 3, 4, 2, False, 1, True),
    (128, 128, 64, 8, 3, 8, 2, False, 2, True),
]


def event_ms(fn, reps: int = 30, warmup: int = 3) -> float:
    """Mean milliseconds per call over ``reps`` back-to-back calls after ``warmup`` (CUDA events)."""
    return 1e3 * seconds_per_call(fn, warmup=warmup, reps=reps, device="cuda")


def gelu_grad_f32(pre):
    p = pre.float()
    return 0.5 * (1 + torch.erf(p * 0.7071067811865476)) + p * torch.exp(-0.5 * p * p) * 0.3989422804014327


def ulps(got, want) -> float:
    """Largest error in units of bf16's rounding step at the largest |want|."""
    step = want.abs().max().item() * 2.0 ** -8
    return (got.float() - want).abs().max().item() / step


SWEEP_FP8 = [  # float8 operands: 128-byte K slices
    (128, 128, 128, 8, 3, 8, 2, True, 2), (128, 128, 128, 8, 4, 8, 2, True, 1), (128, 256, 128, 8, 3, 8, 2, True, 1),
    (128, 256, 128, 8, 4, 8, 2, True, 1), (128, 128, 128, 8, 2, 8, 2, True, 2), (256, 128, 128, 8, 3, 8, 2, True, 1),
    (128, 256, 64, 8, 4, 8, 2, True, 1), (128, 128, 64, 8, 4, 8, 2, True, 2), (64, 256, 128, 8, 3, 4, 2, True, 2),
]


def fp8_part(args, K, base: dict) -> list:
    """float8 (e4m3, row-wise scales) products with the scales, bias and GELU in the epilogue,
    against the exact bf16 kernels that serve the same products (issue 24's FP8 inference):
    q/k/v (N = 3h, bias) and fc1 (N = 4h, bias + GELU)."""
    m, h = args.tokens, args.hidden
    bf = dict(device="cuda", dtype=torch.bfloat16)
    torch.manual_seed(0)
    x = torch.randn(m, h, **bf)
    gelu_c = torch.compile(lambda t: F.gelu(t))
    records = []
    for case, n, epilogue in (("q/k/v", 3 * h, "bias"), ("fc1 + GELU", 4 * h, "gelu")):
        w, b = torch.randn(n, h, **bf) * 0.04, torch.randn(n, **bf) * 0.1
        xs = (x.float().abs().amax(1) / 448).contiguous()
        ws = (w.float().abs().amax(1) / 448).contiguous()
        q = (x.float() / xs[:, None]).to(torch.float8_e4m3fn)
        qw = (w.float() / ws[:, None]).to(torch.float8_e4m3fn)
        exact = x.float() @ w.float().T + b.float()
        exact = F.gelu(exact) if epilogue == "gelu" else exact
        peers = {"cuBLAS bf16" + (" + Inductor GELU" if epilogue == "gelu" else " (bias epilogue)"):
                 (lambda: gelu_c(F.linear(x, w, b))) if epilogue == "gelu" else (lambda: F.linear(x, w, b))}
        if epilogue == "gelu":
            peers["ctxkit bf16 GELU GEMM"] = lambda: K.linear_epilogue(x, w, b, epilogue="gelu")
        peers["cuBLAS fp8 row-wise (torch._scaled_mm, bias)"] = lambda: torch._scaled_mm(
            q, qw.t(), scale_a=xs[:, None], scale_b=ws[None, :], bias=b, out_dtype=torch.bfloat16)
        peer_ms = {name: event_ms(fn, args.reps) for name, fn in peers.items()}

        def ours(cfg):
            return lambda: K.linear_epilogue(q, qw, b, epilogue=epilogue, x_scale=xs, w_scale=ws, config=cfg)

        if args.sweep:
            for tiles in SWEEP_FP8:
                cfg = K.GemmConfig(*tiles)
                try:
                    print(f"fp8 sweep {case} {tiles}: {event_ms(ours(cfg), args.reps):.4f} ms", flush=True)
                except Exception as exc:
                    cause = exc.__cause__ or exc
                    print(f"fp8 sweep {case} {tiles}: {type(exc).__name__}: {str(cause).strip().splitlines()[-1][:120]}")
        cfg = K.config_for(m, n, h, epilogue, fp8=True)
        ms = event_ms(ours(cfg), args.reps)
        out = ours(cfg)()[0]
        # Against the unquantised float32 product: e4m3's 3 mantissa bits, a few per cent of the row's size.
        rel = ((out.float() - exact).abs().max(1).values / exact.abs().max(1).values).max().item()
        bf16_best = min(v for k, v in peer_ms.items() if "bf16" in k)
        bf16_name = min((k for k in peer_ms if "bf16" in k), key=peer_ms.get)
        print(f"fp8 {case}: ctxkit {ms:.4f} ms ({2 * m * h * n / ms / 1e9:.0f} TFLOP/s), peers {peer_ms}, "
              f"max row-relative error vs float32 {rel:.4f}", flush=True)
        records.append({"benchmark": "ffn_gemm", "case": f"{case}, fp8 e4m3 row-wise scales, ({m} x {h}) @ ({h} x {n}), "
                        "scales/bias" + ("/GELU" if epilogue == "gelu" else "") + " in the epilogue (declared precision)",
                        "metric": "time", "unit": "ms", "ctxkit": round(ms, 4), "ctxkit_tiling": list(cfg),
                        "peer_name": f"fastest exact bf16 kernel for the same product ({bf16_name})", "peer": round(bf16_best, 4),
                        "speedup": round(bf16_best / ms, 3), "all_peers_ms": {k: round(v, 4) for k, v in peer_ms.items()},
                        "max_row_relative_error_vs_fp32": round(rel, 4), **base})
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256 * 128)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--sweep", nargs="?", const="all", choices=["all", "ws"],
                        help="time tilings too: 'all' (SWEEP + SWEEP_WS) or 'ws' (SWEEP_WS only)")
    parser.add_argument("--fp8", action="store_true",
                        help="time the float8 products instead (q/k/v and fc1 + GELU; writes ffn_gemm_fp8.json)")
    parser.add_argument("--results", default=None, help="default: benchmarks/results/ffn_gemm.json (ffn_gemm_fp8.json with --fp8)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/ffn_gemm.py measures a GPU: no CUDA device here")
    from ctxkit.fast import gemm_kernels as K

    name = "ffn_gemm_fp8.json" if args.fp8 else "ffn_gemm.json"
    base = {"device": f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}", "date": datetime.date.today().isoformat(),
            "command": command_line("ffn_gemm.py", argv if argv is not None else sys.argv[1:])}
    if args.fp8:
        records = fp8_part(args, K, base)
        print(f"wrote {write_records(name, records, args.results)}")
        return 0

    m, h = args.tokens, args.hidden
    ffn = 4 * h
    bf = dict(device="cuda", dtype=torch.bfloat16)
    torch.manual_seed(0)
    x, g = torch.randn(m, h, **bf), torch.randn(m, h, **bf) * 0.1
    w1, b1 = torch.randn(ffn, h, **bf) * 0.04, torch.randn(ffn, **bf) * 0.1
    w2 = torch.randn(h, ffn, **bf) * 0.02
    pre_ref = x.float() @ w1.float().T + b1.float()
    pre = pre_ref.bfloat16()
    want = {"bias": pre_ref, "gelu": F.gelu(pre_ref)}
    grad_ref = (g.float() @ w2.float()) * gelu_grad_f32(pre)
    want["gelu_grad"] = grad_ref

    # Peers: cuBLAS (bias in its epilogue) + Inductor's elementwise kernels.
    gelu_c = torch.compile(lambda t: F.gelu(t))
    bwd_c = torch.compile(lambda t, p: (lambda d: (d, d.float().sum(0)))(torch.ops.aten.gelu_backward(t, p)))
    peers = {
        "bias": lambda: F.linear(x, w1, b1),
        "gelu": lambda: gelu_c(F.linear(x, w1, b1)),
        "gelu + pre": lambda: gelu_c(F.linear(x, w1, b1)),
        "gelu_grad": lambda: bwd_c(g @ w2, pre),
    }

    def ours(case, cfg):
        if case == "bias":
            return lambda: K.linear_epilogue(x, w1, b1, epilogue="bias", config=cfg)
        if case == "gelu":
            return lambda: K.linear_epilogue(x, w1, b1, epilogue="gelu", config=cfg)
        if case == "gelu + pre":
            return lambda: K.linear_epilogue(x, w1, b1, epilogue="gelu", store_pre=True, config=cfg)
        return lambda: K.linear_epilogue(g, w2, epilogue="gelu_grad", pre=pre, weight_kn=True, config=cfg)

    def check(case, cfg) -> float:
        out, side = ours(case, cfg)()
        err = ulps(out, want[case.split(" ")[0]])
        if case == "gelu + pre":
            err = max(err, ulps(side, pre_ref))
        if case == "gelu_grad":
            err = max(err, ulps(side, grad_ref.sum(0)))
        return err

    peer_ms = {case: event_ms(fn, args.reps) for case, fn in peers.items()}
    print(f"peers (cuBLAS + Inductor), ms: {peer_ms}", flush=True)
    best = {}
    if args.sweep:
        for tiles in (SWEEP_WS if args.sweep == "ws" else SWEEP + SWEEP_WS):
            cfg = K.GemmConfig(*tiles)
            row = {}
            for case in ("bias", "gelu", "gelu + pre", "gelu_grad"):
                try:
                    err = check(case, cfg)
                    row[case] = (round(event_ms(ours(case, cfg), args.reps), 4), round(err, 2))
                    if case not in best or row[case][0] < best[case][0]:
                        best[case] = (row[case][0], list(tiles))
                except Exception as exc:  # a tiling that does not compile (shared memory) is reported
                    cause = exc.__cause__ or exc
                    row[case] = f"{type(exc).__name__}: {str(cause).strip().splitlines()[-1][:120]}"
            print(f"sweep {tiles}: {row}", flush=True)
    records = []
    for case in peers:
        cfg = K.config_for(m, ffn, h, case.split(" ")[0])
        err = check(case, cfg)
        ms = event_ms(ours(case, cfg), args.reps)
        flops = 2 * m * h * ffn
        print(f"{case}: ctxkit {ms:.4f} ms ({flops / ms / 1e9:.0f} TFLOP/s), peer {peer_ms[case]:.4f} ms, "
              f"error {err:.2f} bf16 steps", flush=True)
        records.append({"benchmark": "ffn_gemm", "case": f"{case}, ({m} x {h}) @ ({h} x {ffn}), bf16", "metric": "time",
                        "unit": "ms", "ctxkit": round(ms, 4), "ctxkit_tiling": list(cfg),
                        "peer_name": "cuBLAS GEMM (bias epilogue)" + ("" if case == "bias" else " + Inductor elementwise kernel"),
                        "peer": round(peer_ms[case], 4), "speedup": round(peer_ms[case] / ms, 3),
                        "max_error_bf16_steps": round(err, 2)})
    path = write_records(name, [{**r, **base} for r in records], args.results)
    if best:
        print("sweep best (ms, tiles): " + json.dumps(best))
        path.with_suffix(".sweep.json").write_text(json.dumps(best) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
