"""Eight minutes of BERT-base pretraining on the whole Wikipedia extract: ``ctxkit pretrain``
against transformers' ``Trainer``, same card, same data, same minutes (issue 37 item 3).

Three steps, each its own call (one device command runs 10 minutes at most; the work
folder stays on the machine between back-to-back calls):

    python benchmarks/pretrain_long.py prepare --corpus ../shared/data/wikipedia-en-extract/AA --work /tmp/long
    python benchmarks/pretrain_long.py ctxkit --work /tmp/long --minutes 8 --summary OUT/ctxkit_long.json
    python benchmarks/pretrain_long.py hf --work /tmp/long --minutes 8 --summary OUT/hf_long.json
    python benchmarks/pretrain_long.py report ctxkit_long.json hf_long.json     # here: records, figure, results table

``prepare``: one vocabulary (``ctxkit pretrain-vocab``) over all files but the last, the
training shards from those files and held-out shards from the last (``ctxkit pretrain-data``,
seq 128). ``ctxkit``: the user's command, ``ctxkit pretrain --preset bert_12_768_12
--max-minutes M --save-every N --eval-data HELD_OUT``, with NVML's busy share sampled; its
log is the curve (tokens/s, loss and MLM accuracy per log interval, an evaluation per
epoch). ``hf``: ``transformers.Trainer`` with ``BertForPreTraining`` (bf16, torch_compile,
4 dataloader workers, ``DataCollatorForLanguageModeling`` at 15 % padded to 128, NSP
labels) on the same token sequences for the same minutes, checkpoints at the same step
interval and an evaluation of the held-out shards per epoch; its MLM accuracy is computed
from the logits of the logged steps. ``report`` writes ``benchmarks/results/pretrain_long.json``,
``docs/pretrain_long.png`` and prints the results table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from harness import device_name, speed_record, today, write_records
from pretrain_real import BusySampler

from ctxkit.cli import main as ctxkit
from ctxkit.pretraining import PretrainDataset
from ctxkit.pretraining.train import default_pretrain_lr

PRESET, BATCH, LOG_EVERY = "bert_12_768_12", 256, 50
# The learning-rate schedule (6 % warm-up, linear decay) spans this many epochs on both sides;
# the time budget stops the run long before (8 minutes are ~18 epochs of 63 files on an H200).
EPOCHS = 20


def run(argv) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        if ctxkit(argv) != 0:
            raise SystemExit(f"ctxkit {' '.join(argv)} failed")


def prepare(corpus: Path, work: Path) -> dict:
    """Vocabulary and shards of the extract: all files but the last train, the last is held out."""
    files = sorted(corpus.glob("wiki_*.xz"))
    if len(files) < 2:
        raise SystemExit(f"{corpus}: needs at least two wiki_*.xz files")
    train, held_out = files[:-1], files[-1:]
    start = time.time()
    run(["pretrain-vocab", *map(str, train), "--vocab-size", "30522", "--out", str(work / "vocab"), "--no-progress"])
    for name, group in (("shards", train), ("held_out", held_out)):
        run(["pretrain-data", *map(str, group), "--tokenizer", str(work / "vocab"), "--out", str(work / name), "--max-seq-len", "128",
             "--no-progress"])
    info = {"files": len(files), "train_sequences": len(PretrainDataset(work / "shards")),
            "held_out_sequences": len(PretrainDataset(work / "held_out")), "prepare_s": round(time.time() - start, 1)}
    (work / "prepared.json").write_text(json.dumps(info))
    return info


def ctxkit_side(work: Path, minutes: float, save_every: int, preset: str = PRESET) -> dict:
    """``ctxkit pretrain`` for ``minutes``; its log as the summary."""
    out = work / "ctxkit_run"
    argv = ["pretrain", "--data", str(work / "shards"), "--eval-data", str(work / "held_out"), "--preset", preset, "--out", str(out),
            "--batch-size", str(BATCH), "--epochs", str(EPOCHS), "--max-minutes", str(minutes), "--save-every", str(save_every), "--log-every", str(LOG_EVERY),
            "--fast", "auto", "--no-progress"]
    with BusySampler() as busy:
        run(argv)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    train = [r for r in log if r["event"] == "train"]
    start = log[0]
    # Busy share per log interval: the NVML samples between the previous record and this one.
    previous = start.get("time") or (train[0]["time"] - train[0]["elapsed"])
    for r in train:
        r["gpu_busy"] = busy.mean(previous, r["time"])
        previous = r["time"]
    return {"side": "ctxkit", "plan": start["fast"], "warm_up": start.get("warm_up"), "train": train,
            "eval": [r for r in log if r["event"] == "eval"], "end": log[-1], "minutes": minutes, "save_every": save_every,
            "preset": preset, "command": ("ctxkit pretrain --data SHARDS --eval-data HELD_OUT --preset " f"{preset} --out RUN --batch-size {BATCH} --epochs {EPOCHS} "
                        f"--max-minutes {minutes:g} --save-every {save_every} --log-every {LOG_EVERY} --fast auto")}


def hf_side(work: Path, minutes: float, save_every: int, preset: str = PRESET, workers: int = 4, partial: Path | None = None) -> dict:
    """transformers' Trainer on the same sequences for ``minutes`` of training; ``partial``
    gets the summary so far at every log step (a run stopped from outside keeps its curve)."""
    import transformers
    from transformers import (
        BertConfig,
        BertForPreTraining,
        BertTokenizerFast,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from ctxkit.models import get_preset

    data, held_out = PretrainDataset(work / "shards"), PretrainDataset(work / "held_out")
    tok = BertTokenizerFast(vocab_file=str(work / "vocab" / "vocab.txt"), do_lower_case=True)
    arch = get_preset(preset).config
    config = BertConfig(vocab_size=data.vocab_size, hidden_size=arch.hidden_size, num_hidden_layers=arch.num_layers,
                        num_attention_heads=arch.num_heads, intermediate_size=arch.ffn_size, attn_implementation="sdpa")

    class Sequences(torch.utils.data.Dataset):
        def __init__(self, source):
            self.source = source

        def __len__(self):
            return len(self.source)

        def __getitem__(self, i):
            f = self.source[i]
            return {"input_ids": f["input_ids"], "token_type_ids": f["token_type_ids"], "next_sentence_label": f["next_sentence_label"]}

    train, evals, marks = [], [], {"start": None, "interval": None, "steps": 0}

    class Pretraining(Trainer):
        """BertForPreTraining's loss, plus MLM/NSP accuracy on the steps that log (one argmax)."""

        def compute_loss(self, model, inputs, return_outputs=False, **kw):
            outputs = model(**inputs)
            step = self.state.global_step + 1
            if model.training and step % LOG_EVERY == 0:
                labels = inputs["labels"]
                scored = labels != -100
                right = (outputs.prediction_logits.argmax(-1) == labels) & scored
                marks["acc"] = (right.sum() / scored.sum().clamp(min=1)).item()
            return (outputs.loss, outputs) if return_outputs else outputs.loss

    class Log(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            marks["launched"] = time.time()

        def on_step_end(self, args, state, control, **kw):
            now = time.time()
            if marks["start"] is None:  # the first step compiles: the clock starts after it
                marks["start"] = marks["interval"] = now
                marks["warm_up_s"] = now - marks["launched"]
                return
            if state.global_step % LOG_EVERY == 0:
                torch.cuda.synchronize() if torch.cuda.is_available() else None
                now = time.time()
                steps = state.global_step - marks["steps"]
                seconds = now - marks["interval"]
                train.append({"step": state.global_step, "elapsed": round(now - marks["start"], 2), "time": round(now, 3),
                              "tokens_per_s": steps * BATCH * mean_len / seconds, "seq_per_s": steps * BATCH / seconds,
                              "loss": None, "mlm_acc": marks.get("acc")})
                marks["interval"], marks["steps"] = now, state.global_step
                if partial is not None:
                    partial.write_text(json.dumps({"side": "hf", "partial": True, "name": "transformers Trainer (partial)",
                                                   "warm_up_s": round(marks.get("warm_up_s", 0.0), 1), "train": train, "eval": evals,
                                                   "minutes": minutes, "save_every": save_every}))
            if now - marks["start"] > 60 * minutes:
                control.should_training_stop = True

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs and train and train[-1]["loss"] is None:
                train[-1]["loss"] = logs["loss"]
            if logs and "eval_loss" in logs:
                evals.append({"step": state.global_step, "epoch": state.epoch, "elapsed": round(time.time() - (marks["start"] or time.time()), 2),
                              **{k: v for k, v in logs.items() if k.startswith("eval_")}})

    def accuracy(eval_pred):
        predictions, labels = eval_pred
        mlm_pred, nsp_pred = predictions
        mlm_labels, nsp_labels = labels
        scored = mlm_labels != -100
        return {"mlm_acc": float(((mlm_pred == mlm_labels) & scored).sum() / max(scored.sum(), 1)),
                "nsp_acc": float((nsp_pred == nsp_labels).mean())}

    mean_len = float(sum(data.lengths) / len(data))
    lr = default_pretrain_lr(preset)  # what `ctxkit pretrain` uses without --lr (1e-4 for BERT-base)
    steps_per_epoch = len(data) // BATCH
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory(dir=work) as out:
        args = TrainingArguments(out, per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH, num_train_epochs=EPOCHS,
                                 learning_rate=lr, weight_decay=0.01, warmup_steps=int(0.06 * EPOCHS * steps_per_epoch), bf16=cuda, torch_compile=cuda,
                                 dataloader_num_workers=workers if cuda else 0, dataloader_pin_memory=cuda, logging_steps=LOG_EVERY,
                                 save_strategy="steps", save_steps=save_every, save_total_limit=1, eval_strategy="steps",
                                 eval_steps=steps_per_epoch, report_to=[], disable_tqdm=True, seed=0, dataloader_drop_last=True,
                                 label_names=["labels", "next_sentence_label"])
        trainer = Pretraining(model=BertForPreTraining(config), args=args, train_dataset=Sequences(data), eval_dataset=Sequences(held_out),
                              data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=0.15, pad_to_multiple_of=128),
                              callbacks=[Log()], compute_metrics=accuracy,
                              preprocess_logits_for_metrics=lambda logits, labels: tuple(x.argmax(-1) for x in logits))
        trainer.train()
    name = (f"transformers {transformers.__version__} Trainer, BertForPreTraining (sdpa{', bf16, torch_compile' if cuda else ''}, "
            f"{workers if cuda else 0} workers, MLM collator 15 %, pad to 128, checkpoint every {save_every} steps, "
            f"evaluation each epoch)")
    return {"side": "hf", "name": name, "warm_up_s": round(marks.get("warm_up_s", 0.0), 1), "train": train, "eval": evals,
            "minutes": minutes, "save_every": save_every, "lr": lr}


