"""What fp8 (e4m3) matrix products and the tanh-GELU epilogue cost a fine-tuned
classifier: SST-2 dev accuracy of the same run in fp32, bf16, bf16 with the FFN's GELU in
tanh form (``ctxkit.fast.enable_gelu_epilogue``, what the fast plan option ``gelutanh``
computes: ``GPUEncoder(model, plan="graphs+compile+qkv+gelutanh")``), fp8
(``ctxkit.inference.fp8``: Transformer-layer projections and FFN in float8 with per-row
activation and per-channel weight scales; plan option ``fp8``) and fp8 of the norm-fed
products only (``convert_to_fp8(model, "norm_inputs")``, plan option ``fp8norm``: q/k/v and
fc1, scales, bias and GELU in the GEMM epilogue -- emulated here in float32 with one
rounding, as the kernel computes it).

    python benchmarks/fp8_accuracy.py --run RUN_DIR      # a `ctxkit finetune sst-2` run

The arithmetic is the GPU's (``torch._scaled_mm`` with fp32 accumulation and row-wise
scales), run on the CPU, so no GPU is needed; speed is measured by
``benchmarks/inference_gpu.py --fast graphs+compile+qkv+fp8,graphs+compile+qkv+fp8norm`` on a
GPU. Writes quality records to benchmarks/results/inference_gpu_quality.json (a rerun
replaces the records of the same run, variant and device).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import platform
import sys
import time

import torch

from harness import command_line, write_records

from ctxkit.inference.fp8 import convert_to_fp8
from ctxkit.fast import enable_gelu_epilogue
from ctxkit.tasks import load_run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a fine-tuned SST-2 run folder (ctxkit finetune sst-2 ...)")
    parser.add_argument("--data", default=None, help="SST-2 folder (default: the run's)")
    parser.add_argument("--device", default="cpu", help="cpu (the GPU arithmetic emulated) or cuda (the GPU kernels themselves)")
    parser.add_argument("--results", default=None, help="records file (default: benchmarks/results/inference_gpu_quality.json)")
    args = parser.parse_args(argv)
    task, model, tokenizer, info = load_run(args.run, args.device)
    if task.name != "sst-2":
        raise SystemExit(f"{args.run} is a {task.name} run; this benchmark reads SST-2 runs")
    examples = task.load(args.data or info["data"], "dev")
    variants = {"fp32": model.float()}  # (a run saved in bf16 loads as bf16)
    variants["bf16"] = copy.deepcopy(model).to(torch.bfloat16)
    ffns = 0
    if args.device == "cpu":  # (its CUDA form is cuBLASLt's epilogue, measured by inference_gpu.py)
        tanh = copy.deepcopy(model).to(torch.bfloat16)
        ffns = enable_gelu_epilogue(tanh)
        variants["bf16 + tanh GELU"] = tanh
    fp8 = copy.deepcopy(model).to(torch.bfloat16)
    converted = convert_to_fp8(fp8)
    variants["fp8"] = fp8
    norm_fed = copy.deepcopy(model).to(torch.bfloat16)
    converted_norm_fed = convert_to_fp8(norm_fed, "norm_inputs")
    variants["fp8 norm_inputs"] = norm_fed
    scores = {}
    for name, m in variants.items():
        start = time.time()
        metrics, _ = task.evaluate(m.eval(), tokenizer, examples, 64, args.device)
        scores[name] = metrics["accuracy"]
        print(f"{name}: SST-2 dev accuracy {scores[name]:.2f} ({time.time() - start:.0f} s)", flush=True)
    # Where the records go is not part of how they were made (and may be a machine path).
    command = command_line("fp8_accuracy.py", argv if argv is not None else sys.argv[1:])
    where = (f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}" if args.device.startswith("cuda")
             else f"CPU ({platform.machine()}), GPU arithmetic emulated by torch._scaled_mm")
    base = {"device": where, "date": datetime.date.today().isoformat(), "command": command}
    model_name = info.get("model", "?")
    records = [{"task": "SST-2", "split": "dev", "metric": "accuracy", "value": round(scores[name], 2),
                "model": f"{model_name} fine-tuned ({args.run}), {name}" + (f" ({converted} Transformer-layer Linears in float8 e4m3)" if name == "fp8" else "")
                + (f" (GELU of {ffns} FFNs in tanh form, as the GPU epilogue computes it)" if "tanh" in name else "")
                + (f" ({converted_norm_fed} Linears in float8 e4m3: q/k/v and fc1 of every layer, scales, bias and GELU in "
                   "the GEMM epilogue; out_proj and fc2 bf16)" if name == "fp8 norm_inputs" else ""),
                "peer_name": "the same run in fp32", "peer_value": round(scores["fp32"], 2), "drop": round(scores["fp32"] - scores[name], 2),
                **base} for name in ("bf16", "bf16 + tanh GELU", "fp8", "fp8 norm_inputs") if name in scores]
    path = write_records("inference_gpu_quality.json", records, args.results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
