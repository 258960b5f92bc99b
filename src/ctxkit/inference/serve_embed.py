"""``ctxkit serve``'s ``/embed``: a work budget per request, and the windows run one forward
pass at a time.

``/classify`` cuts a text to the model's length; ``/embed`` embeds all of it, window by
window (:func:`ctxkit.features.embed.embed`), so a request's cost follows its tokens, not its
texts: 64 texts of 10,000 CJK characters are 64 x 26 windows of 512 tokens, which once held
the model thread for over ten minutes (every other request waiting) and 4 GB of memory. So:

* :class:`EmbedPlanner` tokenizes a request off the model thread and counts its windows;
  past ``--max-windows`` the request is refused (413) before any forward pass, and the
  tokenizing stops at the first text that goes over.
* :func:`embed_step_fn` runs the accepted windows ``max_batch`` at a time, each pass a job
  of its own on the model thread (:class:`~ctxkit.inference.serve.MicroBatcher` with
  ``stepwise=True``), so other endpoints' batches run between them; each text's vector is
  pooled as its windows come out, and the memory of a large request is handed back to the
  system after it (:func:`release_memory`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from typing import Any, Callable, Generator, List, Optional, Sequence, Tuple

from ..core.errors import UserError
from ..features.embed import embed_steps
from ..features.windows import Plan, plan_text

__all__ = ["EmbedPlanner", "WorkBudgetExceeded", "embed_step_fn", "release_memory"]

#: windows of ``max_len`` tokens per /embed request, per text of --max-items (--max-windows' default)
WINDOWS_PER_ITEM = 2
STRIDE = 128  # embed()'s default overlap: the served vectors are the offline ones


class WorkBudgetExceeded(UserError):
    """A request needs more forward-pass windows than ``--max-windows`` allows (413)."""


def _private_tokenizer(tokenizer: Any) -> Any:
    """A copy of a WordPiece tokenizer for the planning thread: the shared one serialises
    its calls with a lock (truncation is a setting of its backend), and the model thread's
    batches should not wait for a long request's tokenizing. Others are shared as they are."""
    backend = getattr(tokenizer, "backend", None)
    if backend is None or not hasattr(backend, "to_str"):
        return tokenizer
    from tokenizers import Tokenizer  # the base install's tokenizer package

    try:
        return type(tokenizer)(Tokenizer.from_str(backend.to_str()), max_length=tokenizer.max_length)
    except (TypeError, ValueError, AttributeError):
        return tokenizer


class EmbedPlanner:
    """Tokenizes /embed requests and lays out their windows, within a budget.

    Args:
        tokenizer: the run's tokenizer (a private copy is made when it can be).
        max_len: tokens per window, [CLS] and [SEP] included (the encoder's ``max_position``).
        max_windows: most windows one request may need (``--max-windows``).
        stride: overlap between windows (embed()'s default).
    """

    def __init__(self, tokenizer: Any, max_len: int, max_windows: int, stride: int = STRIDE):
        self.tokenizer, self.max_len, self.max_windows, self.stride = _private_tokenizer(tokenizer), max_len, max_windows, stride

    def plan(self, texts: Sequence[str], fields: Sequence[str]) -> List[Plan]:
        """The windows of each text (``fields[i]`` names text ``i`` in messages).

        Raises:
            WorkBudgetExceeded: the texts need more than ``max_windows`` windows; counted text
                by text, so a request far over the budget costs the tokenizing of a few texts.
            UserError: a text the tokenizer refuses.
        """
        plans: List[Plan] = []
        windows = 0
        for i, text in enumerate(texts):
            try:
                plan = plan_text(i, text, self.tokenizer, self.max_len - 2, self.stride, "window")
            except UserError as err:
                raise UserError(f"{fields[i]}: {str(err).removeprefix(f'text {i}: ')}") from None
            windows += len(plan.windows)
            if windows > self.max_windows:
                upto = fields[0] if i == 0 else f"{fields[0]} to {fields[i]}"
                raise WorkBudgetExceeded(
                    f"/embed embeds long texts window by window, each window a forward pass of {self.max_len} tokens: "
                    f"{upto} alone need {windows} windows; the limit is {self.max_windows} windows per request "
                    "(--max-windows); send fewer or shorter texts, or raise --max-windows")
            plans.append(plan)
        return plans


def release_memory() -> None:
    """Hand freed memory back to the system: collect cycles, then ask glibc's malloc to
    return the free pages of its arenas (``malloc_trim``), which it otherwise keeps for
    ever after a large batch's activations. Nothing else on other C libraries."""
    gc.collect()
    if _libc_trim is not None:
        _libc_trim(0)


def _find_trim() -> Optional[Callable[[int], int]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim  # glibc only: musl has no such symbol (AttributeError)
    except (OSError, AttributeError):
        return None


_libc_trim = _find_trim()


def embed_step_fn(encoder: Any, tokenizer: Any, pooling: str, max_batch: int) -> Callable[[list], Generator]:
    """The stepwise batch function of the /embed batcher.

    Its items are ``(text, plan)`` pairs from :meth:`EmbedPlanner.plan`; ``fn(items)`` is a
    generator that runs ``max_batch`` windows per ``next()`` and returns one vector (a list of
    floats) per item: the vectors of offline :func:`~ctxkit.features.embed.embed` with the same
    pooling, computed the same way.
    """
    def run(items: List[Tuple[str, Plan]]) -> Generator[int, None, List[List[float]]]:
        texts, plans = [t for t, _ in items], [p for _, p in items]
        vectors = yield from embed_steps(texts, (encoder, tokenizer), pooling=pooling, batch_size=max_batch, plans=plans)
        windows = sum(vectors.num_windows)
        out = vectors.tolist()
        del vectors
        if windows > max_batch:  # more than one pass: its activations' pages go back to the system
            release_memory()
        return out

    return run
