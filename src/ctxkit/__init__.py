"""ctxkit: contextual text representations in PyTorch.

Quick start::

    import ctxkit
    model, tokenizer = ctxkit.get_model("bert_6_384_12", checkpoint="all_minilm_l6_v2")
    words = ctxkit.embed(["He sat on the river bank."], model=(model, tokenizer))
"""

from .core.version import __version__
from .features.embed import embed as _embed
from .inference.pipelines import pipeline
from .zoo import AutoModel, AutoTokenizer, get_model, list_models


def embed(texts, model="all_minilm_l6_v2", **kwargs):
    """Contextual word (or sentence) vectors; see :func:`ctxkit.features.embed.embed`."""
    return _embed(texts, model=model, **kwargs)




__all__ = ["AutoModel", "AutoTokenizer", "embed", "get_model", "list_models", "pipeline", "__version__"]
