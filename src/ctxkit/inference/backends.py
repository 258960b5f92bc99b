"""Pick the runtime behind a loaded task model: PyTorch, ONNX Runtime, compiled PyTorch
(CPU) or the GPU encoder (bf16, CUDA graphs, packed batches).

All three keep the task models' interface (``model(input_ids=...)["logits"]``), so
``predict`` and ``evaluate`` run unchanged; ``benchmarks/inference_cpu.py`` measures which
is fastest per precision on a machine (docs/performance.md).

``with_backend(model, "auto", precision, run_dir=RUN)`` decides once per run folder: the
timed choice is kept in ``RUN/auto_backend/choice.json`` (with the verified ONNX export
when ONNX Runtime won), keyed by what makes it valid (weights files, precision, CPU,
threads, ctxkit / torch / onnxruntime versions); later calls read it instead of exporting
and timing again.

A precision asked of the pytorch backend reaches the model: it comes back wrapped in
:class:`PrecisionModel` (fp32 = no autocast, whatever encloses the call; bf16 = bf16
autocast), which :func:`ctxkit.training.predict` honours.

The gpu backend runs a fast plan (:class:`ctxkit.fast.FastPlan`, ``--fast``; default
``auto``, the fastest exact plan for inference on the GPU): its description names the
resolved plan. The precisions ``fp8`` and ``bf16-gelu-tanh`` are that backend's declared
ones: the same as adding ``+fp8`` / ``+gelutanh`` to the plan.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Optional, Tuple

import torch
from torch import nn

from ..core.deps import missing, require_all
from ..core.errors import UserError
from ..core.checkpoint import atomic_write, write_json
from ..core.version import __version__
from ..fast import FastPlan, resolve
from ..zoo.families import find_family
from .cpu_compile import CompiledCPUModel
from .export import DEPLOY_NEEDS, OrtTaskModel, _example_batch, _vocab_size, export_onnx, verify_onnx
from .gpu import GPUTaskModel

__all__ = ["BACKENDS", "COMPILE_PAYS_FROM", "with_backend", "choose_backend", "median_ms", "plan_for_items", "PrecisionModel",
           "AUTO_CHOICE_DIR"]

logger = logging.getLogger("ctxkit")

# RUN/<this>/choice.json holds the auto decision for a run folder (RUN/best/backend.json
# already means "an exported ONNX run" to load_run, hence a folder of its own).
AUTO_CHOICE_DIR = "auto_backend"

BACKENDS = ("auto", "pytorch", "onnxruntime", "compiled", "gpu")


# Precisions of the gpu backend beyond fp32/bf16: declared approximations, never chosen by "auto";
# each is a plan option of the gpu backend (GPU_PRECISION_OPTIONS).
GPU_ONLY_PRECISIONS = ("fp8", "bf16-gelu-tanh")
GPU_PRECISION_OPTIONS = {"fp8": "fp8", "bf16-gelu-tanh": "gelutanh"}
PRECISIONS = ("fp32", "bf16") + GPU_ONLY_PRECISIONS


#: Inputs below which ``ctxkit predict`` leaves ``compile`` out of an ``auto`` plan. Compiling
#: the GPU encoder costs 10-30 s at the first batch (H200, BERT-base, cold cache) and saves at
#: most ~9 us a line (24.7k against 20.3k sequences/s of 128 tokens without it), and only where
#: the encoder, not the host's tokenizing, is the bound: it repays from ~1-3 million lines
#: (docs/notes/gpu-serving.md, "Token blocks"). A server compiles anyway (it runs for long).
COMPILE_PAYS_FROM = 1_000_000


def plan_for_items(plan: Optional[FastPlan], items: int, asked: Optional[str], device) -> Tuple[Optional[FastPlan], Optional[str]]:
    """``(plan, note)``: ``plan`` without ``compile`` when ``auto`` (or the run's recorded plan,
    ``asked`` None) would compile for fewer than :data:`COMPILE_PAYS_FROM` items, with a note
    saying so; else ``plan`` as it is and no note. An explicit ``--fast`` is kept as asked."""
    if plan is None or asked not in (None, "auto") or items >= COMPILE_PAYS_FROM:
        return plan, None
    if resolve(plan, use="infer", device=device).compile == "off":
        return plan, None  # nothing to leave out here (a CPU, or a plan without compile)
    return plan.with_options("-compile"), (f"compile off for {items:,} inputs: it costs 10-30 s at the first batch and "
                                           f"repays from ~{COMPILE_PAYS_FROM:,} (--fast auto+compile compiles anyway)")


def add_backend_arguments(parser, default: Optional[str], what: str) -> None:
    """``--backend``, ``--precision`` and ``--fast`` for a command line (``ctxkit predict``, ``ctxkit serve``).

    Args:
        parser: an ``argparse`` parser.
        default: the default backend (None: the command decides, and ``what`` says how).
        what: what the backend runs, for the help text (e.g. "runtime of the task endpoint").
    """
    parser.add_argument("--backend", choices=BACKENDS, default=default,
                        help=f"{what}: auto = the fastest correct one here (on CPU by timing PyTorch and a verified ONNX "
                             "export; on a GPU the gpu backend for BERT-family runs), pytorch = as loaded, onnxruntime or "
                             "compiled on CPU, gpu = bf16 GPU encoder with CUDA graphs and packed batches; the choice is "
                             "named (see docs/deployment.md; an int8 run always uses ONNX Runtime"
                             + (f"; default: {default})" if default else ")"))
    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help="the precision that runs: for --backend pytorch (fp32 = no autocast, bf16 = bf16 autocast; "
                             "default: bf16 autocast on a GPU, fp32 on CPU), compiled (default fp32) or gpu (default bf16; "
                             "fp8: float8 GEMMs on Hopper GPUs, the same as --fast auto+fp8; "
                             "bf16-gelu-tanh: bf16 with the FFN's GELU in tanh form inside the GEMM's epilogue, a declared "
                             "approximation of BERT's erf GELU, the same as --fast auto+gelutanh)")
    parser.add_argument("--fast", default=None, metavar="PLAN",
                        help="how fast the model runs: a fast plan, preset+option-option (auto = the fastest exact plan here; "
                             "reference = the plain modules; e.g. auto-compile, infer; python -m ctxkit.fast.plan lists the "
                             "options; default: the plan the run was trained with, what of it runs here, else auto)")


def with_backend(model: nn.Module, backend: str = "pytorch", precision: Optional[str] = None,
                 run_dir: Optional[Path] = None, plan=None) -> Tuple[nn.Module, str]:
    """``(model, description)`` for ``backend``.

    Args:
        model: from :func:`ctxkit.tasks.load_run` (PyTorch, or ONNX Runtime for an int8 run).
        backend: "auto" (see :func:`choose_backend`), "pytorch" (as loaded), "onnxruntime" (exported now, checked against
            PyTorch within 1e-4), "compiled" (:class:`~ctxkit.inference.cpu_compile.CompiledCPUModel`)
            or "gpu" (:class:`~ctxkit.inference.gpu.GPUTaskModel`, on the current CUDA device).
        precision: "fp32" or "bf16" for the pytorch (default: bf16 autocast on CUDA, fp32 on
            CPU; an explicit one is enforced by :class:`PrecisionModel`), compiled (default
            fp32) and gpu (default bf16) backends; "fp8" for the gpu backend (float8 matrix
            products, a declared precision: :mod:`ctxkit.inference.fp8`) and "bf16-gelu-tanh"
            (bf16 with the feed-forward GELU in tanh form inside the fc1 GEMM:
            ``GPUEncoder(gelu_epilogue=True)``).
        run_dir: the run folder ``model`` was loaded from; with "auto", the decision is kept
            there and reused (see :func:`choose_backend`). Ignored by the other backends.
        plan: the gpu backend's fast plan (a :class:`~ctxkit.fast.FastPlan` or its string;
            None: ``auto``). The other backends run the model as loaded.

    Raises:
        UserError: an unknown backend or precision, or one that cannot run this model.
    """
    if backend not in BACKENDS:
        raise UserError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if precision not in (None,) + PRECISIONS:
        raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if backend == "auto":
        return choose_backend(model, precision, run_dir=run_dir, plan=plan)
    if isinstance(model, OrtTaskModel):
        if backend == "compiled":
            raise UserError("this run is an exported ONNX model (ctxkit quantize): it runs on ONNX Runtime only")
        if precision not in (None, "fp32"):
            raise UserError(f"this run is an exported ONNX model (ctxkit quantize): it runs as exported, not in {precision}; "
                            "drop --precision")
        return model, f"ONNX Runtime ({model.path.name})"
    if precision in GPU_ONLY_PRECISIONS and backend != "gpu":
        raise UserError(f"{precision} is a precision of the gpu backend (GPU GEMM kernels); use --backend gpu")
    device = next(model.parameters()).device
    if backend == "gpu":

        if not torch.cuda.is_available():
            raise UserError("the gpu backend needs a CUDA device; on CPU use pytorch, onnxruntime or compiled")
        if not _is_bert(model):
            raise UserError(f"the gpu backend runs BERT-family encoders (packed batches go through BertModel); this run's "
                             f"encoder is {type(model.encoder).__name__}: use --backend pytorch on the GPU")
        precision = precision or "bf16"
        plan = FastPlan.parse(plan)
        if precision in GPU_PRECISION_OPTIONS:
            plan = plan.with_options("+" + GPU_PRECISION_OPTIONS[precision])
        gpu = GPUTaskModel(model, dtype=torch.float32 if precision == "fp32" else torch.bfloat16, plan=plan)
        weights = {"fp8": "fp8 matrix products, bf16 elsewhere",
                   "bf16-gelu-tanh": "bf16 weights, tanh GELU in the fc1 GEMM epilogue"}.get(precision, f"{precision} weights")
        # The encoder sets its own dtypes: predict() must not lay autocast on top of it.
        gpu.inference_precision = "native"
        return gpu, f"GPU encoder ({weights}; {gpu.runner.plan.describe()})"
    if backend == "pytorch":
        if precision is None:  # as loaded: predict()'s default, bf16 autocast on CUDA, fp32 on CPU
            return model, f"PyTorch ({device}, {'bf16 autocast' if device.type == 'cuda' else 'fp32'})"
        return PrecisionModel(model, precision), f"PyTorch ({device}, {_PRECISION_NAMES[precision]})"
    precision = precision or "fp32"
    if device.type != "cpu":
        raise UserError(f"the {backend} backend is for CPU inference; this model is on {device} (use --device cpu)")
    if backend == "onnxruntime":
        require_all(DEPLOY_NEEDS, "the onnxruntime backend")
        if precision != "fp32":
            raise UserError(f"the onnxruntime backend runs an fp32 export, not {precision}: use --backend pytorch or compiled for bf16")
        # The session holds the graph in memory, so the export is not kept on disk.
        with tempfile.TemporaryDirectory(prefix="ctxkit-onnx-") as folder:
            return _onnxruntime(model, Path(folder) / "model.onnx")
    return CompiledCPUModel(model, precision), f"compiled PyTorch ({precision}, frozen weights, Inductor C++ GEMMs)"


_PRECISION_NAMES = {"fp32": "fp32, no autocast", "bf16": "bf16 autocast"}


class PrecisionModel(nn.Module):
    """A task model that runs at the precision it was asked for, whatever encloses the call.

    ``fp32`` turns autocast off inside the forward (so ``predict``'s default bf16 autocast
    on CUDA cannot lower it); ``bf16`` runs the forward under bf16 autocast (on CPU too).
    fp32 matrix products follow ``torch.backends.cuda.matmul.allow_tf32`` / the float32
    matmul precision, which PyTorch leaves at full fp32 (no TF32) unless told otherwise.

    The wrapped model's attributes (``encoder``, ``head``, ``config``...) read through, and
    :func:`ctxkit.training.predict` sees ``inference_precision`` and adds no autocast of
    its own.

    Args:
        model: a task model (``model(input_ids=...)`` returns a dict).
        precision: "fp32" or "bf16".
    """

    def __init__(self, model: nn.Module, precision: str):
        super().__init__()
        if precision not in _PRECISION_NAMES:
            raise UserError(f"precision must be fp32 or bf16 here, got {precision!r}")
        self.model = model
        self.inference_precision = precision

    def forward(self, *args, **kwargs):
        """The wrapped model's output, computed at ``inference_precision``."""
        param = next(self.model.parameters(), None)
        device_type = param.device.type if param is not None else "cpu"
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.inference_precision == "bf16"):
            return self.model(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("model"), name)


