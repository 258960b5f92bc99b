"""The one error type for mistakes in what a user gave ctxkit.

A :class:`UserError` means "your input is wrong, here is why": a file that does not parse
(the message names ``file:line``), an option that cannot work, a model name that does not
exist. The command line prints its message on one line and exits with status 2.

Anything else that escapes a command is a bug in ctxkit: the command line prints the
traceback and says so, rather than dressing the bug up as bad input.

``UserError`` derives from ``ValueError`` so that code written against the Python API
(``except ValueError``) keeps working; the readers' :class:`~ctxkit.data.DataError` and
the checkpoint loaders' :class:`~ctxkit.core.checkpoint.CheckpointError` derive from it.
"""

from __future__ import annotations

__all__ = ["UserError", "UnknownNameError", "MissingFileError", "MissingDependencyError"]


class UserError(ValueError):
    """A problem with the user's input (a file, an option, a name), not a bug in ctxkit."""


class UnknownNameError(UserError, KeyError):
    """A name (model, preset, task, metric, word) that is not known; lists what is.

    Also a ``KeyError``, so lookups keep their usual contract.
    """

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named is missing, or lacks what it should hold.

    Also a ``FileNotFoundError``, so ``except OSError`` keeps catching it.
    """


class MissingDependencyError(UserError, ImportError):
    """An optional package this feature needs is not installed; the message says what to install."""
