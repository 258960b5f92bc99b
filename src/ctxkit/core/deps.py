"""Optional dependencies: which extra installs each, and one-line errors when one is missing.

``pip install ctxkit`` installs what every model needs (torch, tokenizers, safetensors,
numpy, tqdm). What serves one purpose only comes with an extra named for that purpose:

=============  ==============================================  ================================
extra          packages                                        needed for
=============  ==============================================  ================================
``tasks``      scipy, scikit-learn, seqeval, sacrebleu         GLUE F1/MCC/correlations, CoNLL F1,
                                                               BLEU, the linear-probe baseline
``plots``      matplotlib                                      ``ctxkit demo``, ``curve.png``, heatmaps
``deploy``     onnx, onnxruntime                               ``ctxkit export`` / ``quantize``, ``--backend onnx``
``serve``      fastapi, uvicorn, pydantic, starlette,          ``ctxkit serve``
               fastapi-offline (/docs and /redoc, no CDN)
``elmo``       h5py, pooch                                     the released ELMo hdf5 weights, fetched by URL
``tensorboard`` / ``mlflow`` / ``wandb``                        ``--log-to`` writers
``all``        all of the above but mlflow and wandb
=============  ==============================================  ================================

Commands check what they will need before they load a model or read data
(:func:`require_all`), so a missing package never costs a training run.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Iterable

from .errors import MissingDependencyError

__all__ = ["EXTRA", "require", "require_all", "missing"]

#: import name -> (pip distribution, extra that installs it)
EXTRA = {
    "scipy": ("scipy", "tasks"),
    "sklearn": ("scikit-learn", "tasks"),
    "seqeval": ("seqeval", "tasks"),
    "sacrebleu": ("sacrebleu", "tasks"),
    "matplotlib": ("matplotlib", "plots"),
    "onnx": ("onnx", "deploy"),
    "onnxruntime": ("onnxruntime", "deploy"),
    "fastapi": ("fastapi", "serve"),
    "uvicorn": ("uvicorn", "serve"),
    "pydantic": ("pydantic", "serve"),
    "starlette": ("starlette", "serve"),
    "fastapi_offline": ("fastapi-offline", "serve"),
    "h5py": ("h5py", "elmo"),
    "pooch": ("pooch", "elmo"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module set to None in sys.modules
        return False


def missing(modules: Iterable[str]) -> list:
    """The import names among ``modules`` that are not installed (nothing is imported)."""
    return [m for m in modules if not _installed(m)]


def _message(modules: list, purpose: str) -> str:
    pips = ", ".join(EXTRA.get(m, (m, ""))[0] for m in modules)
    extras = sorted({EXTRA[m][1] for m in modules if m in EXTRA})
    fix = f"pip install 'ctxkit[{','.join(extras)}]'" if extras else f"pip install {pips}"
    return f"{purpose} needs {pips}, which is not installed: {fix}"


def require_all(modules: Iterable[str], purpose: str) -> None:
    """Raise one :class:`MissingDependencyError` naming every missing module's extra.

    Cheap (no import): call it before a command spends time on data or models.
    """
    absent = missing(modules)
    if absent:
        raise MissingDependencyError(_message(absent, purpose))


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module``, or raise :class:`MissingDependencyError` naming the extra to install.

    Args:
        module: import name, e.g. ``"onnxruntime"`` or ``"matplotlib.pyplot"``.
        purpose: what needs it, for the message, e.g. ``"ctxkit quantize"``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        top = module.split(".")[0]
        if err.name not in (None, top, module) and not str(err.name).startswith(top + "."):
            raise  # the package is there but one of *its* dependencies is broken: show the real error
        raise MissingDependencyError(_message([top], purpose)) from None
