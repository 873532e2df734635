"""The evaluated runs of a warehouse, as `sira eval` (and so `sira run`) writes them: WAREHOUSE/runs/NAME.trec, the
retrieval programs beside it (NAME.programs.jsonl, one line per query) and NAME.run.json, what the run is (the
dataset it was judged on, split, variant, metrics, the query ids of the programs' lines). Comparing two runs
here and with `sira compare` is one function, so both give the same numbers."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

from sira.core.datasets import resolve_dataset
from sira.core.defaults import SEARCH_K
from sira.core.metrics import paired_comparison, read_trec_run

RUNS_FOLDER = "runs"
INFO_SUFFIX = ".run.json"
PROGRAMS_SUFFIX = ".programs.jsonl"
METRIC = re.compile(r"(ndcg|recall|precision|map|mrr|hit_rate)(@[1-9][0-9]{0,3})?")


class RunNotFound(LookupError):
    pass


def run_folder(warehouse: str) -> Path:
    return Path(warehouse) / RUNS_FOLDER


def write_run_info(run_path: Path, summary: dict, source: str, qids: list[str]) -> Path:
    """NAME.run.json beside NAME.trec: the eval summary, the dataset `source` as given (a folder made absolute, so
    a server started elsewhere finds it) and the query ids of the programs file's lines."""
    local = Path(source)
    info = {**summary, "name": run_path.stem, "source": str(local.resolve()) if local.exists() else source,
            "qids": qids, "created_at": datetime.now(timezone.utc).isoformat()}
    path = run_path.with_name(run_path.stem + INFO_SUFFIX)
    path.write_text(json.dumps(info, default=str) + "\n", encoding="utf-8")
    return path


def list_runs(warehouse: str) -> list[dict]:
    """Every described run of the warehouse (what it is, not its rankings), by dataset, split and name."""
    out = []
    for path in sorted(run_folder(warehouse).glob("*" + INFO_SUFFIX)):
        info = json.loads(path.read_text(encoding="utf-8"))
        out.append({k: info.get(k) for k in ("name", "dataset", "split", "preset", "variant", "num_queries",
                                             "metrics", "index_version", "expansion", "created_at")})
    return sorted(out, key=lambda r: (r["dataset"] or "", r["split"] or "", r["name"]))


def run_info(warehouse: str, name: str) -> dict:
    """A run's NAME.run.json; RunNotFound unless the warehouse has that run (a name is never a path)."""
    known = {p.name[: -len(INFO_SUFFIX)] for p in run_folder(warehouse).glob("*" + INFO_SUFFIX)}
    if name not in known:
        raise RunNotFound(f"no run {name!r} in warehouse {warehouse} (GET /runs lists them)")
    return json.loads((run_folder(warehouse) / (name + INFO_SUFFIX)).read_text(encoding="utf-8"))


@lru_cache(maxsize=8)
def _cached_run(path: str, mtime_ns: int) -> dict[str, dict[str, float]]:
    return read_trec_run(path)


def read_run(warehouse: str, name: str) -> dict[str, dict[str, float]]:
    path = run_folder(warehouse) / f"{name}.trec"
    return _cached_run(str(path), path.stat().st_mtime_ns)


def compare_run_files(dataset: str, split: str, base_run: str | Path, run_file: str | Path, metric: str = "ndcg@10",
                      base: dict | None = None, run: dict | None = None, **test) -> dict:
    """`sira compare`: two TREC runs on the split's judged queries (sira.core.metrics.paired_comparison, `test`: its
    permutations and seed when not its defaults); `base` / `run`: the runs already read."""
    qrels = resolve_dataset(dataset).qrels(split)
    return {"dataset": dataset, "split": split, "base_run": str(base_run), "run_file": str(run_file),
            **paired_comparison(qrels, base if base is not None else read_trec_run(base_run),
                                run if run is not None else read_trec_run(run_file), metric, **test)}


def comparable(warehouse: str, base: str, run: str) -> tuple[dict, dict]:
    """Both runs' infos; ValueError unless they were judged on the same dataset and split."""
    a, b = run_info(warehouse, base), run_info(warehouse, run)
    if (a["source"], a["split"]) != (b["source"], b["split"]):
        raise ValueError(f"runs {base!r} ({a['dataset']} / {a['split']}) and {run!r} ({b['dataset']} / {b['split']}) "
                         "were not judged on the same dataset and split")
    return a, b


