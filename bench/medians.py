"""Median and range of every ratio over repeated runs of one benchmark: what a README or docs figure quotes.

    python bench/medians.py RUN1.json RUN2.json RUN3.json --what "..." --output-json OUT.json [--key seconds ...]

Reads each run's JSON (any bench/ script's output), finds every number whose key has "ratio" or "speedup" in its
name, or is one of the `--key` names (a figure that is not a ratio: a cold load's `seconds`), at any depth (a path
such as `datasets.scifact.k10.ratio_vs_bm25s_numba`), and writes OUT.json with `what` (how the runs were made:
commit, what else ran), `command` (this command line), `keys` (the `--key` names, when given), `summary` ({path:
{median, min, max, values}}) and `runs` (the runs whole), so the figure and the numbers behind it stay together.
Prints the summary as a table. A path missing from some run is an error: the runs must be of one benchmark.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

KEY_WORDS = ("ratio", "speedup")


def ratio_paths(node, prefix: str = "", keys: tuple[str, ...] = ()) -> dict[str, float]:
    """{dotted path: value} of every int or float under `node` whose own key names a ratio or a speed-up, or is one
    of `keys`."""
    found: dict[str, float] = {}
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if any(word in str(key) for word in KEY_WORDS) or key in keys:
                    found[path] = float(value)
            else:
                found.update(ratio_paths(value, path, keys))
    return found


def summarize(runs: list[dict], keys: tuple[str, ...] = ()) -> dict[str, dict]:
    per_run = [ratio_paths(run, keys=keys) for run in runs]
    paths = sorted(set().union(*per_run))
    missing = [(i, p) for p in paths for i, found in enumerate(per_run) if p not in found]
    if missing:
        i, p = missing[0]
        raise SystemExit(f"run {i + 1} has no {p}: the runs are not of one benchmark ({len(missing)} missing)")
    summary = {}
    for p in paths:
        values = [found[p] for found in per_run]
        summary[p] = {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}
    return summary


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="the runs' JSON files")
    ap.add_argument("--what", required=True, help="how the runs were made: the commit, what else was running")
    ap.add_argument("--output-json", type=Path, required=True)
    ap.add_argument("--key", action="append", default=[], help="also summarise the numbers under this key name")
    args = ap.parse_args(argv)
    if len(args.runs) < 3:
        print(f"warning: {len(args.runs)} runs; a quoted figure is the median of at least three", file=sys.stderr)
    runs = [json.loads(p.read_text(encoding="utf-8")) for p in args.runs]
    summary = summarize(runs, tuple(args.key))
    command = "python bench/medians.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    out = {"what": args.what, "command": command, **({"keys": args.key} if args.key else {}), "summary": summary,
           "runs": runs}
    args.output_json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    width = max((len(p) for p in summary), default=4)
    for path, s in summary.items():
        print(f"{path:<{width}}  {s['median']:.3f}  ({s['min']:.3f}-{s['max']:.3f})")
    print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
