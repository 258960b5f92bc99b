"""The model card a fine-tuned run folder carries: ``RUN/README.md``, the file the Hugging Face
Hub renders as a model's page.

YAML front matter in the Hub's model-card format (``library_name``, ``pipeline_tag``,
``base_model`` when the model came from the Hub, and a ``model-index`` with every split's
metrics, which the Hub shows as evaluation results), then for readers: the scores, the data,
the command that trained it, the hyper-parameters and fast plan, and how to use the folder.
Everything comes from what the run recorded (``task.json``, ``results.json``): a card never
claims a number the run did not measure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ..core.durable import atomic_write
from ..core.hub import is_hub_id

__all__ = ["model_card", "write_model_card"]

# ctxkit task name -> the Hub's pipeline tag
_PIPELINE_TAGS = {"conll2003": "token-classification", "squad": "question-answering"}


def _pipeline_tag(task: str) -> str:
    return _PIPELINE_TAGS.get(task, "text-classification")


def _yaml_str(value) -> str:
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a valid YAML scalar


def model_card(run_name: str, info: dict, summary: dict, command: Optional[str] = None) -> str:
    """The card's text (see the module docstring) from ``task.json`` (``info``) and
    ``results.json`` (``summary``)."""
    task, model = info["task"], str(info.get("model", "?"))
    tag = _pipeline_tag(task)
    base = model if "/" in model and is_hub_id(model) and not Path(model).exists() else None
    data_name = Path(str(info.get("data", ""))).name or "?"
    lines = ["---", "library_name: ctxkit", f"pipeline_tag: {tag}", "tags:", "- ctxkit", f"- {_yaml_str(task)}"]
    if base:
        lines.append(f"base_model: {_yaml_str(base)}")
    lines += ["model-index:", f"- name: {_yaml_str(run_name)}", "  results:"]
    for split, metrics in summary.get("results", {}).items():
        lines += ["  - task:", f"      type: {tag}", "    dataset:", f"      name: {_yaml_str(data_name)}",
                  f"      type: {_yaml_str(task)}", f"      split: {_yaml_str(split)}", "    metrics:"]
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                lines += [f"    - type: {_yaml_str(name)}", f"      value: {value}"]
    lines.append("---")

    lines += ["", f"# {run_name}", "",
              f"`{model}` fine-tuned on **{task}** ({data_name}) with [ctxkit](https://pypi.org/project/ctxkit/).", ""]
    if "stopped" in summary:
        stop = summary["stopped"]
        lines += [f"Training was stopped by `--{stop['reason'].replace('_', '-')}` at step {stop['step']}; the scores are "
                  "those of the best model up to then.", ""]
    lines += ["## Results", "", "| split | " + " | ".join(_metric_names(summary)) + " |",
              "|---|" + "---|" * len(_metric_names(summary))]
    for split, metrics in summary.get("results", {}).items():
        lines.append(f"| {split} | " + " | ".join(_cell(metrics.get(m)) for m in _metric_names(summary)) + " |")
    examples = summary.get("eval_examples", {})
    lines += ["", f"Best epoch {summary.get('best_epoch')}, {summary.get('steps')} steps, "
                  f"{summary.get('train_examples')} training examples"
                  + (f", evaluated on {', '.join(f'{n} {s}' for s, n in examples.items())} examples" if examples else "")
                  + f"; {summary.get('train_time_s')} s of training on {summary.get('device', '?')}.", ""]
    lines += ["## Training", ""]
    if command:
        lines += ["```bash", command, "```", ""]
    config = info.get("config") or {}
    keep = ("epochs", "batch_size", "lr", "weight_decay", "warmup_ratio", "max_grad_norm", "precision", "seed")
    shown = {k: config[k] for k in keep if k in config}
    if shown:
        lines += ["| hyper-parameter | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in shown.items()] + [""]
    lines += [f"Fast plan: `{summary.get('fast', '?')}`; task options: `{json.dumps(info.get('options', {}))}`.", ""]
    lines += ["## Use", "", "```bash", f"ctxkit predict {run_name} input.txt        # one JSON line per input line",
              f"ctxkit serve {run_name}                    # a JSON HTTP API", "```", "", "```python", "import ctxkit",
              f"pipe = ctxkit.pipeline({_yaml_str(tag)}, model={_yaml_str(run_name)})", "```", ""]
    return "\n".join(lines)


def _metric_names(summary: dict) -> list:
    names = []
    for metrics in summary.get("results", {}).values():
        names += [k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in names]
    return names


def _cell(value) -> str:
    return "" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def write_model_card(run_dir: Path, info: dict, summary: dict, command: Optional[str] = None) -> Path:
    """Write ``run_dir/README.md`` (atomically); returns its path."""
    path = Path(run_dir) / "README.md"
    text = model_card(Path(run_dir).name, info, summary, command)
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
