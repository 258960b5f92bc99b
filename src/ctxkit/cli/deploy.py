"""Deployment verbs: export, quantize (ONNX, int8) and serve (the JSON HTTP API).

Imports inside the handlers are on purpose: a verb loads its machinery (models, training,
tasks) only when it runs, so parsing the command line and every other verb stay light.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


from ..core.errors import UserError
from .train_flags import device_option
from ..data.lines import decode_lines, read_lines
from ..inference import serve
from ..inference.pipelines import PIPELINE_TASKS, pipeline
from ..inference.token_groups import STRATEGIES as TOKEN_STRATEGIES
from ..inference.backends import add_backend_arguments
from ..inference.serve_limits import at_least_one, non_negative, port_number, positive_seconds
from ..core.deps import require_all
from ..inference.export import DEPLOY_NEEDS, export_onnx, folder_size_mb, quantize_onnx, quantize_run, verify_onnx
from ..tasks import load_run, push_run

serve_log = logging.getLogger("ctxkit.serve")

def cmd_export(args: argparse.Namespace) -> int:
    """Handler of ``ctxkit export``: ONNX file(s) of a fine-tuned run, checked against PyTorch."""

    require_all(DEPLOY_NEEDS, "ctxkit export")  # before the run loads
    _, model, _, info = load_run(args.run_dir, device="cpu")
    if "backend" in info:
        raise UserError(f"{args.run_dir} is already an exported run ({info['backend']['file']}); export the original run")
    path = export_onnx(model, args.onnx, opset=args.opset)
    diff = verify_onnx(model, path, atol=args.atol)
    result = {"onnx": str(path), "max_abs_diff_vs_pytorch": diff, "mb": round(folder_size_mb([path]), 2)}
    if args.int8:
        q = quantize_onnx(path, Path(path).with_suffix(".int8.onnx"))
        result.update(int8=str(q), int8_mb=round(folder_size_mb([q]), 2))
    print(json.dumps(result))
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    """Handler of ``ctxkit quantize``: an int8 run folder that predict/evaluate/serve load."""

    result = quantize_run(args.run_dir, args.out)
    print(f"int8 model: {result['int8_mb']} MB on disk vs {result['fp32_mb']} MB fp32 ({result['ratio']:.2f}x); "
          f"fp32 export matched PyTorch within {result['max_abs_diff_fp32_export']:.1e}", file=sys.stderr)
    print(json.dumps({"out": str(args.out), **result}))
    return 0


def add_export_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``export`` and ``quantize``."""
    p = sub.add_parser("export", help="export a fine-tuned run to ONNX (dynamic batch and length), checked against PyTorch",
                       description="Write RUN_DIR's model as ONNX; ONNX Runtime's outputs are compared with PyTorch's first.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--onnx", required=True, metavar="FILE", help="the .onnx file to write")
    p.add_argument("--int8", action="store_true", help="also write FILE.int8.onnx (dynamic int8 weights)")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--atol", type=float, default=1e-4, help="largest allowed |ONNX - PyTorch| (default 1e-4)")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("quantize", help="int8 copy of a fine-tuned run (ONNX Runtime), loadable by predict/evaluate/serve",
                       description="Export, check, and quantise RUN_DIR's model to int8 into a new run folder; prints sizes.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--out", required=True, metavar="DIR")
    p.set_defaults(func=cmd_quantize)


