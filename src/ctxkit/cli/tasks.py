"""``ctxkit finetune | evaluate | predict``: the task verbs of the command line.

Imports inside the handlers are on purpose: a verb loads its machinery (models, training,
tasks) only when it runs, so parsing the command line and every other verb stay light.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from pathlib import Path

from ..core.diskspace import write_output
from ..core.errors import UserError
from ..core.run_state import resolve_device
from ..training.callbacks import add_log_to_argument, make_callbacks
from ..training.progress import progress_bar
from .train_flags import (device_option, add_allow_changes_argument, add_fast_argument, add_on_sigterm_argument, add_train_flags,
                          fast_from_args, signal_status, train_config_from_args)
from ..data.lines import decode_lines, read_lines
from ..inference.backends import add_backend_arguments, plan_for_items, with_backend
from ..tasks import evaluate_run, finetune, get_task, load_run, load_task
from ..tasks.distill import distill

__all__ = ["add_commands"]

_TASK_HELP = "sst-2, cola, mrpc, sts-b, qqp, mnli, qnli, rte, wnli, table, conll2003, squad, squad2"


def _task_options(args: argparse.Namespace) -> dict:
    options = {}
    if args.max_length:
        options["max_seq_len" if args.task.startswith("squad") else "max_length"] = args.max_length
    if args.doc_stride:
        options["doc_stride"] = args.doc_stride
    if args.eval_articles is not None:
        if not args.task.lower().startswith("squad"):
            raise UserError("--eval-articles is for SQuAD-style tasks (the article split of one file)")
        options["eval_articles"] = args.eval_articles
    if args.labels:
        if args.task.lower() not in ("conll2003", "table"):
            raise UserError("--labels is for conll2003 and table tasks (the others have a fixed label set)")
        options["labels"] = [label.strip() for label in args.labels.split(",") if label.strip()]
    if args.allow_unknown_tags:
        if args.task.lower() != "conll2003":
            raise UserError("--allow-unknown-tags is for conll2003")
        options["unknown_tags"] = "score"
    return options


def _cmd_distill(args: argparse.Namespace) -> int:
    logging.getLogger("ctxkit").setLevel(logging.INFO)
    task, info = load_task(args.teacher)
    data = args.data or info.get("data")
    if data is None or not Path(data).exists():
        raise UserError(f"{args.teacher} was trained on {data}, which does not exist here; pass --data PATH")
    layers = None
    if args.layers:
        try:
            layers = [int(x) for x in args.layers.split(",")]
        except ValueError:
            raise UserError(f"--layers takes comma-separated layer numbers, got {args.layers!r}") from None
    callbacks = make_callbacks(args.log_to, args.out, eval_name=task.eval_splits[0])
    summary = distill(args.teacher, data, args.out, train_config_from_args(args), student_layers=args.student_layers,
                      layers=layers, student_init=args.student_init, temperature=args.temperature, alpha=args.alpha,
                      transfer_data=args.transfer_data,
                      eval_data=info.get("eval_data") if args.data is None else None, limit_train=args.limit_train,
                      limit_eval=args.limit_eval, resume=args.resume, callbacks=callbacks)
    print(json.dumps(summary, indent=2))
    return signal_status(summary, args.out, args.on_sigterm)


def _cmd_finetune(args: argparse.Namespace) -> int:
    logging.getLogger("ctxkit").setLevel(logging.INFO)
    task = get_task(args.task, **_task_options(args))
    # Built before any data is read: a missing --log-to extra costs no training time.
    callbacks = make_callbacks(args.log_to, args.out, eval_name=task.eval_splits[0])
    config = train_config_from_args(args)
    summary = finetune(task, args.model, args.data, args.out, config, resume=args.resume,
                       limit_train=args.limit_train, limit_eval=args.limit_eval, eval_data=args.eval_data, callbacks=callbacks,
                       command=getattr(args, "command_line", None))
    print(json.dumps(summary, indent=2))
    if summary.get("stopped", {}).get("reason") == "signal":  # SIGTERM/SIGUSR1: the status schedulers expect
        return signal_status(summary, args.out, args.on_sigterm)
    if "stopped" in summary:  # a stop that was asked for is a success
        print(f"ctxkit: stopped by --{summary['stopped']['reason'].replace('_', '-')} at step {summary['stopped']['step']}; "
              f"{args.out}/best holds the best model so far; add --resume to continue", file=sys.stderr)
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    kw = {} if args.limit_eval is None else {"limit_eval": args.limit_eval}
    if args.allow_unknown_tags:
        kw["unknown_tags"] = "score"
    results = evaluate_run(args.run_dir, args.data, args.split, args.batch_size, args.device, progress=args.progress,
                           fast=fast_from_args(args), **kw)
    print(json.dumps(results, indent=2))
    return 0


def _input_lines(source: str):
    """``(line number, text)`` of the non-empty lines of a file or stdin (``-``)."""

    lines = decode_lines(sys.stdin.buffer, "<stdin>") if source == "-" else read_lines(source)
    return [(i + 1, line) for i, line in enumerate(lines) if line.strip()]


def _cmd_predict(args: argparse.Namespace) -> int:
    # The input is checked against the task's format before any weights are loaded.
    task, _ = load_task(args.run_dir)
    source = "<stdin>" if args.input == "-" else args.input
    numbered = _input_lines(args.input)
    if not numbered:
        raise UserError(f"{source}: no input lines to predict")
    lines = task.clean_input(numbered, source, args.extra_columns)
    task, model, tokenizer, info = load_run(args.run_dir, args.device, fast=args.fast)
    # A file too short to repay compiling the GPU encoder is predicted without (auto only).
    info["fast"], note = plan_for_items(info.get("fast"), len(lines), args.fast, resolve_device(args.device))
    if note:
        print(f"ctxkit: {note}", file=sys.stderr)
    # auto decides once per run folder; the gpu backend runs the plan (the run's own unless --fast)
    # auto keeps its timed choice in a run folder; a transformers checkpoint (maybe in the Hub cache) is not written to
    keep = None if info.get("hf_task") else args.run_dir
    model, description = with_backend(model, args.backend, args.precision, run_dir=keep, plan=info.get("fast"))
    if "fast plan" not in description and info.get("fast_plan"):  # the backends that run the loaded model as it is
        description += f"; fast plan: {info['fast_plan']}"
    print(f"backend: {description}", file=sys.stderr)
    # The first batch apart: it compiles and captures (GPU backend), the rest runs at the
    # speed that stays; both are reported (tokenizing included, loading the model not).
    head, tail = lines[:args.batch_size], lines[args.batch_size:]
    start = time.perf_counter()
    rows = task.predict_lines(model, tokenizer, head, args.batch_size, args.device)
    first = time.perf_counter() - start
    with progress_bar("predict", len(tail), unit="line") if tail else contextlib.nullcontext():
        rows += task.predict_lines(model, tokenizer, tail, args.batch_size, args.device) if tail else []
    rest = time.perf_counter() - start - first
    # All lines or none in a file stdout is redirected to: a full disk is found before or while writing.
    write_output("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    rate = f"; the other {len(tail)} at {len(tail) / max(rest, 1e-9):,.0f} lines/s" if tail else ""
    print(f"ctxkit: predicted {len(rows)} lines in {first + rest:.2f} s: the first {len(head)} in {first:.2f} s{rate}",
          file=sys.stderr)
    return 0


PREDICT_FORMATS = """\
input, one example per line (empty lines are skipped; output line i answers the i-th non-empty line):
  single-sentence tasks (sst-2, cola, a table without text_pair):
          one text; a line with a tab has extra columns (e.g. a label): an error
          naming the line, or dropped with a warning under --extra-columns drop
  pair tasks (mrpc, sts-b, qqp, mnli, qnli, rte, wnli, a table with text_pair):
          'text<TAB>pair', exactly two columns
  conll2003: one sentence of raw text; entities come back with character spans
  squad, squad2: JSON {"question": ..., "context": ...} or 'question<TAB>context'
