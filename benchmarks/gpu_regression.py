"""Compare ctxkit's figures of two runs of benchmarks/gpu_regression.sh (before and after a
change, same session, same card) and write them as speed records.

    python benchmarks/gpu_regression.py BEFORE_DIR AFTER_DIR --change "issue 19 ..." \
        --results benchmarks/results/refactor_regression.json

Each record: ``ctxkit`` = the figure after the change, ``peer`` = the same figure before it
(``peer_name`` = "ctxkit before the change"), ``speedup`` = how much faster after (for
throughputs after/before, for times before/after). Exits 1 when a figure is more than
``--tolerance`` (default 3 %) worse.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

LOWER_IS_BETTER = ("ms", "s", "seconds", "milliseconds", "us")


GENERATE_LINE = re.compile(r"^batch (\d+): ctxkit (\d+) tok/s$", re.M)


def _generate_from_log(folder: Path) -> dict:
    """Runs of generate.py --no-peer made before it wrote ctxkit-only records: read its log."""
    log = folder / "generate.log"
    if not log.exists():
        return {}
    known = [r for p in folder.glob("*.json") for r in _load(p) if r.get("device")]
    device, date = (known[0]["device"], known[0].get("date")) if known else (None, None)
    out = {}
    for batch, tps in GENERATE_LINE.findall(log.read_text(encoding="utf-8")):
        case = f"gpt2_117m random weights, prompt 32, 256 new tokens, greedy, batch {batch}, bf16 (best ctxkit variant)"
        out[("generate", case, "new tokens per second")] = {"benchmark": "generate", "case": case, "metric": "new tokens per second",
                                                            "unit": "tokens/s", "ctxkit": float(tps), "device": device, "date": date}
    return out


def _load(path: Path) -> list:
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, list) else data.get("records", [])


# What names a ctxkit configuration inside a case: the plan (", --fast PLAN") of a tree with
# fast plans, or the variant in parentheses of an older one. Cases are matched without it,
# and each side keeps its best configuration (both trees run the same set of them).
_CONFIGURATION = re.compile(r"(, --fast \S+$)|( \((?:ctxkit )?graphs[^)]*\)$)|( \(best ctxkit variant\)$)")


def case_key(case: str) -> str:
    """A record's case without the configuration that produced it."""
    return _CONFIGURATION.sub("", case)


def _better(a: dict, b: dict) -> bool:
    lower = str(a.get("unit", "")).split("/")[0].strip() in LOWER_IS_BETTER
    return a["ctxkit"] < b["ctxkit"] if lower else a["ctxkit"] > b["ctxkit"]


def _records(folder: Path) -> dict:
    out = {}
    if not any(r.get("benchmark") == "generate" for p in folder.glob("*.json") for r in _load(p)):
        out.update(_generate_from_log(folder))
    for path in sorted(folder.glob("*.json")):
        for r in _load(path):
            if "ctxkit" in r and isinstance(r.get("ctxkit"), (int, float)):
                key = (r["benchmark"], case_key(r["case"]), r["metric"])
                if key not in out or _better(r, out[key]):
                    out[key] = r
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--change", required=True, help="what changed, for the records")
    parser.add_argument("--tolerance", type=float, default=0.03)
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--command", default="bash benchmarks/gpu_regression.sh (before and after) && python benchmarks/gpu_regression.py")
    args = parser.parse_args(argv)
    before, after = _records(args.before), _records(args.after)
    rows, worse = [], []
    for key in sorted(before.keys() & after.keys()):
        b, a = before[key], after[key]
        lower = str(a.get("unit", "")).split("/")[0].strip() in LOWER_IS_BETTER
        gain = (b["ctxkit"] / a["ctxkit"]) if lower else (a["ctxkit"] / b["ctxkit"])
        rows.append({"benchmark": key[0], "case": key[1], "metric": key[2], "unit": a.get("unit"), "ctxkit": a["ctxkit"],
                     "peer_name": "ctxkit before the change", "peer": b["ctxkit"], "speedup": round(gain, 4),
                     "device": a.get("device"), "date": a.get("date"), "command": args.command, "change": args.change})
        if gain < 1 - args.tolerance:
            worse.append(rows[-1])
    width = max((len(f"{r['benchmark']}: {r['case']} [{r['metric']}]") for r in rows), default=20)
    for r in rows:
        label = f"{r['benchmark']}: {r['case']} [{r['metric']}]"
        print(f"{label:<{width}}  before {r['peer']:>12.4g}  after {r['ctxkit']:>12.4g}  {r['unit'] or '':<12} x{r['speedup']:.3f}")
    print(f"{len(rows)} figures compared; {len(worse)} more than {args.tolerance:.0%} worse; "
          f"only before: {len(before.keys() - after.keys())}, only after: {len(after.keys() - before.keys())}")
    if args.results:
        args.results.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
