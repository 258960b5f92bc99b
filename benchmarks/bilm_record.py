"""Turn a ``ctxkit pretrain-elmo`` run into perplexity records in benchmarks/results/elmo.json.

    python benchmarks/bilm_record.py RUN_DIR --corpus wikipedia-en-extract \\
        --command "ctxkit pretrain-elmo ..." [--results benchmarks/results/elmo.json]

Reads RUN_DIR/results.json (``valid``: the last validation pass, ``test``: the ``--test``
files) and writes forward, backward and average perplexity for each split, replacing the
records of the same corpus. The average is exp of the mean of the two directions' NLLs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ANCHOR = ("ELMo paper biLM on the 1B Word Benchmark (average), as quoted in issue 7 (another corpus: not comparable)", 39.7)


def records(run: dict, corpus: str, command: str, device: str) -> list:
    a = run["model"]
    lstm = a.get("lstm", {})
    cnn = a.get("char_cnn", {})
    filters = sum(n for _, n in cnn.get("filters", [])) or "?"
    desc = (f"ELMo biLM (char CNN {filters} filters, {cnn.get('n_highway', '?')} highway, {lstm.get('n_layers', '?')} x LSTM "
            f"{lstm.get('dim', '?')} -> {lstm.get('projection_dim', '?')}, "
            f"{run['parameters']:,} parameters, vocabulary {run['vocab_size']:,} words, {run['train_config']['softmax']} softmax), "
            f"{run['train_time_s']:.0f} s on {corpus} train ({run['train_tokens']:,} tokens, {run['steps']} steps, "
            f"epoch {run['epoch']}, {run['tokens_per_s']:,.0f} tokens/s)")
    out = []
    for split in ("test", "valid"):
        r = run.get(split)
        if not r:
            continue
        avg = math.exp((r["forward_nll"] + r["backward_nll"]) / 2)
        for metric, value, peer in (("perplexity (forward LM)", r["forward_perplexity"], (None, None)),
                                    ("perplexity (backward LM)", r["backward_perplexity"], (None, None)),
                                    ("perplexity (average of the two log-perplexities)", avg, ANCHOR if split == "test" else (None, None))):
            out.append({"task": f"{corpus} language modelling", "split": split, "metric": metric, "value": round(value, 2),
                        "model": desc, "peer_name": peer[0], "peer_value": peer[1], "train_time_s": run["train_time_s"],
                        "tokens": r.get("tokens"), "device": device, "date": datetime.date.today().isoformat(), "command": command})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="pretrain-elmo run folder (with results.json)")
    p.add_argument("--corpus", required=True, help="corpus name, e.g. wikipedia-en-extract")
    p.add_argument("--command", required=True, help="the pretrain-elmo command that made the run")
    p.add_argument("--device", default=None, help="device name (default: the GPU of this machine, else the run's device)")
    p.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results" / "elmo.json")
    args = p.parse_args(argv)
    run = json.loads((args.run / "results.json").read_text())
    device = args.device
    if device is None:
        import torch

        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else run["device"]
    new = records(run, args.corpus, args.command, device)
    if not new:
        raise SystemExit(f"{args.run}/results.json has neither valid nor test perplexities")
    old = json.loads(args.results.read_text()) if args.results.is_file() else []
    task = new[0]["task"]
    merged = [r for r in old if r.get("task") != task]
    at = next((i for i, r in enumerate(old) if r.get("task") == task), len(merged))
    merged[at:at] = new
    args.results.write_text(json.dumps(merged, indent=1) + "\n")
    for r in new:
        print(f"{r['task']} {r['split']} {r['metric']}: {r['value']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
