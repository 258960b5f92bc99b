"""Decoding: greedy, sampling and beam search with a KV cache, the graph-captured static
decoder, the CPU matrix-vector path and text streamers. Below the tasks (translation) and the
command line."""

from .generate import GenerationConfig, apply_repetition_penalty, filter_logits, generate, left_pad
from .streamers import TextIteratorStreamer, streamer_hook

__all__ = ["GenerationConfig", "TextIteratorStreamer", "apply_repetition_penalty", "filter_logits", "generate", "left_pad",
           "streamer_hook"]
