"""Loaders build on the meta device without running initialisers (core/meta_build.py)."""

import subprocess
import sys
import threading
from pathlib import Path

import torch
from torch import nn
from torch.nn import init

from ctxkit.core.meta_build import meta_device

SRC = Path(__file__).resolve().parents[1] / "src"


def test_loading_a_checkpoint_and_eager_inference_never_import_the_compiler(minilm_dir):
    """``nn.init.normal_`` on a meta tensor went through torch._refs, whose wrapper imports
    torch._dynamo: 2.8 s of every predict/serve process's start, for nothing; and the fused
    q/k/v cache marked its matrices static for the compiler, which cost a server's first
    request the same 2.8 s (3.0 s -> 0.06 s for ctxkit serve's first /classify on a CPU)."""
    code = ("import sys, torch; from ctxkit.models.bert.model import load_bert; from ctxkit.models.bert.mlm import load_bert_masked_lm; "
            "from ctxkit.fast import fuse_qkv; "
            f"m = load_bert({str(minilm_dir)!r}); loaded = 'torch._dynamo' in sys.modules; fused = fuse_qkv(m); "
            "torch.inference_mode().__enter__(); m(torch.ones(1, 8, dtype=torch.long)); m(torch.ones(2, 5, dtype=torch.long)); "
            "print(sum(p.numel() for p in m.parameters()), all(not p.is_meta for p in m.parameters()), fused, loaded, "
            "'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["22713216", "True", "6", "False", "False"]  # 22.7M real weights, 6 layers fused, no compiler


def test_the_skeleton_is_the_one_torch_builds_and_real_tensors_are_still_initialised():
    with torch.device("meta"):
        plain = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 4), nn.LayerNorm(4))
    with meta_device():
        skeleton = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 4), nn.LayerNorm(4))
        real = torch.empty(3, 5, device="cpu")
        init.constant_(real, 2.0)  # not a meta tensor: initialised as always
        in_thread = []
        other = threading.Thread(target=lambda: in_thread.append(init.normal_(torch.zeros(1000), mean=5.0).mean().item()))
        other.start()
        other.join()
    assert [(k, v.shape, v.dtype, v.device.type) for k, v in skeleton.state_dict().items()] == \
           [(k, v.shape, v.dtype, v.device.type) for k, v in plain.state_dict().items()]
    assert torch.equal(real, torch.full((3, 5), 2.0))
    assert abs(in_thread[0] - 5.0) < 0.2  # mean of 1000 N(5, 1) draws: 6 standard errors
    # Nested uses restore torch's own initialisers when the outermost ends.
    with meta_device():
        with meta_device():
            pass
        assert hasattr(init.normal_, "__wrapped__")
    assert not hasattr(init.normal_, "__wrapped__") and init.normal_.__module__ == "torch.nn.init"
