"""Choose the encoder proposer's CPU default by measurement on a train/dev split, and report on test.

Everything runs in memory with the same sira_core pieces the jobs use (analysis, vocabulary entries, nearest
entries, corpus-side filter and injection, query-side filter, RetrievalProgram, BM25 kernel); embeddings are
computed once per dataset by the packaged encoder and cached under --cache (as .npy, not committed).

    python bench/select_encoder_proposer.py --dataset beir:scifact --split train --output-json F   # select
    python bench/select_encoder_proposer.py --dataset beir:scifact --split test --only CONFIG_JSON   # report
    python bench/select_encoder_proposer.py --encoder bge-small-en-v1.5 ...   # the second embedded encoder
    python bench/select_encoder_proposer.py ... --baseline CONFIG_JSON --only CONFIG_JSON   # two settings, paired

Per configuration: nDCG@10, Recall@10/100, and against plain BM25 (or --baseline) the paired randomization test
p-value (`sira.core.metrics.paired_comparison`: 10,000 seeded random swaps; all-MiniLM-L6-v2's committed
`bench/results/encoder_*.json` were written with ranx's "fisher" test, whose parallel draws its seed does not fix:
a rerun moves p in the third decimal; the `*_bge_*` files with the seeded test) and per-query wins / losses on
nDCG@10.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
from ranx import Qrels, Run, evaluate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sira.pipelines.enrichment.encoder import SentenceEncoder  # noqa: E402
from sira.pipelines.enrichment.encoder_proposer import shared_encoder  # noqa: E402
from sira.core.analysis import Analyzer, index_text, ngrams  # noqa: E402
from sira.core.datasets import resolve_dataset  # noqa: E402
from sira.core.dfstats import DFTable  # noqa: E402
from sira.core.memory_index import build_searcher  # noqa: E402
from sira.core.presets import get_preset  # noqa: E402
from sira.core.query_path import QueryPath  # noqa: E402
from sira.core.retriever import Retriever, hits_by_query  # noqa: E402
from sira.core.proposers import (DEFAULT_ENCODER, EncoderProposerConfig, Vocabulary, held_terms, nearest_entries,  # noqa: E402
                                 surface_forms, vocabulary_entries)

METRICS = ["ndcg@10", "recall@10", "recall@100"]
FLOOR = EncoderProposerConfig.model_fields["min_similarity"].default  # the proposer's cosine floor unless swept


def cached_encode(encoder: SentenceEncoder, texts: list[str], path: Path) -> np.ndarray:
    if path.exists():
        vecs = np.load(path)
        if len(vecs) == len(texts):
            return vecs
    t = time.perf_counter()
    vecs = encoder.encode(texts)
    print(f"  encoded {len(texts)} texts in {time.perf_counter() - t:.0f} s -> {path.name}", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, vecs)
    return vecs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--split", required=True)
    ap.add_argument("--preset", default="sira")
    ap.add_argument("--encoder", default=DEFAULT_ENCODER, help="the embedded encoder (EncoderProposerConfig.model)")
    ap.add_argument("--cache", default=".cache/encoder")
    ap.add_argument("--doc-n", default="0,5,10", help="doc-side proposals (0: no corpus side)")
    ap.add_argument("--query-n", default="0,5,10", help="query-side proposals (0: no query side)")
    ap.add_argument("--entries", default="unigram,bigram")
    ap.add_argument("--tau", default="0.02,0.05,0.1")
    ap.add_argument("--w", default="0.25,0.5,1.0")
    ap.add_argument("--min-similarity", default=str(FLOOR), help="cosine below which nothing is proposed (both sides)")
    ap.add_argument("--only", help="JSON of one configuration (doc_n, query_n, entries, tau, w) or a list of them: "
                                   "report just these")
    ap.add_argument("--baseline", help="JSON of the configuration the others are tested against (default: plain "
                                       "BM25, named bm25 in the results)")
    ap.add_argument("--output-json")
    args = ap.parse_args()

    ds = resolve_dataset(args.dataset)
    preset = get_preset(args.preset)
    analyzer = Analyzer(preset.analyzer)
    import gzip

    docs = []
    opener = gzip.open if str(ds.corpus_path).endswith(".gz") else open
    with opener(ds.corpus_path, "rt", encoding="utf-8") as fh:
        for line in fh:
            o = json.loads(line)
            docs.append((str(o["_id"]), o.get("title") or "", o.get("text") or ""))
    qrels = ds.qrels(args.split)
    queries = ds.queries(args.split)
    # The default encoder's vectors keep the cache folder they had before the encoder was a setting.
    cache = Path(args.cache) / (ds.name if args.encoder == DEFAULT_ENCODER else f"{args.encoder}/{ds.name}")
    encoder = shared_encoder(model=args.encoder)
    print(f"{ds.name}/{args.split}: {len(docs)} docs, {len(queries)} queries", flush=True)

    texts = [index_text(t, x) for _, t, x in docs]
    doc_vecs = cached_encode(encoder, texts, cache / "docs.npy")
    qids = list(queries)
    query_vecs = cached_encode(encoder, [queries[q] for q in qids], cache / f"queries-{args.split}.npy")
    doc_held = [held_terms(analyzer, t) for t in texts]
    query_held = [held_terms(analyzer, queries[q]) for q in qids]

    term_df: dict[str, int] = {}
    for t in texts:
        for term in set(ngrams(analyzer.tokens(t), 2)):
            term_df[term] = term_df.get(term, 0) + 1
    forms = surface_forms(texts, analyzer, bigrams=True)
    vocabularies: dict[tuple[str, float], Vocabulary] = {}

    def vocabulary(entries: str, tau: float) -> Vocabulary:
        if (entries, tau) not in vocabularies:
            cfg = EncoderProposerConfig(model=args.encoder, entries=entries, vocabulary_tau=tau)
            ents = vocabulary_entries(term_df, forms, len(docs), cfg)
            surfaces = [e.surface for e in ents]
            all_vecs = _surface_vectors(encoder, surfaces, cache)
            vocabularies[entries, tau] = Vocabulary([e.term for e in ents], surfaces,
                                                    np.array([e.df for e in ents]), all_vecs)
        return vocabularies[entries, tau]

    ids = [d[0] for d in docs]
    if args.only:
        only = json.loads(args.only)
        grid = only if isinstance(only, list) else [only]
    else:
        grid = _grid(args)
    results = []
    searchers: dict[tuple, object] = {}
    baseline_run = None
    plain = dict(doc_n=0, query_n=0, entries="unigram", tau=0.05, w=0.5)
    for cfg in [json.loads(args.baseline) if args.baseline else plain] + grid:
        cfg.setdefault("min_similarity", FLOOR)

        def settings(proposals: int) -> EncoderProposerConfig:  # one side's proposer settings under this cfg
            return EncoderProposerConfig(model=args.encoder, proposals=proposals, entries=cfg["entries"],
                                         vocabulary_tau=cfg["tau"], min_similarity=cfg["min_similarity"])

        key = (cfg["doc_n"], cfg["entries"] if cfg["doc_n"] else "", cfg["tau"] if cfg["doc_n"] else 0,
               cfg["min_similarity"] if cfg["doc_n"] else 0)
        started = time.perf_counter()
        if key not in searchers:
            phrases = None
            if cfg["doc_n"]:
                props = nearest_entries(doc_vecs, doc_held, vocabulary(cfg["entries"], cfg["tau"]),
                                        settings(cfg["doc_n"]))
                phrases = {i: p.phrases for i, p in zip(ids, props)}
            searchers[key] = build_searcher(docs, preset, phrases=phrases, tau=cfg["tau"])
        searcher = searchers[key]
        path = QueryPath(searcher, analyzer, searcher.num_docs, df_table=_df_table(searcher), tau=cfg["tau"])
        proposer = None
        if cfg["query_n"]:
            proposer = NearestEntries([queries[q] for q in qids], query_vecs, query_held,
                                      vocabulary(cfg["entries"], cfg["tau"]), settings(cfg["query_n"]))
        # The retriever the jobs use: DF-validated programs, w, and the scored top 100 (a query's own document is
        # dropped after ranking, as this selection always did).
        retriever = Retriever(path, proposer, w=cfg["w"], k=100)
        _, ranked = retriever.run({q: queries[q] for q in qids})
        run = {q: {d: s for d, s in hits.items() if not (ds.queries_are_documents and d == q)}
               for q, hits in ({q: {} for q in qids} | hits_by_query(ranked)).items()}
        run = {q: hits or {"__none__": 0.0} for q, hits in run.items()}
        scores = evaluate(Qrels.from_dict(qrels), Run.from_dict(run), METRICS, make_comparable=True)
        row = {**cfg, **{m: round(float(scores[m]), 4) for m in METRICS}, "seconds": round(time.perf_counter() - started, 1)}
        if baseline_run is None:
            baseline_run = run
            row["name"] = "baseline" if args.baseline else "bm25"
        else:
            row.update(_versus(qrels, baseline_run, run))
        results.append(row)
        print(json.dumps(row), flush=True)
    best = max(results[1:], key=lambda r: r["ndcg@10"]) if len(results) > 1 else results[0]
    out = {"dataset": ds.name, "split": args.split, "preset": args.preset, "encoder": args.encoder,
           "results": results, "best": best}
    print("best:", json.dumps(best))
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps(out, indent=2))


def _grid(args) -> list[dict]:
    """Every combination of the options' values, less those that cannot differ: w without query proposals, and the
    vocabulary's settings and the cosine floor without proposals on either side (one such row: plain BM25 again)."""
    ws, entries, taus = _floats(args.w), args.entries.split(","), _floats(args.tau)
    floors = _floats(args.min_similarity)
    combos = itertools.product(_ints(args.doc_n), _ints(args.query_n), entries, taus, ws, floors)
    return [dict(doc_n=dn, query_n=qn, entries=e, tau=t, w=w, min_similarity=m) for dn, qn, e, t, w, m in combos
            if not (qn == 0 and w != ws[0])
            and not (dn == 0 and qn == 0 and (e != entries[0] or t != taus[0] or m != floors[0]))]


