"""Streaming a generation's text as its tokens arrive, with transformers' streamer protocol.

A streamer is any object with ``put(token_ids)`` and ``end()`` (transformers' ``TextStreamer``
and ``TextIteratorStreamer`` are such objects): ``put`` gets the prompt ``(1, prompt)`` first,
then each new token ``(1,)``, and ``end`` says the generation is over.
:func:`streamer_hook` turns one into :func:`~ctxkit.decoding.generate`'s ``on_tokens``;
:class:`TextIteratorStreamer` is ctxkit's own, an iterator of text pieces.
"""

from __future__ import annotations

import queue
import unicodedata
from typing import Callable, Iterator, List, Optional

from torch import Tensor

from ..core.errors import UserError

__all__ = ["StopStringText", "TextIteratorStreamer", "streamer_hook"]


def streamer_hook(streamer) -> Callable[[Tensor], None]:
    """``on_tokens`` for :func:`~ctxkit.decoding.generate` that hands each step's tokens
    ``(batch,)`` to ``streamer.put`` on the CPU (as transformers does), stopping no row."""

    def hook(new: Tensor) -> None:
        streamer.put(new.cpu())

    return hook


class TextIteratorStreamer:
    """Text pieces of one generation at a time, to iterate over while another thread
    generates (transformers' ``TextIteratorStreamer``, same arguments and protocol).

    The text is decoded from all tokens so far; a piece is the new end of it, held back while
    it may still change: a piece with symbols (an incomplete UTF-8 character decodes as
    U+FFFD) goes out only up to its last space. So the pieces always join into the decoded
    continuation, whatever the tokenizer glues or cleans up.

    Args:
        tokenizer: anything with ``decode(ids, ...)``.
        skip_prompt: drop the first ``put`` (the prompt), streaming the new text only.
        timeout: seconds the iterator waits for the next piece (None: forever).
        decode_kwargs: passed to ``tokenizer.decode``.
    """

    def __init__(self, tokenizer, skip_prompt: bool = False, timeout: Optional[float] = None, **decode_kwargs):
        self.tokenizer, self.skip_prompt, self.timeout, self.decode_kwargs = tokenizer, skip_prompt, timeout, decode_kwargs
        self.token_cache: List[int] = []
        self.print_len = 0
        self.next_tokens_are_prompt = True
        self.pieces: "queue.Queue[Optional[str]]" = queue.Queue()

    def put(self, value: Tensor) -> None:
        """Take token ids ``(1, n)`` or ``(n,)``; queue the text that became final.

        Raises:
            UserError: a batch of more than one row.
        """
        if value.dim() > 1 and value.size(0) > 1:
            raise UserError("a text streamer follows one sequence; generate one row at a time to stream")
        if self.skip_prompt and self.next_tokens_are_prompt:
            self.next_tokens_are_prompt = False
            return
        self.token_cache.extend(value.reshape(-1).tolist())
        text = self.tokenizer.decode(self.token_cache, **self.decode_kwargs)
        pending = text[self.print_len:]
        if not all(c.isspace() or unicodedata.category(c)[0] in "LMN" for c in pending):
            pending = text[self.print_len:text.rfind(" ") + 1]  # symbols may still change: up to the last space
        self.print_len += len(pending)
        if pending:
            self.pieces.put(pending)

    def end(self) -> None:
        """Queue the rest of the text and the end of the stream; ready for the next generation."""
        if self.token_cache:
            rest = self.tokenizer.decode(self.token_cache, **self.decode_kwargs)[self.print_len:]
            if rest:
                self.pieces.put(rest)
        self.token_cache, self.print_len, self.next_tokens_are_prompt = [], 0, True
        self.pieces.put(None)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        piece = self.pieces.get(timeout=self.timeout)
        if piece is None:
            raise StopIteration
        return piece


class StopStringText:
    """The text of one continuation as its tokens arrive, cut at the first stop string.

    New tokens are decoded with the few tokens before them as context (``decode(ids[prefix:])``
    minus ``decode(ids[prefix:read])``, as vLLM's incremental detokenizer does), so a token
    costs a decode of a handful of ids, not of the whole continuation (re-decoding everything
    made the generation server's per-token cost grow with the output: ~55 us a token at 256
    tokens). The context makes the join exact where decoding is not a plain concatenation
    (WordPiece ``##``, word-level spaces, sentencepiece's leading space); a tokenizer whose
    window does not extend its context's text falls back to decoding everything.

    :meth:`push` returns only the new part that is final: held back while the new tokens end
    in an incomplete UTF-8 character (U+FFFD) or the text ends in the start of a stop string,
    which the next tokens may complete. ``ctxkit generate`` prints these pieces; the
    generation server streams them.

    Args:
        tokenizer: anything with ``decode(ids)``.
        stop_strings: texts that end the continuation (not included in it).
    """

    def __init__(self, tokenizer, stop_strings=()):
        self.tokenizer = tokenizer
        self.stop_strings = [s for s in stop_strings if s]
        self.ids: List[int] = []
        self.text = ""  # the continuation so far (cut at a stop string once one appears)
        self.sent = 0  # characters of it handed out
        self.stopped = False
        self._prefix = 0  # ids[_prefix:_read]: the context the next tokens are decoded with
        self._read = 0  # ids[:_read] are in text

    def _advance(self, final: bool) -> int:
        """Append the text of ``ids[_read:]`` (not while it ends inside a character, unless
        ``final``); returns where in :attr:`text` the new part starts."""
        before = len(self.text)
        if self._read == len(self.ids):
            return before
        window = self.tokenizer.decode(self.ids[self._prefix:])
        if window.endswith("\ufffd") and not final:
            return before
        context = self.tokenizer.decode(self.ids[self._prefix:self._read]) if self._read > self._prefix else ""
        if window.startswith(context):
            self.text += window[len(context):]
        else:  # not prefix-consistent: the whole continuation decoded, as it would be at once
            self.text = self.tokenizer.decode(self.ids)
            before = min(before, len(self.text))
        if len(self.text) > before:  # tokens that gave no text (skipped specials) are no context
            self._prefix = self._read
        self._read = len(self.ids)
        return before

    def _cut(self, since: int) -> None:
        """End the text at the first stop string (searched from where a new one could start)."""
        start = max(0, since - max((len(s) for s in self.stop_strings), default=0))
        cut = min((i for i in (self.text.find(s, start) for s in self.stop_strings) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = self.text[:cut], True

    def push(self, token: int) -> str:
        """Add one token; returns the text that became final (maybe empty)."""
        if self.stopped:
            return ""
        self.ids.append(int(token))
        since = self._advance(final=False)
        if self._read < len(self.ids):  # the new tokens end inside a character: nothing final yet
            return ""
        self._cut(since)
        safe = len(self.text)
        if not self.stopped:  # keep back a tail that may grow into a stop string
            for s in self.stop_strings:
                for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(s[:k]):
                        safe = min(safe, len(self.text) - k)
                        break
        piece = self.text[self.sent:safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return piece

    def flush(self) -> str:
        """The text held back so far (the generation ended), incomplete characters included."""
        if not self.stopped:
            self._cut(self._advance(final=True))
        piece = self.text[self.sent:]
        self.sent = len(self.text)
        return piece
