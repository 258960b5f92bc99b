"""``python -m ctxkit``: the same command line as the ``ctxkit`` script."""

import sys

from ctxkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
