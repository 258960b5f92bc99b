"""The ``ctxkit`` command line: :func:`main` and the one parser tree. Each verb group has its
module: :mod:`.models` (demo, embed, list-models, download, train-tokenizer, tokenize),
:mod:`.tasks` (finetune, evaluate, predict), :mod:`.decoding` (generate, translate-train,
translate), :mod:`.deploy` (export, quantize, serve), :mod:`.pretraining` (pretrain-data,
pretrain-vocab, lm-corpus, pretrain, lm-train, perplexity, pretrain-elmo, pretrain-xlnet,
train-transformer-xl), :mod:`.static` (word2vec-train, neighbors, analogy, bag-classifier).

Errors a user can cause (:class:`ctxkit.core.errors.UserError`: a missing or undecodable
file, an unknown checkpoint, an invalid option; or an ``OSError`` naming a file) print
``ctxkit: error: <message>`` to stderr and exit with status 2. Anything else is a bug in
ctxkit: the traceback is printed, followed by a line saying so, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from typing import Optional, Sequence

from ..core.errors import UserError
from . import decoding, deploy, models, pretraining, static, tasks
from .models import _text_to_line


class _LineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = "warning: " if record.levelno >= logging.WARNING else ""
        return f"ctxkit: {level}" + _text_to_line(record.getMessage())


# What a user can cause: their input is wrong (UserError: a file that does not parse, an option
# that cannot work, an unknown name), or the machine refuses a file (OSError with a file name:
# missing, no permission, disk full). Everything else is a bug in ctxkit and shows its traceback.
BUG_REPORT = ("ctxkit: internal error: this is a bug in ctxkit, not a problem with your input; "
              "please report it with the traceback above")


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


def _is_user_error(exc: BaseException) -> bool:
    if isinstance(exc, UserError):
        return True
    # A file the machine refuses (missing, unreadable, disk full) is about the user's files, not our code.
    return isinstance(exc, OSError) and bool(exc.filename or exc.errno)


# ---------------------------------------------------------------- parser


class _VerbListFormatter(argparse.HelpFormatter):
    """Keeps each verb's help on the verb's own line.

    argparse measures sub-commands at the section indent but prints them 2 columns
    deeper, so the longest verb (train-tokenizer) would overflow into its help column.
    """

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=100)

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction):
            self._action_max_length += 2


def build_parser() -> argparse.ArgumentParser:
    """The one parser tree: every verb, registered by its group's ``add_commands``."""
    parser = argparse.ArgumentParser(
        prog="ctxkit", description="Contextual text representations: BERT features, demos and tokenizers.",
        formatter_class=_VerbListFormatter)
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    models.add_commands(sub)  # demo, embed, list-models, download, train-tokenizer, tokenize
    pretraining.add_elmo_xl_xlnet_commands(sub)  # pretrain-elmo, pretrain-xlnet, train-transformer-xl
    static.add_static_parsers(sub)  # word2vec-train, neighbors, analogy, bag-classifier
    tasks.add_commands(sub)
    decoding.add_commands(sub)  # generate, translate-train, translate
    deploy.add_export_commands(sub)
    deploy.add_serve_command(sub)
    pretraining.add_commands(sub)
    pretraining.add_pretrain_command(sub)
    pretraining.add_lm_commands(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the CLI.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        Exit status: 0 on success, 2 on a user error (argparse also exits with 2), 1 on a
        bug (traceback printed), 130 when interrupted.
    """
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    # Windowing/truncation warnings from embed() go to stderr, never silently dropped.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LineFormatter("ctxkit: warning: %(message)s"))
    log = logging.getLogger("ctxkit")
    log.addHandler(handler)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("ctxkit: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - sorted into user errors and bugs below
        if _is_user_error(exc):
            print(f"ctxkit: error: {_message(exc)}", file=sys.stderr)
            return 2
        traceback.print_exc(file=sys.stderr)
        print(BUG_REPORT, file=sys.stderr)
        return 1
    finally:
        log.removeHandler(handler)


if __name__ == "__main__":
    sys.exit(main())
