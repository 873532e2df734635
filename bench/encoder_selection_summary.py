"""Rank the encoder proposer's settings by their mean nDCG@10 gain over BM25 on scifact train and nfcorpus dev.

    python bench/encoder_selection_summary.py [--output-json bench/results/encoder_selection_summary.json]
    python bench/encoder_selection_summary.py --encoder bge-small-en-v1.5   # -> encoder_selection_summary_bge.json

Reads the committed grids of bench/select_encoder_proposer.py (bench/results/encoder_selection_scifact_train.json,
bench/results/encoder_selection_nfcorpus_dev.json, or encoder_selection_bge_*.json for bge-small; nothing is rerun)
and reports, for every setting that both grids hold (doc proposals, query proposals, vocabulary, tau, w, minimum
cosine), each split's nDCG@10, its gain over the split's BM25 row
(from the files' 4-decimal values), p and wins / losses, and the mean of the two gains, best first. Also the
largest change of nDCG@10 that tau alone makes on scifact train (the one grid with several tau) for each vocabulary.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "bench/results"
# The grids of each encoder (all-MiniLM-L6-v2's kept their names from before the encoder was a setting).
GRIDS = {"all-MiniLM-L6-v2": ("", "encoder_selection_summary.json"),
         "bge-small-en-v1.5": ("bge_", "encoder_selection_summary_bge.json")}
KEY = ("doc_n", "query_n", "entries", "tau", "w", "min_similarity")
DEFAULT_MIN_SIMILARITY = 0.2  # the grids written before the floor was swept ran at the default


def load(name: str) -> tuple[float, dict]:
    rows = json.loads((RESULTS / name).read_text())["results"]
    base = next(r for r in rows if r.get("name") == "bm25")["ndcg@10"]
    return base, {tuple(r.get(k, DEFAULT_MIN_SIMILARITY) for k in KEY): r for r in rows
                  if r.get("name") != "bm25" and (r["doc_n"] or r["query_n"])}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", default="all-MiniLM-L6-v2", choices=sorted(GRIDS))
    parser.add_argument("--output-json", help="default: bench/results/encoder_selection_summary[_bge].json")
    args = parser.parse_args(argv)
    prefix, output = GRIDS[args.encoder]
    splits = {"scifact_train": f"encoder_selection_{prefix}scifact_train.json",
              "nfcorpus_dev": f"encoder_selection_{prefix}nfcorpus_dev.json"}
    grids = {split: load(name) for split, name in splits.items()}
    common = set.intersection(*(set(rows) for _, rows in grids.values()))
    ranked = []
    for key in common:
        entry = dict(zip(KEY, key))
        gains = []
        for split, (base, rows) in grids.items():
            r = rows[key]
            gain = round(r["ndcg@10"] - base, 4)
            gains.append(gain)
            entry[split] = {"bm25": base, "ndcg@10": r["ndcg@10"], "delta": gain, "p_value": r["p_value"],
                            "wins": r["wins"], "losses": r["losses"]}
        entry["mean_delta"] = round(sum(gains) / len(gains), 5)
        ranked.append(entry)
    ranked.sort(key=lambda e: (-e["mean_delta"], e["doc_n"], e["query_n"], e["entries"], e["w"], e["min_similarity"]))

    _, scifact = grids["scifact_train"]
    by_setting = defaultdict(list)
    for (doc_n, query_n, entries, tau, w, floor), r in scifact.items():
        by_setting[(doc_n, query_n, entries, w, floor)].append(r["ndcg@10"])
    tau_spread = {}
    for (_, _, entries, w, _), values in by_setting.items():
        if len(values) > 1:
            spread = round(max(values) - min(values), 4)
            name = f"{entries}, w {w}"
            tau_spread[name] = max(tau_spread.get(name, 0.0), spread)

    result = {
        "command": "python bench/encoder_selection_summary.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "encoder": args.encoder,
        "sources": {split: f"bench/results/{name}" for split, name in splits.items()},
        "ranked": ranked,
        "scifact_train_max_ndcg_change_over_tau": dict(sorted(tau_spread.items())),
    }
    Path(args.output_json or RESULTS / output).write_text(json.dumps(result, indent=2) + "\n")
    for e in ranked:
        cells = (f"{e[s]['ndcg@10']} ({e[s]['delta']:+.4f}, p {e[s]['p_value']}, {e[s]['wins']}/{e[s]['losses']})"
                 for s in splits)
        print(*(e[k] for k in KEY), e["mean_delta"], *cells)
    print(json.dumps(result["scifact_train_max_ndcg_change_over_tau"], indent=2))
    return result


if __name__ == "__main__":
    main()
