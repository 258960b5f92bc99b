"""``python -m ctxkit`` and the ``ctxkit`` script: the command line (``ctxkit.cli.main``).

``ctxkit --help``, ``ctxkit VERB --help`` and ``ctxkit --version`` answer from here without
importing the command line's modules (and with them torch, ~2-5 s): the help texts are the
parser's own, kept in ``cli/help.txt`` (top level) and ``cli/help.json`` (each verb;
tests/test_startup.py checks both are what the parser prints; ``ctxkit.cli.write_help``
regenerates them)."""

import json
import sys
from pathlib import Path

HELP = Path(__file__).parent / "cli" / "help.txt"
VERB_HELP = Path(__file__).parent / "cli" / "help.json"


def run(argv=None) -> int:
    """The ``ctxkit`` entry point."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["--help"], ["-h"]) and HELP.is_file():
        sys.stdout.write(HELP.read_text(encoding="utf-8"))
        return 0
    if len(args) >= 2 and args[-1] in ("--help", "-h") and not any(a.startswith("-") for a in args[:-1]) and VERB_HELP.is_file():
        text = json.loads(VERB_HELP.read_text(encoding="utf-8")).get(" ".join(args[:-1]))
        if text is not None:  # else (a positional argument before --help, a typo) argparse answers
            sys.stdout.write(text)
            return 0
    if args == ["--version"]:
        from ctxkit.core.version import __version__  # lazy: startup

        print(f"ctxkit {__version__}")
        return 0
    from ctxkit.cli import main  # lazy: startup (the parser tree imports every verb's modules)

    return main(args)


if __name__ == "__main__":
    sys.exit(run())
