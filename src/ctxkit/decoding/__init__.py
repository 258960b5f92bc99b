"""Decoding: greedy, sampling and beam search with a KV cache, the graph-captured static
decoder and the CPU matrix-vector path. Below the tasks (translation) and the command line."""

from .generate import GenerationConfig, apply_repetition_penalty, filter_logits, generate, left_pad

__all__ = ["GenerationConfig", "apply_repetition_penalty", "filter_logits", "generate", "left_pad"]
