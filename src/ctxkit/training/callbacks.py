"""Watching training live: a callback interface and the writers behind ``--log-to``.

Every training loop reports through four hooks of :class:`Callback`:

* ``on_train_begin(run_info)``: ``run_info["config"]`` holds the hyper-parameters; a
  resumed run adds ``run_info["resumed_at_step"]`` (the checkpoint's step).
* ``on_log(step, metrics)``: a training record (mean loss since the last one, learning
  rate, throughput, ...).
* ``on_eval(step, metrics)``: an evaluation (dev accuracy, validation perplexity, ...).
* ``on_train_end(summary)``: the run finished; ``close()`` follows, also after a failure.

``metrics`` is the record as the loop's ``log.jsonl`` gets it, so it may repeat ``step``
and hold strings; the writers plot the numbers in it except the bookkeeping fields
:data:`NOT_PLOTTED`. Scalars are named ``train/<key>`` and ``<eval_name>/<key>`` (e.g.
``train/loss``, ``train/lr``, ``dev/accuracy``).

Writers: :class:`JsonlWriter` (the run folder's ``log.jsonl``, always on),
:class:`TensorBoardWriter` (``RUN/tensorboard/``), :class:`MLflowWriter` and
:class:`WandbWriter`. The last three import their library when built, so a missing extra
is a :class:`~ctxkit.core.errors.MissingDependencyError` before any training compute.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..core.callbacks import Callback, CallbackList
from ..core.deps import require
from ..core.errors import UnknownNameError

__all__ = ["Callback", "CallbackList", "JsonlWriter", "TensorBoardWriter", "MLflowWriter", "WandbWriter", "WRITERS",
           "NOT_PLOTTED", "make_callbacks", "add_log_to_argument"]

logger = logging.getLogger("ctxkit")

# Fields of a record that say when it was written rather than how training goes.
NOT_PLOTTED = frozenset({"step", "epoch", "elapsed", "time"})


class JsonlWriter(Callback):
    """Appends each record to a JSON-lines file (a run folder's ``log.jsonl``), one line each.

    Args:
        path: the file; opened and closed per record, so it can be read while training runs.
        style: the layout of the loop's log.
            ``"events"`` (the Trainer: fine-tuning, BERT/XLNet/GPT-2 pretraining,
            translation): ``{"event": "start"|"train"|"eval"|"end", ...}`` records, no start
            record on resume (the log goes on).
            ``"plain"`` (biLM, Transformer-XL): training records as they come, evaluations
            as ``{"eval": record}``, no start or end record.

    The hooks' dicts are written as received, keys in their order.
    """

    def __init__(self, path: os.PathLike, style: str = "events"):
        if style not in ("events", "plain"):
            raise ValueError(f"style must be 'events' or 'plain', got {style!r}")
        self.path = Path(path)
        self.style = style

    def _write(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def on_train_begin(self, run_info: dict) -> None:
        if self.style == "events" and "resumed_at_step" not in run_info:
            self._write({"event": "start", **run_info})

    def on_log(self, step: int, metrics: dict) -> None:
        self._write({"event": "train", **metrics} if self.style == "events" else metrics)

    def on_eval(self, step: int, metrics: dict) -> None:
        self._write({"event": "eval", **metrics} if self.style == "events" else {"eval": metrics})

    def on_train_end(self, summary: dict) -> None:
        if self.style == "events":
            self._write({"event": "end", **summary})


def _scalars(metrics: dict) -> Dict[str, float]:
    """The plottable numbers of a record (NaN included: a diverging run should show; bools
    and strings are left out)."""
    return {k: float(v) for k, v in metrics.items()
            if k not in NOT_PLOTTED and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _flat(config: dict, prefix: str = "") -> Dict[str, object]:
    """Nested config dicts as ``{"a.b": value}``, for parameter tables."""
    out: Dict[str, object] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _remembered(out_dir: Path, key: str) -> Optional[str]:
    """A run id written by :func:`_remember` (``RUN/monitoring.json``), for resumed runs."""
    path = out_dir / "monitoring.json"
    return json.loads(path.read_text(encoding="utf-8")).get(key) if path.is_file() else None


def _remember(out_dir: Path, key: str, value: str) -> None:
    path = out_dir / "monitoring.json"
    known = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    path.write_text(json.dumps({**known, key: value}, indent=2) + "\n", encoding="utf-8")


class TensorBoardWriter(Callback):
    """Scalars into ``RUN/tensorboard/`` (``tensorboard --logdir RUN/tensorboard``); the
    config as a text table.

    On resume the writer starts with ``purge_step`` = the checkpoint's step + 1: TensorBoard
    then hides what the interrupted attempt logged after its checkpoint, and each step is
    shown once, with the values of the attempt that the model's weights come from.
    """

    def __init__(self, out_dir: os.PathLike, eval_name: str = "dev"):
        require("tensorboard", "--log-to tensorboard")  # torch's SummaryWriter is built on it
        from torch.utils.tensorboard import SummaryWriter

        self._summary_writer = SummaryWriter
        self.log_dir = Path(out_dir) / "tensorboard"
        self.eval_name = eval_name
        self._writer = None

    def on_train_begin(self, run_info: dict) -> None:
        resumed = run_info.get("resumed_at_step")
        first = 0 if resumed is None else resumed + 1
        self._writer = self._summary_writer(str(self.log_dir), purge_step=None if resumed is None else first)
        rows = "".join(f"| {k} | {v} |\n" for k, v in _flat(run_info.get("config", {})).items())
        title = "config" if resumed is None else f"config (resumed at step {resumed})"
        self._writer.add_text("config", f"**{title}**\n\n| setting | value |\n|---|---|\n{rows}", global_step=first)

    def _add(self, prefix: str, step: int, metrics: dict) -> None:
        for key, value in _scalars(metrics).items():
            self._writer.add_scalar(f"{prefix}/{key}", value, global_step=step)

    def on_log(self, step: int, metrics: dict) -> None:
        self._add("train", step, metrics)

    def on_eval(self, step: int, metrics: dict) -> None:
        self._add(self.eval_name, step, metrics)
        self._writer.flush()  # evaluations are rare and worth seeing at once

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class _ScalarWriter(Callback):
    """The hooks that MLflow and W&B runs share: each record as step scalars, and whether
    training ended normally.

    Subclasses open their run in ``on_train_begin``, send scalars in :meth:`_add` and end
    the run in ``close``, as finished when ``_finished`` is set and as failed otherwise
    (``on_train_end`` does not come after a failure).

    Args:
        out_dir: the run folder the writer puts its files in.
        eval_name: prefix of evaluation scalars (``dev``, ``valid``).
    """

    def __init__(self, out_dir: os.PathLike, eval_name: str = "dev"):
        self.out_dir = Path(out_dir)
        self.eval_name = eval_name
        self._finished = False

    @staticmethod
    def _named(prefix: str, metrics: dict) -> Dict[str, float]:
        """The plottable numbers of ``metrics``, keyed ``<prefix>/<key>``."""
        return {f"{prefix}/{k}": v for k, v in _scalars(metrics).items()}

    def _add(self, prefix: str, step: int, metrics: dict) -> None:
        """Send the plottable numbers of ``metrics`` as ``<prefix>/<key>`` at ``step``."""
        raise NotImplementedError

    def on_log(self, step: int, metrics: dict) -> None:
        self._add("train", step, metrics)

    def on_eval(self, step: int, metrics: dict) -> None:
        self._add(self.eval_name, step, metrics)

    def on_train_end(self, summary: dict) -> None:
        self._finished = True


class MLflowWriter(_ScalarWriter):
    """An MLflow run: the config as parameters, the records as step metrics.

    ``MLFLOW_TRACKING_URI`` (and ``MLFLOW_EXPERIMENT_NAME``) are honoured; without a
    tracking URI the run goes to a file store in ``RUN/mlruns`` (``mlflow ui
    --backend-store-uri RUN/mlruns``). A resumed run continues the same MLflow run (its id
    is kept in ``RUN/monitoring.json``); steps the interrupted attempt logged after its
    checkpoint then hold two values. The run ends ``FINISHED``, or ``FAILED`` when training
    did not end normally.
    """

    def __init__(self, out_dir: os.PathLike, eval_name: str = "dev"):
        self._mlflow = require("mlflow", "--log-to mlflow")
        super().__init__(out_dir, eval_name)
        self._active = False

    def on_train_begin(self, run_info: dict) -> None:
        mlflow = self._mlflow
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            mlflow.set_tracking_uri((self.out_dir / "mlruns").resolve().as_uri())
        run_id = _remembered(self.out_dir, "mlflow_run_id") if "resumed_at_step" in run_info else None
        run = mlflow.start_run(run_id=run_id, run_name=None if run_id else self.out_dir.name)
        self._active, self._finished = True, False
        _remember(self.out_dir, "mlflow_run_id", run.info.run_id)
        if run_id is None:  # MLflow refuses a parameter logged again with another value
            mlflow.log_params({k: str(v)[:500] for k, v in _flat(run_info.get("config", {})).items()})

    def _add(self, prefix: str, step: int, metrics: dict) -> None:
        values = self._named(prefix, metrics)
        if values:
            self._mlflow.log_metrics(values, step=step)

    def close(self) -> None:
        if self._active:
            self._active = False
            self._mlflow.end_run(status="FINISHED" if self._finished else "FAILED")


class WandbWriter(_ScalarWriter):
    """A Weights & Biases run in ``RUN/wandb/``: the config, the records as step metrics.

    ``WANDB_MODE`` (``offline``, ``disabled``), ``WANDB_PROJECT`` (default ``ctxkit``) and
    the other ``WANDB_*`` settings are honoured. A resumed run continues the same W&B run
    (``resume="allow"``, id in ``RUN/monitoring.json``); W&B ignores steps below the last
    one it has, so for steps the interrupted attempt logged after its checkpoint it keeps
    that attempt's values.
    """

    def __init__(self, out_dir: os.PathLike, eval_name: str = "dev"):
        self._wandb = require("wandb", "--log-to wandb")
        super().__init__(out_dir, eval_name)
        self._run = None

    def on_train_begin(self, run_info: dict) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)  # wandb.init wants its dir to exist
        run_id = _remembered(self.out_dir, "wandb_run_id") if "resumed_at_step" in run_info else None
        self._run = self._wandb.init(project=os.environ.get("WANDB_PROJECT", "ctxkit"), dir=str(self.out_dir),
                                     name=self.out_dir.name, config=_flat(run_info.get("config", {})),
                                     id=run_id, resume="allow" if run_id else None)
        self._finished = False
        _remember(self.out_dir, "wandb_run_id", self._run.id)

    def _add(self, prefix: str, step: int, metrics: dict) -> None:
        self._run.log(self._named(prefix, metrics), step=step)

    def close(self) -> None:
        if self._run is not None:
            run, self._run = self._run, None
            run.finish(exit_code=0 if self._finished else 1)


# ``--log-to`` names and their writers.
WRITERS = {"tensorboard": TensorBoardWriter, "mlflow": MLflowWriter, "wandb": WandbWriter}


def make_callbacks(names: Optional[Sequence[str]], out_dir: os.PathLike, eval_name: str = "dev") -> List[Callback]:
    """The writers named by ``--log-to``, built now so that a missing extra fails before training.

    Args:
        names: writer names (``tensorboard``, ``mlflow``, ``wandb``); repeats are ignored.
        out_dir: the run folder the writers put their files in.
        eval_name: prefix of evaluation scalars (``dev``, ``valid``).

    Raises:
        UnknownNameError: a name that is not a writer (the message lists them).
        MissingDependencyError: a writer's package is not installed (names the extra).
    """
    chosen = list(dict.fromkeys(names or ()))
    unknown = [n for n in chosen if n not in WRITERS]
    if unknown:
        raise UnknownNameError(f"unknown --log-to {', '.join(map(repr, unknown))}; choose from {', '.join(WRITERS)}")
    return [WRITERS[n](out_dir, eval_name=eval_name) for n in chosen]


def _writer_names(value: str) -> List[str]:
    """argparse type of ``--log-to``: comma-separated writer names, checked."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in WRITERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown writer {', '.join(map(repr, unknown)) or repr(value)}; "
                                         f"choose from {', '.join(WRITERS)}")
    return names


def add_log_to_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--log-to NAME[,NAME]`` (repeatable) to a training verb; ``args.log_to`` is a list."""
    parser.add_argument("--log-to", dest="log_to", action="extend", type=_writer_names, default=[], metavar="WRITER",
                        help=f"also send training metrics to {', '.join(WRITERS)} (repeatable or comma-separated; "
                             "files go into the run folder, e.g. RUN/tensorboard; see docs/monitoring.md)")
