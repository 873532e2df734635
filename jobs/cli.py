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
from sira.core.defaults import DEFAULT_TAU, SEARCH_K, TAU_HELP, W_HELP
from sira.jobs import eval as eval_job, index as index_job, nightly as nightly_job, query as query_job
from sira.jobs import report as report_job, run as run_job, serve as serve_job, sweep as sweep_job
from sira.jobs.options import (PROPOSER, TRACKING, BaseUrlOption, OutputJson, ProposalTable, RerankBackend,
                               RerankDepth, RerankModel, Verbose, Warehouse, config_options, dataset_warehouse,
                               log_engines, option_errors, with_doc_backend, with_reranker, write_json)
from sira.pipelines.enrichment.backend_config import DEFAULT_PROPOSER
from sira.pipelines.enrichment.corpus_enrichment import EnrichConfig
from sira.pipelines.storage.ingest import IngestConfig

stdout = Console()  # results go to stdout; logs and progress go to stderr (sira.pipelines.tracking.console.console)
app = typer.Typer(add_completion=False, no_args_is_help=True, help="SIRA: single-call expert retrieval over BM25.")
# LLM settings of the enrichment (corpus side) beyond the proposer's.
LLM_RUN = ("backend.api_key_env", "backend.batch_size", "backend.concurrency")


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


@app.command()
@config_options(EnrichConfig, (
    "warehouse", *PROPOSER, *LLM_RUN, "task", "max_n", "limit", "commit_every", "commit_interval_s", "retry_errors",
    "ray_address", "preset", "backend.qps", "backend.max_in_flight", "backend.timeout_s", "backend.max_retries",
    "backend.max_tokens", "backend.structured_output", "backend.engine_kwargs", "backend.sampling_kwargs"))
def enrich(ctx: typer.Context, values: dict, output_json: Optional[Path] = OutputJson, verbose: bool = Verbose):
    """Propose each document's missing search vocabulary (encoder or LLM; incremental, resumable)."""
    from sira.jobs import enrich as job

    cfg = EnrichConfig(**values)
    log_engines(ctx, cfg.warehouse, verbose)
    summary = job.run(cfg)
    stdout.print(f"documents {summary['documents']}  enriched {summary['enriched']}  skipped {summary['skipped']}  "
                 f"errors {summary['errors']}  tokens in/out {summary['input_tokens']}/{summary['output_tokens']}  "
                 f"{summary['docs_per_second']:.2f} docs/s  {summary['seconds']:.1f} s")
    write_json(summary, output_json)


@app.command()
@config_options(index_job.IndexConfig, (
    "warehouse", "preset", "shards", "spark_master", "enrichment", "tau", "full", "enrichment_model",
    "enrichment_prompt_version", "max_segments", "merge_below_fraction", "max_dead_fraction",
    "max_term_stats_versions"))
def index(ctx: typer.Context, values: dict, output_json: Optional[Path] = OutputJson, verbose: bool = Verbose):
    """Build and publish a new index version with Spark: only new or changed documents are analysed, and they
    enter a new segment on top of the newest version of the same kind (a full build when there is none)."""
    cfg = index_job.IndexConfig(**values)
    log_engines(ctx, cfg.warehouse, verbose)
    summary = index_job.run(cfg)
    console.print(f"published index version {summary['index_version']}: {summary['num_docs']} docs, "
                  f"{summary['num_terms']} terms, {summary['num_shards']} shards, segments {summary['segments']}")
    write_json(summary, output_json)


@app.command()
def search(
    text: Optional[str] = typer.Argument(None, help="the query (or give --program)"),
    warehouse: str = Warehouse,
    k: int = typer.Option(SEARCH_K, "-k", min=1, max=10_000),
    index_version: Optional[int] = typer.Option(None, help="default: the newest published version"),
    preset: Optional[str] = typer.Option(None, help="newest version of this preset"),
    must: list[str] = typer.Option([], "--must", help="a term or phrase every hit must hold (repeatable)"),
    exclude: list[str] = typer.Option([], "--exclude", help="a term or phrase no hit may hold (repeatable)"),
    program_file: Optional[Path] = typer.Option(None, "--program", help="run a retrieval program (JSON file)"),
    expand: bool = typer.Option(False, "--expand", help="add the LLM's expected-response sketch (DF-validated)"),
    backend: str = typer.Option(DEFAULT_PROPOSER, help="--expand: encoder | local | openai"),
    model: Optional[str] = typer.Option(None, help="--expand: model"),
    base_url: str = BaseUrlOption,
    task: Optional[str] = typer.Option(None, help="--expand: prompt task (default: the one recorded at ingest)"),
    w: Optional[float] = typer.Option(None, "--expansion-weight", help=W_HELP),
    tau: float = typer.Option(DEFAULT_TAU, "--tau", help=TAU_HELP),
    explain: bool = typer.Option(False, "--explain", help="show each hit's per-term contributions"),
    as_json: bool = typer.Option(False, "--json", help="print JSON (hits and the retrieval program)"),
):
    """Search one query (or run a retrieval program) and print the ranked hits."""
    from sira.pipelines.enrichment.backend_config import BackendConfig
    from sira.pipelines.serving.online_proposer import OnlineProposer
    from sira.pipelines.serving.retrievers import open_retriever
    from sira.core.program import RetrievalProgram

    if (text is None) == (program_file is None):
        raise ValueError("give either a query text or --program FILE")
    expand = expand and text is not None
    backend_config = BackendConfig(backend=backend, model=model, base_url=base_url)
    proposer = partial(OnlineProposer, warehouse, backend_config, task) if expand else None
    retriever, manifest = open_retriever(warehouse, index_version, preset, proposer=proposer, tau=tau, w=w, k=k)
    if program_file is not None:
        program = RetrievalProgram.model_validate_json(program_file.read_text(encoding="utf-8")) \
            .constrained(retriever.path.analyzer, must, exclude)
    else:
        proposals = retriever.proposer.propose([text]) if expand else None
        for failed in (p.error for p in proposals or () if p.error):
            console.print(f"[yellow]expansion failed, searching the plain query:[/yellow] {failed}")
        [program] = retriever.programs([text], must, exclude, proposals)
    results = retriever.rank([""], [program])
    hits = list(zip(results["doc_id"].to_pylist(), results["score"].to_pylist()))
    contributions = retriever.contributions(program, [d for d, _ in hits]) if explain else None
    _print_hits(program, manifest, hits, contributions, as_json)


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


