"""Frozen features of a pretrained encoder: :mod:`.embed` (``ctxkit.embed``: word-aligned or
pooled vectors, layer choices, windowing) and :mod:`.probe` (a linear probe on them)."""