"""


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register finetune, evaluate and predict on the ``ctxkit`` parser."""
    p = sub.add_parser("finetune", help="fine-tune a checkpoint on a task; writes a run folder",
                       description="Fine-tune a checkpoint on a task, evaluate each epoch, keep the best epoch.")
    p.add_argument("task", metavar="TASK", help=_TASK_HELP)
    p.add_argument("--model", default="all_minilm_l6_v2", help="checkpoint name or HF folder (default: all_minilm_l6_v2)")
    p.add_argument("--data", required=True, help="task data folder (GLUE task folder, CoNLL folder, SQuAD file or folder, or your train/dev files)")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run folder (log.jsonl, curve.png, best/, results.json)")
    add_train_flags(p, "finetune")  # epochs, lr, batch sizes, ... (cli/train_flags.py)
    p.add_argument("--max-length", dest="max_length", type=int, help="tokens per example / QA window")
    p.add_argument("--doc-stride", dest="doc_stride", type=int, help="QA: step between windows in context tokens (default: 128)")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoint exactly")
    add_allow_changes_argument(p)
    add_on_sigterm_argument(p)
    p.add_argument("--limit-train", type=int, help="use only the first N training examples")
    p.add_argument("--limit-eval", type=int, help="use only the first N evaluation examples (recorded; evaluate applies it too)")
    p.add_argument("--eval-data", dest="eval_data", default=None, metavar="PATH",
                   help="evaluation data elsewhere (a folder with the dev file; for squad a separate file, all of whose "
                        "questions evaluate while every question of --data trains)")
    p.add_argument("--eval-articles", dest="eval_articles", type=int, default=None, metavar="N",
                   help="squad: the last N articles of --data evaluate, the rest train (default: the data protocol's "
                        "first 38 articles train)")
    p.add_argument("--labels", default=None, metavar="L1,L2,...",
                   help="conll2003 / table: the label set (default: taken from the training file); a training tag "
                        "outside it is an error")
    p.add_argument("--allow-unknown-tags", dest="allow_unknown_tags", action="store_true",
                   help="conll2003: score evaluation tags outside the label set as missed entities instead of refusing them")
    add_log_to_argument(p)
    p.set_defaults(func=_cmd_finetune)

    p = sub.add_parser("distill", help="distil a fine-tuned run into a smaller student run (DistilBERT's recipe)",
                       description="Task-specific distillation: the teacher run's logits (computed once, cached in "
                                   "RUN_DIR/teacher_logits.safetensors) train a student that keeps every other teacher "
                                   "layer, on alpha * T^2 KL(teacher || student) + (1 - alpha) * the task loss. "
                                   "--alpha 0 trains the same student without distillation (the baseline).")
    p.add_argument("teacher", metavar="TEACHER_RUN", help="a ctxkit finetune run folder")
    p.add_argument("--data", default=None, help="task data (default: the data the teacher was trained on)")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="the student's run folder")
    p.add_argument("--student-layers", dest="student_layers", type=int, default=3,
                   help="teacher layers the student keeps, evenly spaced from the first (default: 3)")
    p.add_argument("--layers", default=None, metavar="I,J,...", help="exactly these teacher layers (0-based) instead")
    p.add_argument("--student-init", dest="student_init", default=None, metavar="CHECKPOINT",
                   help="start the student from this checkpoint instead of the teacher's layers (same vocabulary)")
    p.add_argument("--temperature", type=float, default=2.0, help="softmax temperature T of the soft targets (default: 2)")
    p.add_argument("--alpha", type=float, default=0.5, help="weight of the soft loss; 0 = no distillation (default: 0.5)")
    p.add_argument("--transfer-data", dest="transfer_data", default=None, metavar="FILE",
                   help="classification: unlabelled texts (one per line, text<TAB>pair for pairs) the teacher labels for the student")
    add_train_flags(p, "distill")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoint exactly")
    add_allow_changes_argument(p)
    add_on_sigterm_argument(p)
    p.add_argument("--limit-train", type=int, help="use only the first N training examples")
    p.add_argument("--limit-eval", type=int, help="use only the first N evaluation examples")
    add_log_to_argument(p)
    p.set_defaults(func=_cmd_distill)

    p = sub.add_parser("evaluate", help="score a fine-tuned run on its evaluation splits",
                       description="Load RUN_DIR/best and report the task's metrics.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--data", default=None, help="data folder/file (default: the one used for training)")
    p.add_argument("--split", action="append", default=None, help="split to score, repeatable (default: the task's eval splits)")
    p.add_argument("--limit-eval", dest="limit_eval", type=int, default=None, metavar="N",
                   help="score the first N examples of each split (default: the run's own --limit-eval, so the number "
                        "matches results.json; 0 = all)")
    p.add_argument("--allow-unknown-tags", dest="allow_unknown_tags", action="store_true",
                   help="conll2003: score tags outside the model's label set as missed entities instead of refusing them")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--device", type=device_option, default="auto")
    p.add_argument("--no-progress", dest="progress", action="store_false", default=True, help="hide the progress bar")
    add_fast_argument(p, default=None)
    p.set_defaults(func=_cmd_evaluate)

    p = sub.add_parser("predict", help="predict with a fine-tuned run, one JSON line per input line",
                       description="Read inputs (a file or stdin) and print one JSON object per line: the label for "
                                   "classification, entities with character spans for NER, the answer with its score "
                                   "for QA. The input is checked against the task's format before the model is loaded.",
                       epilog=PREDICT_FORMATS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("input", nargs="?", default="-", metavar="FILE|-", help="UTF-8 input file, or - for stdin (default)")
    p.add_argument("--extra-columns", dest="extra_columns", choices=("error", "drop"), default="error",
                   help="a line with more tab-separated columns than the task reads: error (default) or drop them with a warning")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", type=device_option, default="auto")

    add_backend_arguments(p, "auto", "runtime")
    p.set_defaults(func=_cmd_predict)
