"""``ctxkit bench``: the speed figures of docs/performance.md, reproduced with one command.

Each measurement goes through the entry a user calls, with a fast plan, and nothing
assembled for the occasion:

* ``ctxkit bench pretrain`` -- the :class:`~ctxkit.training.Trainer` (``use="pretrain"``,
  the MLM collator masking in its loader processes, the plan's CUDA graphs and compiling)
  on fixed-length sentence pairs of random tokens, the shape of ``pretrain-data``'s
  shards; the figure is the Trainer's own log interval after warm-up.
* ``ctxkit bench infer`` -- :class:`~ctxkit.inference.gpu.GPUEncoder` (what ``predict
  --backend gpu`` and ``serve`` run) on full batches of a BERT classifier.
* ``ctxkit bench decode`` -- :func:`ctxkit.decoding.generate` (what ``ctxkit generate``
  runs) on a GPT-2 with greedy decoding.

Weights are random (speed does not depend on them). Every command prints one JSON line
with the figure and the resolved plan; ``benchmarks/*.py`` call the same functions and
time the peer (transformers) in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from typing import Optional

import numpy as np
import torch

from ..core.errors import UserError
from ..core.timing import median_latency_ms, seconds_per_call
from ..data.batching import collate
from ..decoding import GenerationConfig, generate
from ..fast import resolve
from ..inference.gpu import GPUEncoder
from ..zoo.families import build_model
from ..zoo.presets import GPT2_PRESETS, get_preset
from ..pretraining.masking import MaskingConfig, MaskingIds, MLMCollator
from ..pretraining.train import PretrainingModel, training_flops_per_token
from ..tasks import get_task
from ..tokenizers import WordPieceTokenizer
from ..training import TrainConfig, Trainer, resolve_device
from ..training.callbacks import Callback
from .train_flags import device_option, FAST_HELP

__all__ = ["SyntheticPairs", "bench_decode", "bench_infer", "bench_pretrain", "add_bench_command"]

CLS, SEP, MASK, PAD = 101, 102, 103, 0  # BERT's uncased WordPiece ids


class SyntheticPairs:
    """``n`` fixed-length sentence pairs of random tokens, as ``pretrain-data`` writes them:
    ``[CLS] a [SEP] b [SEP]``, segment ids 0 then 1, next-sentence labels alternating.

    A sequence (``lengths``, ``__len__``, ``__getitem__``): the Trainer reads it like
    memory-mapped shards; each item is drawn from its own seed, so loader processes agree.
    """

    def __init__(self, n: int, seq: int, vocab_size: int, seed: int = 0):
        if seq < 5:
            raise ValueError(f"seq must be >= 5 for [CLS] a [SEP] b [SEP], got {seq}")
        self.n, self.seq, self.vocab_size, self.seed = n, seq, vocab_size, seed
        self.lengths = [seq] * n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.n:
            raise IndexError(i)
        ids = np.random.default_rng((self.seed, i)).integers(1000, self.vocab_size, self.seq)
        half = self.seq // 2
        ids[0], ids[half - 1], ids[-1] = CLS, SEP, SEP
        types = [0] * half + [1] * (self.seq - half)
        return {"input_ids": ids.tolist(), "token_type_ids": types, "attention_mask": [1] * self.seq,
                "next_sentence_label": i % 2}


class _LastLog(Callback):
    def __init__(self):
        self.records = []

    def on_log(self, step: int, metrics: dict) -> None:
        self.records.append(dict(metrics))


def bench_pretrain(preset: str = "bert_12_768_12", batch: int = 256, seq: int = 128, masked: int = 20, steps: int = 20,
                   warmup: Optional[int] = None, fast: str = "auto", device: str = "auto", precision: str = "auto",
                   peak_tflops: Optional[float] = None, data_workers: Optional[int] = None, progress: bool = False) -> dict:
    """BERT MLM + NSP pretraining throughput through the Trainer.

    Args:
        preset: a BERT preset (``bert_12_768_12`` is BERT-base).
        batch, seq, masked: sequences per step, their length, masked positions per sequence.
        steps: timed steps (one log interval of the Trainer).
        warmup: steps before them (compiling, CUDA-graph capture, loader start-up);
            rounded up to a multiple of ``steps``; default ``steps``.
        fast: the fast plan (resolved for ``pretrain``).
        device, precision, data_workers: as :class:`~ctxkit.training.TrainConfig`.
        peak_tflops: the device's bf16 peak, for the MFU (:func:`~ctxkit.core.timing.measured_peak_tflops`).

    Returns:
        ``seq_per_s``, ``tokens_per_s``, ``mfu`` (with ``peak_tflops``), ``warmup_s`` and
        the resolved ``fast`` plan with its one-line description.
    """
    warmup = steps * max(1, math.ceil((warmup if warmup is not None else steps) / steps))
    arch = get_preset(preset).config.replace(max_position=max(512, seq))
    data = SyntheticPairs(batch * (warmup + steps), seq, arch.vocab_size)
    ids = MaskingIds(arch.vocab_size, MASK, frozenset({PAD, CLS, SEP, MASK}), PAD)
    collator = MLMCollator(ids, MaskingConfig(max_predictions=masked), seed=0)
    torch.manual_seed(0)
    model = PretrainingModel(arch)
    config = TrainConfig(epochs=1, batch_size=batch, max_steps=warmup + steps, log_every=steps, lr=1e-4, warmup_ratio=0.0,
                         device=device, precision=precision, progress=progress, eval_each_epoch=False, save_checkpoints=False,
                         group_factor=0, peak_tflops=peak_tflops, data_workers=data_workers, fast=fast)
    log = _LastLog()
    with tempfile.TemporaryDirectory(prefix="ctxkit-bench-") as out:
        trainer = Trainer(model, data, config, out, collate_fn=collator, callbacks=[log], use="pretrain",
                          flops_per_token=lambda s: training_flops_per_token(arch, s, masked / seq))
        trainer.train()
    timed, first = log.records[-1], log.records[0]
    return {"bench": "pretrain", "asked": str(fast), "preset": preset, "batch": batch, "seq": seq, "masked": masked, "steps": steps, "warmup": warmup,
            "seq_per_s": timed["seq_per_s"], "tokens_per_s": timed["tokens_per_s"], "mfu": timed.get("mfu"),
            "warmup_s": first["elapsed"], "fast": str(trainer.plan), "plan": trainer.plan.describe(),
            "device": _device_name(trainer.device)}


def bench_infer(preset: str = "bert_12_768_12", task: str = "sst-2", batch: int = 256, seq: int = 128, reps: int = 50,
                warmup: int = 5, fast: str = "auto", dtype: str = "bf16", data: Optional[str] = None, tokenizer: Optional[str] = None,
                split: str = "dev") -> dict:
    """Encoder inference throughput of a BERT classifier through :class:`~ctxkit.inference.gpu.GPUEncoder`
    (host inputs in pinned memory, logits back as fresh tensors, as ``predict`` and ``serve`` call it).

    Without ``data``: full batches of ``batch`` x ``seq`` random tokens (the fixed-shape path);
    for ``batch`` 1 also the median latency of synchronised calls. With ``data`` (a GLUE
    task folder, e.g. ``SST-2``): its ``split`` sentences tokenized with ``tokenizer`` (a
    BERT uncased WordPiece folder), ``batch`` at a time in file order, each padded to its
    longest (the packed path); ``reps`` passes over them.

    Returns:
        ``seq_per_s`` (sentences/s), ``ms_per_batch``, ``latency_ms`` (batch 1) and the resolved ``fast`` plan.
    """
    torch.manual_seed(0)
    model = get_task(task).build_model(build_model(get_preset(preset).config)).eval()
    encoder = GPUEncoder(model, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32, plan=fast)
    out = {"bench": "infer", "asked": str(fast), "preset": preset, "task": task, "batch": batch, "dtype": dtype}
    if data is None:
        ids = torch.randint(1000, 20000, (batch, seq), generator=torch.Generator().manual_seed(1)).pin_memory()
        batches = [(ids, torch.zeros_like(ids).pin_memory(), torch.ones_like(ids).pin_memory())]
        out["seq"] = seq
    else:
        batches, tokens = _glue_batches(task, data, tokenizer, split, batch)
        out.update(data=f"{task} {split} ({sum(len(b[0]) for b in batches)} sentences, {tokens} tokens)", passes=reps)
    n = sum(len(b[0]) for b in batches)

    def run() -> None:
        for ids, types, mask in batches:
            encoder(ids, mask, token_type_ids=types)["logits"]

    seconds = seconds_per_call(run, warmup=warmup if data is None else 1, reps=reps)
    out.update(seq_per_s=round(n / seconds, 1), ms_per_batch=round(seconds * 1e3 / len(batches), 4))
    if data is None and batch == 1:
        out["latency_ms"] = round(median_latency_ms(run, reps), 4)
    return {**out, "fast": str(encoder.plan), "plan": encoder.plan.describe(), "device": _device_name(encoder.device)}


def _glue_batches(task_name: str, data: str, tokenizer: Optional[str], split: str, batch: int):
    """A GLUE split's sentences, ``batch`` at a time in file order, padded to each batch's longest."""
    task = get_task(task_name)
    if tokenizer is None:
        raise UserError("bench infer --data needs --tokenizer (a BERT uncased WordPiece folder)")
    feats = task.featurize(WordPieceTokenizer.from_dir(tokenizer), task.load(data, split), train=False)
    batches = []
    for start in range(0, len(feats), batch):
        b = collate([{k: f[k] for k in ("input_ids", "attention_mask")} for f in feats[start:start + batch]])
        batches.append((b["input_ids"].pin_memory(), torch.zeros_like(b["input_ids"]).pin_memory(), b["attention_mask"].pin_memory()))
    return batches, sum(len(f["input_ids"]) for f in feats)


def bench_decode(preset: str = "gpt2_117m", batch: int = 1, prompt: int = 32, new: int = 256, reps: int = 3, fast: str = "auto",
                 device: str = "auto") -> dict:
    """Greedy decoding throughput of a GPT-2 through :func:`ctxkit.decoding.generate`
    (bf16 on a GPU, fp32 on a CPU; ``new`` tokens after a ``prompt``-token prompt).

    Returns:
        ``tokens_per_s`` (new tokens, all rows), ``ms_per_call`` and the resolved ``fast`` plan.
    """
    dev = resolve_device(device)
    torch.manual_seed(0)
    model = build_model(GPT2_PRESETS[preset].replace(dropout=0.0, attention_dropout=0.0)).eval()
    model = model.to(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32)
    plan = resolve(fast, use="decode", device=dev)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(1)).to(dev)
    config = GenerationConfig(max_new_tokens=new)
    seconds = seconds_per_call(lambda: generate(model, ids, None, config, plan=plan), warmup=1, reps=reps, device=dev)
    return {"bench": "decode", "asked": str(fast), "preset": preset, "batch": batch, "prompt": prompt, "new": new,
            "tokens_per_s": round(batch * new / seconds, 1), "ms_per_call": round(seconds * 1e3, 2), "fast": str(plan),
            "plan": plan.describe(), "device": _device_name(dev)}


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "CPU"


def _cmd_bench(args: argparse.Namespace) -> int:
    options = {k: v for k, v in vars(args).items() if k not in ("verb", "func", "what", "command_line")}
    result = {"pretrain": bench_pretrain, "infer": bench_infer, "decode": bench_decode}[args.what](**options)
    print(result["plan"], file=sys.stderr)
    print(json.dumps(result))
    return 0


def add_bench_command(sub: argparse._SubParsersAction) -> None:
    """Register ``bench pretrain|infer|decode``."""
    p = sub.add_parser("bench", help="measure pretraining, inference or decoding speed through the product (random weights)",
                       description="The figures of docs/performance.md, through the same entries a user calls (Trainer, "
                                   "GPU encoder, generate) with a fast plan. Prints one JSON line.")
    what = p.add_subparsers(dest="what", metavar="WHAT", required=True)
    q = what.add_parser("pretrain", help="BERT MLM + NSP pretraining through the Trainer (sequences/s, MFU)")
    q.add_argument("--preset", default="bert_12_768_12")
    q.add_argument("--batch", type=int, default=256)
    q.add_argument("--seq", type=int, default=128)
    q.add_argument("--masked", type=int, default=20, help="masked positions per sequence (default: 20)")
    q.add_argument("--steps", type=int, default=20, help="timed steps (default: 20)")
    q.add_argument("--warmup", type=int, default=None, help="steps before them (default: --steps)")
    q.add_argument("--device", type=device_option, default="auto")
    q.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"))
    q.add_argument("--peak-tflops", type=float, default=None, help="the GPU's bf16 peak, for the MFU")
    q.add_argument("--data-workers", type=int, default=None)
    q.add_argument("--fast", default="auto", metavar="PLAN", help=FAST_HELP)
    q.set_defaults(func=_cmd_bench)
    q = what.add_parser("infer", help="BERT classifier inference through the GPU encoder (sequences/s)")
    q.add_argument("--preset", default="bert_12_768_12")
    q.add_argument("--task", default="sst-2")
    q.add_argument("--batch", type=int, default=256)
    q.add_argument("--seq", type=int, default=128)
    q.add_argument("--reps", type=int, default=50)
    q.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    q.add_argument("--data", default=None, metavar="GLUE_TASK_DIR",
                   help="real sentences instead of full random batches: a GLUE task folder (e.g. .../glue/SST-2)")
    q.add_argument("--split", default="dev")
    q.add_argument("--tokenizer", default=None, metavar="DIR", help="with --data: a BERT uncased WordPiece folder")
    q.add_argument("--fast", default="auto", metavar="PLAN", help=FAST_HELP)
    q.set_defaults(func=_cmd_bench)
    q = what.add_parser("decode", help="GPT-2 greedy decoding through generate (new tokens/s)")
    q.add_argument("--preset", default="gpt2_117m")
    q.add_argument("--batch", type=int, default=1)
    q.add_argument("--prompt", type=int, default=32)
    q.add_argument("--new", type=int, default=256)
    q.add_argument("--reps", type=int, default=3)
    q.add_argument("--device", type=device_option, default="auto")
    q.add_argument("--fast", default="auto", metavar="PLAN", help=FAST_HELP)
    q.set_defaults(func=_cmd_bench)
