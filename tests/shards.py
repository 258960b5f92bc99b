"""Test helper (not collected): pretraining shards of the real Wikipedia extract."""

from __future__ import annotations

from pathlib import Path


def wiki_shards_of(docs: int, shared_data: Path, minilm_dir: Path, tmp_path_factory) -> Path:
    """Pretraining shards (seq 64, MiniLM's vocabulary) of the first ``docs`` documents of the
    real Wikipedia extract."""
    from ctxkit.pretraining import build_shards

    out = tmp_path_factory.mktemp(f"shards{docs}")
    build_shards([shared_data / "wikipedia-en-extract" / "AA" / "wiki_00.xz"], minilm_dir, out, max_seq_len=64,
                 limit_docs=docs, workers=1, show_progress=False)
    return out
