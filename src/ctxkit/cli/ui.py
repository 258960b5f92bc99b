"""``ctxkit ui [MODEL]``: the demo page (:mod:`ctxkit.inference.ui`) in the browser.

MODEL is put where it fits (a GPT-2 generates, a question-answering or NER run answers,
anything else is the encoder); ``--encoder``, ``--generator``, ``--qa`` and ``--ner`` add
models for the other panels. A panel without a model says which option gives it one.
"""

from __future__ import annotations

import argparse
import sys

from ..core.deps import require_all
from ..inference.serve_limits import SERVE_NEEDS, at_least_one, port_number
from ..inference.ui import DEFAULT_ENCODER, PANELS, create_ui_app, load_ui_models, run_ui
from .train_flags import device_option

__all__ = ["add_ui_command"]


def _cmd_ui(args: argparse.Namespace) -> int:
    require_all(SERVE_NEEDS, "ctxkit ui")  # before any model loads
    models = load_ui_models(args.model, encoder=args.encoder, generator=args.generator, qa=args.qa, ner=args.ner,
                            device=args.device)
    app = create_ui_app(models, max_new_tokens=args.max_new_tokens)
    shown = "localhost" if args.host in ("127.0.0.1", "0.0.0.0", "::") else args.host
    panels = [panel for panel, role in PANELS.items() if getattr(models, role) is not None]
    print(f"ctxkit: the demo page is at http://{shown}:{args.port}/ ({', '.join(panels) or 'no panel has a model'}); "
          "Ctrl-C stops it", file=sys.stderr)
    run_ui(app, host=args.host, port=args.port)
    return 0


def add_ui_command(sub: argparse._SubParsersAction) -> None:
    """Register ``ui`` on the ``ctxkit`` parser."""
    p = sub.add_parser("ui", help="a demo page in the browser: senses in context, attention, fill-mask, QA, NER, streamed generation",
                       description="Serve one page that shows what the models do: contextual vs static similarities of a word "
                                   "('retail bank or river bank?'), attention maps per layer and head, fill-mask candidates "
                                   "(an encoder), a question-answering run's answer and an NER run's entities highlighted in "
                                   "the text, and a GPT-2's generation streamed token by token with its sampling controls. "
                                   "A panel without a model says which option adds one. See docs/ui.md.")
    p.add_argument("model", metavar="MODEL", nargs="?", default=None,
                   help="the model at hand, used where it fits: a GPT-2 (lm-train run, folder, gpt2) generates, a "
                        "question-answering or NER run (or transformers task checkpoint) answers, anything else is the "
                        f"encoder (with no model named at all: the encoder {DEFAULT_ENCODER})")
    p.add_argument("--encoder", metavar="NAME", default=None,
                   help="a BERT-family checkpoint, Hub id or folder: similarities, attention, and fill-mask when it has "
                        "its masked-LM head")
    p.add_argument("--generator", metavar="GPT2", default=None, help="a GPT-2 for the generation panel (lm-train run, folder, gpt2)")
    p.add_argument("--qa", metavar="RUN", default=None, help="a question-answering run (ctxkit finetune squad) or checkpoint")
    p.add_argument("--ner", metavar="RUN", default=None, help="an NER run (ctxkit finetune conll2003) or checkpoint")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=port_number, default=8080, help="TCP port (default: 8080)")
    p.add_argument("--device", type=device_option, default="auto", help="auto, cpu, cuda, cuda:1 ... (default: auto)")
    p.add_argument("--max-new-tokens", type=at_least_one, default=256, help="the most tokens one generation may ask for (default: 256)")
    p.set_defaults(func=_cmd_ui)
