"""BERT pretraining on real text, end to end: ``ctxkit pretrain`` vs its synthetic figure and vs the HF Trainer.

    python benchmarks/pretrain_real.py --corpus ../shared/data/wikipedia-en-extract/AA --files 8
    python benchmarks/pretrain_real.py --corpus DIR --files 2 --preset bert_2_128_2 --steps 8 --no-peer   # CPU smoke run

What a user runs, in one process, on one card:

1. ``ctxkit pretrain-vocab`` and ``ctxkit pretrain-data`` (seq 128) over the first --files
   files of the Wikipedia extract;
2. ``ctxkit pretrain --preset P --fast PLAN --max-steps N`` on those shards: tokens/s of the
   log intervals after warm-up (the run's own log), the warm-up time, the graphs it compiled
   (the log's ``compiles``) and how busy the GPU was (NVML utilisation sampled every 0.1 s
   over the timed intervals);
3. ``ctxkit bench pretrain`` with the same plan (the synthetic figure): real / synthetic;
4. the peer: ``transformers.Trainer`` with ``BertForPreTraining`` (bf16, ``torch_compile``,
   4 dataloader workers, ``DataCollatorForLanguageModeling`` at 15 % with 80/10/10, NSP
   labels) on the very token sequences of the shards, the same batch size and steps.

Writes speed records to benchmarks/results/pretrain_real.json (issue 37's targets: real >=
0.9 x synthetic, GPU busy >= 90 %, warm-up <= 60 s, no compile after warm-up, >= 2.0x the HF
Trainer's tokens/s).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from harness import command_line, device_name, speed_record, today, write_records

from ctxkit.cli import main as ctxkit
from ctxkit.cli.bench import bench_pretrain
from ctxkit.pretraining import PretrainDataset


class BusySampler:
    """NVML's GPU utilisation (percent of time a kernel ran) every 0.1 s while running."""

    def __init__(self):
        self.samples, self._stop, self._thread = [], threading.Event(), None

    def __enter__(self):
        if torch.cuda.is_available():
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.1):
            try:
                self.samples.append((time.time(), torch.cuda.utilization()))
            except Exception:  # noqa: BLE001 - no NVML here: nothing to sample
                return

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def mean(self, start: float, end: float):
        inside = [u for t, u in self.samples if start <= t <= end]
        return sum(inside) / len(inside) if inside else None


def run(argv) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        if ctxkit(argv) != 0:
            raise SystemExit(f"ctxkit {' '.join(argv)} failed")


def hf_trainer(shards: Path, vocab: Path, preset: str, batch: int, steps: int, warmup: int, workers: int, pad_multiple: int = 128) -> dict:
    """Tokens/s of transformers' Trainer on the shards' token sequences (after ``warmup`` steps)."""
    import transformers
    from transformers import (BertConfig, BertForPreTraining, BertTokenizerFast, DataCollatorForLanguageModeling, Trainer,
                              TrainerCallback, TrainingArguments)

    from ctxkit.models import get_preset

    data = PretrainDataset(shards)
    tok = BertTokenizerFast(vocab_file=str(vocab / "vocab.txt"), do_lower_case=True)
    arch = get_preset(preset).config
    config = BertConfig(vocab_size=data.vocab_size, hidden_size=arch.hidden_size, num_hidden_layers=arch.num_layers,
                        num_attention_heads=arch.num_heads, intermediate_size=arch.ffn_size, attn_implementation="sdpa")

    class Sequences(torch.utils.data.Dataset):
        def __len__(self):
            return len(data)

        def __getitem__(self, i):
            f = data[i]
            return {"input_ids": f["input_ids"], "token_type_ids": f["token_type_ids"], "next_sentence_label": f["next_sentence_label"]}

    times = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            torch.cuda.synchronize() if torch.cuda.is_available() else None
            times.append(time.perf_counter())

    cuda = torch.cuda.is_available()
    # Batches of similar lengths, as ctxkit's: transformers >= 5.2 spells it train_sampling_strategy.
    names = inspect.signature(TrainingArguments).parameters
    grouped = ({"train_sampling_strategy": "group_by_length"} if "train_sampling_strategy" in names else
               {"group_by_length": True} if "group_by_length" in names else {})
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(out, per_device_train_batch_size=batch, max_steps=warmup + steps, learning_rate=1e-4,
                                 weight_decay=0.01, warmup_steps=0, bf16=cuda, torch_compile=cuda,
                                 dataloader_num_workers=workers if cuda else 0, dataloader_pin_memory=cuda, logging_steps=10_000,
                                 save_strategy="no", report_to=[], disable_tqdm=True, seed=0, **grouped)
        trainer = Trainer(model=BertForPreTraining(config), args=args, train_dataset=Sequences(),
                          data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=0.15, pad_to_multiple_of=pad_multiple or None),
                          callbacks=[Clock()])
        trainer.train()
    seconds = times[-1] - times[warmup - 1]
    # Its collator runs in worker processes in the sampler's order: the timed steps' real tokens
    # are counted as the shards' mean length per sequence (ctxkit's side counts its own exactly).
    mean_len = sum(data.lengths) / len(data)
    return {"tokens_per_s": steps * batch * mean_len / seconds, "seq_per_s": steps * batch / seconds,
            "name": f"transformers {transformers.__version__} Trainer, BertForPreTraining (sdpa{', bf16, torch_compile' if cuda else ''}, "
                    f"{workers if cuda else 0} workers, grouped by length, MLM collator 15 %"
                    f"{f', pad to {pad_multiple}' if pad_multiple else ''})"}


