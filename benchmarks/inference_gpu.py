"""GPU inference: ctxkit's GPU encoder vs transformers, BERT-base bf16, same weights, same run.

    python benchmarks/inference_gpu.py --tokenizer DIR --data .../glue/SST-2      # auto vs HF, batch 1 and 256 + SST-2 dev
    python benchmarks/inference_gpu.py --fast auto,reference,graphs+qkv --no-sst2

Cases: batch-1 latency (median over --reps synchronised calls, inputs copied from the host
as a server would) and batch-256 throughput at seq 128 with every row full; then a
variable-length case: the real SST-2 dev sentences (BERT uncased WordPiece) in file order,
--sst2-batch at a time, padded to each batch's longest, fed to both sides identically
(ctxkit packs away the padding itself).

The ctxkit side is ``ctxkit bench infer --fast PLAN`` (:func:`ctxkit.cli.bench.bench_infer`:
:class:`ctxkit.inference.gpu.GPUEncoder` with the plan, what ``predict --backend gpu`` and
``serve`` run); each plan of --fast is timed and recorded with its command. The peer is
``transformers.BertForSequenceClassification`` (sdpa, bf16 weights) eager and under
``torch.compile``, holding the same weights; speedup is against the faster HF mode.
Declared precisions (``+fp8norm``, ``+gelutanh``) are plans like any other: their cases
say so. Writes benchmarks/results/inference_gpu.json (a rerun replaces the same cases).
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from harness import command_line, seconds_per_call, speed_record, write_records

from ctxkit.core.timing import median_latency_ms

from ctxkit.cli.bench import _glue_batches, bench_infer
from ctxkit.fast import FastPlan
from ctxkit.models.bert.model import BertModel, save_bert
from ctxkit.zoo.presets import PRESETS
from ctxkit.tasks import get_task

DECLARED = {"fp8": "fp8 matrix products (declared precision; peers bf16)", "fp8norm": "fp8 q/k/v and fc1 (declared precision; peers bf16)",
            "gelutanh": "bf16, tanh GELU in the GEMM epilogue (declared approximation)"}


def precision_of(plan: str) -> str:
    """The case's precision words: bf16, or the declared precision the plan adds."""
    parsed = FastPlan.parse(plan)
    tokens = {t for t, on in parsed.edits if on} if parsed.auto else set(parsed.tokens())
    for token, words in DECLARED.items():
        if token in tokens:
            return words
    return "bf16"


def hf_models(dtype):
    import transformers

    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp())
    atexit.register(shutil.rmtree, tmp, True)
    encoder = BertModel(PRESETS["bert_12_768_12"].config).eval()
    ours = get_task("sst-2").build_model(encoder).eval()  # the same seed: bench_infer builds these weights
    save_bert(encoder, tmp / "hf")
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp / "hf", attn_implementation="sdpa", dtype=dtype).cuda().eval()
    with torch.no_grad():  # the same task head on both sides
        hf.classifier.weight.copy_(ours.head.classifier.weight)
        hf.classifier.bias.copy_(ours.head.classifier.bias)

    def runner(model):
        def run(ids, types, mask):
            with torch.inference_mode():
                to = dict(device="cuda", non_blocking=True)
                return model(input_ids=ids.to(**to), attention_mask=mask.to(**to), token_type_ids=types.to(**to)).logits
        return run

    return {f"transformers {transformers.__version__} sdpa eager": runner(hf),
            f"transformers {transformers.__version__} sdpa + torch.compile": runner(torch.compile(hf))}


def peer_figures(peers, batches, reps: int, latency: bool) -> dict:
    n = sum(len(b[0]) for b in batches)
    out = {}
    for name, run in peers.items():
        def every():
            for b in batches:
                run(*b)
        if latency:
            out[name] = median_latency_ms(every, reps, warmup=5)
        else:
            out[name] = n / seconds_per_call(every, warmup=3, reps=reps)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--reps", type=int, default=200, help="batch-1 calls timed")
    parser.add_argument("--repeat", type=int, default=20, help="passes over a large batch / over SST-2 dev")
    parser.add_argument("--sst2-batch", type=int, default=256)
    parser.add_argument("--fast", default="auto", help="ctxkit fast plans, comma-separated (default: auto)")
    parser.add_argument("--data", default=None, help="the GLUE SST-2 folder (for the variable-length case)")
    parser.add_argument("--tokenizer", default=None, help="a BERT uncased WordPiece folder (for the variable-length case)")
    parser.add_argument("--no-sst2", action="store_true", help="skip the variable-length SST-2 dev case")
    parser.add_argument("--no-peer", action="store_true", help="time ctxkit only")
    parser.add_argument("--results", default=None)
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = True
    script = command_line("inference_gpu.py", argv if argv is not None else sys.argv[1:])
    peers = {} if args.no_peer else hf_models(torch.bfloat16)
    records = []
    plans = args.fast.split(",")
    cases = [(b, None) for b in args.batch] + ([] if args.no_sst2 or not args.data else [(args.sst2_batch, args.data)])
    for batch, data in cases:
        if data is None:
            ids = torch.randint(1000, 20000, (batch, args.seq), generator=torch.Generator().manual_seed(1)).pin_memory()
            batches = [(ids, torch.zeros_like(ids).pin_memory(), torch.ones_like(ids).pin_memory())]
        else:
            batches, tokens = _glue_batches("sst-2", data, args.tokenizer, "dev", batch)
        latency = data is None and batch == 1
        theirs = peer_figures(peers, batches, args.reps if latency else args.repeat, latency) if peers else {}
        for plan in plans:
            ours = bench_infer(batch=batch, seq=args.seq, reps=args.reps if latency else args.repeat, fast=plan, data=data,
                               tokenizer=args.tokenizer, warmup=5)
            if data is None:
                case = f"BERT-base classifier, {precision_of(plan)}, batch {batch}, seq {args.seq}, --fast {plan}"
                command = f"ctxkit bench infer --batch {batch} --seq {args.seq} --fast {plan}"
            else:
                case = (f"BERT-base classifier, {precision_of(plan)}, SST-2 dev ({ours['data'].split('(')[1][:-1]}), "
                        f"batches of {batch} in file order, --fast {plan}")
                command = f"ctxkit bench infer --data GLUE/SST-2 --tokenizer BERT_UNCASED_VOCAB --batch {batch} --fast {plan}"
            value, metric, unit = ((ours["latency_ms"], "latency (median)", "ms") if latency
                                   else (ours["seq_per_s"], "throughput", "sentences/s" if data else "sequences/s"))
            best = (min if latency else max)(theirs, key=theirs.get) if theirs else None
            print(f"{case}: ctxkit {value:.3f} {unit} ({ours['fast']}); " + "; ".join(f"{k} {v:.3f}" for k, v in theirs.items()),
                  flush=True)
            records.append(speed_record("inference_gpu", case, metric, unit, value, best, theirs.get(best), command,
                                        lower_is_better=latency, ctxkit_plan=ours["fast"], peers_all={k: round(v, 3) for k, v in theirs.items()},
                                        benchmark_command=script))
            write_records("inference_gpu.json", records, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
