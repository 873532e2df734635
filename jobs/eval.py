"""`sira eval`: ingest and index whatever the warehouse lacks, run a split's queries, compute metrics (its config,
EvalConfig, and the evaluation itself are in sira.pipelines.tracking.evaluation)."""

from __future__ import annotations

from pathlib import Path

from sira.pipelines.tracking.evaluation import EvalConfig


def run(cfg: EvalConfig, manifest: dict | None = None) -> dict:
    """`manifest`: the index to search, when a composite job has brought it up to date already; None: whatever the
    warehouse lacks is ingested, enriched and indexed first."""
    from sira.core.datasets import resolve_dataset
    from sira.pipelines.tracking.evaluation import open_variant, run_name, run_split, split_metrics
    from sira.pipelines.tracking.runs import RUNS_FOLDER, write_run, write_run_info

    dataset = resolve_dataset(cfg.dataset)
    warehouse, queries, qrels = cfg.warehouse_path(dataset.name), dataset.queries(cfg.split), dataset.qrels(cfg.split)
    retriever, dense, manifest = open_variant(cfg, warehouse, manifest, dataset.queries_are_documents)
    done = run_split(retriever, f"{dataset.name}/{cfg.split}", queries, warehouse, cfg.rerank, dense)
    name = run_name(dataset.name, cfg.split, cfg.preset, cfg.variant, manifest["index_version"] if cfg.enriched
                    else None, cfg.backend.model_id() if cfg.expanded else None, cfg.dense and cfg.dense_encoder)
    run_path = Path(warehouse) / RUNS_FOLDER / f"{name}.trec"
    programs_path = write_run(run_path, done.run_hits, done.programs, f"sira-{cfg.preset}-{cfg.variant}")
    summary = {
        "dataset": dataset.name, "split": cfg.split, "preset": cfg.preset, "variant": cfg.variant,
        "num_queries": len(queries), "metrics": split_metrics(dataset, cfg.split, qrels, warehouse, done.run_hits),
        "index_version": manifest["index_version"], "warehouse": warehouse, "run_file": str(run_path),
        "programs_file": str(programs_path), "expansion": done.expansion, "rerank": done.rerank,
        "queries_per_second": len(queries) / done.seconds if done.seconds > 0 else None,
    }
    # What the run is, beside it: `sira serve`'s compare view lists and compares the runs of a warehouse.
    summary["info_file"] = str(write_run_info(run_path, summary, cfg.dataset, list(queries)))
    return summary
