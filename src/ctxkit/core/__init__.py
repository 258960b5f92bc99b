"""Things every part of ctxkit shares and that depend on nothing else in it."""

from .errors import MissingDependencyError, MissingFileError, UnknownNameError, UserError

__all__ = ["UserError", "UnknownNameError", "MissingFileError", "MissingDependencyError"]