@app.command()
@config_options(query_job.QueryConfig, ("warehouse", "queries", "out", "parquet", "run_id", "k", "expand", *PROPOSER,
                                        "task", "w", "tau", "index_version", "preset", "batch_size", "commit_every",
                                        "scorer", "ray_address"))
def query(ctx: typer.Context, values: dict, verbose: bool = Verbose, output_json: Optional[Path] = OutputJson):
    """Bulk scoring: expand, validate and score a query set; write the Delta `runs` table and a TREC run."""
    cfg = query_job.QueryConfig(**values)
    log_engines(ctx, cfg.warehouse, verbose)
    summary = query_job.run(cfg)
    stdout.print(f"run {summary['run_id']}: scored {summary['scored']}, skipped {summary['skipped']}, rejected "
                 f"{summary['rejected']} -> {summary['run_file']}, {summary['parquet_file']}")
    write_json(summary, output_json)


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
                                      "ray_address"), defaults={"doc_backend.backend": None})
def eval_(ctx: typer.Context, values: dict, rerank_backend: Optional[str] = RerankBackend,
          rerank_model: Optional[str] = RerankModel, rerank_depth: Optional[int] = RerankDepth,
          verbose: bool = Verbose, output_json: Optional[Path] = OutputJson):
    """Evaluate on a BEIR split (nDCG@10, Recall@10, Recall@100), building what the warehouse lacks."""
    cfg = eval_job.EvalConfig(**with_reranker(with_doc_backend(values), rerank_backend, rerank_model, rerank_depth))
    log_engines(ctx, cfg.warehouse or dataset_warehouse(cfg.dataset), verbose)
    summary = eval_job.run(cfg)
    table = Table(title=f"{summary['dataset']} / {summary['split']} / {summary['preset']} / {summary['variant']} "
                        f"({summary['num_queries']} queries)")
    for m in summary["metrics"]:
        table.add_column(m)
    table.add_row(*(f"{v:.4f}" for v in summary["metrics"].values()))
    stdout.print(table)
    write_json(summary, output_json)


@app.command()
def compare(
    base_run: Path = typer.Argument(..., help="TREC run of the baseline (e.g. the bm25 variant's run_file)"),
    run_file: Path = typer.Argument(..., metavar="RUN", help="TREC run compared with it"),
    dataset: str = typer.Option(..., "--dataset", "-d", help="beir:NAME or a folder in BEIR format"),
    split: str = typer.Option("test"),
    metric: str = typer.Option("ndcg@10", help="a ranx metric"),
    permutations: int = typer.Option(10_000, min=100, help="random swaps of the paired randomization test"),
    seed: int = typer.Option(0),
    output_json: Optional[Path] = OutputJson,
    plot: Optional[Path] = typer.Option(None, "--plot", help="also write a PNG of the sorted per-query differences"),
):
    """Two TREC runs on a split's judged queries: both means, the difference, the paired randomization test's p
    and per-query wins / losses / ties (each query's two scores go to --output-json)."""
    from sira.pipelines.tracking.runs import compare_run_files

    summary = compare_run_files(dataset, split, base_run, run_file, metric, permutations=permutations, seed=seed)
    table = Table(title=f"{dataset} / {split}: {run_file.name} against {base_run.name} ({summary['queries']} queries)")
    for col in ("base", "run", "delta", "p", "wins / losses / ties"):
        table.add_column(col)
    table.add_row(f"{summary['base']:.4f}", f"{summary['run']:.4f}", f"{summary['delta']:+.4f}",
                  f"{summary['p_value']:.4f}", f"{summary['wins']} / {summary['losses']} / {summary['ties']}")
    stdout.print(table)
    if plot is not None:
        from sira.pipelines.tracking.report import plot_paired_comparison

        stdout.print(f"wrote {plot_paired_comparison(summary, plot)}")
    write_json(summary, output_json)


