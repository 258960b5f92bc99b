"""Inference as served: ``ctxkit predict --backend gpu`` over a large file vs the GPU encoder alone.

    python benchmarks/predict_gpu.py --tokenizer DIR --data .../glue/SST-2 --lines 50000

A BERT-base SST-2 classifier (random weights, saved as a run folder with the given
uncased WordPiece vocabulary) predicts a file of ``--lines`` lines, each SST-2 train
sentences joined until it fills the task's 128 tokens. Two figures of the same run:

* ``ctxkit predict RUN FILE --backend gpu --batch-size 256`` as a user runs it (a
  subprocess; its own report: the lines after the first batch per second, tokenizing and
  writing included, loading and the first batch's compiling not);
* the GPU encoder alone (:class:`ctxkit.inference.gpu.GPUTaskModel`, what predict runs)
  on the very batches predict forms, already tokenized and in pinned memory, for each plan
  of --fast; the fastest exact one is the peer.

The record's speedup is predict / encoder: the share of the encoder's speed a user gets
(the target is >= 0.95). Writes benchmarks/results/predict_gpu.json.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from harness import command_line, seconds_per_call, speed_record, write_records

from ctxkit.core.checkpoint import write_json
from ctxkit.core.durable import write_folder
from ctxkit.data.batching import collate, sequential_batches
from ctxkit.data.blocks import TokenBlock
from ctxkit.data.glue import TextExample
from ctxkit.inference.backends import with_backend
from ctxkit.models import BertModel, get_preset
from ctxkit.tasks import get_task, load_run
from ctxkit.tasks.runs import save_run_model
from ctxkit.tokenizers import WordPieceTokenizer
from ctxkit.training import predict


def make_run(folder: Path, tokenizer_dir: str) -> Path:
    task = get_task("sst-2", max_length=128)
    torch.manual_seed(0)
    model = task.build_model(BertModel(get_preset("bert_12_768_12").config)).eval()
    tokenizer = WordPieceTokenizer.from_dir(tokenizer_dir)
    write_folder(folder / "best", lambda f: save_run_model(model, tokenizer, f))
    write_json({"task": task.name, "options": task.options(), "model": "bert_12_768_12 (random weights)", "data": ""},
               folder / "task.json")
    return folder


def make_lines(data: str, n: int, words: int = 150) -> list:
    sentences = [line.split("\t")[0] for line in Path(data, "train.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    lines, current, i = [], [], 0
    while len(lines) < n:
        current += sentences[i % len(sentences)].split()
        i += 1
        if len(current) >= words:
            lines.append(" ".join(current))
            current = []
    return lines


def encoder_figure(run: Path, lines: list, batch: int, plan: str, passes: int) -> tuple:
    """Lines per second of the GPU encoder alone on predict's own batches (tokenized, pinned)."""
    task, model, tokenizer, info = load_run(run, "cuda", fast=plan)
    gpu, _ = with_backend(model, "gpu", None, plan=info["fast"])
    start = time.perf_counter()
    feats = task.featurize(tokenizer, [TextExample(line, None, None, "") for line in lines], train=False)
    tokenize = len(lines) / (time.perf_counter() - start)
    lengths = [len(f["input_ids"]) for f in feats]
    batches = []
    for idx in sequential_batches(lengths, batch):
        b = collate([{k: feats[i][k] for k in ("input_ids", "token_type_ids", "attention_mask")} for i in idx])
        batches.append({k: v.pin_memory() for k, v in b.items()})

    def run_all():
        for b in batches:
            gpu(**b)["logits"]

    seconds = seconds_per_call(run_all, warmup=1, reps=passes)
    # predict() itself (batching, pinning, reading back) on the tokens made beforehand: the
    # pipeline's own ceiling, without tokenizing beside it.
    block = TokenBlock.from_ids([f["input_ids"] for f in feats])
    loop = seconds_per_call(lambda: predict(gpu, block, batch, "cuda"), warmup=1, reps=passes)
    return len(lines) / seconds, gpu.runner.plan, tokenize, len(lines) / loop


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True, help="a BERT uncased WordPiece folder (vocab.txt)")
    parser.add_argument("--data", required=True, help="the GLUE SST-2 folder (train.tsv gives the text)")
    parser.add_argument("--lines", type=int, default=50000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--passes", type=int, default=3, help="timed passes of the encoder over the file's batches")
    parser.add_argument("--fast", default="graphs+qkv,graphs+compile+qkv,infer", help="exact plans for the encoder-alone figure")
    parser.add_argument("--predict-fast", default="auto", help="the plan predict runs (default: auto, what a user gets)")
    parser.add_argument("--results", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/predict_gpu.py measures a GPU: no CUDA device here")
    script = command_line("predict_gpu.py", argv if argv is not None else sys.argv[1:])
    tmp = Path(tempfile.mkdtemp(prefix="ctxkit-predict-"))
    try:
        run = make_run(tmp / "run", args.tokenizer)
        lines = make_lines(args.data, args.lines)
        (tmp / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "ctxkit", "predict", str(run), str(tmp / "in.txt"), "--backend", "gpu",
                               "--batch-size", str(args.batch), "--device", "cuda", "--fast", args.predict_fast],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t0
        print(done.stderr[-2000:], flush=True)
        if done.returncode:
            raise SystemExit(f"ctxkit predict failed ({done.returncode})")
        rate = float(re.search(r"the other \d+ at ([\d,]+) lines/s", done.stderr).group(1).replace(",", ""))
        plan_line = next((line for line in done.stderr.splitlines() if line.startswith("backend:")), "")
        encoder, tokenize, loops = {}, [], []
        for plan in args.fast.split(","):
            encoder[plan], resolved, rate_tok, rate_loop = encoder_figure(run, lines, args.batch, plan, args.passes)
            tokenize.append(rate_tok)
            loops.append(rate_loop)
            print(f"GPU encoder alone, --fast {plan} ({resolved}): {encoder[plan]:,.0f} lines/s; the task's tokenizing alone "
                  f"{rate_tok:,.0f} lines/s; predict() on the tokens made beforehand {rate_loop:,.0f} lines/s", flush=True)
        best = max(encoder, key=encoder.get)
        print(f"ctxkit predict: {rate:,.0f} lines/s after the first batch ({wall:.1f} s in all) = {rate / encoder[best]:.1%} of "
              f"the encoder alone ({encoder[best]:,.0f}, --fast {best}); tokenizing alone (the bound of any pipeline on "
              f"{os.cpu_count()} cores): {max(tokenize):,.0f} lines/s", flush=True)
        record = speed_record(
            "predict_gpu", f"ctxkit predict --backend gpu, BERT-base SST-2 classifier (random weights), {args.lines} lines of 128 tokens, "
            f"batch {args.batch}, --fast {args.predict_fast}", "throughput after the first batch", "lines/s", rate,
            f"the GPU encoder alone on the same batches, tokenized and pinned (fastest exact plan of the same run: --fast {best})",
            encoder[best], f"ctxkit predict RUN FILE --backend gpu --batch-size {args.batch} --fast {args.predict_fast}",
            benchmark_command=script, predict_wall_s=round(wall, 1), tokenize_lines_per_s=round(max(tokenize), 1),
            predict_pretokenized_lines_per_s=round(max(loops), 1), cpu_cores=os.cpu_count(), backend=plan_line, encoder_all={k: round(v, 1) for k, v in encoder.items()})
        write_records("predict_gpu.json", [record], args.results)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
