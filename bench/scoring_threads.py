"""Scoring a query file in one process: one thread against two threads over the two halves of the batch (the
scoring kernels are numba nogil), on a warehouse of bench/bulk_query.py. For comparing with the same queries
through `sira query`'s four Ray shard actors (that bench's `scoring` seconds).

    python bench/scoring_threads.py WAREHOUSE QUERIES.jsonl OUTPUT.json
"""
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from sira.pipelines.serving.query_runs import iter_queries
from sira.pipelines.serving.retrievers import open_retriever

wh, qf = sys.argv[1], sys.argv[2]  # sys.argv[3]: the results file
r, m = open_retriever(wh, k=100)
searcher = r.path.scorer
texts = [q.text for q in iter_queries(qf)]
compiled = [searcher.compile(t) for t in texts]
out = {}
for k in (10, 100, 1000):
    searcher.rank_many(compiled[:500], k, as_rankings=False)  # warm
    t = time.perf_counter(); one = searcher.rank_many(compiled, k, as_rankings=False); t1 = time.perf_counter() - t
    half = len(compiled) // 2
    with ThreadPoolExecutor(2) as pool:
        t = time.perf_counter()
        a, b = pool.map(lambda qs: searcher.rank_many(qs, k, as_rankings=False), (compiled[:half], compiled[half:]))
        t2 = time.perf_counter() - t
    same = a.doc_ids.to_pylist() + b.doc_ids.to_pylist() == one.doc_ids.to_pylist()
    out[k] = {"one_thread_s": round(t1, 2), "two_threads_s": round(t2, 2), "speedup": round(t1 / t2, 2), "same": same}
    print(k, out[k], flush=True)
out["command"] = "python bench/scoring_threads.py " + " ".join(sys.argv[1:])
with open(sys.argv[3], "w") as fh:
    fh.write(json.dumps(out, indent=2) + "\n")
