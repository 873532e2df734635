"""SPLADE-tiny as the corpus side: choose its settings on a train/dev split, report on test, against the encoder
proposer's corpus side (the CPU default) with the same query side.

Everything runs in memory with the sira_core pieces the jobs use (analysis, corpus-side filter and injection,
query-side filter, RetrievalProgram, BM25 kernel), as bench/select_encoder_proposer.py does; SPLADE weights and
encoder vectors are computed once per dataset and cached under --cache (.npz / .npy, not committed).

    python bench/select_splade_proposer.py --dataset beir:scifact --split train --output-json F   # select
    python bench/select_splade_proposer.py --dataset beir:scifact --split test --only CONFIG_JSON   # report

Rows: `bm25`; `encoder-doc` (the encoder proposer's corpus side at its defaults); `splade-doc` per
(doc_n, min_weight); each with no query side and with the encoder query side at its defaults (query_n 5, w 0.25);
and `splade+encoder-doc` (both corpus sides' phrases). Per row: nDCG@10, Recall@10/100, and against bm25 the paired
randomization test (10,000 seeded swaps) with per-query wins / losses.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np
from ranx import Qrels, Run, evaluate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from select_encoder_proposer import (NearestEntries, _df_table, _floats, _ints, _surface_vectors,  # noqa: E402
                                     _versus, cached_encode)
from sira.pipelines.enrichment.encoder import MiniLMEncoder  # noqa: E402
from sira.pipelines.enrichment.splade import SpladeEncoder  # noqa: E402
from sira.core.analysis import Analyzer, index_text, ngrams  # noqa: E402
from sira.core.datasets import resolve_dataset  # noqa: E402
from sira.core.memory_index import build_searcher  # noqa: E402
from sira.core.presets import get_preset  # noqa: E402
from sira.core.proposers import (ENCODER_DEFAULT_W, EncoderProposerConfig, SpladeProposerConfig,  # noqa: E402
                                 Vocabulary, held_terms, nearest_entries, sparse_expansion, surface_forms,
                                 vocabulary_entries)
from sira.core.query_path import QueryPath  # noqa: E402
from sira.core.retriever import Retriever, hits_by_query  # noqa: E402

METRICS = ["ndcg@10", "recall@10", "recall@100"]
TOP = 64  # SPLADE entries kept per document in the cache


def cached_splade(encoder: SpladeEncoder, texts: list[str], path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    if path.exists():
        with np.load(path) as z:  # each z[name] reads the array from the file again: once each, here
            o, ids, weights = z["offsets"], z["ids"], z["weights"]
        if len(o) == len(texts) + 1:
            return [(ids[o[i]:o[i + 1]], weights[o[i]:o[i + 1]]) for i in range(len(texts))]
    t = time.perf_counter()
    out = encoder.encode(texts, top=TOP)
    print(f"  SPLADE over {len(texts)} texts in {time.perf_counter() - t:.0f} s -> {path.name}", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    offsets = np.r_[0, np.cumsum([len(i) for i, _ in out])]
    np.savez(path, offsets=offsets, ids=np.concatenate([i for i, _ in out]) if out else np.zeros(0, np.int64),
             weights=np.concatenate([w for _, w in out]) if out else np.zeros(0, np.float32))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--split", required=True)
    ap.add_argument("--preset", default="sira")
    ap.add_argument("--cache", default=".cache/encoder")
    ap.add_argument("--doc-n", default="5,10,20")
    ap.add_argument("--min-weight", default="0,0.5,1.0")
    ap.add_argument("--tau", type=float, default=0.05)
    ap.add_argument("--no-encoder", action="store_true",
                    help="SPLADE's corpus side against bm25 only: no encoder rows, no query side (no MiniLM encoding; "
                         "the encoder's doc-side test numbers are in bench/results/encoder_test_NAME.json)")
    ap.add_argument("--only", help="JSON list of rows to report (name, doc_n, min_weight, query_side)")
    ap.add_argument("--output-json")
    args = ap.parse_args()

    ds = resolve_dataset(args.dataset)
    preset = get_preset(args.preset)
    analyzer = Analyzer(preset.analyzer)
    docs = []
    with (gzip.open if str(ds.corpus_path).endswith(".gz") else open)(ds.corpus_path, "rt", encoding="utf-8") as fh:
        for line in fh:
            o = json.loads(line)
            docs.append((str(o["_id"]), o.get("title") or "", o.get("text") or ""))
    qrels, queries = ds.qrels(args.split), ds.queries(args.split)
    cache = Path(args.cache) / ds.name
    print(f"{ds.name}/{args.split}: {len(docs)} docs, {len(queries)} queries", flush=True)
    texts = [index_text(t, x) for _, t, x in docs]
    ids = [d[0] for d in docs]
    qids = list(queries)

    splade = SpladeEncoder()
    sparse = cached_splade(splade, texts, cache / "splade-docs.npz")
    enc_cfg = EncoderProposerConfig(vocabulary_tau=args.tau)
    if not args.no_encoder:
        encoder = MiniLMEncoder()
        doc_vecs = cached_encode(encoder, texts, cache / "docs.npy")
        query_vecs = cached_encode(encoder, [queries[q] for q in qids], cache / f"queries-{args.split}.npy")
        doc_held = [held_terms(analyzer, t) for t in texts]
        query_held = [held_terms(analyzer, queries[q]) for q in qids]
        term_df: dict[str, int] = {}
        for t in texts:
            for term in set(ngrams(analyzer.tokens(t), 2)):
                term_df[term] = term_df.get(term, 0) + 1
        entries = vocabulary_entries(term_df, surface_forms(texts, analyzer, bigrams=True), len(docs), enc_cfg)
        surfaces = [e.surface for e in entries]
        vocabulary = Vocabulary([e.term for e in entries], surfaces, np.array([e.df for e in entries]),
                                _surface_vectors(encoder, surfaces, cache))
        encoder_phrases = {i: p.phrases for i, p in zip(ids, nearest_entries(doc_vecs, doc_held, vocabulary, enc_cfg))}

    def splade_phrases(doc_n: int, min_weight: float) -> dict[str, list[str]]:
        cfg = SpladeProposerConfig(proposals=doc_n, min_weight=min_weight)
        return {i: sparse_expansion([splade.vocabulary[t] for t in tok], w, text, analyzer, cfg).phrases
                for i, (tok, w), text in zip(ids, sparse, texts)}

    if args.only:
        grid = json.loads(args.only)
    else:
        grid = [dict(name="encoder-doc")] + [dict(name="splade-doc", doc_n=n, min_weight=m)
                                             for n in _ints(args.doc_n) for m in _floats(args.min_weight)]
        grid = [dict(r, query_side=qs) for r in grid for qs in ((False,) if args.no_encoder else (False, True))
                if not (args.no_encoder and r["name"] == "encoder-doc")]
    results, baseline_run = [], None
    for row_cfg in [dict(name="bm25", query_side=False)] + grid:
        started = time.perf_counter()
        name = row_cfg["name"]
        if name == "bm25":
            phrases = None
        elif name == "encoder-doc":
            phrases = encoder_phrases
        elif name == "splade-doc":
            phrases = splade_phrases(row_cfg["doc_n"], row_cfg["min_weight"])
        elif name == "splade+encoder-doc":
            sp = splade_phrases(row_cfg["doc_n"], row_cfg["min_weight"])
            phrases = {i: encoder_phrases[i] + sp[i] for i in ids}
        else:
            raise SystemExit(f"unknown row {name!r}")
        searcher = build_searcher(docs, preset, phrases=phrases, tau=args.tau)
        path = QueryPath(searcher, analyzer, searcher.num_docs, df_table=_df_table(searcher), tau=args.tau)
        proposer = NearestEntries([queries[q] for q in qids], query_vecs, query_held, vocabulary,
                                  enc_cfg) if row_cfg["query_side"] else None
        _, hits = Retriever(path, proposer, w=ENCODER_DEFAULT_W, k=100).run({q: queries[q] for q in qids})
        run = {q: {d: s for d, s in h.items() if not (ds.queries_are_documents and d == q)}
               for q, h in ({q: {} for q in qids} | hits_by_query(hits)).items()}
        run = {q: h or {"__none__": 0.0} for q, h in run.items()}
        scores = evaluate(Qrels.from_dict(qrels), Run.from_dict(run), METRICS, make_comparable=True)
        row = {**row_cfg, **{m: round(float(scores[m]), 4) for m in METRICS},
               "seconds": round(time.perf_counter() - started, 1)}
        if baseline_run is None:
            baseline_run = run
        else:
            row.update(_versus(qrels, baseline_run, run))
        results.append(row)
        print(json.dumps(row), flush=True)
    out = {"dataset": ds.name, "split": args.split, "preset": args.preset, "tau": args.tau, "results": results}
    for query_side in (False, True):
        rows = [r for r in results if r["name"].startswith("splade") and r["query_side"] == query_side]
        if rows:
            out[f"best_splade_query_side_{str(query_side).lower()}"] = max(rows, key=lambda r: r["ndcg@10"])
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
