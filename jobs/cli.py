"""The `sira` command line: one subcommand per job. A command's options are generated from its job's typed config
(sira.jobs.options.config_options), so each default and help text is written once, in the config."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from sira.pipelines.tracking.console import console
from sira.pipelines.tracking.stages import StageFailed
from sira.jobs import enrich as enrich_job, eval as eval_job, index as index_job, nightly as nightly_job
from sira.jobs import query as query_job, report as report_job, run as run_job, serve as serve_job, sweep as sweep_job
from sira.jobs.options import (PROPOSER, RERANK, RERANK_DEFAULTS, TRACKING, OutputJson, ProposalTable, Verbose,
                               Warehouse, config_options, dataset_warehouse, log_engines, option_errors,
                               with_doc_backend, write_json)
from sira.pipelines.enrichment.corpus_enrichment import EnrichConfig
from sira.pipelines.serving.config import SearchConfig
from sira.pipelines.tracking.evaluation import CompareConfig
from sira.pipelines.storage.ingest import IngestConfig

stdout = Console()  # results go to stdout; logs and progress go to stderr (sira.pipelines.tracking.console.console)
app = typer.Typer(add_completion=False, no_args_is_help=True, help="SIRA: single-call expert retrieval over BM25.")
# LLM settings of the enrichment (corpus side) beyond the proposer's.
LLM_RUN = ("backend.api_key_env", "backend.batch_size", "backend.concurrency")
# What a hosted endpoint allows (rate, requests in flight) and how long it may take: `sira enrich` and `sira nightly`.
LLM_LIMITS = ("backend.qps", "backend.max_in_flight", "backend.timeout_s", "backend.max_retries", "backend.max_tokens")


@app.command()
@config_options(IngestConfig, ("warehouse", "task", "max_delete_fraction", "batch_size"), arguments=("source",))
def ingest(ctx: typer.Context, values: dict,
           merge: bool = typer.Option(False, "--merge", help="MERGE into the current docs table (inserts, updates, "
                                                             "deletes by content hash) instead of replacing it"),
           output_json: Optional[Path] = OutputJson, verbose: bool = Verbose):
    """Validate a corpus and write the Delta `docs` table; bad records go to `rejected` with the reason."""
    from sira.jobs import ingest as job

    cfg = IngestConfig(**values, mode="merge" if merge else "replace")
    log_engines(ctx, cfg.warehouse, verbose)
    summary = job.run(cfg)
    console.print(
        f"read {summary['read']}  kept {summary['kept']}  rejected {summary['rejected']}"
        + (f"  {summary['rejected_by_reason']}" if summary["rejected"] else "")
        + ("  " + "  ".join(f"{k} {v}" for k, v in summary["changes"].items()) if "changes" in summary else "")
    )
    write_json(summary, output_json)


def _job(name: str, config, fields: tuple, run, headline: str, doc: str) -> None:
    """A command that makes `config` from its options, runs `run` with the engines' logs in the warehouse, prints
    `headline` (filled in from the job's summary) and writes --output-json."""

    def command(ctx: typer.Context, values: dict, output_json: Optional[Path] = OutputJson, verbose: bool = Verbose):
        cfg = config(**values)
        log_engines(ctx, cfg.warehouse, verbose)
        summary = run(cfg)
        stdout.print(headline.format_map(summary), highlight=False)
        write_json(summary, output_json)

    command.__doc__ = doc
    app.command(name)(config_options(config, fields)(command))


_job("enrich", EnrichConfig, (
    "warehouse", *PROPOSER, *LLM_RUN, "task", "max_n", "limit", "commit_every", "commit_interval_s", "retry_errors",
    "embeddings", "ray_address", "preset", *LLM_LIMITS, "backend.structured_output", "backend.engine_kwargs",
    "backend.sampling_kwargs"),
    lambda cfg: enrich_job.run(cfg),
    "documents {documents}  enriched {enriched}  skipped {skipped}  errors {errors}  tokens in/out "
    "{input_tokens}/{output_tokens}  {docs_per_second:.2f} docs/s  {seconds:.1f} s",
    "Propose each document's missing search vocabulary (encoder or LLM; incremental, resumable).")
_job("index", index_job.IndexConfig, (
    "warehouse", "preset", "shards", "spark_master", "enrichment", "tau", "full", "enrichment_model",
    "enrichment_prompt_version", "segments.max_segments", "segments.merge_below_fraction",
    "segments.max_dead_fraction", "segments.max_term_stats_versions"), lambda cfg: index_job.run(cfg),
    "published index version {index_version}: {num_docs} docs, {num_terms} terms, {num_shards} shards, segments "
    "{segments}",
    "Build and publish a new index version with Spark: only new or changed documents are analysed, and they enter a "
    "new segment on top of the newest version of the same kind (a full build when there is none).")


@app.command()
@config_options(SearchConfig, ("warehouse", "k", "index_version", "preset", "must", "exclude", "program", "expand",
                               *PROPOSER, "task", "w", "tau"), arguments=("text",))
def search(values: dict, explain: bool = typer.Option(False, "--explain", help="show each hit's per-term contributions"),
           as_json: bool = typer.Option(False, "--json", help="print JSON (hits and the retrieval program)")):
    """Search one query (or run a retrieval program) and print the ranked hits."""
    from sira.pipelines.serving.online_proposer import OnlineProposer
    from sira.pipelines.serving.retrievers import open_retriever
    from sira.core.program import RetrievalProgram

    cfg = SearchConfig(**values)
    expand = cfg.expand and cfg.text is not None
    proposer = partial(OnlineProposer, cfg.warehouse, cfg.backend, cfg.task) if expand else None
    retriever, manifest = open_retriever(cfg.warehouse, cfg.index_version, cfg.preset, proposer=proposer, tau=cfg.tau,
                                         w=cfg.w, k=cfg.k)
    if cfg.program is not None:
        program = RetrievalProgram.model_validate_json(cfg.program.read_text(encoding="utf-8")) \
            .constrained(retriever.path.analyzer, cfg.must, cfg.exclude)
    else:
        proposals = retriever.proposer.propose([cfg.text]) if expand else None
        for failed in (p.error for p in proposals or () if p.error):
            console.print(f"[yellow]expansion failed, searching the plain query:[/yellow] {failed}")
        [program] = retriever.programs([cfg.text], cfg.must, cfg.exclude, proposals)
    results = retriever.rank([""], [program])
    hits = list(zip(results["doc_id"].to_pylist(), results["score"].to_pylist()))
    contributions = retriever.contributions(program, [d for d, _ in hits]) if explain else None
    _print_hits(program, manifest, hits, contributions, as_json)


def _print_table(title: str, columns, rows) -> None:
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    stdout.print(table)


def _print_hits(program, manifest: dict, hits: list[tuple[str, float]], contributions: dict | None,
                as_json: bool) -> None:
    """`sira search`'s output: JSON (the program and the hits), or a table; with `contributions`, each hit's."""
    if as_json:
        sys.stdout.write(json.dumps({
            "query": program.query, "index_version": manifest["index_version"], "terms": program.original_terms,
            "program": program.model_dump(),
            "hits": [{"rank": i, "doc_id": d, "score": score,
                      **({"contributions": contributions[d]} if contributions is not None else {})}
                     for i, (d, score) in enumerate(hits, 1)],
        }, indent=2) + "\n")
        return
    table = Table(title=f"{program.query!r}  (index v{manifest['index_version']}, {manifest['preset']})")
    for col in ("rank", "doc_id", "score") + (("contributions",) if contributions is not None else ()):
        table.add_column(col)
    for i, (d, score) in enumerate(hits, 1):
        row = [str(i), d, f"{score:.4f}"]
        if contributions is not None:
            row.append(", ".join(f"{t}={v:.3f}" for t, v in sorted(contributions[d].items(), key=lambda kv: -kv[1])))
        table.add_row(*row)
    stdout.print(table) if hits else stdout.print("no hits")


_job("query", query_job.QueryConfig, (
    "warehouse", "queries", "out", "parquet", "run_id", "k", "expand", *PROPOSER, "task", "w", "tau", "index_version",
    "preset", "batch_size", "commit_every", "scorer", "workers", "ray_address"), lambda cfg: query_job.run(cfg),
    "run {run_id}: scored {scored}, skipped {skipped}, rejected {rejected} -> {run_file}, {parquet_file}",
    "Bulk scoring: expand, validate and score a query set; write the Delta `runs` table and a TREC run.")


@app.command()
@config_options(serve_job.ServeConfig, (
    "warehouse", "host", "port", "index_version", "preset", "follow", "poll_s", "api_token_env", "max_query_chars",
    "max_k", "max_concurrent", "backend.backend", "backend.model", "backend.base_url", "backend.timeout_s", "w", "tau",
    "task", "ray_address"), defaults={"backend.backend": None, **serve_job.ONLINE_PROPOSER_DEFAULTS})
def serve(values: dict):
    """Serve POST /search, GET /health, /runs, /compare over HTTP, and the pages that look inside (/, /compare);
    shards are held by Ray actors, queried scatter-gather."""
    serve_job.run(serve_job.ServeConfig(**values))


@app.command("eval")
@config_options(eval_job.EvalConfig, ("dataset", "warehouse", "preset", "split", "variant", "tau", "w", "task",
                                      *PROPOSER, "doc_backend.backend", "depth", "shards", "spark_master",
                                      "ray_address", *RERANK), defaults={"doc_backend.backend": None, **RERANK_DEFAULTS})
def eval_(ctx: typer.Context, values: dict, verbose: bool = Verbose, output_json: Optional[Path] = OutputJson):
    """Evaluate on a BEIR split (nDCG@10, Recall@10, Recall@100), building what the warehouse lacks."""
    cfg = eval_job.EvalConfig(**with_doc_backend(values))
    log_engines(ctx, cfg.warehouse or dataset_warehouse(cfg.dataset), verbose)
    summary = eval_job.run(cfg)
    _print_table(f"{summary['dataset']} / {summary['split']} / {summary['preset']} / {summary['variant']} "
                 f"({summary['num_queries']} queries)", summary["metrics"],
                 [[f"{v:.4f}" for v in summary["metrics"].values()]])
    write_json(summary, output_json)


@app.command()
@config_options(CompareConfig, ("dataset", "split", "metric", "permutations", "seed", "plot"),
                arguments=("base_run", "run_file"))
def compare(values: dict, output_json: Optional[Path] = OutputJson):
    """Two TREC runs on a split's judged queries: both means, the difference, the paired randomization test's p
    and per-query wins / losses / ties (each query's two scores go to --output-json)."""
    from sira.pipelines.tracking.runs import compare_run_files

    cfg = CompareConfig(**values)
    summary = compare_run_files(cfg.dataset, cfg.split, cfg.base_run, cfg.run_file, cfg.metric,
                                permutations=cfg.permutations, seed=cfg.seed)
    _print_table(f"{cfg.dataset} / {cfg.split}: {cfg.run_file.name} against {cfg.base_run.name} "
                 f"({summary['queries']} queries)",
                 ("base", "run", "delta", "p", "wins / losses / ties"),
                 [[f"{summary['base']:.4f}", f"{summary['run']:.4f}", f"{summary['delta']:+.4f}",
                   f"{summary['p_value']:.4f}", f"{summary['wins']} / {summary['losses']} / {summary['ties']}"]])
    if cfg.plot is not None:
        from sira.pipelines.tracking.report import plot_paired_comparison

        stdout.print(f"wrote {plot_paired_comparison(summary, cfg.plot)}")
    write_json(summary, output_json)


@app.command()
@config_options(run_job.RunConfig, run_job.OPTIONS, defaults=run_job.OPTION_DEFAULTS)
def run(ctx: typer.Context, values: dict, output_json: Optional[Path] = OutputJson, verbose: bool = Verbose):
    """The whole pipeline on one dataset: ingest, index, enrich, expand, and evaluate bm25 / doc / query / sira."""
    from sira.pipelines.tracking.report import variant_label
    from sira.core.datasets import resolve_dataset

    cfg = run_job.RunConfig(**with_doc_backend(values))
    log_engines(ctx, cfg.warehouse_path(resolve_dataset(cfg.dataset).name), verbose)
    summary = run_job.run(cfg)
    base = summary["variants"].get("bm25", {}).get("metrics")
    _print_table(f"{summary['dataset']} / {summary['split']}: {summary['seconds']:.0f} s"
                 + (f", MLflow run {summary['mlflow_run_id']}" if summary["mlflow_run_id"] else ""),
                 ("variant", "nDCG@10", "Recall@10", "Recall@100", "Δ nDCG@10"),
                 [[variant_label(variant, r),
                   *(f"{r['metrics'][m]:.4f}" for m in ("ndcg@10", "recall@10", "recall@100")),
                   f"{r['metrics']['ndcg@10'] - base['ndcg@10']:+.4f}" if base and variant != "bm25" else ""]
                  for variant, r in summary["variants"].items()])
    write_json(summary, output_json)


@app.command()
@config_options(sweep_job.SweepConfig, ("dataset", "split", "grid", "variant", "metric", "warehouse", "preset",
                                        "backend.backend", "backend.model", "backend.base_url", "doc_backend.backend",
                                        "shards", *TRACKING), defaults={"doc_backend.backend": None})
def sweep(ctx: typer.Context, values: dict, verbose: bool = Verbose, output_json: Optional[Path] = OutputJson):
    """Grid over tau / w / n-gram order, selected on train or dev, the choice evaluated once on test."""
    cfg = sweep_job.SweepConfig(**with_doc_backend(values))
    log_engines(ctx, cfg.warehouse or dataset_warehouse(cfg.dataset), verbose)
    summary = sweep_job.run(cfg)
    metric, split = cfg.metric, cfg.split
    _print_table(f"sweep {cfg.dataset} ({cfg.variant}): selected on {split} by {metric}",
                 ("setting", f"{metric} ({split})"),
                 [[str(t["point"]) + (" <- selected" if t["point"] == summary["selected"] else ""),
                   f"{t['metrics'][metric]:.4f}"] for t in summary["tried"]])
    stdout.print(f"test ({summary['test']['split']}): " + "  ".join(f"{k} {v:.4f}" for k, v in summary["test"]["metrics"].items()))
    write_json(summary, output_json)


_job("nightly", nightly_job.NightlyConfig, (
    "warehouse", "source", "enrichment", *PROPOSER, *LLM_RUN, *LLM_LIMITS, "task", "preset", "shards", "tau",
    "spark_master", "ray_address", "keep_days", "commit_every", "max_delete_fraction", "embeddings", "tracking.enabled",
    *TRACKING),
    lambda cfg: nightly_job.run(cfg),
    "index v{index_version}: {ingested[inserted]} inserted, {ingested[updated]} updated, {ingested[deleted]} deleted, "
    "{ingested[unchanged]} unchanged; {enriched} enriched; {rejected} rejected; expired versions {expired_versions}",
    "Incremental update: MERGE the new snapshot, enrich only new or changed docs, publish a new index version.")


@app.command()
@config_options(report_job.ReportConfig, ("output_dir", "datasets", *TRACKING))
def report(values: dict):
    """Markdown report and plots: our variants per dataset (newest `sira run` each) beside published references."""
    summary = report_job.run(report_job.ReportConfig(**values))
    stdout.print(f"wrote {summary['report']} and {len(summary['plots'])} plots ({', '.join(summary['datasets'])})")


proposals_app = typer.Typer(no_args_is_help=True, help="Move LLM proposals between warehouses as Parquet files.")
app.add_typer(proposals_app, name="proposals")


@proposals_app.command("export")
def proposals_export(
    warehouse: str = Warehouse,
    output: Path = typer.Option(..., "--output", "-o", help="Parquet file to write"),
    table: str = ProposalTable,
    model: Optional[str] = typer.Option(None, help="only this model"),
    prompt_version: Optional[str] = typer.Option(None, "--prompt-version", help="only this prompt version"),
    include_errors: bool = typer.Option(False, "--include-errors", help="keep rows that recorded an error"),
    output_json: Optional[Path] = OutputJson,
):
    """Write a warehouse's proposals (enrichment or expansions) to one Parquet file with the table's schema."""
    from sira.pipelines.enrichment.proposal_transfer import export_proposals

    summary = export_proposals(warehouse, output, table, model, prompt_version, include_errors)
    stdout.print(f"exported {summary['rows']} {table} rows to {output} "
                 f"({summary['errors_left_out']} errored rows left out): {summary['versions']}")
    write_json(summary, output_json)


@proposals_app.command("import")
def proposals_import(
    path: Path = typer.Argument(..., help="a Parquet export (file or folder)"),
    warehouse: str = Warehouse,
    table: str = ProposalTable,
    output_json: Optional[Path] = OutputJson,
):
    """Merge a Parquet export into a warehouse's proposals; rows for text the warehouse no longer holds are left
    out, and rows it already has are kept as they are."""
    from sira.pipelines.enrichment.proposal_transfer import import_proposals

    summary = import_proposals(warehouse, path, table)
    stdout.print(f"imported {summary['inserted']} {table} rows from {path}: {summary['already_present']} already "
                 f"present, {summary['stale']} stale (document changed or gone)")
    write_json(summary, output_json)


def main() -> None:
    try:
        app()
    except ValidationError as exc:
        console.print(f"[red]error:[/red] {option_errors(exc)}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (FileNotFoundError, LookupError, ValueError, ConnectionError, StageFailed) as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)


if __name__ == "__main__":
    main()
