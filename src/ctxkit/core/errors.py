"""The one error type for mistakes in what a user gave ctxkit.

A :class:`UserError` means "your input is wrong, here is why": a file that does not parse
(the message names ``file:line``), an option that cannot work, a model name that does not
exist. The command line prints its message on one line and exits with status 2.

Anything else that escapes a command is a bug in ctxkit: the command line prints the
traceback and says so, rather than dressing the bug up as bad input.

``UserError`` derives from ``ValueError`` so that code written against the Python API
(``except ValueError``) keeps working; the readers' :class:`~ctxkit.data.DataError` and
the checkpoint loaders' :class:`~ctxkit.core.checkpoint.CheckpointError` derive from it.

Messages stay short whatever the input: :func:`quote` echoes at most ~200 characters of a
user's text (a 20 MB line without newlines must not become a 20 MB error line), and
:func:`capped_list` / :func:`capped_join` show at most ~20 entries of a long list, then
"... and N more".
"""

from __future__ import annotations

from typing import Iterable, Optional

__all__ = ["UserError", "UnknownNameError", "MissingFileError", "MissingDependencyError", "QUOTE_LIMIT", "LIST_LIMIT",
           "quote", "clip", "capped_list", "capped_join"]

#: characters of a user's text that an error message echoes
QUOTE_LIMIT = 200
#: entries of a list that an error message shows before "... and N more"
LIST_LIMIT = 20


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


def quote(text: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(text)``, cut to about ``limit`` characters, for echoing input in an error.

    Of a string only a slice is rendered, so a 20 MB line costs no more than a short one.
    Other values (a number or list from a JSON file) are shown as their ``repr``, cut alike.

    Args:
        text: what the user gave (a line, a field, a label, a config value).
        limit: the most characters of the quoted form kept.

    Returns:
        ``'abc'``, or for longer text ``'abcd...' (20,000,000 characters)``.
    """
    if not isinstance(text, str):
        shown = repr(text)
        return shown if len(shown) <= limit else f"{shown[:limit]}... ({len(shown):,} characters)"
    # Escapes can make repr up to 10x longer than the text (\U0010ffff): render a slice only.
    shown = repr(text[:limit + 1])
    if len(text) <= limit and len(shown) <= limit + 2:  # + 2: the quotes
        return shown
    return f"{shown[:limit]}...{shown[0]} ({len(text):,} characters)"


def clip(text: object, limit: int = QUOTE_LIMIT) -> str:
    """``str(text)`` cut to ``limit`` characters (``...`` marks the cut); for messages of other
    libraries' exceptions, which may quote the input in full."""
    text = text if isinstance(text, str) else str(text)
    return text if len(text) <= limit else text[:limit] + "..."


def capped_list(items: Iterable[object], limit: int = LIST_LIMIT, indent: str = "  ", total: Optional[int] = None) -> str:
    """Entries as indented lines, each after a newline, at most ``limit`` of them and then
    ``... and N more``; ``""`` for no entries. Append it to a one-line message.

    Each entry is clipped to :data:`QUOTE_LIMIT` characters, so the list stays short too.

    Args:
        items: the entries.
        limit: the most entries shown.
        indent: put before each entry.
        total: how many entries there are in all, when ``items`` is already a selection of them.
    """
    items = list(items)
    lines = [f"\n{indent}{clip(item)}" for item in items[:limit]]
    more = (len(items) if total is None else total) - len(lines)
    if more > 0:
        lines.append(f"\n{indent}... and {more} more")
    return "".join(lines)


def capped_join(items: Iterable[object], limit: int = LIST_LIMIT, sep: str = ", ") -> str:
    """Entries joined on one line, at most ``limit`` of them and then ``... and N more``
    (for short names such as allowed labels; each entry clipped as in :func:`capped_list`)."""
    items = list(items)
    shown = [clip(item) for item in items[:limit]]
    if len(items) > limit:
        shown.append(f"... and {len(items) - limit} more")
    return sep.join(shown)
