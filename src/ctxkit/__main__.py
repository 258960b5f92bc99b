"""``python -m ctxkit`` and the ``ctxkit`` script: the command line (``ctxkit.cli.main``).

``ctxkit --help`` and ``ctxkit --version`` answer from here without importing the command
line's modules (and with them torch, ~2-5 s): the top-level help is the parser's own text,
kept in ``cli/help.txt`` (tests/test_startup.py checks it is what the parser prints)."""

import sys
from pathlib import Path

HELP = Path(__file__).parent / "cli" / "help.txt"


def run(argv=None) -> int:
    """The ``ctxkit`` entry point."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["--help"], ["-h"]) and HELP.is_file():
        sys.stdout.write(HELP.read_text(encoding="utf-8"))
        return 0
    if args == ["--version"]:
        from ctxkit.core.version import __version__  # lazy: startup

        print(f"ctxkit {__version__}")
        return 0
    from ctxkit.cli import main  # lazy: startup (the parser tree imports every verb's modules)

    return main(args)


if __name__ == "__main__":
    sys.exit(run())
