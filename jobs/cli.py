"""The `sira` command line: one subcommand per job; each validates its flags into the job's typed config."""

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
from sira.core.defaults import FOLLOW_POLL_S
from sira.core import variants as variant_table
from sira.jobs.options import (BaseUrlOption, Entries, OutputJson, ProposalTable, Proposals, RerankBackend,
                               RerankDepth, RerankModel, ShardsOption, SparkMasterOption, TauOption, TrackingUri,
                               Verbose, Warehouse, WeightOption, backend_of, dataset_warehouse, key_values,
                               log_engines, option_errors, reranker_of, write_json)

stdout = Console()  # results go to stdout; logs and progress go to stderr (sira.pipelines.tracking.console.console)
app = typer.Typer(add_completion=False, no_args_is_help=True, help="SIRA: single-call expert retrieval over BM25.")


@app.command()
def ingest(
    ctx: typer.Context,
    source: str = typer.Argument(..., help="beir:NAME, a BEIR folder, a .jsonl[.gz] or a .parquet file"),
    warehouse: str = Warehouse,
    merge: bool = typer.Option(False, "--merge", help="MERGE into the current docs table (inserts, updates, deletes "
                                                      "by content hash) instead of replacing it"),
    task: Optional[str] = typer.Option(None, help="prompt task recorded for this warehouse (default: the BEIR "
                                                  "dataset's, else the one recorded before, else generic)"),
    output_json: Optional[Path] = OutputJson,
    verbose: bool = Verbose,
):
    """Validate a corpus and write the Delta `docs` table; bad records go to `rejected` with the reason."""
    from sira.jobs import ingest as job

    log_engines(ctx, warehouse, verbose)
    summary = job.run(job.IngestConfig(source=source, warehouse=warehouse, mode="merge" if merge else "replace",
                                       task=task))
    console.print(
        f"read {summary['read']}  kept {summary['kept']}  rejected {summary['rejected']}"
        + (f"  {summary['rejected_by_reason']}" if summary["rejected"] else "")
        + ("  " + "  ".join(f"{k} {v}" for k, v in summary["changes"].items()) if "changes" in summary else "")
    )
    write_json(summary, output_json)