def _surface_vectors(encoder: SentenceEncoder, surfaces: list[str], cache: Path) -> np.ndarray:
    """Embeddings of vocabulary surface forms, cached across configurations (one file, grown as needed)."""
    path, names_path = cache / "surfaces.npy", cache / "surfaces.json"
    known: dict[str, np.ndarray] = {}
    if path.exists() and names_path.exists():
        known = dict(zip(json.loads(names_path.read_text()), np.load(path)))
    todo = sorted({s for s in surfaces if s not in known})
    if todo:
        t = time.perf_counter()
        known.update(zip(todo, encoder.encode(todo)))
        print(f"  encoded {len(todo)} vocabulary entries in {time.perf_counter() - t:.0f} s", flush=True)
        names = sorted(known)
        cache.mkdir(parents=True, exist_ok=True)
        np.save(path, np.stack([known[n] for n in names]))
        names_path.write_text(json.dumps(names))
    return np.stack([known[s] for s in surfaces]) if surfaces else np.zeros((0, encoder.dim), np.float32)


def _df_table(searcher) -> DFTable:
    """DF in the indexed (enriched) field, from the postings of the one shard."""
    shard = searcher.shards[0]
    return DFTable(shard.term_ids, np.diff(shard.indptr), searcher.num_docs)


class NearestEntries:
    """A TermProposer: the nearest vocabulary entries of each query, from its vector encoded once up front."""

    name, version, default_w = "encoder", None, 0.5

    def __init__(self, texts: list[str], vectors: np.ndarray, held: list, vocabulary: Vocabulary,
                 cfg: EncoderProposerConfig):
        self.row = {text: i for i, text in enumerate(texts)}
        self.vectors, self.held, self.vocabulary, self.cfg = vectors, held, vocabulary, cfg

    def propose(self, texts):
        rows = [self.row[text] for text in texts]
        return nearest_entries(self.vectors[rows], [self.held[r] for r in rows], self.vocabulary, self.cfg)


def _versus(qrels, base: dict, run: dict) -> dict:
    from sira.core.metrics import paired_comparison

    result = paired_comparison(qrels, base, run, "ndcg@10")
    return {"p_value": round(result["p_value"], 4), "wins": result["wins"], "losses": result["losses"]}


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


if __name__ == "__main__":
    main()