def compare_runs(warehouse: str, base: str, run: str, metric: str = "ndcg@10") -> dict:
    """`sira compare` of two runs of the warehouse (the same numbers), with each judged query's text."""
    if not METRIC.fullmatch(metric):
        raise ValueError(f"metric {metric!r}: expected ndcg, recall, precision, map, mrr or hit_rate, "
                         "optionally @k (e.g. ndcg@10)")
    a, _ = comparable(warehouse, base, run)
    summary = compare_run_files(a["source"], a["split"], base, run, metric, base=read_run(warehouse, base),
                                run=read_run(warehouse, run))
    texts = resolve_dataset(a["source"]).queries(a["split"])
    return {**summary, "dataset": a["dataset"], "texts": {q: texts.get(q, "") for q in summary["per_query"]}}


def query_detail(warehouse: str, base: str, run: str, qid: str, k: int = SEARCH_K) -> dict:
    """One judged query in two runs: each run's top k with the judged relevance of every hit and the run's
    retrieval program, and the query's judgments."""
    from sira.pipelines.serving.hit_details import read_documents

    a, b = comparable(warehouse, base, run)
    dataset = resolve_dataset(a["source"])
    qrels = dataset.qrels(a["split"])
    if qid not in qrels:
        raise RunNotFound(f"query {qid!r} is not judged in {a['dataset']} / {a['split']}")
    sides = {}
    for side, info in (("base", a), ("run", b)):
        ranked = sorted(read_run(warehouse, info["name"]).get(qid, {}).items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        sides[side] = {"name": info["name"], "variant": info.get("variant"), "program": _program(warehouse, info, qid),
                       "hits": [{"rank": i, "doc_id": d, "score": s, "relevance": qrels[qid].get(d)}
                                for i, (d, s) in enumerate(ranked, 1)]}
    judged = qrels[qid]
    docs = read_documents(warehouse, sorted({h["doc_id"] for s in sides.values() for h in s["hits"]} | set(judged)))
    for s in sides.values():
        for h in s["hits"]:
            h["title"] = docs.get(h["doc_id"], {}).get("title", "")
    return {"qid": qid, "query": dataset.queries(a["split"]).get(qid, ""), "dataset": a["dataset"],
            "split": a["split"], "judged": [{"doc_id": d, "relevance": r, "title": docs.get(d, {}).get("title", "")}
                                            for d, r in sorted(judged.items(), key=lambda kv: (-kv[1], kv[0]))],
            **sides}


def _program(warehouse: str, info: dict, qid: str) -> dict | None:
    """The run's retrieval program of query `qid` (its line in NAME.programs.jsonl)."""
    qids = info.get("qids") or []
    if qid not in qids:
        return None
    line = qids.index(qid)
    with (run_folder(warehouse) / (info["name"] + PROGRAMS_SUFFIX)).open(encoding="utf-8") as fh:
        for i, text in enumerate(fh):
            if i == line:
                return json.loads(text)
    return None


def write_run(run_path: Path, run_hits: dict, programs: list, tag: str) -> Path:
    """The TREC run file and the programs beside it (JSONL, in query order); returns the programs' path."""
    from sira.core.metrics import write_trec_run

    write_trec_run(run_hits, run_path, tag)
    programs_path = run_path.with_suffix(PROGRAMS_SUFFIX)
    programs_path.write_text("".join(p.model_dump_json() + "\n" for p in programs), encoding="utf-8")
    return programs_path


def answer_coverage_of(warehouse: str, run_hits: dict, answers: dict[str, list[str]], ks=(10, 100)) -> dict[str, float]:
    """answer_coverage@k of a run on a dataset with gold answers, over the passages of its top hits."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from sira.pipelines.storage.delta_io import read_table
    from sira.core import tables
    from sira.core.analysis import index_text
    from sira.core.metrics import answer_coverage

    wanted = sorted({d for q in answers for d, _ in sorted(run_hits.get(q, {}).items(), key=lambda kv: -kv[1])[:max(ks)]})
    docs = read_table(tables.table_uri(warehouse, tables.DOCS), columns=["doc_id", "title", "text"])
    docs = docs.filter(pc.is_in(docs["doc_id"], value_set=pa.array(wanted, pa.string())))
    passages = {d: index_text(t, x) for d, t, x in zip(docs["doc_id"].to_pylist(), docs["title"].to_pylist(),
                                                      docs["text"].to_pylist())}
    return {f"answer_coverage@{k}": answer_coverage(run_hits, answers, passages, k) for k in ks}
