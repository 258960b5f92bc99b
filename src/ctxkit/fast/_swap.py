"""Class swaps: how :mod:`ctxkit.fast` turns a built module into its fast variant.

Each fast variant is a subclass of the teaching class it speeds up (``FusedQKVAttention``
of ``MultiHeadAttention`` ...). Swapping sets the *instance's* class to it, as
:mod:`torch.nn.utils.parametrize` does: the module object, its parameters, buffers,
hooks and ``state_dict`` keys stay exactly what they were, so optimisers, checkpoints and
references held elsewhere keep working; only ``forward`` (and its helpers) change.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Tuple

from torch import nn

_CLASSES: Dict[Tuple[type, type], type] = {}


def plain_class(fast: type, cls: type) -> type:
    """The teaching class under ``cls``: the first class in its MRO that is not ``fast``'s."""
    return next(c for c in cls.__mro__ if not issubclass(c, fast))


def fast_class(fast: type, cls: type) -> type:
    """The class of a ``cls`` module in ``fast``'s form: ``fast`` itself for its own teaching
    class, ``cls`` when it has the form already, else (a further subclass, e.g.
    Transformer-XL's relative attention) a class ``(fast, cls)`` made once and registered
    in ``fast``'s module, so that it pickles by name."""
    if issubclass(cls, fast):
        return cls
    if cls is plain_class(fast, fast):
        return fast
    key = (fast, cls)
    if key not in _CLASSES:
        name = fast.__name__ + "_" + cls.__name__
        made = type(name, (fast, cls), {"__module__": fast.__module__, "__qualname__": name})
        setattr(sys.modules[fast.__module__], name, made)
        _CLASSES[key] = made
    return _CLASSES[key]


def swap(module: nn.Module, fast: type) -> bool:
    """Give ``module`` the class of its ``fast`` form; returns whether it changed."""
    new = fast_class(fast, type(module))
    if new is type(module):
        return False
    module.__class__ = new
    return True


def unswap(module: nn.Module, fast: type) -> bool:
    """Give ``module`` back its teaching class; returns whether it changed."""
    if not isinstance(module, fast):
        return False
    module.__class__ = plain_class(fast, type(module))
    return True


def set_swapped(module: nn.Module, fast: type, attr: str, value: Any) -> None:
    """Put ``module`` in ``fast``'s form with ``value`` as its setting ``attr``, or, for
    ``None``, back in its teaching class without that setting.

    Args:
        module: the module to set, in place.
        fast: the fast variant, whose class attribute ``attr`` is the off default.
        attr: the name of the setting the fast variant reads.
        value: the setting, or ``None`` for the plain layer.
    """
    if value is None:
        unswap(module, fast)
        # Drop the instance's copy too, so that the module is as it was before any swap
        # and a later swap starts from the class default.
        module.__dict__.pop(attr, None)
    else:
        swap(module, fast)
        setattr(module, attr, value)