def profile_steps(shards: Path, preset: str, batch: int, fast: str, out: Path, start_step: int = 40, steps: int = 10) -> str:
    """A torch.profiler trace of ``steps`` real-data steps after ``start_step`` (host and
    device): the run is ``ctxkit.pretraining.pretrain`` (what ``ctxkit pretrain`` calls) with a
    callback that starts the profiler at one log record and stops it at the next. Writes
    the tables (device time and host time by operator) to ``out`` and returns them."""
    from torch.profiler import ProfilerActivity, profile

    from ctxkit.core.callbacks import Callback
    from ctxkit.pretraining import MaskingConfig
    from ctxkit.pretraining.train import pretrain
    from ctxkit.training import TrainConfig

    class Profiling(Callback):
        def __init__(self):
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self.profiler, self.running, self.wall = profile(activities=activities), False, None

        def on_log(self, step, metrics):
            if step == start_step:
                torch.cuda.synchronize() if torch.cuda.is_available() else None
                self.profiler.__enter__()
                self.running, self.wall = True, time.perf_counter()
            elif self.running:
                torch.cuda.synchronize() if torch.cuda.is_available() else None
                self.wall = time.perf_counter() - self.wall
                self.profiler.__exit__(None, None, None)
                self.running = False

    hook = Profiling()
    config = TrainConfig(batch_size=batch, max_steps=start_step + steps, log_every=steps, fast=fast, progress=False,
                         eval_each_epoch=False)
    with tempfile.TemporaryDirectory(prefix="ctxkit-profile-") as run_dir:
        pretrain(shards, preset, run_dir, config, masking=MaskingConfig(max_predictions=20), callbacks=[hook])
    averages = hook.profiler.key_averages()
    device_key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    text = (f"{steps} steps of {preset}, batch {batch}, real shards, --fast {fast}: {hook.wall * 1e3 / steps:.1f} ms per step (wall)\n\n"
            f"By device time:\n{averages.table(sort_by=device_key, row_limit=25, max_name_column_width=60)}\n\n"
            f"By host time:\n{averages.table(sort_by='self_cpu_time_total', row_limit=20, max_name_column_width=60)}\n")
    out.write_text(text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=None, help="the folder of the Wikipedia extract's wiki_NN.xz files")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--preset", default="bert_12_768_12")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60, help="timed steps (after --warmup)")
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--fast", default="auto")
    parser.add_argument("--workers", type=int, default=4, help="the HF side's dataloader workers")
    parser.add_argument("--pad-multiple", type=int, default=128,
                        help="the HF side's pad_to_multiple_of (default 128: one shape, one compile; 16 gave it eight "
                             "shapes and 0.9 s steps under torch_compile on an H200; 0: pad to each batch's longest)")
    parser.add_argument("--prepared", default=None, metavar="WORK",
                        help="use the vocabulary and shards of `pretrain_long.py prepare --work WORK` (the whole extract) instead")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--profile", default=None, metavar="FILE",
                        help="also profile 10 real-data steps (torch.profiler, host and device) and write the tables to FILE")
    parser.add_argument("--results", default=None)
    args = parser.parse_args(argv)
    script = command_line("pretrain_real.py", argv if argv is not None else sys.argv[1:])
    files = sorted(Path(args.corpus).glob("wiki_*.xz"))[:args.files] if args.corpus else []
    log_every = 10
    warmup = -(-args.warmup // log_every) * log_every
    steps = -(-args.steps // log_every) * log_every
    with tempfile.TemporaryDirectory(prefix="ctxkit-real-") as tmp:
        tmp = Path(tmp)
        t0 = time.time()
        shards, vocab = (Path(args.prepared) / "shards", Path(args.prepared) / "vocab") if args.prepared else (tmp / "shards", tmp / "vocab")
        if not args.prepared:
            run(["pretrain-vocab", *map(str, files), "--vocab-size", "30522", "--out", str(vocab), "--no-progress"])
            run(["pretrain-data", *map(str, files), "--tokenizer", str(vocab), "--out", str(shards), "--max-seq-len", "128", "--no-progress"])
        else:  # shards of pretrain_long.py prepare: all files but the last
            files = [None] * (json.loads((Path(args.prepared) / "prepared.json").read_text())["files"] - 1)
        prepared = time.time() - t0
        data = PretrainDataset(shards)
        print(f"shards: {len(data)} sequences of <= 128 tokens from {len(files)} files ({prepared:.0f} s)", flush=True)
        pretrain = ["pretrain", "--data", str(shards), "--preset", args.preset, "--out", str(tmp / "run"),
                    "--batch-size", str(args.batch), "--max-steps", str(warmup + steps), "--log-every", str(log_every),
                    "--fast", args.fast, "--no-progress"]
        with BusySampler() as busy:
            run(pretrain)
        log = [json.loads(line) for line in (tmp / "run" / "log.jsonl").read_text().splitlines()]
        train = [r for r in log if r["event"] == "train"]
        start = log[0]
        timed = [r for r in train if r["step"] > warmup]
        seconds = sum(r["elapsed"] - p["elapsed"] for p, r in zip(train, train[1:]) if r["step"] > warmup)
        tokens_s = sum(r["tokens_per_s"] * (r["elapsed"] - p["elapsed"]) for p, r in zip(train, train[1:]) if r["step"] > warmup) / seconds
        compiles = [r.get("compiles") for r in train]
        warm = next(r for r in train if r["step"] >= warmup)
        # Compiling every bucket before step 1 (the start record's warm_up), then the first log
        # interval (the CUDA-graph captures): the wait before the run goes at full speed.
        compile_s = (start.get("warm_up") or {}).get("seconds", 0.0)
        warm_s = compile_s + train[0]["elapsed"]
        gpu_busy = busy.mean(warm["time"], train[-1]["time"])
        synthetic = bench_pretrain(args.preset, args.batch, 128, 20, steps, warmup=warmup, fast=args.fast)
        print(f"ctxkit pretrain ({start['fast']}): {tokens_s:,.0f} tokens/s after warm-up ({warm_s:.0f} s, compiling {compile_s:.0f} s), compiles {compiles}, "
              f"GPU busy {gpu_busy}; synthetic {synthetic['tokens_per_s']:,.0f} tokens/s: {tokens_s / synthetic['tokens_per_s']:.1%}",
              flush=True)
        command = (f"ctxkit pretrain --data SHARDS --preset {args.preset} --out RUN --batch-size {args.batch} "
                   f"--max-steps {warmup + steps} --log-every {log_every} --fast {args.fast}")
        case = f"{args.preset}, seq <= 128, batch {args.batch}, {len(data)} real sequences ({len(files)} Wikipedia files), --fast {args.fast}"
        extra = dict(ctxkit_plan=start["fast"], warmup_s=round(warm_s, 1), compile_warm_up_s=compile_s, compiles=compiles, gpu_busy_percent=gpu_busy,
                     timed_steps=len(timed) * log_every, benchmark_command=script)
        records = [speed_record("pretrain_real", case, "tokens per second, real vs synthetic", "tokens/s", tokens_s,
                                f"ctxkit bench pretrain, the same plan (synthetic, fixed 128 tokens): {synthetic['fast']}",
                                synthetic["tokens_per_s"], command, **extra)]
        if not args.no_peer:
            hf = hf_trainer(shards, vocab, args.preset, args.batch, steps, warmup, args.workers, args.pad_multiple)
            print(f"{hf['name']}: {hf['tokens_per_s']:,.0f} tokens/s -> ctxkit {tokens_s / hf['tokens_per_s']:.2f}x", flush=True)
            records.append(speed_record("pretrain_real", case, "tokens per second, end to end", "tokens/s", tokens_s, hf["name"],
                                        hf["tokens_per_s"], command, **extra))
        write_records("pretrain_real.json", records, args.results)
        if args.profile:
            print(profile_steps(shards, args.preset, args.batch, args.fast, Path(args.profile))[:3000], flush=True)
    print(json.dumps({"device": device_name(), "date": today(), "records": len(records)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
