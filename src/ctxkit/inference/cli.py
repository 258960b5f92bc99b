"""``ctxkit generate``: the lectures' GPT-2 sampling demo, one-shot or interactive,
printing tokens as they are produced."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import List, Optional, Sequence

import torch

from ..core.errors import UserError

logger = logging.getLogger("ctxkit")


class TextStreamer:
    """Print a continuation as its tokens arrive, and spot stop strings.

    Text is re-decoded from all tokens so far and only the new suffix is printed, held
    back while it ends in an incomplete UTF-8 character (U+FFFD) or could be the start of
    a stop string.
    """

    def __init__(self, tokenizer, stop_strings: Sequence[str] = (), out=None):
        self.tokenizer = tokenizer
        self.stop_strings = [s for s in stop_strings if s]
        self.out = out if out is not None else sys.stdout
        self.ids: List[int] = []
        self.printed = 0
        self.text = ""
        self.stopped = False

    def __call__(self, new: torch.Tensor) -> Optional[torch.Tensor]:
        if self.stopped:
            return torch.ones(1, dtype=torch.bool)
        self.ids.append(int(new[0]))
        text = self.tokenizer.decode(self.ids)
        cut = min((text.find(s) for s in self.stop_strings if s in text), default=-1)
        if cut >= 0:
            self.text, self.stopped = text[:cut], True
        else:
            self.text = text
            if text.endswith("\ufffd"):
                return None
        safe = len(self.text)
        if not self.stopped:  # keep back a tail that may grow into a stop string
            for s in self.stop_strings:
                for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(s[:k]):
                        safe = min(safe, len(self.text) - k)
                        break
        if safe > self.printed:
            self.out.write(self.text[self.printed:safe])
            self.out.flush()
            self.printed = safe
        return torch.ones(1, dtype=torch.bool) if self.stopped else None

    def finish(self) -> str:
        """Print what was held back; returns the whole continuation."""
        if len(self.text) > self.printed:
            self.out.write(self.text[self.printed:])
        self.out.write("\n")
        self.out.flush()
        return self.text


def cmd_generate(args: argparse.Namespace) -> int:
    """Handler of ``ctxkit generate``."""
    from ..models.gpt2 import load_gpt2
    from ..tokenizers import ByteLevelBPETokenizer
    from ..training import resolve_device
    from .generate import GenerationConfig, generate

    device = resolve_device(args.device)
    model = load_gpt2(args.model).to(device).eval()
    tokenizer = ByteLevelBPETokenizer.from_dir(args.model)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=not args.greedy and args.num_beams == 1,
                              temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              repetition_penalty=args.repetition_penalty, num_beams=args.num_beams,
                              eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.eos_id)
    config.check()
    generator = torch.Generator(device=device).manual_seed(args.seed) if args.seed is not None else None
    interactive = args.prompt is None
    prompts = _stdin_prompts() if interactive else [args.prompt]
    budget = model.config.max_position - args.max_new_tokens
    if budget < 1:
        raise UserError(f"--max-new-tokens {args.max_new_tokens} leaves no room for a prompt in a context of {model.config.max_position}")
    for prompt in prompts:
        ids = tokenizer.encode(prompt) or [tokenizer.eos_id]  # an empty prompt starts from <|endoftext|>
        if len(ids) > budget:
            logger.warning("prompt has %d tokens; keeping the last %d so %d new ones fit the context of %d",
                           len(ids), budget, args.max_new_tokens, model.config.max_position)
            ids = ids[-budget:]
        if not args.no_echo:
            sys.stdout.write(prompt)
        streamer = TextStreamer(tokenizer, args.stop or ())
        input_ids = torch.tensor([ids], device=device)
        if config.num_beams > 1:
            out = generate(model, input_ids, None, config)
            for token in out[0, len(ids):]:
                if streamer(token[None]) is not None:
                    break
        else:
            generate(model, input_ids, None, config, generator=generator, on_tokens=streamer, compile=args.compile)
        streamer.finish()
    return 0


def _stdin_prompts():
    tty = sys.stdin.isatty()
    while True:
        if tty:
            sys.stdout.write("prompt> ")
            sys.stdout.flush()
        line = sys.stdin.readline()
        if not line:
            return
        yield line.rstrip("\n")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``generate`` on the ``ctxkit`` parser."""
    p = sub.add_parser("generate", help="continue text with a GPT-2 checkpoint, streaming tokens (interactive without --prompt)",
                       description="Sample (or greedy/beam-decode) a continuation. Without --prompt, every line read from "
                                   "stdin is a prompt (an interactive loop on a terminal).")
    p.add_argument("model", metavar="MODEL_DIR", help="HF-format GPT-2 folder (config.json, weights, vocab.json, merges.txt)")
    p.add_argument("--prompt", default=None, help="one prompt; omit for the interactive loop")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=40, help="sample among the k most likely tokens (0: all; default 40)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (default 1.0: off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--greedy", action="store_true", help="argmax decoding instead of sampling")
    p.add_argument("--num-beams", type=int, default=1, help="beam search with N beams (deterministic)")
    p.add_argument("--stop", action="append", default=None, metavar="TEXT", help="stop when this text appears (repeatable)")
    p.add_argument("--seed", type=int, default=None, help="seed for reproducible samples")
    p.add_argument("--no-echo", action="store_true", help="print only the continuation, not the prompt")
    p.add_argument("--compile", action="store_true",
                   help="compile the decoding step (fastest; the first prompt waits for compilation: ~1 min on CPU)")
    p.add_argument("--device", default="auto")
    p.set_defaults(func=cmd_generate)


def cmd_export(args: argparse.Namespace) -> int:
    """Handler of ``ctxkit export``: ONNX file(s) of a fine-tuned run, checked against PyTorch."""
    from ..tasks import load_run
    from ..core.deps import require_all
    from .export import DEPLOY_NEEDS, export_onnx, folder_size_mb, quantize_onnx, verify_onnx

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
    from .export import quantize_run

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
