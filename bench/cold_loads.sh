#!/usr/bin/env bash
# Cold loads of a warehouse's newest `sira` index by two commits, alternating: each load a fresh process (bench/scale.py
# --load: load_searcher with an empty SIRA_SHARD_CACHE), the baseline first in every round. Round 0 is a warm-up
# (numba compiles each worktree's kernels once) and is not kept. Each commit runs from its own worktree
# (bench/worktree.sh), so the code measured is the commit's.
#
#   bench/cold_loads.sh WAREHOUSE ROUNDS OUT_DIR BASELINE_DIR CANDIDATE_DIR
#   python bench/medians.py OUT_DIR/round_*.json --key seconds --key baseline_seconds --what "..." --output-json F
#
# OUT_DIR/round_R.json: the candidate's load (seconds, memory, segments, postings), the baseline's seconds and
# `speedup_vs_baseline` (baseline seconds over candidate seconds).
set -euo pipefail
wh=${1:?usage}; rounds=${2:?usage}; out=${3:?usage}; base=${4:?usage}; cand=${5:?usage}
python=$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python
mkdir -p "$out"
load() {  # load DIR JSON: one cold load by the code in worktree DIR
  local cache
  cache=$(mktemp -d)
  (cd "$1" && SIRA_SHARD_CACHE=$cache PYTHONPATH=$1 "$python" bench/scale.py --load "$wh" 2>"$2.err" | tail -1 >"$2")
  rm -rf "$cache"
}
for r in $(seq 0 "$rounds"); do
  load "$base" "$out/baseline_$r.json"
  load "$cand" "$out/candidate_$r.json"
  [ "$r" -eq 0 ] && continue
  "$python" - "$out" "$r" "$(git -C "$base" rev-parse --short HEAD)" "$(git -C "$cand" rev-parse --short HEAD)" <<'EOF'
import json, sys
out, r, base_rev, cand_rev = sys.argv[1:]
cand = json.load(open(f"{out}/candidate_{r}.json"))
base = json.load(open(f"{out}/baseline_{r}.json"))
row = {**cand, "commit": cand_rev, "baseline_commit": base_rev, "baseline_seconds": base["seconds"],
       "baseline_peak_rss_mb": base["peak_rss_mb"], "speedup_vs_baseline": base["seconds"] / cand["seconds"]}
json.dump(row, open(f"{out}/round_{r}.json", "w"), indent=1)
print(f"round {r}: {base_rev} {base['seconds']:.2f} s, {cand_rev} {cand['seconds']:.2f} s")
EOF
done
