"""ctxkit: contextual text representations in PyTorch.

Quick start::

    import ctxkit
    model, tokenizer = ctxkit.get_model("bert_6_384_12", checkpoint="all_minilm_l6_v2")
    words = ctxkit.embed(["He sat on the river bank."], model=(model, tokenizer))

The names below load on first use (PEP 562): ``import ctxkit`` and ``ctxkit --help`` do not
import torch.
"""

from .core.version import __version__

_SUBPACKAGES = ("cli", "core", "data", "decoding", "fast", "features", "heads", "inference", "layers", "models",
                "pretraining", "tasks", "tokenizers", "training", "zoo")

__all__ = ["AutoModel", "AutoTokenizer", "embed", "get_model", "list_models", "pipeline", "__version__"]


def embed(texts, model="all_minilm_l6_v2", **kwargs):
    """Contextual word (or sentence) vectors; see :func:`ctxkit.features.embed.embed`."""
    from .features.embed import embed as _embed  # lazy: startup (import ctxkit stays free of torch)

    return _embed(texts, model=model, **kwargs)


def __getattr__(name: str):
    if name in ("AutoModel", "AutoTokenizer", "get_model", "list_models"):
        from . import zoo  # lazy: startup (import ctxkit stays free of torch)

        return getattr(zoo, name)
    if name == "pipeline":
        from .inference.pipelines import pipeline  # lazy: startup (import ctxkit stays free of torch)

        return pipeline
    if name in _SUBPACKAGES:  # ctxkit.zoo, ctxkit.models, ... as attributes, as before they loaded lazily
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'ctxkit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
