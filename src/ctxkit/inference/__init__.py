"""Inference: decoding (greedy, sampling, beam search with a KV cache)."""

from .generate import GenerationConfig, apply_repetition_penalty, filter_logits, generate, left_pad

__all__ = ["GenerationConfig", "apply_repetition_penalty", "filter_logits", "generate", "left_pad"]
