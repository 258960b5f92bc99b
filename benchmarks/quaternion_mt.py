"""Records of the Quaternion Transformer on Multi30k (issue 22.3): BLEU on test2016 of the
real translator and its quaternion versions at the same width and at about the same
parameter count, trained for the same wall-clock time on one GPU each (benchmarks/lectures_more.sh).

    python benchmarks/quaternion_mt.py OUT/mt --results benchmarks/results/quaternion_mt.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from harness import write_records

RUNS = {  # preset -> what it shows
    "transformer_3_256_8": "real-valued Transformer 3+3 x 256 (the reference)",
    "quaternion_3_256_8": "quaternion Transformer, same depth and width (quaternion projections and FFN)",
    "quaternion_3_448_8": "quaternion Transformer, width 448: about the reference's parameter count",
}


def bleu(log: Path) -> float:
    """The BLEU of a ``ctxkit translate --ref`` run: its last JSON line."""
    return json.loads(log.read_text().strip().splitlines()[-1])["bleu"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", help="the folder holding one translate-train run per preset")
    parser.add_argument("--device", required=True, help="the card the runs used, e.g. 'NVIDIA H200'")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--results", default=None, help="records file (default: benchmarks/results/quaternion_mt.json)")
    args = parser.parse_args(argv)
    ref = json.loads((Path(args.runs) / "transformer_3_256_8" / "results.json").read_text())
    ref_bleu = {b: bleu(Path(args.runs) / "transformer_3_256_8" / f"test2016_beam{b}.log") for b in (4, 1)}
    records, rows = [], []
    for preset, what in RUNS.items():
        folder = Path(args.runs) / preset
        s = json.loads((folder / "results.json").read_text())
        for beams in (4, 1):
            value = bleu(folder / f"test2016_beam{beams}.log")
            records.append({
                "task": "translation de-en (Multi30k)", "split": "test2016", "metric": f"BLEU (sacreBLEU, {'beam 4' if beams > 1 else 'greedy'})",
                "value": value, "model": f"{preset}: {what}", "peer_name": "transformer_3_256_8 (real-valued)",
                "peer_value": ref_bleu[beams], "parameters": s["parameters"], "peer_parameters": ref["parameters"],
                "steps": s["steps"], "train_time_s": s["wall_time_s"], "best_epoch": s["best_epoch"],
                "valid_bleu": round(s["valid_bleu"], 2), "device": args.device, "date": args.date,
                "command": f"bash benchmarks/lectures_more.sh 1 ... (MINUTES=2.2: ctxkit translate-train --preset {preset} --dropout 0.2 "
                           f"--max-minutes 2.2; ctxkit translate --beams {beams})"})
        rows.append(f"| {preset} | {s['parameters'] / 1e6:.2f} M | {s['steps']} | {s['wall_time_s']:.0f} s | "
                    f"{bleu(folder / 'test2016_beam4.log'):.2f} | {bleu(folder / 'test2016_beam1.log'):.2f} |")
    write_records("quaternion_mt.json", records, args.results)
    print("| preset | parameters | steps | train time | test2016 BLEU beam 4 | greedy |\n|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
