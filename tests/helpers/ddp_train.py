"""Run by tests/test_distributed.py under torchrun (2 gloo processes) and directly (1 process)."""

import json
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_trainer import _model, _toy_features  # noqa: E402

from ctxkit.training import TrainConfig, Trainer  # noqa: E402

out = Path(sys.argv[1])
grad_accum = int(sys.argv[2])
cfg = TrainConfig(epochs=2, batch_size=16, grad_accum=grad_accum, lr=1e-3, device="cpu", progress=False, log_every=1, seed=5)
trainer = Trainer(_model(0.0), _toy_features(64), cfg, out)
result = trainer.train()
if trainer.rank == 0:
    weights = {k: v.tolist() for k, v in trainer.model.state_dict().items() if k.endswith("classifier.weight")}
    (out / "result.json").write_text(json.dumps({"world": trainer.world, "weights": weights}))