@app.command()
def enrich(
    ctx: typer.Context,
    warehouse: str = Warehouse,
    backend: str = typer.Option("encoder", help="encoder | local | openai | vllm"),
    model: Optional[str] = typer.Option(None, help="model id (openai/vllm) or GGUF path / packaged name (local)"),
    proposals: Optional[int] = Proposals,
    entries: Optional[str] = Entries,
    base_url: str = BaseUrlOption,
    api_key_env: str = typer.Option("OPENAI_API_KEY", "--api-key-env", help="openai: env var with the key"),
    task: Optional[str] = typer.Option(None, help="prompt task (generic, fact_check, argument, ...)"),
    max_n: int = typer.Option(3, "--max-n", help="longest phrase in words"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="rows per engine call (default: the "
                                                                         "backend's, backend_config.BATCH_SIZES)"),
    concurrency: Optional[int] = typer.Option(None, help="engine replicas (vllm: one per GPU; default: local one "
                                                         "per CPU core, the others 1)"),
    qps: Optional[int] = typer.Option(None, help="openai: requests per second"),
    timeout_s: float = typer.Option(60.0, "--timeout-s"),
    max_retries: int = typer.Option(3, "--max-retries"),
    max_tokens: int = typer.Option(160, "--max-tokens"),
    limit: Optional[int] = typer.Option(None, help="enrich at most this many documents"),
    commit_every: Optional[int] = typer.Option(None, "--commit-every", help="most rows per Delta commit (default: "
                                                                         "sira.pipelines.enrichment.ray_enrich.COMMIT_EVERY)"),
    commit_interval_s: Optional[float] = typer.Option(None, "--commit-interval-s",
                                                      help="commit what has arrived once this long has passed "
                                                           "since the last commit"),
    max_in_flight: Optional[int] = typer.Option(None, "--max-in-flight",
                                                help="openai: most requests waiting for an answer at once"),
    retry_errors: bool = typer.Option(True, "--retry-errors/--keep-errors",
                                      help="run documents whose last answer was an error again (--keep-errors: "
                                           "leave them, e.g. a local model, whose fixed seed fails the same way again)"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster address (default: local)"),
    structured_output: bool = typer.Option(True, "--structured-output/--free-output",
                                           help="LLMs: constrain the answer to the JSON schema (--free-output: "
                                                "decode freely; the parser records unusable answers as errors)"),
    engine_arg: list[str] = typer.Option([], "--engine-arg", help="vllm / local: engine argument KEY=VALUE "
                                                                  "(repeatable; VALUE read as JSON when it parses)"),
    sampling_arg: list[str] = typer.Option([], "--sampling-arg", help="vllm: SamplingParams KEY=VALUE, openai: "
                                                                      "request-body field (repeatable)"),
    output_json: Optional[Path] = OutputJson,
    verbose: bool = Verbose,
):
    """Propose each document's missing search vocabulary (encoder or LLM; incremental, resumable)."""
    from sira.jobs import enrich as job

    log_engines(ctx, warehouse, verbose)
    commits = {k: v for k, v in (("commit_every", commit_every), ("commit_interval_s", commit_interval_s))
               if v is not None}
    cfg = job.EnrichConfig(
        warehouse=warehouse, task=task, max_n=max_n, limit=limit, ray_address=ray_address, retry_errors=retry_errors,
        **commits,
        backend=backend_of(backend, model, base_url, proposals, entries, api_key_env=api_key_env,
                         batch_size=batch_size, concurrency=concurrency, qps=qps, timeout_s=timeout_s,
                         max_retries=max_retries, max_tokens=max_tokens, structured_output=structured_output,
                         engine_kwargs=key_values(engine_arg, "--engine-arg"),
                         sampling_kwargs=key_values(sampling_arg, "--sampling-arg"),
                         **({"max_in_flight": max_in_flight} if max_in_flight is not None else {})),
    )
    summary = job.run(cfg)
    stdout.print(f"documents {summary['documents']}  enriched {summary['enriched']}  skipped {summary['skipped']}  "
                 f"errors {summary['errors']}  tokens in/out {summary['input_tokens']}/{summary['output_tokens']}  "
                 f"{summary['docs_per_second']:.2f} docs/s  {summary['seconds']:.1f} s")
    write_json(summary, output_json)


@app.command()
def index(
    ctx: typer.Context,
    warehouse: str = Warehouse,
    preset: str = typer.Option("sira", help="pyserini-flat | sira"),
    shards: int = ShardsOption,
    spark_master: str = SparkMasterOption,
    enrichment: Optional[bool] = typer.Option(None, "--enrichment/--no-enrichment",
                                              help="inject enrichment phrases (default: when the warehouse has them)"),
    tau: float = TauOption,
    full: bool = typer.Option(False, "--full", help="one segment with every document instead of a new segment on "
                                                    "top of the newest version of the same kind"),
    output_json: Optional[Path] = OutputJson,
    verbose: bool = Verbose,
):
    """Build and publish a new index version with Spark: only new or changed documents are analysed, and they
    enter a new segment on top of the newest version of the same kind (a full build when there is none)."""
    from sira.jobs import index as job

    log_engines(ctx, warehouse, verbose)
    summary = job.run(job.IndexConfig(warehouse=warehouse, preset=preset, shards=shards, spark_master=spark_master,
                                      enrichment=enrichment, tau=tau, full=full))
    console.print(f"published index version {summary['index_version']}: {summary['num_docs']} docs, "
                  f"{summary['num_terms']} terms, {summary['num_shards']} shards, segments {summary['segments']}")
    write_json(summary, output_json)


@app.command()
def search(
    text: Optional[str] = typer.Argument(None, help="the query (or give --program)"),
    warehouse: str = Warehouse,
    k: int = typer.Option(10, "-k", min=1, max=10_000),
    index_version: Optional[int] = typer.Option(None, help="default: the newest published version"),
    preset: Optional[str] = typer.Option(None, help="newest version of this preset"),
    must: list[str] = typer.Option([], "--must", help="a term or phrase every hit must hold (repeatable)"),
    exclude: list[str] = typer.Option([], "--exclude", help="a term or phrase no hit may hold (repeatable)"),
    program_file: Optional[Path] = typer.Option(None, "--program", help="run a retrieval program (JSON file)"),
    expand: bool = typer.Option(False, "--expand", help="add the LLM's expected-response sketch (DF-validated)"),
    backend: str = typer.Option("encoder", help="--expand: encoder | local | openai"),
    model: Optional[str] = typer.Option(None, help="--expand: model"),
    base_url: str = BaseUrlOption,
    task: Optional[str] = typer.Option(None, help="--expand: prompt task (default: the one recorded at ingest)"),
    w: Optional[float] = WeightOption,
    tau: float = TauOption,
    explain: bool = typer.Option(False, "--explain", help="show each hit's per-term contributions"),
    as_json: bool = typer.Option(False, "--json", help="print JSON (hits and the retrieval program)"),
):
    """Search one query (or run a retrieval program) and print the ranked hits."""
    from sira.pipelines.serving.online_proposer import OnlineProposer
    from sira.pipelines.serving.retrievers import open_retriever
    from sira.core.program import RetrievalProgram

    if (text is None) == (program_file is None):
        raise ValueError("give either a query text or --program FILE")
    expand = expand and text is not None
    proposer = partial(OnlineProposer, warehouse, backend_of(backend, model, base_url), task) if expand else None
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
def query(
    ctx: typer.Context,
    warehouse: str = Warehouse,
    queries: str = typer.Option(..., "--queries", help="queries.jsonl[.gz], a qid<TAB>text TSV or a Delta table"),
    out: Path = typer.Option(..., "--out", help="TREC run file to write"),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="default: the run file's name"),
    k: int = typer.Option(1000, "-k"),
    expand: bool = typer.Option(True, "--expand/--no-expand", help="query-side expansion"),
    backend: str = typer.Option("encoder", help="encoder | local | openai | vllm"),
    model: Optional[str] = typer.Option(None),
    base_url: str = BaseUrlOption,
    proposals: Optional[int] = Proposals,
    entries: Optional[str] = Entries,
    task: Optional[str] = typer.Option(None, help="prompt task (default: the one recorded at ingest)"),
    w: Optional[float] = WeightOption,
    tau: float = TauOption,
    index_version: Optional[int] = typer.Option(None, "--index-version"),
    batch_size: int = typer.Option(256, "--batch-size", help="queries per scoring round and per runs-table commit"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address"),
    verbose: bool = Verbose,
    output_json: Optional[Path] = OutputJson,
):
    """Bulk scoring: expand, validate and score a query set; write the Delta `runs` table and a TREC run."""
    from sira.jobs import query as job

    log_engines(ctx, warehouse, verbose)

    summary = job.run(job.QueryConfig(warehouse=warehouse, queries=queries, out=out, run_id=run_id, k=k, expand=expand,
                                      backend=backend_of(backend, model, base_url, proposals, entries),
                                      task=task, w=w, tau=tau, index_version=index_version, batch_size=batch_size,
                                      ray_address=ray_address))
    stdout.print(f"run {summary['run_id']}: scored {summary['scored']}, skipped {summary['skipped']} "
                 f"-> {summary['run_file']}")
    write_json(summary, output_json)


@app.command()
def serve(
    warehouse: str = Warehouse,
    host: str = typer.Option("127.0.0.1", help="interface to bind (loopback unless told otherwise)"),
    port: int = typer.Option(8080, help="0: any free port"),
    index_version: Optional[int] = typer.Option(None, "--index-version", help="default: the newest published"),
    preset: Optional[str] = typer.Option(None, help="newest index of this preset"),
    api_token_env: Optional[str] = typer.Option(None, "--api-token-env",
                                                help="env var holding the bearer token the JSON endpoints require "
                                                     "(all but /health; the pages ask for it)"),
    max_query_chars: int = typer.Option(2000, "--max-query-chars"),
    max_k: int = typer.Option(1000, "--max-k"),
    max_concurrent: int = typer.Option(32, "--max-concurrent", help="searches in flight; more get 429"),
    backend: Optional[str] = typer.Option(None, help="query-side proposer for expand: encoder | openai | local "
                                                     "(default: none)"),
    model: Optional[str] = typer.Option(None, help="query-side model"),
    base_url: str = BaseUrlOption,
    timeout_s: float = typer.Option(10.0, "--timeout-s", help="openai: per-attempt timeout of an expansion"),
    w: Optional[float] = WeightOption,
    tau: float = TauOption,
    task: Optional[str] = typer.Option(None, help="prompt task (default: the one recorded at ingest)"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster address (default: local)"),
    follow: Optional[bool] = typer.Option(None, "--follow/--no-follow", help="switch to newer published versions "
                                                                        "(default: unless --index-version pins one)"),
    poll_s: float = typer.Option(FOLLOW_POLL_S, "--poll-s", help="seconds between checks for a newer version"),
):
    """Serve POST /search, GET /health, /runs, /compare over HTTP, and the pages that look inside (/, /compare);
    shards are held by Ray actors, queried scatter-gather."""
    from sira.jobs import serve as job


    # Online: one retry and short backoff; a user is waiting (a failed expansion falls back to the plain query).
    proposer = None if backend is None else backend_of(backend, model, base_url, timeout_s=timeout_s, max_retries=1,
                                                     retry_base_s=0.2)
    job.run(job.ServeConfig(warehouse=warehouse, host=host, port=port, index_version=index_version, preset=preset,
                            api_token_env=api_token_env, max_query_chars=max_query_chars, max_k=max_k,
                            max_concurrent=max_concurrent, backend=proposer, w=w, tau=tau, task=task,
                            ray_address=ray_address, follow=follow, poll_s=poll_s))


@app.command("eval")
def eval_(
    ctx: typer.Context,
    dataset: str = typer.Option(..., "--dataset", "-d", help="beir:NAME or a folder in BEIR format"),
    preset: str = typer.Option("sira", help="pyserini-flat | sira"),
    split: str = typer.Option("test"),
    variant: str = typer.Option("bm25", help=variant_table.help_text() + " (needs --rerank-backend)"),
    tau: float = TauOption,
    w: Optional[float] = WeightOption,
    task: Optional[str] = typer.Option(None, help="prompt task (default: from the dataset name)"),
    backend: str = typer.Option("encoder", help="query-side proposer: encoder | local | openai | vllm"),
    doc_backend: Optional[str] = typer.Option(None, "--doc-backend",
                                              help="corpus-side proposer: enrich with it first (default: index the warehouse's enrichment; encoder when none)"),
    model: Optional[str] = typer.Option(None, help="LLM model (both sides)"),
    base_url: str = BaseUrlOption,
    proposals: Optional[int] = Proposals,
    entries: Optional[str] = Entries,
    warehouse: Optional[str] = typer.Option(None, "--warehouse", "-w", help="default: warehouses/<dataset name>"),
    shards: int = ShardsOption,
    spark_master: str = SparkMasterOption,
    rerank_backend: Optional[str] = RerankBackend,
    rerank_model: Optional[str] = RerankModel,
    rerank_depth: int = RerankDepth,
    verbose: bool = Verbose,
    output_json: Optional[Path] = OutputJson,
):
    """Evaluate on a BEIR split (nDCG@10, Recall@10, Recall@100), building what the warehouse lacks."""
    from sira.jobs import eval as job

    log_engines(ctx, warehouse or dataset_warehouse(dataset), verbose)

    doc = None if doc_backend is None else backend_of(doc_backend, model, base_url, proposals, entries)
    summary = job.run(job.EvalConfig(dataset=dataset, preset=preset, split=split, variant=variant, tau=tau, w=w, task=task,
                                     backend=backend_of(backend, model, base_url, proposals, entries), doc_backend=doc,
                                     warehouse=warehouse, shards=shards, spark_master=spark_master,
                                     rerank=reranker_of(rerank_backend, rerank_model or (model if rerank_backend == backend else None),
                                                      base_url, rerank_depth)))
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
        from sira.jobs.report import plot_paired_comparison

        stdout.print(f"wrote {plot_paired_comparison(summary, plot)}")
    write_json(summary, output_json)


@app.command()
def run(
    ctx: typer.Context,
    dataset: str = typer.Option("beir:scifact", "--dataset", "-d", help="beir:NAME or a folder in BEIR format"),
    warehouse: Optional[str] = typer.Option(None, "--warehouse", "-w", help="default: warehouses/<dataset name>"),
    preset: str = typer.Option("sira", help="pyserini-flat | sira"),
    split: str = typer.Option("test"),
    variants: str = typer.Option(",".join(variant_table.SINGLE_CALL_VARIANTS), help=(
        f"comma-separated: {', '.join(variant_table.SINGLE_CALL_VARIANTS)}; add {variant_table.RERANK_VARIANT} (with "
        "--rerank-backend) to opt in")),
    backend: str = typer.Option("encoder", help="query-side proposer: encoder | local | openai | vllm"),
    doc_backend: Optional[str] = typer.Option(None, "--doc-backend", help="corpus-side proposer (default: --backend)"),
    model: Optional[str] = typer.Option(None, help="LLM model (both sides)"),
    base_url: str = BaseUrlOption,
    proposals: Optional[int] = Proposals,
    entries: Optional[str] = Entries,
    tau: float = TauOption,
    w: Optional[float] = WeightOption,
    shards: int = ShardsOption,
    spark_master: str = SparkMasterOption,
    tracking_uri: Optional[str] = TrackingUri,
    experiment: str = typer.Option("sira", help="MLflow experiment"),
    tracking: bool = typer.Option(True, "--tracking/--no-tracking", help="log to MLflow"),
    rerank_backend: Optional[str] = RerankBackend,
    rerank_model: Optional[str] = RerankModel,
    rerank_depth: int = RerankDepth,
    output_json: Optional[Path] = OutputJson,
    verbose: bool = Verbose,
):
    """The whole pipeline on one dataset: ingest, index, enrich, expand, and evaluate bm25 / doc / query / sira."""
    from sira.jobs import run as job
    from sira.pipelines.tracking.tracking import TrackingConfig
    from sira.core.datasets import resolve_dataset

    doc = None if doc_backend is None else backend_of(doc_backend, model, base_url, proposals, entries)
    cfg = job.RunConfig(dataset=dataset, warehouse=warehouse, preset=preset, split=split,
                        variants=[v.strip() for v in variants.split(",") if v.strip()],
                        backend=backend_of(backend, model, base_url, proposals, entries), doc_backend=doc, tau=tau, w=w,
                        shards=shards, spark_master=spark_master,
                        rerank=reranker_of(rerank_backend, rerank_model or (model if rerank_backend == backend else None),
                                         base_url, rerank_depth),
                        tracking=TrackingConfig(enabled=tracking, tracking_uri=tracking_uri, experiment=experiment))
    log_engines(ctx, cfg.warehouse_path(resolve_dataset(dataset).name), verbose)
    summary = job.run(cfg)
    table = Table(title=f"{summary['dataset']} / {summary['split']}: {summary['seconds']:.0f} s"
                        + (f", MLflow run {summary['mlflow_run_id']}" if summary["mlflow_run_id"] else ""))
    for col in ("variant", "nDCG@10", "Recall@10", "Recall@100", "Δ nDCG@10"):
        table.add_column(col)
    base = summary["variants"].get("bm25", {}).get("metrics")
    for variant, r in summary["variants"].items():
        m = r["metrics"]
        delta = f"{m['ndcg@10'] - base['ndcg@10']:+.4f}" if base and variant != "bm25" else ""
        table.add_row(job.variant_label(variant, r), f"{m['ndcg@10']:.4f}", f"{m['recall@10']:.4f}",
                      f"{m['recall@100']:.4f}", delta)
    stdout.print(table)
    write_json(summary, output_json)


@app.command()
def sweep(
    ctx: typer.Context,
    dataset: str = typer.Option(..., "--dataset", "-d", help="beir:NAME or a folder in BEIR format"),
    split: str = typer.Option(..., help="train | dev: the split the setting is selected on (never test)"),
    param: list[str] = typer.Option(..., "--param", help="NAME=V1,V2 for tau, w or n (n-gram order); repeatable"),
    variant: str = typer.Option("sira", help=variant_table.help_text(variant_table.SINGLE_CALL_VARIANTS)),
    metric: str = typer.Option("ndcg@10", help="selection metric"),
    warehouse: Optional[str] = typer.Option(None, "--warehouse", "-w", help="default: warehouses/<dataset name>"),
    preset: str = typer.Option("sira"),
    backend: str = typer.Option("encoder", help="query-side proposer: encoder | local | openai | vllm"),
    doc_backend: Optional[str] = typer.Option(None, "--doc-backend", help="corpus-side proposer"),
    model: Optional[str] = typer.Option(None),
    base_url: str = BaseUrlOption,
    shards: int = ShardsOption,
    tracking_uri: Optional[str] = TrackingUri,
    experiment: str = typer.Option("sira", help="MLflow experiment"),
    verbose: bool = Verbose,
    output_json: Optional[Path] = OutputJson,
):
    """Grid over tau / w / n-gram order, selected on train or dev, the choice evaluated once on test."""
    from sira.jobs import sweep as job
    from sira.pipelines.tracking.tracking import TrackingConfig

    log_engines(ctx, warehouse or dataset_warehouse(dataset), verbose)

    grid = dict(job.parse_param(p) for p in param)
    doc = None if doc_backend is None else backend_of(doc_backend, model, base_url)
    summary = job.run(job.SweepConfig(dataset=dataset, warehouse=warehouse, preset=preset, split=split, variant=variant,
                                      grid=grid, metric=metric, backend=backend_of(backend, model, base_url),
                                      doc_backend=doc, shards=shards,
                                      tracking=TrackingConfig(tracking_uri=tracking_uri, experiment=experiment)))
    table = Table(title=f"sweep {dataset} ({variant}): selected on {split} by {metric}")
    table.add_column("setting")
    table.add_column(f"{metric} ({split})")
    for t in summary["tried"]:
        mark = " <- selected" if t["point"] == summary["selected"] else ""
        table.add_row(str(t["point"]) + mark, f"{t['metrics'][metric]:.4f}")
    stdout.print(table)
    stdout.print(f"test ({summary['test']['split']}): " + "  ".join(f"{k} {v:.4f}" for k, v in summary["test"]["metrics"].items()))
    write_json(summary, output_json)


@app.command()
def nightly(
    ctx: typer.Context,
    warehouse: str = Warehouse,
    source: str = typer.Option(..., "--source", help="the corpus snapshot: beir:NAME, a BEIR folder, .jsonl[.gz], .parquet"),
    backend: str = typer.Option("encoder", help="corpus-side proposer: encoder | local | openai | vllm"),
    enrichment: bool = typer.Option(True, "--enrichment/--no-enrichment",
                                    help="enrich and publish the enriched index; --no-enrichment: the plain index"),
    model: Optional[str] = typer.Option(None, help="LLM model"),
    base_url: str = BaseUrlOption,
    api_key_env: str = typer.Option("OPENAI_API_KEY", "--api-key-env", help="openai: env var with the key"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="rows per engine call (default: the "
                                                                         "backend's, backend_config.BATCH_SIZES)"),
    concurrency: Optional[int] = typer.Option(None, help="LLM engine replicas (vllm: one per GPU; default: local "
                                                         "one per CPU core, the others 1)"),
    task: Optional[str] = typer.Option(None, help="prompt task (default: the one recorded at ingest)"),
    preset: str = typer.Option("sira", help="pyserini-flat | sira"),
    shards: int = ShardsOption,
    tau: float = TauOption,
    spark_master: str = SparkMasterOption,
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster address (default: local)"),
    keep_days: float = typer.Option(7.0, "--keep-days", help="delete index versions older than this (the newest "
                                                             "of each kind stays)"),
    max_delete_fraction: float = typer.Option(0.5, "--max-delete-fraction",
                                              help="refuse a snapshot that deletes more than this share of the docs"),
    tracking_uri: Optional[str] = TrackingUri,
    experiment: str = typer.Option("sira", help="MLflow experiment"),
    tracking: bool = typer.Option(True, "--tracking/--no-tracking", help="log to MLflow"),
    output_json: Optional[Path] = OutputJson,
    verbose: bool = Verbose,
):
    """Incremental update: MERGE the new snapshot, enrich only new or changed docs, publish a new index version."""
    from sira.jobs import nightly as job
    from sira.pipelines.tracking.tracking import TrackingConfig

    log_engines(ctx, warehouse, verbose)
    summary = job.run(job.NightlyConfig(
        warehouse=warehouse, source=source, task=task, preset=preset, enrichment=enrichment,
        backend=backend_of(backend, model, base_url, api_key_env=api_key_env, batch_size=batch_size,
                         concurrency=concurrency),
        shards=shards, tau=tau, spark_master=spark_master, ray_address=ray_address, keep_days=keep_days,
        max_delete_fraction=max_delete_fraction,
        tracking=TrackingConfig(enabled=tracking, tracking_uri=tracking_uri, experiment=experiment)))
    i = summary["ingested"]
    stdout.print(f"index v{summary['index_version']}: {i['inserted']} inserted, {i['updated']} updated, "
                 f"{i['deleted']} deleted, {i['unchanged']} unchanged; {summary['enriched']} enriched; "
                 f"{summary['rejected']} rejected; expired versions {summary['expired_versions'] or 'none'}")
    write_json(summary, output_json)


@app.command()
def report(
    output_dir: Path = typer.Option(Path("reports"), "--output-dir", help="report.md and PNG plots go here"),
    dataset: list[str] = typer.Option([], "--dataset", help="limit to these datasets (repeatable)"),
    tracking_uri: Optional[str] = TrackingUri,
    experiment: str = typer.Option("sira", help="MLflow experiment"),
):
    """Markdown report and plots: our variants per dataset (newest `sira run` each) beside published references."""
    from sira.jobs import report as job
    from sira.pipelines.tracking.tracking import TrackingConfig

    summary = job.run(job.ReportConfig(output_dir=str(output_dir), datasets=dataset or None,
                                       tracking=TrackingConfig(tracking_uri=tracking_uri, experiment=experiment)))
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