def _cmd_serve(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers and not serve_log.handlers:
        handler = logging.StreamHandler()  # stderr, one JSON object a line
        handler.setFormatter(logging.Formatter("%(message)s"))
        serve_log.addHandler(handler)
    serve_log.setLevel(logging.INFO)
    serve_log.propagate = False  # the CLI's "ctxkit: " line prefix would break the JSON lines
    serve.serve(**{k: v for k, v in vars(args).items() if k not in ("verb", "func", "command_line")})  # option dests match serve()
    return 0


def add_serve_command(sub: argparse._SubParsersAction) -> None:
    """Register ``serve`` on the ``ctxkit`` parser."""
    p = sub.add_parser("serve", help="serve a fine-tuned run (or a GPT-2 for text generation) as a JSON HTTP API",
                       description="JSON HTTP API for a fine-tuned run: POST /classify, /ner or /qa (by the run's task), "
                                   "POST /embed, GET /health. Concurrent requests are merged into batches. A GPT-2 (an "
                                   "lm-train run, a folder, gpt2) serves POST /generate and OpenAI's POST /v1/completions "
                                   "(streamed as server-sent events) with continuous batching over --max-batch slots. "
                                   "SIGINT/SIGTERM stop accepting, answer in-flight requests, then exit. See docs/serving.md.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run folder written by ctxkit finetune, or a GPT-2 (run, folder, name)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=port_number, default=8000, help="TCP port (default: 8000)")
    p.add_argument("--device", type=device_option, default="auto", help="auto, cpu, cuda, cuda:1 ... (default: auto)")
    p.add_argument("--max-batch", type=at_least_one, default=32, help="most texts per forward pass (default: 32)")
    p.add_argument("--max-wait-ms", type=non_negative, default=5.0, help="how long a request waits for others to batch with (default: 5)")
    p.add_argument("--max-queue", type=at_least_one, default=None,
                   help="most texts waiting per endpoint; more get 429 with Retry-After (default: 4 x --max-batch)")
    p.add_argument("--threads", type=at_least_one, default=None,
                   help="torch/ONNX Runtime threads of the model (default: $OMP_NUM_THREADS if set, else the available "
                        "cores minus one, left to the HTTP server; logged at startup and shown in /health)")
    p.add_argument("--max-items", type=at_least_one, default=64, help="most texts per request (default: 64)")
    p.add_argument("--max-text-chars", type=at_least_one, default=10_000, help="longest text/question/context (default: 10000)")
    p.add_argument("--max-body-bytes", type=at_least_one, default=None, help="largest request body (default: fits max-items texts)")
    p.add_argument("--max-windows", type=at_least_one, default=None,
                   help="most windows of the encoder's length one /embed request may need (long texts are embedded "
                        "window by window, a forward pass each); more get 413 before any compute (default: 2 x --max-items)")
    p.add_argument("--pooling", choices=("mean", "cls"), default="mean", help="/embed vectors (default: mean)")
    p.add_argument("--prefill-chunk", type=at_least_one, default=None, metavar="TOKENS",
                   help="generation server: prompt tokens prefilled per decoding step while other requests decode, so a "
                        "long prompt does not stall them (default: 256)")
    add_backend_arguments(p, None, "runtime of the task endpoint (named in /health and the startup log; default: gpu for a "
                                   "BERT-family run on a CUDA device, pytorch otherwise)")
    p.add_argument("--graceful-timeout", type=float, default=30.0, help="seconds to finish in-flight requests on shutdown (default: 30)")
    g = p.add_argument_group("connections", "what keeps idle and slow clients from starving the others (shown in /health)")
    g.add_argument("--header-timeout", type=positive_seconds, default=10.0,
                   help="seconds for a request's line and headers, from the connection's opening or the request's first "
                        "byte; then 408, or a silent close if nothing came (default: 10)")
    g.add_argument("--body-timeout", type=positive_seconds, default=30.0,
                   help="seconds for a request's whole body after its headers; then 408 (default: 30)")
    g.add_argument("--keep-alive-timeout", type=positive_seconds, default=5.0,
                   help="seconds an idle connection stays open between requests (default: 5)")
    g.add_argument("--max-header-bytes", type=at_least_one, default=32768,
                   help="largest request line plus headers; more gets 431 (default: 32768)")
    g.add_argument("--max-connections", type=at_least_one, default=None,
                   help="most open connections; past it a new one replaces the longest-idle connection, or gets 503 "
                        "at once if all are busy (default: the open-file limit minus the larger of 48 and an eighth of it, "
                        "at most 4096)")
    p.add_argument("--expose-paths", action="store_true",
                   help="show the run's and model's paths in /health and keep this host's paths in error messages "
                        "(local debugging; by default clients see names only)")
    p.set_defaults(func=_cmd_serve)


def _cmd_pipeline(args: argparse.Namespace) -> int:

    source = "<stdin>" if args.input == "-" else args.input
    lines = decode_lines(sys.stdin.buffer, "<stdin>") if args.input == "-" else read_lines(args.input)
    items = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if args.task in ("question-answering",):
            try:
                record = json.loads(line)
                items.append({"question": record["question"], "context": record["context"]})
            except (json.JSONDecodeError, KeyError, TypeError):
                question, sep, context = line.partition("\t")
                if not sep:
                    raise UserError(f"{source}:{number}: expected JSON {{\"question\", \"context\"}} or 'question<TAB>context'") from None
                items.append({"question": question, "context": context})
        elif args.task in ("text-classification", "sentiment-analysis") and "\t" in line:
            text, _, pair = line.partition("\t")
            items.append({"text": text, "text_pair": pair})
        else:
            items.append(line)
    if not items:
        raise UserError(f"{source}: no input lines")
    options = {k: v for k, v in (("top_k", args.top_k), ("aggregation_strategy", args.aggregation_strategy),
                                 ("max_new_tokens", args.max_new_tokens), ("num_beams", args.num_beams)) if v is not None}
    pipe = pipeline(args.task, args.model, device=args.device, fast=args.fast, batch_size=args.batch_size)
    for result in pipe(items, **options):
        sys.stdout.write(json.dumps(result, ensure_ascii=False) + "\n")
    return 0


def add_pipeline_command(sub: argparse._SubParsersAction) -> None:
    """Register ``pipeline`` on the ``ctxkit`` parser."""

    names = sorted({n for name, aliases in PIPELINE_TASKS.items() for n in (name, *aliases)})
    p = sub.add_parser("pipeline", help="transformers-style pipeline over input lines, one JSON line each",
                       description="Run ctxkit.pipeline(TASK, model=MODEL) over the lines of a file or stdin and "
                                   "print one JSON answer per non-empty line (transformers' output keys). "
                                   "question-answering lines: 'question<TAB>context' or JSON {question, context}; "
                                   "text-classification: 'text' or 'text<TAB>pair'.")
    p.add_argument("task", metavar="TASK", choices=names, help=f"one of: {', '.join(names)}")
    p.add_argument("model", metavar="MODEL", help="a run folder, a transformers task checkpoint (folder or Hub id), a zoo name; "
                                                  "translation: a translate-train run or model folder")
    p.add_argument("input", nargs="?", default="-", help="input file (default: stdin)")
    p.add_argument("--device", type=device_option, default="auto")
    p.add_argument("--fast", default="auto", help="the fast plan (default: auto)")
    p.add_argument("--batch-size", type=at_least_one, default=32)
    p.add_argument("--top-k", type=int, default=None, help="text-classification, fill-mask: how many answers")
    p.add_argument("--aggregation-strategy", choices=TOKEN_STRATEGIES, default=None, help="token-classification")
    p.add_argument("--max-new-tokens", type=at_least_one, default=None, help="text-generation, translation")
    p.add_argument("--num-beams", type=at_least_one, default=None, help="translation: beam size (default 1: greedy)")
    p.set_defaults(func=_cmd_pipeline)


def _cmd_push(args: argparse.Namespace) -> int:
    url = push_run(args.run_dir, args.repo_id, private=True if args.private else None, commit_message=args.message)
    print(f"ctxkit: pushed {args.run_dir} to {args.repo_id}: {url}", file=sys.stderr)
    return 0


def add_push_command(sub: argparse._SubParsersAction) -> None:
    """Register ``push`` on the ``ctxkit`` parser."""
    p = sub.add_parser("push", help="upload a fine-tuned run to the Hugging Face Hub (ORG/NAME then works in every verb)",
                       description="Upload a fine-tuned run (best/'s files, task.json, results.json and the model card) "
                                   "to a Hub model repository in one commit, creating it if needed; predict, evaluate and "
                                   "serve then take ORG/NAME. Uses your Hugging Face token (hf auth login, or HF_TOKEN).")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("repo_id", metavar="ORG/NAME")
    p.add_argument("--private", action="store_true", help="create the repository private")
    p.add_argument("--message", default=None, help="the commit message")
    p.set_defaults(func=_cmd_push)