def _onnxruntime(model: nn.Module, path: Path) -> Tuple[nn.Module, str]:
    """Export ``model`` to ``path``, check it against PyTorch (1e-4) and load it in ONNX Runtime."""
    export_onnx(model, path)
    diff = verify_onnx(model, path)
    return OrtTaskModel(path), f"ONNX Runtime (fp32 export, max |ORT - PyTorch| {diff:.1e})"


def median_ms(fn, reps: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``reps`` calls, after ``warmup``
    calls (ONNX Runtime plans its memory on the first run)."""

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def choose_backend(model: nn.Module, precision: Optional[str] = None, run_dir: Optional[Path] = None,
                   plan=None) -> Tuple[nn.Module, str]:
    """The fastest correct backend for ``model`` here, and a description saying which and why.

    * an exported (int8) run: ONNX Runtime, the only runtime it has;
    * a CUDA device: the GPU encoder (bf16 unless ``precision="fp32"``) with ``plan``;
    * CPU, bf16: the compiled backend (AVX-512 BF16 GEMMs; autocast is 1.2-1.45x slower,
      docs/performance.md);
    * CPU, fp32: PyTorch and ONNX Runtime (exported and checked against PyTorch within
      1e-4) are both timed on a 4 x 64 batch and the faster is kept: which one wins depends
      on the CPU's BLAS (MKL is ~2x slower than ONNX Runtime's kernels on AMD CPUs).

    With ``run_dir`` (the run folder ``model`` was loaded from) the timed choice is made
    once: it is kept in ``run_dir/auto_backend/choice.json`` (and the verified export in
    ``run_dir/auto_backend/model-<key>.onnx`` when ONNX Runtime won) and reused, without
    export or timing, while its key holds: the files of ``run_dir/best`` (size and mtime),
    the precision, the CPU model, torch's thread count and the ctxkit, torch and
    onnxruntime versions. Delete the folder to decide again. A folder that cannot be
    written (read-only) still works: the choice is made each time, with a warning.
    """
    if isinstance(model, OrtTaskModel):
        return with_backend(model, "onnxruntime")
    if torch.cuda.is_available() and next(model.parameters()).device.type == "cuda":
        if not _is_bert(model):
            pytorch, description = with_backend(model, "pytorch", precision)
            return pytorch, f"auto: {description}; the gpu backend runs BERT-family encoders only"
        gpu, description = with_backend(model, "gpu", precision, plan=plan)
        return gpu, f"auto: {description}"
    if precision in GPU_ONLY_PRECISIONS:
        raise UserError(f"{precision} is a precision of the gpu backend (GPU GEMM kernels); this model is on the CPU")
    if (precision or "fp32") == "bf16":
        compiled, description = with_backend(model, "compiled", "bf16")
        return compiled, f"auto: {description}"
    store = _ChoiceStore(Path(run_dir), _choice_key(model, Path(run_dir), precision)) if run_dir is not None else None
    if store is not None:
        kept = store.load(model, precision)
        if kept is not None:
            return kept
    if missing(DEPLOY_NEEDS):  # nothing to time against: PyTorch it is, and the user learns why
        pytorch, description = with_backend(model, "pytorch", precision)
        return pytorch, (f"auto: {description}; ONNX Runtime was not timed against it, as it is not installed "
                         "(pip install 'ctxkit[deploy]')")
    with tempfile.TemporaryDirectory(prefix="ctxkit-onnx-") as folder:
        # The session holds the graph in memory; the file is only kept (in run_dir) when ONNX Runtime wins.
        export = Path(folder) / "model.onnx"
        ort, ort_description = _onnxruntime(model, export)
        batch = _example_batch(_vocab_size(model), batch=4, seq=64)
        with torch.inference_mode():
            ms = {"pytorch": median_ms(lambda: model(**batch)), "onnxruntime": median_ms(lambda: ort(**batch))}
        timing = f"{ms['onnxruntime']:.1f} ms vs PyTorch {ms['pytorch']:.1f} ms on a 4x64 batch"
        if ms["onnxruntime"] <= ms["pytorch"]:
            chosen, description = ort, f"{ort_description}; {timing}"
        else:
            chosen, description = model, f"PyTorch (cpu, fp32); ONNX Runtime {timing}"
            if precision is not None:
                chosen = PrecisionModel(model, precision)
        saved = store.save("onnxruntime" if chosen is ort else "pytorch", description, ms, export) if store is not None else None
    return chosen, f"auto: {description}" + (f" (decision kept in {saved})" if saved else "")


def _cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _choice_key(model: nn.Module, run_dir: Path, precision: Optional[str]) -> Optional[dict]:
    """What the auto decision for ``run_dir`` depends on; None when the weights cannot be named
    (no ``run_dir/best`` folder), so nothing is kept."""
    best = run_dir / "best"
    try:
        files = sorted(p for p in best.iterdir() if p.is_file())
    except OSError:
        return None
    if not files:
        return None
    try:
        import onnxruntime  # lazy: optional (the deploy extra)

        ort_version = onnxruntime.__version__
    except ImportError:
        ort_version = None
    return {
        "backend_choice": 1,  # the layout of choice.json; a new layout decides again
        "device": "cpu",
        "precision": precision or "fp32",
        "weights": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files],
        "parameters": sum(p.numel() for p in model.parameters()),
        "cpu": _cpu_name(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "ctxkit": __version__,
        "torch": torch.__version__,
        "onnxruntime": ort_version,
    }


class _ChoiceStore:
    """``run_dir/auto_backend/``: the auto decision for a run folder, read back while its key holds."""

    def __init__(self, run_dir: Path, key: Optional[dict]):
        self.folder = run_dir / AUTO_CHOICE_DIR
        self.path = self.folder / "choice.json"
        self.key = key
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16] if key is not None else ""
        self.onnx_name = f"model-{digest}.onnx"
        if key is None:
            logger.warning("%s has no best/ folder to key the backend choice on: deciding without keeping it", run_dir)

    def load(self, model: nn.Module, precision: Optional[str]) -> Optional[Tuple[nn.Module, str]]:
        """The kept ``(model, description)``, or None when there is none or its key no longer holds."""

        if self.key is None:
            return None
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # none yet, unreadable or half-written by an older ctxkit: decide again
        if not isinstance(record, dict) or record.get("key") != self.key:
            return None
        when = f"auto (decided {str(record.get('decided', '?'))[:10]} for this run folder on {self.key['cpu']})"
        if record.get("backend") == "pytorch":
            chosen = model if precision is None else PrecisionModel(model, precision)
            return chosen, f"{when}: {record.get('description', 'PyTorch (cpu, fp32)')}"
        if record.get("backend") == "onnxruntime" and record.get("onnx") == self.onnx_name:
            try:
                return OrtTaskModel(self.folder / self.onnx_name), f"{when}: {record.get('description', 'ONNX Runtime')}"
            except Exception as err:  # noqa: BLE001 - a missing or damaged export: decide again
                logger.warning("%s: could not load the kept export (%s: %s); deciding again", self.folder / self.onnx_name,
                               type(err).__name__, err)
        return None

    def save(self, backend: str, description: str, ms: dict, export: Path) -> Optional[Path]:
        """Keep the decision (and the export, when ONNX Runtime won); returns the file, or None
        (with a warning) when the run folder cannot be written."""
        if self.key is None:
            return None
        record = {"backend": backend, "description": description, "key": self.key,
                  "decided": datetime.datetime.now().isoformat(timespec="seconds"),
                  "timing_ms": {k: round(v, 3) for k, v in ms.items()}}
        try:
            if backend == "onnxruntime":
                # The export first, then the record that names it: a reader never sees a record without its file.
                atomic_write(self.folder / self.onnx_name, lambda tmp: shutil.copyfile(export, tmp))
                record["onnx"] = self.onnx_name
            write_json(record, self.path)
        except OSError as err:
            logger.warning("could not keep the backend choice in %s (%s); it will be decided again next time",
                           self.folder, err.strerror or err)
            return None
        for old in self.folder.glob("model-*.onnx"):  # exports of earlier decisions
            if old.name != record.get("onnx"):
                try:
                    old.unlink()
                except OSError:
                    pass
        return self.path


def _is_bert(model) -> bool:
    """Whether a task model's encoder is of the BERT family (what the GPU encoder packs), as the
    family registry (:mod:`ctxkit.zoo.families`) tells."""
    encoder = getattr(model, "encoder", None)
    family = find_family(encoder) if encoder is not None else None
    return family is not None and family.name == "bert"
