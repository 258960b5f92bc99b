"""Decoding verbs: ``generate`` (the lectures' GPT-2 sampling demo, one-shot or interactive,
printing tokens as they are produced), ``translate-train`` and ``translate``.

Imports inside the handlers are on purpose: a verb loads its machinery (models, training,
tasks) only when it runs, so parsing the command line and every other verb stay light.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Optional, Sequence

import torch

from ..core.errors import UserError
from ..training.callbacks import add_log_to_argument, make_callbacks
from .train_flags import (device_option, add_fast_argument, add_on_sigterm_argument, add_train_flags, fast_from_args, signal_status,
                          train_config_from_args)
from ..data.lines import decode_lines, read_lines
from ..decoding.generate import GenerationConfig, generate
from ..decoding.streamers import StopStringText
from ..fast import resolve
from ..zoo import checkpoint_folder
from ..tasks.translation import alignment, bleu, load_translator, read_parallel, train_translation, translate
from ..zoo.families import build_model, load_model
from ..zoo.presets import GPT2_PRESETS
from ..tokenizers import ByteLevelBPETokenizer
from ..training import resolve_device

logger = logging.getLogger("ctxkit")


class TextStreamer:
    """Print a continuation as its tokens arrive, and spot stop strings
    (:class:`~ctxkit.decoding.streamers.StopStringText` decides what is final)."""

    def __init__(self, tokenizer, stop_strings: Sequence[str] = (), out=None):
        self.pieces = StopStringText(tokenizer, stop_strings)
        self.out = out if out is not None else sys.stdout

    @property
    def text(self) -> str:
        return self.pieces.text

    def __call__(self, new: torch.Tensor) -> Optional[torch.Tensor]:
        piece = self.pieces.push(int(new[0]))
        if piece:
            self.out.write(piece)
            self.out.flush()
        return torch.ones(1, dtype=torch.bool) if self.pieces.stopped else None

    def finish(self) -> str:
        """Print what was held back; returns the whole continuation."""
        self.out.write(self.pieces.flush() + "\n")
        self.out.flush()
        return self.pieces.text


def cmd_generate(args: argparse.Namespace) -> int:
    """Handler of ``ctxkit generate``."""

    device = resolve_device(args.device)
    if args.random_init:
        model, tokenizer = _random_gpt2(args.model, args.seed)
        model = model.to(device).eval()
    else:
        if args.model in GPT2_PRESETS:
            raise UserError(f"{args.model} is a preset (an architecture, no weights): add --random-init to sample from "
                            "random weights, or name a checkpoint (gpt2, distilgpt2, a folder)")
        folder = checkpoint_folder(args.model)  # a folder, a run folder (its best/), a checkpoint name or a Hub id such as gpt2
        model, _ = load_model(folder, family="gpt2")
        model = model.to(device).eval()
        tokenizer = ByteLevelBPETokenizer.from_dir(folder)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=not args.greedy and args.num_beams == 1,
                              temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              repetition_penalty=args.repetition_penalty, num_beams=args.num_beams,
                              eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.eos_id)
    config.check()
    generator = torch.Generator(device=device).manual_seed(args.seed) if args.seed is not None else None
    plan = resolve(fast_from_args(args), use="decode", device=device)  # refused here, before any prompt, if it cannot run
    print(plan.describe(), file=sys.stderr)
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
            out = generate(model, input_ids, None, config, plan=plan)
            for token in out[0, len(ids):]:
                if streamer(token[None]) is not None:
                    break
        else:
            generate(model, input_ids, None, config, generator=generator, on_tokens=streamer, plan=plan)
        streamer.finish()
    return 0


def _random_gpt2(preset: str, seed: Optional[int]):
    """A GPT-2 preset with random weights (seeded) and a byte-level tokenizer of the 256 byte
    symbols and ``<|endoftext|>`` (the vocabulary the model gets): the architecture, explicitly
    without any training."""
    if preset not in GPT2_PRESETS:
        raise UserError(f"--random-init builds a GPT-2 preset; {preset!r} is none of {', '.join(sorted(GPT2_PRESETS))}")
    tokenizer = ByteLevelBPETokenizer.train(iter([""]), vocab_size=257, min_frequency=1, show_progress=False)
    # The preset's shape with the tokenizer's vocabulary: every id the model can pick decodes.
    config = GPT2_PRESETS[preset].replace(vocab_size=tokenizer.vocab_size)
    torch.manual_seed(0 if seed is None else seed)
    logger.warning("%s: random weights (--random-init): the text will be noise", preset)
    return build_model(config), tokenizer


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


def add_generate_command(sub: argparse._SubParsersAction) -> None:
    """Register ``generate`` on the ``ctxkit`` parser."""
    p = sub.add_parser("generate", help="continue text with a GPT-2 checkpoint, streaming tokens (interactive without --prompt)",
                       description="Sample (or greedy/beam-decode) a continuation. Without --prompt, every line read from "
                                   "stdin is a prompt (an interactive loop on a terminal).")
    p.add_argument("model", metavar="MODEL", help="a GPT-2: a Hub id or name (gpt2, distilgpt2, org/name), an HF-format folder "
                                                  "(config.json, weights, vocab.json, merges.txt) or an lm-train run folder")
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
    p.add_argument("--random-init", action="store_true",
                   help="MODEL is a GPT-2 preset (gpt2_2_128_2, gpt2_117m, ...): build it with random weights and a byte-level tokenizer")
    add_fast_argument(p, what="; compile: the first prompt waits for compilation, ~1 min on a CPU")
    p.add_argument("--device", type=device_option, default="auto")
    p.set_defaults(func=cmd_generate)


def _cmd_translate_train(args: argparse.Namespace) -> int:
    logging.getLogger("ctxkit").setLevel(logging.INFO)
    callbacks = make_callbacks(args.log_to, args.out, eval_name="valid")
    config = train_config_from_args(args)
    overrides = {"dropout": args.dropout} if args.dropout is not None else {}
    summary = train_translation((args.train_src, args.train_tgt), (args.valid_src, args.valid_tgt), args.out, config,
                                preset=args.preset, vocab_size=args.vocab_size, max_length=args.max_length,
                                label_smoothing=args.label_smoothing, eval_beams=args.eval_beams, callbacks=callbacks,
                                quaternion=args.quaternion, **overrides)
    print(json.dumps({k: v for k, v in summary.items() if k != "history"}, indent=2))
    return signal_status(summary, args.out, args.on_sigterm, resumable=False)


def _cmd_translate(args: argparse.Namespace) -> int:
    model, tok = load_translator(args.run_dir)
    if args.ref:
        if args.input == "-":
            raise UserError("--ref needs the source as a file, to check the two are line-aligned")
        pairs = read_parallel(args.input, args.ref)
        sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    else:
        sources = list(decode_lines(sys.stdin.buffer, "<stdin>") if args.input == "-" else read_lines(args.input))
    if not sources:
        raise UserError("no input lines to translate")
    hyps = translate(model, tok, sources, num_beams=args.beams, batch_size=args.batch_size, device=args.device)
    sys.stdout.write("".join(h + "\n" for h in hyps))
    if args.ref:
        print(json.dumps({"bleu": round(bleu(hyps, refs), 2), "sentences": len(hyps), "beams": args.beams}), file=sys.stderr)
    if args.heatmap:
        from ..core.plots import plot_alignment  # lazy: matplotlib (the plots extra) only when drawing

        weights, src_tokens, tgt_tokens = alignment(model, tok, sources[0], hyps[0], device=args.device)
        plot_alignment(weights, src_tokens, tgt_tokens, args.heatmap, title=f"{sources[0][:60]} -> {hyps[0][:60]}")
        print(f"wrote the encoder-decoder attention of the first sentence to {args.heatmap}", file=sys.stderr)
    return 0


def add_translation_commands(sub: argparse._SubParsersAction) -> None:
    """Register translate-train and translate."""
    p = sub.add_parser("translate-train", help="train a Transformer translator on parallel text (BLEU per epoch)",
                       description="Joint byte-level BPE, Transformer encoder-decoder, label smoothing, validation sacreBLEU.")
    p.add_argument("--train-src", required=True)
    p.add_argument("--train-tgt", required=True)
    p.add_argument("--valid-src", required=True)
    p.add_argument("--valid-tgt", required=True)
    p.add_argument("--out", required=True, metavar="RUN_DIR")
    p.add_argument("--preset", default="transformer_3_256_8")
    p.add_argument("--vocab-size", type=int, default=8000, help="joint BPE vocabulary (default: 8000)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=None, help="override the preset's dropout")
    p.add_argument("--eval-beams", type=int, default=1, help="beams for the per-epoch validation BLEU (default: greedy)")
    p.add_argument("--quaternion", action="store_true",
                   help="quaternion attention and FFN projections (Tay et al. 2019: 1/4 of their weights); embeddings stay real")
    add_train_flags(p, "translate-train")  # epochs, lr, schedule, ... (cli/train_flags.py)
    add_on_sigterm_argument(p)
    add_log_to_argument(p)
    p.set_defaults(func=_cmd_translate_train)

    p = sub.add_parser("translate", help="translate one sentence per line with a translate-train run",
                       description="Print one translation per input line; with --ref also print sacreBLEU to stderr.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("input", nargs="?", default="-", metavar="FILE|-")
    p.add_argument("--ref", default=None, metavar="FILE", help="reference translations, line-aligned: report BLEU")
    p.add_argument("--beams", type=int, default=4, help="beam size (1 = greedy; default 4)")
    p.add_argument("--heatmap", default=None, metavar="PNG", help="draw the first sentence's encoder-decoder attention")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", type=device_option, default="auto")
    p.set_defaults(func=_cmd_translate)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register generate, translate-train and translate."""
    add_generate_command(sub)
    add_translation_commands(sub)