@app.command()
@config_options(run_job.RunConfig, ("dataset", "warehouse", "preset", "split", "variants", *PROPOSER,
                                    "doc_backend.backend", "tau", "w", "depth", "shards", "spark_master",
                                    "tracking.enabled", *TRACKING), defaults={"doc_backend.backend": None})
def run(ctx: typer.Context, values: dict, rerank_backend: Optional[str] = RerankBackend,
        rerank_model: Optional[str] = RerankModel, rerank_depth: Optional[int] = RerankDepth,
        output_json: Optional[Path] = OutputJson, verbose: bool = Verbose):
    """The whole pipeline on one dataset: ingest, index, enrich, expand, and evaluate bm25 / doc / query / sira."""
    from sira.pipelines.tracking.report import variant_label
    from sira.core.datasets import resolve_dataset

    cfg = run_job.RunConfig(**with_reranker(with_doc_backend(values), rerank_backend, rerank_model, rerank_depth))
    log_engines(ctx, cfg.warehouse_path(resolve_dataset(cfg.dataset).name), verbose)
    summary = run_job.run(cfg)
    table = Table(title=f"{summary['dataset']} / {summary['split']}: {summary['seconds']:.0f} s"
                        + (f", MLflow run {summary['mlflow_run_id']}" if summary["mlflow_run_id"] else ""))
    for col in ("variant", "nDCG@10", "Recall@10", "Recall@100", "Δ nDCG@10"):
        table.add_column(col)
    base = summary["variants"].get("bm25", {}).get("metrics")
    for variant, r in summary["variants"].items():
        m = r["metrics"]
        delta = f"{m['ndcg@10'] - base['ndcg@10']:+.4f}" if base and variant != "bm25" else ""
        table.add_row(variant_label(variant, r), f"{m['ndcg@10']:.4f}", f"{m['recall@10']:.4f}",
                      f"{m['recall@100']:.4f}", delta)
    stdout.print(table)
    write_json(summary, output_json)


@app.command()
@config_options(sweep_job.SweepConfig, ("dataset", "split", "variant", "metric", "warehouse", "preset",
                                        "backend.backend", "backend.model", "backend.base_url", "doc_backend.backend",
                                        "shards", *TRACKING), defaults={"doc_backend.backend": None})
def sweep(ctx: typer.Context, values: dict,
          param: list[str] = typer.Option(..., "--param", help="NAME=V1,V2 for tau, w or n (n-gram order); "
                                                               "repeatable"),
          verbose: bool = Verbose, output_json: Optional[Path] = OutputJson):
    """Grid over tau / w / n-gram order, selected on train or dev, the choice evaluated once on test."""
    cfg = sweep_job.SweepConfig(**with_doc_backend(values), grid=dict(map(sweep_job.parse_param, param)))
    log_engines(ctx, cfg.warehouse or dataset_warehouse(cfg.dataset), verbose)
    summary = sweep_job.run(cfg)
    metric, split = cfg.metric, cfg.split
    table = Table(title=f"sweep {cfg.dataset} ({cfg.variant}): selected on {split} by {metric}")
    table.add_column("setting")
    table.add_column(f"{metric} ({split})")
    for t in summary["tried"]:
        mark = " <- selected" if t["point"] == summary["selected"] else ""
        table.add_row(str(t["point"]) + mark, f"{t['metrics'][metric]:.4f}")
    stdout.print(table)
    stdout.print(f"test ({summary['test']['split']}): " + "  ".join(f"{k} {v:.4f}" for k, v in summary["test"]["metrics"].items()))
    write_json(summary, output_json)


@app.command()
@config_options(nightly_job.NightlyConfig, (
    "warehouse", "source", "enrichment", *PROPOSER, *LLM_RUN, "task", "preset", "shards", "tau", "spark_master",
    "ray_address", "keep_days", "commit_every", "max_delete_fraction", "tracking.enabled", *TRACKING))
def nightly(ctx: typer.Context, values: dict, output_json: Optional[Path] = OutputJson, verbose: bool = Verbose):
    """Incremental update: MERGE the new snapshot, enrich only new or changed docs, publish a new index version."""
    cfg = nightly_job.NightlyConfig(**values)
    log_engines(ctx, cfg.warehouse, verbose)
    summary = nightly_job.run(cfg)
    i = summary["ingested"]
    stdout.print(f"index v{summary['index_version']}: {i['inserted']} inserted, {i['updated']} updated, "
                 f"{i['deleted']} deleted, {i['unchanged']} unchanged; {summary['enriched']} enriched; "
                 f"{summary['rejected']} rejected; expired versions {summary['expired_versions'] or 'none'}")
    write_json(summary, output_json)


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
