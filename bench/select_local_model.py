"""Choose the `local` backend's default model and prompt format by measurement, on train/dev splits only.

    python bench/select_local_model.py [--configs ...] [--scifact-queries 8] [--nfcorpus-queries 6]
                                       [--output-json bench/results/select_local_model.json]

Document subset: for a seeded sample of judged queries of scifact TRAIN and nfcorpus DEV (never test), the
relevant documents plus the `--competitors` best-ranked non-relevant BM25 hits of each query, so the documents
a query must separate are all enriched. Each config (packaged model x prompt format x JSON-constrained
decoding or not) enriches every subset document through `LocalLLMActor` (the code `sira enrich` runs), with
the dataset's task prompt (`DATASET_TASKS`), max_n 3 and the default decoding (temperature 0.4, seed 42,
max_tokens 160).

Reported per config: parse success (no row error, usable phrases), proposed phrases/doc, the share of them
not already in the document, phrases/doc kept by the corpus-side DF filter (tau 0.05), the share of proposed
phrases copied from the few-shot examples, seconds/doc and output tokens/doc; and the retrieval effect: the
`sira` preset over the whole corpus, with the kept phrases of the subset documents appended to their text
(an approximation of injection: a bigram may span two phrases), nDCG@10 / Recall@100 of the sampled queries
against plain BM25. The subset is small and the machine shared: read seconds/doc as indicative.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import re
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from sira.pipelines.enrichment.backend_config import BackendConfig  # noqa: E402
from sira.pipelines.enrichment.local_llm import FEWSHOT_EXAMPLES, LocalLLMActor  # noqa: E402
from sira.core.analysis import Analyzer  # noqa: E402
from sira.core.datasets import RawRecord, RecordError, iter_lines, parse_record, resolve_dataset  # noqa: E402
from sira.core.dfstats import corpus_side_filter  # noqa: E402
from sira.core.enrichment import document_input, load_template, parse_phrases, task_for_dataset  # noqa: E402
from sira.core.memory_index import build_searcher, index_text  # noqa: E402
from sira.core.metrics import evaluate_run  # noqa: E402
from sira.core.presets import get_preset  # noqa: E402

SMOLLM2 = "smollm2-135m-instruct-q4_1"
GEMMA3 = "gemma3-270m-q4_k_m"
# name -> (model, prompt format, JSON-constrained decoding)
CONFIGS = {
    "gemma3/completion-fewshot/json": (GEMMA3, "completion-fewshot", True),
    "smollm2/chat-fewshot/json": (SMOLLM2, "chat-fewshot", True),
    "smollm2/chat/json": (SMOLLM2, "chat", True),
    "gemma3/completion/json": (GEMMA3, "completion", True),
    "smollm2/chat/free": (SMOLLM2, "chat", False),
}
SPLITS = {"scifact": "train", "nfcorpus": "dev"}
METRICS = ("ndcg@10", "mrr@100", "recall@100")
MAX_N = 3
TAU = 0.05
_WORDS = re.compile(r"[^a-z0-9]+")
EXAMPLE_PHRASES = {p.lower() for _, answer in FEWSHOT_EXAMPLES for p in answer}


def copied_from_prompt(phrase: str, instructions: str) -> bool:
    """A phrase lifted from the prompt rather than the document: a few-shot answer, or words of the instructions
    (tiny models answer "phrase", "term", "evidence"). Such phrases pass the DF filter and only add noise."""
    words = _WORDS.sub(" ", phrase.lower()).strip()
    return phrase.lower() in EXAMPLE_PHRASES or f" {words} " in f" {_WORDS.sub(' ', instructions.lower())} "



def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_corpus(dataset) -> dict[str, tuple[str, str]]:
    docs: dict[str, tuple[str, str]] = {}
    for n, line in iter_lines(dataset.corpus_path):
        try:
            doc_id, title, text = parse_record(RawRecord(str(dataset.corpus_path), n, line))
        except RecordError:
            continue
        docs.setdefault(doc_id, (title, text))
    return dict(sorted(docs.items()))


def prepare(name: str, n_queries: int, competitors: int, max_relevant: int, seed: int) -> dict:
    """Corpus, sampled train/dev queries, the document subset to enrich, the DF table and the baseline run."""
    dataset = resolve_dataset(f"beir:{name}")
    split = SPLITS[name]
    docs = load_corpus(dataset)
    queries = dataset.queries(split)
    qrels = {q: {d: r for d, r in rel.items() if r > 0 and d in docs} for q, rel in dataset.qrels(split).items()}
    eligible = sorted(q for q, rel in qrels.items() if 1 <= len(rel) <= max_relevant)
    sampled = sorted(random.Random(seed).sample(eligible, min(n_queries, len(eligible))))
    preset = get_preset("sira")
    analyzer = Analyzer(preset.analyzer)
    searcher = build_searcher(((d, t, x) for d, (t, x) in docs.items()), preset)
    baseline = {q: {h.doc_id: h.score for h in searcher.search(queries[q], k=100)} for q in sampled}
    subset = set()
    for q in sampled:
        subset |= set(qrels[q])
        subset |= set([d for d in baseline[q] if d not in qrels[q]][:competitors])
    df: Counter = Counter()
    for title, text in docs.values():
        df.update(set(analyzer.terms(index_text(title, text))))
    return {"name": name, "split": split, "docs": docs, "queries": {q: queries[q] for q in sampled},
            "qrels": {q: qrels[q] for q in sampled}, "subset": sorted(subset), "df": df, "analyzer": analyzer,
            "preset": preset, "baseline": evaluate_run({q: qrels[q] for q in sampled}, baseline, METRICS)}


def enrich_subset(actor: LocalLLMActor, data: dict) -> list[dict]:
    template = load_template("doc", task_for_dataset(data["name"]))
    analyzer, df, num_docs = data["analyzer"], data["df"], len(data["docs"])
    instructions = template.render("", MAX_N)
    rows = []
    for i, doc_id in enumerate(data["subset"]):
        title, text = data["docs"][doc_id]
        out = actor.generate(template.render(document_input(title, text), MAX_N))
        phrases, parse_error = parse_phrases(out["raw_output"], max_words=MAX_N) if not out["error"] else ([], None)
        decisions = corpus_side_filter(phrases, analyzer.tokens(index_text(title, text)), analyzer,
                                       lambda terms: {t: df[t] for t in terms}, num_docs, TAU)
        rows.append({"doc_id": doc_id, "error": out["error"] or parse_error, "phrases": phrases,
                     "kept": [d.phrase for d in decisions if d.kept],
                     "novel": sum(d.reason not in ("in document", "no terms") for d in decisions),
                     "prompt_copies": sum(copied_from_prompt(p, instructions) for p in phrases),
                     "useful_kept": sum(not copied_from_prompt(d.phrase, instructions) for d in decisions if d.kept),
                     "latency_s": out["latency_ms"] / 1000, "input_tokens": out["input_tokens"],
                     "output_tokens": out["output_tokens"], "raw_output": out["raw_output"]})
        if (i + 1) % 10 == 0:
            log(f"    {data['name']}: {i + 1}/{len(data['subset'])} docs")
    return rows


def retrieval_with(data: dict, rows: list[dict]) -> dict[str, float]:
    kept = {r["doc_id"]: r["kept"] for r in rows}
    enriched = ((d, t, x + "".join(f" . {p}" for p in kept.get(d, ()))) for d, (t, x) in data["docs"].items())
    searcher = build_searcher(enriched, data["preset"])
    run = {q: {h.doc_id: h.score for h in searcher.search(text, k=100)} for q, text in data["queries"].items()}
    return evaluate_run(data["qrels"], run, METRICS)


def summarize(rows: list[dict]) -> dict:
    n = len(rows)
    proposed = sum(len(r["phrases"]) for r in rows)
    return {
        "docs": n,
        "parse_ok": sum(r["error"] is None for r in rows) / n,
        "phrases_per_doc": proposed / n,
        "novel_share": sum(r["novel"] for r in rows) / proposed if proposed else 0.0,
        "kept_per_doc": sum(len(r["kept"]) for r in rows) / n,
        "prompt_copy_share": sum(r["prompt_copies"] for r in rows) / proposed if proposed else 0.0,
        "useful_kept_per_doc": sum(r["useful_kept"] for r in rows) / n,
        "seconds_per_doc": sum(r["latency_s"] for r in rows) / n,
        "input_tokens_per_doc": sum(r["input_tokens"] for r in rows) / n,
        "output_tokens_per_doc": sum(r["output_tokens"] for r in rows) / n,
        "errors": dict(Counter((r["error"] or "")[:40] for r in rows if r["error"]).most_common(3)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--scifact-queries", type=int, default=8)
    parser.add_argument("--nfcorpus-queries", type=int, default=4)
    parser.add_argument("--competitors", type=int, default=2, help="non-relevant top BM25 hits enriched per query")
    parser.add_argument("--max-relevant", type=int, default=4, help="sample queries with at most this many relevant docs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", default=str(REPO_ROOT / "bench/results/select_local_model.json"))
    args = parser.parse_args(argv)

    started = time.perf_counter()
    datasets = []
    for name, n in (("scifact", args.scifact_queries), ("nfcorpus", args.nfcorpus_queries)):
        if n > 0:
            datasets.append(prepare(name, n, args.competitors, args.max_relevant, args.seed))
            d = datasets[-1]
            log(f"{name}/{d['split']}: {len(d['queries'])} queries, {len(d['subset'])} docs to enrich, "
                f"baseline nDCG@10 {d['baseline']['ndcg@10']:.4f}")

    results: dict = {}
    for config in args.configs:
        model, prompt_format, structured = CONFIGS[config]
        log(f"{config}: loading {model}")
        actor = LocalLLMActor(BackendConfig(model=model, structured_output=structured).model_dump_json(),
                              prompt_format=prompt_format)
        per_dataset, all_rows = {}, []
        for data in datasets:
            rows = enrich_subset(actor, data)
            all_rows += rows
            retrieval = retrieval_with(data, rows)
            per_dataset[data["name"]] = {**summarize(rows), "retrieval": retrieval,
                                         "delta": {m: retrieval[m] - data["baseline"][m] for m in METRICS},
                                         "rows": [{k: r[k] for k in ("doc_id", "phrases", "kept", "error")}
                                                  for r in rows]}
        del actor
        results[config] = {"model": model, "prompt_format": prompt_format, "structured_output": structured,
                           **summarize(all_rows), "datasets": per_dataset}
        log(f"{config}: done, {results[config]['seconds_per_doc']:.1f} s/doc")
        # Written after every config, so a run stopped early keeps what it measured.
        write_report(args, argv, datasets, results, time.perf_counter() - started)
    print_table(results, datasets, choose(results, datasets))
    log(f"wrote {args.output_json} ({time.perf_counter() - started:.0f} s)")
    return 0


def choose(results: dict, datasets: list[dict]) -> str:
    """The pick: largest mean nDCG@10 gain over the datasets, then MRR@100 gain, then more kept phrases per
    document that were not copied from the prompt."""
    def rank_key(name: str):
        r = results[name]
        def gain(metric: str) -> float:
            return sum(r["datasets"][d["name"]]["delta"][metric] for d in datasets) / len(datasets)
        return (round(gain("ndcg@10"), 6), round(gain("mrr@100"), 6), r["useful_kept_per_doc"])

    return max(results, key=rank_key)


def write_report(args, argv, datasets: list[dict], results: dict, seconds: float) -> None:
    report = {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python bench/select_local_model.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "settings": {"max_n": MAX_N, "tau": TAU, "preset": "sira", "seed": args.seed,
                     "competitors": args.competitors, "max_relevant": args.max_relevant,
                     "decoding": BackendConfig().model_dump(include={"temperature", "seed", "max_tokens"})},
        "datasets": {d["name"]: {"split": d["split"], "queries": sorted(d["queries"]), "docs": len(d["subset"]),
                                 "baseline": d["baseline"]} for d in datasets},
        "configs": results,
        "chosen": choose(results, datasets),
        "seconds": seconds,
    }
    Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output_json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def print_table(results: dict, datasets: list[dict], chosen: str) -> None:
    names = [d["name"] for d in datasets]
    head = (f"{'config':32} {'parse ok':>8} {'phr/doc':>7} {'novel':>6} {'kept/doc':>8} {'copied':>6} {'useful':>6} "
            f"{'s/doc':>6} {'out tok':>7} " + " ".join(f"{'dnDCG@10 ' + n:>17} {'dMRR ' + n:>13}" for n in names))
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        deltas = " ".join(f"{r['datasets'][n]['delta']['ndcg@10']:>+17.4f} {r['datasets'][n]['delta']['mrr@100']:>+13.4f}"
                          for n in names)
        mark = " *" if name == chosen else ""
        print(f"{name + mark:32} {r['parse_ok']:>8.0%} {r['phrases_per_doc']:>7.2f} {r['novel_share']:>6.0%} "
              f"{r['kept_per_doc']:>8.2f} {r['prompt_copy_share']:>6.0%} {r['useful_kept_per_doc']:>6.2f} "
              f"{r['seconds_per_doc']:>6.1f} "
              f"{r['output_tokens_per_doc']:>7.1f} {deltas}")
    print("baseline nDCG@10: " + ", ".join(f"{d['name']} {d['baseline']['ndcg@10']:.4f}" for d in datasets)
          + "   (* = chosen: largest mean nDCG@10 gain, then MRR@100 gain, then useful kept/doc)")


if __name__ == "__main__":
    sys.exit(main())