def _steady(train: list) -> list:
    """The log intervals after the first minute (warm-up and the first captures behind), or
    after the first eighth of a shorter run (a CPU smoke run)."""
    after = min(60.0, train[-1]["elapsed"] / 8) if train else 0.0
    return [r for r in train if r["elapsed"] >= after]


def _mean_rate(train: list) -> float:
    """Tokens/s over the steady intervals, weighted by their lengths."""
    rows = _steady(train)
    times = [r["elapsed"] for r in rows]
    spans = [b - a for a, b in zip(times, times[1:])]
    return sum(r["tokens_per_s"] * s for r, s in zip(rows[1:], spans)) / max(sum(spans), 1e-9)


def _last_minute_acc(train: list) -> float | None:
    """Mean MLM accuracy of the logged training batches of the run's last minute."""
    rows = [r for r in train if r.get("mlm_acc") is not None and r["elapsed"] >= train[-1]["elapsed"] - 60]
    return round(sum(r["mlm_acc"] for r in rows) / len(rows), 4) if rows else None


def _interval_medians(train: list, eval_steps: list, save_every: int | None) -> dict:
    """Median tokens/s of the log intervals (after the first): plain ones, those holding a
    ``--save-every`` checkpoint, and those holding an epoch's end (evaluation, checkpoint,
    the next loader), with their counts: where a long run loses time, if anywhere."""
    kinds: dict = {"plain": [], "checkpoint": [], "epoch_end": []}
    for before, r in zip(train[1:], train[2:]):
        inside = range(before["step"] + 1, r["step"] + 1)
        if any(s in inside for s in eval_steps):
            kinds["epoch_end"].append(r["tokens_per_s"])
        elif save_every and any(s % save_every == 0 for s in inside):
            kinds["checkpoint"].append(r["tokens_per_s"])
        else:
            kinds["plain"].append(r["tokens_per_s"])
    return {k: {"tokens_per_s": round(statistics.median(v)), "intervals": len(v)} for k, v in kinds.items() if v}


