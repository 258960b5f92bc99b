"""Reference outputs of transformers' Transformer-XL (transformers 4.57, the last release
that ships it, under ``transformers.models.deprecated``), run in its own process with that
release first on ``sys.path``: ``python hf_transfo_xl.py OUT_DIR [div_val untie_r]``.

Writes an HF checkpoint of a randomly initialised ``TransfoXLLMHeadModel`` to ``OUT_DIR``
and ``OUT_DIR/reference.safetensors``: two consecutive segments' last hidden states and
log-probabilities (the second segment reads the first one's memory).
"""

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

from transformers.models.deprecated.transfo_xl import TransfoXLConfig, TransfoXLLMHeadModel  # noqa: E402


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
    mems = None
    with torch.no_grad():
        for s, segment in enumerate(ids.split(7, dim=1)):
            body = model.transformer(segment, mems=mems)
            head = model(segment, mems=mems)
            result[f"hidden_{s}"] = body.last_hidden_state.contiguous()
            result[f"log_probs_{s}"] = head.prediction_scores.contiguous()
            mems = body.mems
    save_file(result, str(Path(out) / "reference.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
