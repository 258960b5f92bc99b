"""Reference outputs of transformers' Transformer-XL (transformers 4.57, the last release
that ships it, under ``transformers.models.deprecated``), run in its own process with that
release first on ``sys.path``: ``python hf_transfo_xl.py OUT_DIR [div_val untie_r]``.

Writes an HF checkpoint of a randomly initialised ``TransfoXLLMHeadModel`` to ``OUT_DIR``
and ``OUT_DIR/reference.safetensors``: two consecutive segments' last hidden states and
log-probabilities (the second segment reads the first one's memory), computed in float32
(``hidden_0``, ``log_probs_0``, ...) and by a float64 copy of the model (``hidden64_0``, ...),
the reference that tests/README.md's tolerances are measured against.
"""

import copy
import inspect
import json

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

# transformers 4.57's Transformer-XL calls ``tensor.type_as(dtype=...)``, which torch never
# accepted; read it as the cast it means (the only change made to the reference).
_type_as = torch.Tensor.type_as


def _patched_type_as(self, other=None, dtype=None):
    return self.to(dtype) if other is None else _type_as(self, other)


torch.Tensor.type_as = _patched_type_as
_float = torch.Tensor.float


def _float_keeping_float64(self, *args, **kwargs):
    """The attention upcasts its scores with ``.float()`` before masking (meant for fp16); in
    the float64 run that would round them to float32, so keep float64 there (the float64
    run's only change)."""
    return self if self.dtype == torch.float64 else _float(self, *args, **kwargs)


from transformers.models.deprecated.transfo_xl import TransfoXLConfig, TransfoXLLMHeadModel, TransfoXLModel  # noqa: E402


def main(out: str, div_val: int = 2, untie_r: bool = True) -> None:
    torch.manual_seed(0)
    config = TransfoXLConfig(vocab_size=300, cutoffs=[60, 150], d_model=32, d_embed=32, n_head=4, d_head=8, d_inner=64, n_layer=3,
                             mem_len=5, tgt_len=7, div_val=div_val, untie_r=untie_r, clamp_len=0, dropout=0.0, dropatt=0.0)
    model = TransfoXLLMHeadModel(config).eval()
    with torch.no_grad():  # the init leaves the biases u, v at small values: make every term count
        for name, p in model.named_parameters():
            if name.endswith(("r_w_bias", "r_r_bias")) or "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(out, safe_serialization=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 300, (2, 14), generator=g)
    result = {"input_ids": ids}
    exact = copy.deepcopy(model).double()
    # The sinusoid frequencies are a float32 buffer (rounded at ~6e-8): give the float64 run
    # the exact ones, as the float64 run of ctxkit gets an exact position table.
    exact.transformer.pos_emb.inv_freq = 1 / (10000 ** (torch.arange(0.0, config.d_model, 2.0, dtype=torch.float64) / config.d_model))
    try:
        for suffix, run in (("", model), ("64", exact)):
            mems = None
            torch.Tensor.float = _float_keeping_float64 if suffix == "64" else _float
            with torch.no_grad():
                for s, segment in enumerate(ids.split(7, dim=1)):
                    body = run.transformer(segment, mems)  # by position: (input_ids, mems) in transformers' order
                    head = run(segment, mems)
                    result[f"hidden{suffix}_{s}"] = body.last_hidden_state.contiguous()
                    result[f"log_probs{suffix}_{s}"] = head.prediction_scores.contiguous()
                    mems = body.mems
    finally:
        torch.Tensor.float = _float  # the next model of this process is built and run as in a fresh one
    save_file(result, str(Path(out) / "reference.safetensors"))
    # The names transformers' forwards take by position, for the calling-convention test.
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    signatures = {cls.__name__: [p.name for p in inspect.signature(cls.forward).parameters.values() if p.kind in kinds][1:]
                  for cls in (TransfoXLModel, TransfoXLLMHeadModel)}
    (Path(out) / "signatures.json").write_text(json.dumps(signatures))


if __name__ == "__main__":
    if len(sys.argv) <= 4:
        main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
    else:  # OUT_DIR div_val untie_r, repeated
        args = sys.argv[1:]
        assert len(args) % 3 == 0, "several outputs: OUT_DIR div_val untie_r triples"
        for i in range(0, len(args), 3):
            main(args[i], int(args[i + 1]), int(args[i + 2]))
