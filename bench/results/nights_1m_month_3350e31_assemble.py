"""How bench/results/nights_1m_month_3350e31.json was assembled (run from the repository root):

    python bench/results/nights_1m_month_3350e31_assemble.py /work/nights1m

The run `python bench/nights.py --continue-from bench/results/nights_1m_more_03e5c2b.json --nights 21
--compare-after --output-json bench/results/nights_1m_month_3350e31.json` (at 3350e31) finished its 21 nights and
died in the fresh build that follows them (no space left on device: 21 nights of docs-table rewrites, none yet
past retention, had filled the disk), before writing its JSON. Its artefacts are whole, and this script assembles
the results from them, without guessing:
- per night, from its own log (`WORK/month.log`, a line per night printed by bench/nights.py) and the nightly's
  summary (`WORK/logs/night-NN.json`): seconds (0.1 s), fraction of the full build (those seconds over the earlier
  run's full build, 915.48 s), steps, segments, tombstones, merged segments;
- failed requests and the versions answered, from the server trickle's log (`WORK/requests.jsonl`, every request);
- follow seconds, approximately: publish times are the corpus_stats commits' timestamps (Delta's commitInfo), and
  request times are relative to the run's start, which the log pins only to within about +-0.5 s (the first
  request, t=28.765 s, came right after the line "[07:37:51] first search"). Peak memory per night is not in the
  artefacts (null).
The comparison with a fresh build of the last snapshot was then run alone with the same function
(`bench.nights.against_fresh_build`) into `WORK/compare_month.json`, and is merged in here.
"""

import json
import re
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nights import chain_of, chain_summary  # noqa: E402

FULL_BUILD_SECONDS = 915.48  # bench/results/nights_1m_dfd1d7f.json
T0 = datetime(2026, 12, 6, 7, 37, 22, 700000, tzinfo=timezone.utc).timestamp()  # +-0.5 s, see above
LINE = re.compile(r"night (\d+)/30: 1% changed, ([\d.]+) s .*?, v(\d+) (new|unchanged), (\d+) segments, (\d+) "
                  r"tombstones(?:, merged (\[[\d, ]*\]))?")


def publish_times(wh: Path) -> dict[int, float]:
    """index_version -> the wall time of the corpus_stats commit that published it."""
    out = {}
    for commit in sorted((wh / "corpus_stats" / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines()]
        stamp = next(a["commitInfo"]["timestamp"] for a in actions if "commitInfo" in a) / 1000
        for a in actions:
            if "add" in a and "index_version" in a["add"].get("stats", ""):
                v = json.loads(a["add"]["stats"])["minValues"]["index_version"]
                out.setdefault(v, stamp)
    return out


def main(work: Path) -> None:
    requests = [json.loads(line) for line in (work / "requests.jsonl").read_text().splitlines()]
    published = publish_times(work / "wh-nights")
    nights = []
    for m in LINE.finditer((work / "month.log").read_text()):
        i, seconds, v = int(m[1]), float(m[2]), int(m[3])
        summary = json.loads((work / "logs" / f"night-{i:02d}.json").read_text())
        at = published[v] - T0
        first = next((r for r in requests if r["t"] >= at and r["status"] == 200 and r["index_version"] >= v), None)
        nights.append({
            "night": i, "changed_fraction": 0.01, "snapshot": str(work / f"snapshot-{i:02d}.parquet"),
            "seconds": seconds, "nightly_seconds": summary["seconds"],
            "fraction_of_full_build": round(seconds / FULL_BUILD_SECONDS, 4), "index_version": v,
            "new_version": m[4] == "new", "segments": int(m[5]), "num_tombstones": int(m[6]),
            "merged_segments": json.loads(m[7]) if m[7] else [], "compacted": int(m[5]) == 1,
            "step_seconds": {k: round(s, 2) for k, s in summary["step_seconds"].items()},
            "ingested": summary["ingested"], "enriched": summary["enriched"],
            "published_at_s": round(at, 2), "follow_seconds": round(first["t"] - at, 2) if first else None,
            "failed_requests": sum(1 for r in requests if r["status"] != 200 and (
                at - seconds <= r["t"] < at)),  # from the night's start to its publish (the next night's start)
        })
    assert [n["night"] for n in nights] == list(range(10, 31)), [n["night"] for n in nights]
    compare = json.loads((work / "compare_month.json").read_text())
    fractions = [n["fraction_of_full_build"] for n in nights]
    follows = [n["follow_seconds"] for n in nights if n["follow_seconds"] is not None]
    failed = [r for r in requests if r["status"] != 200]
    earlier = Path("bench/results/nights_1m_more_03e5c2b.json")
    out = {
        "docs": 1_000_000, "nights": nights, "continued_from": str(earlier),
        "night_fraction_mean": round(statistics.mean(fractions), 4), "night_fraction_max": max(fractions),
        "follow_seconds_max": max(follows), "follow_seconds_approximate": "+-0.5 s: see the assembling script",
        "failed_requests": len(failed),
        "rankings_equal_full_rebuild": compare["compare"]["rankings_equal"],
        "query_speed_after_nights_vs_fresh": round(compare["compare"]["qps_nights"] / compare["compare"]["qps_fresh"], 4),
        "cold_load_seconds": round(compare["cold_load"]["seconds"], 3),
        "full_build_seconds": FULL_BUILD_SECONDS, "changed_fraction": 0.01, "cores": 2,
        "command": "python bench/nights.py --continue-from bench/results/nights_1m_more_03e5c2b.json --nights 21 "
                   "--compare-after --output-json bench/results/nights_1m_month_3350e31.json (died in the fresh "
                   "build; assembled by bench/results/nights_1m_month_3350e31_assemble.py)",
        "git_commit": "3350e31", "requests": len(requests),
        "versions_answered": sorted({r["index_version"] for r in requests if r["index_version"] is not None}),
        "fresh_build": compare["fresh_build"], "compare": compare["compare"], "cold_load": compare["cold_load"],
        "compare_git_commit": compare["git_commit"],
        "chain": chain_summary(chain_of(earlier) + [{**n, "git_commit": "3350e31"} for n in nights]),
    }
    Path("bench/results/nights_1m_month_3350e31.json").write_text(json.dumps(out, indent=1, default=str) + "\n")
    print({k: v for k, v in out.items() if not isinstance(v, (list, dict))})
    print(out["chain"])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
