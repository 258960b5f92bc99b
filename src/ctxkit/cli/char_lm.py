"""``ctxkit char-corpus`` and ``ctxkit lm-train --char``: character-level language models
(Al-Rfou et al. 2018; :mod:`ctxkit.pretraining.char_lm`)."""

from __future__ import annotations

import argparse
import json
import logging

from ..core.errors import UserError
from ..data.errors import check_input
from ..zoo.presets import CHAR_PRESETS
from ..pretraining.char_corpus import build_char_corpus
from ..pretraining.char_lm import train_char_lm
from ..training.callbacks import make_callbacks
from .train_flags import signal_status, train_config_from_args

__all__ = ["add_char_corpus_command", "add_char_flags", "run_char_lm"]

DEFAULT_CHAR_PRESET = "char_t6_256"


def cmd_char_corpus(args: argparse.Namespace) -> int:
    """Handler of ``char-corpus``; prints the split sizes."""
    for path in args.corpus:
        check_input(path)
    meta = build_char_corpus(args.corpus, args.out, format=args.format, show_progress=not args.no_progress)
    print(json.dumps({"out": str(args.out), "format": args.format, **meta}, indent=2))
    return 0


def add_char_corpus_command(sub: argparse._SubParsersAction) -> None:
    """Register ``char-corpus``."""
    p = sub.add_parser("char-corpus", help="WikiExtractor files -> a text8-style (or byte) corpus split train/valid/test",
                       description="text8 rules (Mahoney's wikifil.pl): lowercase, digits spelled out, every other "
                                   "character a space. Documents are split by the CRC-32 of their title: 90/5/5.")
    p.add_argument("corpus", nargs="+", metavar="CORPUS", help="WikiExtractor text files (plain or .xz)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder: train.txt, valid.txt, test.txt, meta.json")
    p.add_argument("--format", choices=("text8", "bytes"), default="text8",
                   help="text8: 27 symbols (default); bytes: the UTF-8 text as is")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=cmd_char_corpus)


def add_char_flags(p: argparse.ArgumentParser) -> None:
    """The ``--char`` switch of ``lm-train`` and the options only it reads."""
    g = p.add_argument_group("character-level models (--char; Al-Rfou et al. 2018)")
    g.add_argument("--char", action="store_true",
                   help=f"train a character LM (presets: {', '.join(CHAR_PRESETS)}; default {DEFAULT_CHAR_PRESET}); "
                        "implied by a char_* preset")
    g.add_argument("--test", nargs="+", default=None, metavar="FILE", help="also report test bits per character")
    g.add_argument("--alphabet", choices=("text8", "bytes"), default="text8", help="27 text8 symbols (default) or bytes")
    g.add_argument("--context", type=int, default=None, help="segment length (default: the preset's)")
    g.add_argument("--attention", choices=("dense", "strided", "fixed"), default=None,
                   help="dense, or a Sparse Transformer pattern (default: the preset's)")
    g.add_argument("--quaternion", action="store_true", help="quaternion attention projections and FFN")
    g.add_argument("--no-aux-positions", action="store_true", help="ablation: score only each segment's last character")
    g.add_argument("--no-aux-layers", action="store_true", help="ablation: no intermediate-layer losses")
    g.add_argument("--no-second-target", action="store_true", help="ablation: no character-after-next loss")
    g.add_argument("--max-eval-chars", type=int, default=None, metavar="N", help="score only the first N valid/test characters")


def run_char_lm(args: argparse.Namespace) -> int:
    """``lm-train --char``: prints the JSON summary."""
    logging.getLogger("ctxkit").setLevel(logging.INFO)
    preset = args.preset if args.preset is not None else DEFAULT_CHAR_PRESET
    if preset not in CHAR_PRESETS:
        raise UserError(f"--char needs a character preset ({', '.join(CHAR_PRESETS)}), got {preset!r}")
    if args.tokenizer is not None:
        raise UserError("--tokenizer does not apply to --char (the alphabet is --alphabet)")
    overrides = {}
    if args.context is not None:
        overrides["context"] = args.context
    if args.attention is not None:
        overrides["attention"] = args.attention
    if args.quaternion:
        overrides["quaternion"] = True
    if args.no_second_target:
        overrides["second_target"] = False
    transformer_only = {k for k in overrides if k != "context"} | ({"aux_layers"} if args.no_aux_layers else set())
    if preset.startswith("char_lstm") and transformer_only:
        raise UserError(f"{', '.join(sorted(transformer_only))}: Transformer options, not for the LSTM preset {preset}")
    callbacks = make_callbacks(args.log_to, args.out, eval_name="valid")
    summary = train_char_lm(args.train, args.valid, preset, args.out, train_config_from_args(args), test_file=args.test,
                            alphabet=args.alphabet, aux_positions=not args.no_aux_positions, aux_layers=not args.no_aux_layers,
                            eval_stride=args.stride, max_eval_chars=args.max_eval_chars, callbacks=callbacks, **overrides)
    print(json.dumps(summary, indent=2))
    return signal_status(summary, args.out, args.on_sigterm, resumable=False)
