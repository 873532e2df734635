"""The embedded encoders side by side: dense retrieval quality alone and encoding throughput per core.

    python bench/dense_encoders.py --dataset beir:scifact --output-json bench/results/dense_encoders_scifact.json

Per encoder (all-MiniLM-L6-v2 on the numpy forward pass, bge-small-en-v1.5 on onnxruntime, and for the choice of
runtime bge-small-en-v1.5@numpy, the same file on the numpy forward pass, throughput only):
- throughput: the first --speed-docs documents encoded on one thread (numpy's BLAS and onnxruntime both held to
  one), after a warm-up batch, best of --repeats, as documents and tokens per second per core;
- quality: every document and the test queries encoded at 256 tokens (bge: queries with its retrieval
  instruction), exact inner product, nDCG@10 and Recall@100 by ranx (a query's own document is dropped, as
  `sira eval` does on arguana).
Vectors are cached under --cache (.npy, not committed).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before numpy loads: the throughput is per core
os.environ.setdefault("OPENBLAS_NUM_THREADS", os.environ["OMP_NUM_THREADS"])

import numpy as np  # noqa: E402
from ranx import Qrels, Run, evaluate  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sira.core.analysis import index_text  # noqa: E402
from sira.core.datasets import resolve_dataset  # noqa: E402
from sira.core.dense import DenseIndex  # noqa: E402


# The same ONNX file through the numpy forward pass: why bge runs on onnxruntime (its vectors are the same, so its
# quality is not measured again).
NUMPY_BGE = "bge-small-en-v1.5@numpy"


def encoders(names: list[str]):
    from sira.pipelines.enrichment.encoder import MiniLMEncoder
    from sira.pipelines.enrichment.onnx_bert import bge_small_encoder

    def bge_on_numpy():
        from sira.pipelines.enrichment.encoder import BertForward, SentenceEncoder
        from sira.pipelines.enrichment.onnx_bert import BGE_QUERY_PREFIX, BGE_SMALL_LAYOUT, bge_small_files

        bert = BertForward.from_onnx(*bge_small_files(), BGE_SMALL_LAYOUT, 256)
        return SentenceEncoder(bert, "bge-small-en-v1.5", "cls", BGE_QUERY_PREFIX)

    makers = {"all-MiniLM-L6-v2": lambda: MiniLMEncoder(), "bge-small-en-v1.5": lambda: bge_small_encoder(threads=1),
              NUMPY_BGE: bge_on_numpy}
    return {n: makers[n]() for n in names}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--encoders", default=f"all-MiniLM-L6-v2,bge-small-en-v1.5,{NUMPY_BGE}")
    ap.add_argument("--speed-docs", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-quality", action="store_true", help="throughput only")
    ap.add_argument("--cache", default=".cache/dense")
    ap.add_argument("--output-json")
    args = ap.parse_args()

    ds = resolve_dataset(args.dataset)
    ids, texts = [], []
    with (gzip.open if str(ds.corpus_path).endswith(".gz") else open)(ds.corpus_path, "rt", encoding="utf-8") as fh:
        for line in fh:
            o = json.loads(line)
            ids.append(str(o["_id"]))
            texts.append(index_text(o.get("title") or "", o.get("text") or ""))
    queries, qrels = ds.queries("test"), ds.qrels("test")
    out = {"dataset": ds.name, "documents": len(texts), "queries": len(queries), "threads": 1,
           "machine": {"cpus": os.cpu_count(), "load_average": list(os.getloadavg()), "python": platform.python_version()},
           "encoders": {}}
    for name, enc in encoders(args.encoders.split(",")).items():
        row = {}
        sample = texts[: args.speed_docs]
        tokens = sum(len(e.ids) for e in enc.tokenizer.encode_batch(sample))
        enc.encode(sample[:8])  # numba's compile / onnxruntime's first run
        seconds = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            enc.encode(sample)
            seconds.append(time.perf_counter() - started)
        row["speed"] = {"documents": len(sample), "tokens": tokens, "seconds": [round(s, 2) for s in seconds],
                        "docs_per_second_per_core": round(len(sample) / min(seconds), 2),
                        "tokens_per_second_per_core": round(tokens / min(seconds), 1)}
        print(name, json.dumps(row["speed"]), flush=True)
        if not args.no_quality and name != NUMPY_BGE:
            cache = Path(args.cache) / ds.name / name
            cache.mkdir(parents=True, exist_ok=True)
            path = cache / "docs.npy"
            if path.exists() and len(np.load(path)) == len(texts):
                doc_vecs = np.load(path)
            else:
                started = time.perf_counter()
                doc_vecs = enc.encode(texts)
                row["corpus_seconds"] = round(time.perf_counter() - started, 1)
                np.save(path, doc_vecs)
            qids = list(queries)
            qvecs = enc.encode_queries([queries[q] for q in qids])
            hits = DenseIndex(ids, doc_vecs).search(qvecs, 100, exclude=qids if ds.queries_are_documents else None)
            run = {q: dict(h) or {"__none__": 0.0} for q, h in zip(qids, hits)}
            scores = evaluate(Qrels.from_dict(qrels), Run.from_dict(run), ["ndcg@10", "recall@100"],
                              make_comparable=True)
            row["dense"] = {m: round(float(v), 4) for m, v in scores.items()}
            print(name, json.dumps(row["dense"]), flush=True)
        out["encoders"][name] = row
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