def report(ctxkit_summary: dict, hf_summary: dict, results, figure: Path, device: str, invalid_eval: str | None = None) -> list:
    """Records and the figure from the two sides' summaries; prints the results table.

    ``invalid_eval``: why ctxkit's held-out evaluations of this run cannot be used (a bug
    found by the run); they are then left out of the figure and the records, and the
    quality record compares the two sides on their logged training batches instead.
    """
    if invalid_eval:
        ctxkit_summary = {**ctxkit_summary, "eval": [], "eval_invalid": invalid_eval}
    c_rate, h_rate = _mean_rate(ctxkit_summary["train"]), _mean_rate(hf_summary["train"])
    rates = [r["tokens_per_s"] for r in _steady(ctxkit_summary["train"])]
    quarter = max(1, len(rates) // 4)
    first, last = sum(rates[:quarter]) / quarter, sum(rates[-quarter:]) / quarter
    minutes = ctxkit_summary["minutes"]
    case = f"{ctxkit_summary['preset']}, seq <= 128, batch {BATCH}, 63 Wikipedia files (+1 held out), {minutes:g} minutes, --fast auto"
    c_eval, h_eval = ctxkit_summary["eval"], hf_summary["eval"]
    busy = [r["gpu_busy"] for r in _steady(ctxkit_summary["train"]) if r.get("gpu_busy") is not None]
    extra = {"ctxkit_plan": ctxkit_summary["plan"], "warm_up": ctxkit_summary["warm_up"], "steps": ctxkit_summary["train"][-1]["step"],
             "peer_steps": hf_summary["train"][-1]["step"] if hf_summary["train"] else 0,
             "last_quarter_over_first": round(last / first, 3), "gpu_busy_percent": round(sum(busy) / len(busy), 1) if busy else None,
             "evaluations": len(c_eval), "peer_evaluations": len(h_eval), "peer_warm_up_s": hf_summary["warm_up_s"],
             "benchmark_command": "python benchmarks/pretrain_long.py prepare|ctxkit|hf|report (see its docstring)",
             "train_sequences": ctxkit_summary.get("prepared", {}).get("train_sequences"),
             "wall_s": ctxkit_summary.get("end", {}).get("wall_time"),
             "interval_medians": _interval_medians(ctxkit_summary["train"], [r["step"] for r in c_eval], ctxkit_summary.get("save_every"))}
    records = [speed_record("pretrain_long", case, "tokens per second over the run", "tokens/s", c_rate, hf_summary["name"], h_rate,
                            ctxkit_summary["command"], device=device, **extra)]
    train_acc = {"task": "BERT pretraining (MLM + NSP), Wikipedia extract", "split": "training batches of the last minute",
                 "metric": "MLM accuracy", "value": _last_minute_acc(ctxkit_summary["train"]),
                 "model": f"{ctxkit_summary['preset']}, {minutes:g} minutes of ctxkit pretrain", "peer_name": hf_summary["name"],
                 "peer_value": _last_minute_acc(hf_summary["train"]), "device": device, "date": today(), "command": ctxkit_summary["command"],
                 "steps": extra["steps"], "peer_steps": extra["peer_steps"]}
    if invalid_eval:
        train_acc["note"] = f"ctxkit's held-out evaluations of this run are left out: {invalid_eval}"
    records.append(train_acc)
    if c_eval:
        quality = {"task": "BERT pretraining (MLM + NSP), held-out Wikipedia file", "split": "held-out", "metric": "MLM accuracy",
                   "value": round(c_eval[-1]["mlm_acc"], 4), "model": f"{ctxkit_summary['preset']}, {minutes:g} minutes of ctxkit pretrain",
                   "peer_name": hf_summary["name"], "peer_value": round(h_eval[-1]["eval_mlm_acc"], 4) if h_eval else None,
                   "device": device, "date": today(), "command": ctxkit_summary["command"],
                   "steps": extra["steps"], "peer_steps": extra["peer_steps"]}
        records.append(quality)
    write_records("pretrain_long.json", records, results)
    _figure(ctxkit_summary, hf_summary, figure)
    print(f"| side | tokens/s (after 1 min) | steps in {minutes:g} min | last logged MLM acc (train) | held-out MLM acc | evaluations |")
    print("|---|---|---|---|---|---|")
    for label, summary, rate, ev, key in (("ctxkit", ctxkit_summary, c_rate, c_eval, "mlm_acc"), ("HF Trainer", hf_summary, h_rate, h_eval, "eval_mlm_acc")):
        last_train = summary["train"][-1] if summary["train"] else {}
        print(f"| {label} | {rate:,.0f} | {last_train.get('step')} | {last_train.get('mlm_acc')} | "
              f"{ev[-1].get(key) if ev else None} | {len(ev)} |")
    print(f"ctxkit / HF: {c_rate / h_rate:.2f}x; ctxkit's last quarter / first quarter: {last / first:.3f}")
    return records


def _figure(ctxkit_summary: dict, hf_summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for (label, summary), color in zip((("ctxkit pretrain", ctxkit_summary), ("HF Trainer", hf_summary)), ("tab:blue", "tab:orange")):
        train = [r for r in summary["train"] if r.get("loss") is not None]
        minutes = [r["elapsed"] / 60 for r in train]
        axes[0].plot(minutes, [r["tokens_per_s"] / 1e3 for r in train], color=color, label=label)
        axes[1].plot(minutes, [r["loss"] for r in train], color=color, label=label)
        axes[2].plot(minutes, [r["mlm_acc"] for r in train], color=color, label=label + " (training batches)")
        key = "mlm_acc" if summary["side"] == "ctxkit" else "eval_mlm_acc"
        if summary["eval"]:
            axes[2].plot([r["elapsed"] / 60 for r in summary["eval"]], [r[key] for r in summary["eval"]], "o--", color=color,
                         alpha=0.7, label=label + " (held out)")
    for ax, title in zip(axes, ("thousand tokens/s", "training loss (MLM + NSP)", "MLM accuracy")):
        ax.set_title(title)
        ax.set_xlabel("minutes of training")
        ax.grid(alpha=0.3)
    axes[2].legend(fontsize=7)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    global LOG_EVERY
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--corpus", required=True)
    p.add_argument("--work", required=True)
    for side in ("ctxkit", "hf"):
        p = sub.add_parser(side)
        p.add_argument("--work", required=True)
        p.add_argument("--minutes", type=float, default=8.0)
        p.add_argument("--save-every", type=int, default=1000)
        p.add_argument("--summary", required=True, help="where the side's summary (JSON) goes")
        p.add_argument("--preset", default=PRESET, help="architecture (a small one for a CPU smoke run)")
        p.add_argument("--log-every", type=int, default=LOG_EVERY)
    p = sub.add_parser("report")
    p.add_argument("ctxkit_summary")
    p.add_argument("hf_summary")
    p.add_argument("--device", default=None, help="the card the summaries come from (default: this machine's)")
    p.add_argument("--figure", default=str(Path(__file__).resolve().parent.parent / "docs" / "pretrain_long.png"))
    p.add_argument("--results", default=None)
    p.add_argument("--invalid-eval", default=None, metavar="WHY",
                   help="leave ctxkit's held-out evaluations out (a bug found by the run), saying why")
    args = parser.parse_args(argv)
    if args.step == "prepare":
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        print(json.dumps(prepare(Path(args.corpus), work)))
    elif args.step in ("ctxkit", "hf"):
        LOG_EVERY = args.log_every
        if args.step == "ctxkit":
            summary = ctxkit_side(Path(args.work), args.minutes, args.save_every, args.preset)
        else:
            summary = hf_side(Path(args.work), args.minutes, args.save_every, args.preset, partial=Path(args.summary))
        summary.update(device=device_name(), date=today(), prepared=json.loads((Path(args.work) / "prepared.json").read_text()))
        Path(args.summary).write_text(json.dumps(summary))
        steady = _mean_rate(summary["train"]) if _steady(summary["train"]) else math.nan
        print(f"{args.step}: {len(summary['train'])} log records, {len(summary['eval'])} evaluations, {steady:,.0f} tokens/s after 1 min")
    else:
        c, h = (json.loads(Path(p).read_text()) for p in (args.ctxkit_summary, args.hf_summary))
        report(c, h, args.results, Path(args.figure), args.device or c.get("device") or device_name(), args.invalid_eval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
