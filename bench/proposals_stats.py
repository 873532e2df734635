"""Counts over the committed proposal files of the embedded LLM (bench/results/proposals/*.parquet).

    python bench/proposals_stats.py [--output-json bench/results/proposals_stats.json]

Reads each file as it is (no model, no warehouse, no network) and reports per file: answered documents (the file
holds answered rows only: `sira proposals export` leaves errors out), the corpus's document count where
`bench/results/run_NAME_encoder.json` records it (its `enrichment.documents`) and the difference, phrases proposed
(the sum of each row's parsed `phrases`; the DF filter, which needs the index, is not applied), the most frequent
proposed phrases (each counted once per answer), the answers that hold each phrase of the worked examples
(`pipelines/enrichment/local_prompts.py`: FEWSHOT_EXAMPLES, FEWSHOT_QUERY_EXAMPLES), and the median `latency_ms` per answered
document as the engine recorded it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import pyarrow.parquet as pq  # noqa: E402

from sira.pipelines.enrichment.local_prompts import FEWSHOT_EXAMPLES, FEWSHOT_QUERY_EXAMPLES  # noqa: E402

PROPOSALS = REPO_ROOT / "bench/results/proposals"
TOP = 10


def file_stats(path: Path) -> dict:
    rows = pq.read_table(path, columns=["doc_id", "phrases", "latency_ms", "error"]).to_pylist()
    per_answer = [set(r["phrases"] or []) for r in rows]
    counts = Counter(p for phrases in per_answer for p in phrases)
    example_phrases = sorted({p for _, ps in (*FEWSHOT_EXAMPLES, *FEWSHOT_QUERY_EXAMPLES) for p in ps})
    dataset = path.name.split("-", 1)[0]
    out = {
        "file": str(path.relative_to(REPO_ROOT)),
        "answered": len(rows),
        "rows_with_error": sum(1 for r in rows if r["error"]),
        "phrases_proposed": sum(len(r["phrases"] or []) for r in rows),
        "top_phrases": [[p, n] for p, n in counts.most_common(TOP)],
        "answers_with_example_phrase": {p: counts[p] for p in sorted(example_phrases, key=lambda p: -counts[p])},
        "median_latency_s": round(statistics.median(r["latency_ms"] for r in rows) / 1000, 2),
    }
    run = REPO_ROOT / f"bench/results/run_{dataset}_encoder.json"
    if run.exists():
        documents = json.loads(run.read_text())["enrichment"]["documents"]
        out.update(corpus_documents=documents, corpus_documents_from=str(run.relative_to(REPO_ROOT)),
                   not_in_file=documents - len(rows))
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-json", default=str(REPO_ROOT / "bench/results/proposals_stats.json"))
    args = parser.parse_args(argv)
    result = {
        "command": "python bench/proposals_stats.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "files": {p.name: file_stats(p) for p in sorted(PROPOSALS.glob("*.parquet"))},
    }
    Path(args.output_json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
