"""The `sira` command line's shared options and the helpers that turn options into job configs: declared once,
used by the commands in sira.jobs.cli (their defaults and help live in sira.core.defaults or the job configs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError

from sira.pipelines.tracking.console import engine_log_path, engine_logs
from sira.core.defaults import (DEFAULT_OPENAI_BASE_URL, DEFAULT_SHARDS, DEFAULT_SPARK_MASTER, DEFAULT_TAU, SHARDS_HELP,
                                 SPARK_MASTER_HELP, TAU_HELP, W_HELP, default_warehouse)

# The options several commands share, declared once (their defaults and help live in sira.core.defaults).
TauOption = typer.Option(DEFAULT_TAU, "--tau", help=TAU_HELP)
WeightOption = typer.Option(None, "--expansion-weight", help=W_HELP)
ShardsOption = typer.Option(DEFAULT_SHARDS, "--shards", help=SHARDS_HELP)
SparkMasterOption = typer.Option(DEFAULT_SPARK_MASTER, "--spark-master", help=SPARK_MASTER_HELP)
BaseUrlOption = typer.Option(DEFAULT_OPENAI_BASE_URL, "--base-url", help="openai: the endpoint's /v1 URL")
OutputJson = typer.Option(None, "--output-json", help="write the job's summary as JSON to this path")
Warehouse = typer.Option(..., "--warehouse", "-w", envvar="SIRA_WAREHOUSE", help="warehouse directory or URI")
Verbose = typer.Option(False, "--verbose", "-v", help="show the engines' own logs (Ray, Spark, Ivy, the JVM) on the "
                                                      "console instead of in WAREHOUSE/logs/")
Proposals = typer.Option(None, "--proposals", help="encoder: phrases proposed per text (default: the measured one)")
Entries = typer.Option(None, "--entries", help="encoder: vocabulary entries, unigram | bigram")
RerankBackend = typer.Option(None, "--rerank-backend", help="sira+rerank: the LLM judge, openai | local")
RerankModel = typer.Option(None, "--rerank-model", help="sira+rerank: the judge's model (default: --model when "
                                                         "--rerank-backend is --backend; local: the packaged one)")
RerankDepth = typer.Option(20, "--rerank-depth", help="sira+rerank: first-stage hits judged per query")
TrackingUri = typer.Option(None, "--tracking-uri", help="MLflow tracking URI (default: sqlite:///mlruns/mlflow.db)")
ProposalTable = typer.Option("enrichment", "--table", help="enrichment (corpus side) | expansions (query side)")

# Config fields whose command-line option is not --FIELD-NAME.
OPTION_OF_FIELD = {"w": "--expansion-weight"}


def log_engines(ctx: typer.Context, warehouse: str, verbose: bool) -> None:
    """Until the command ends, the engines' output goes to a log file of the warehouse, named at the end (on the
    console when `verbose`)."""
    path = None if verbose else engine_log_path(warehouse, ctx.info_name)
    ctx.with_resource(engine_logs(path))


def dataset_warehouse(dataset: str) -> str:
    from sira.core.datasets import resolve_dataset

    return default_warehouse(resolve_dataset(dataset).name)


def write_json(summary: dict, path: Optional[Path]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")


def backend_of(backend: str, model: str | None = None, base_url: str = DEFAULT_OPENAI_BASE_URL,
               proposals: int | None = None, entries: str | None = None, **kwargs):
    """A BackendConfig from command-line options; --proposals / --entries set the encoder proposer."""
    from sira.pipelines.enrichment.backend_config import BackendConfig
    from sira.core.proposers import EncoderProposerConfig

    encoder = EncoderProposerConfig(**{k: v for k, v in (("proposals", proposals), ("entries", entries))
                                       if v is not None})
    return BackendConfig(backend=backend, model=model, base_url=base_url, encoder=encoder, **kwargs)


def key_values(pairs: list[str], option: str) -> dict:
    """KEY=VALUE options -> a dict; a VALUE that reads as JSON (numbers, true, lists) is taken as JSON, else as text."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint=option)
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def reranker_of(backend: str | None, model: str | None, base_url: str, depth: int):
    """The sira+rerank reranker from command-line options; None without --rerank-backend."""
    if backend is None:
        return None
    from sira.pipelines.enrichment.rerank import RerankConfig, judge_backend

    if backend == "openai" and model is None:
        raise ValueError("--rerank-backend openai needs --rerank-model (the endpoint's model id)")
    return RerankConfig(backend=judge_backend(backend, model, base_url), depth=depth)


def option_errors(exc: ValidationError) -> str:
    """A job config's validation errors, one line each, named by the option that set the value: "--variant:
    'dense' is not one of bm25, doc, ...", not pydantic's multi-line report with a web address."""
    lines = []
    for err in exc.errors(include_url=False):
        fields = [str(part) for part in err["loc"] if isinstance(part, str)]
        if err["type"] == "value_error":  # the config's own check, which names what is wrong
            what = str(err["ctx"]["error"])
        elif err["type"] == "literal_error":
            what = f"{err['input']!r} is not one of {err['ctx']['expected'].replace(' or ', ', ')}"
        else:
            what = f"{err['msg']} (got {err['input']!r})"
        if not fields:  # a check of several fields together
            lines.append(what)
            continue
        option = OPTION_OF_FIELD.get(fields[-1], "--" + fields[-1].replace("_", "-"))
        if fields[:-1]:  # a nested config's field (backend.model): its path says which
            option += f" ({'.'.join(fields)})"
        lines.append(f"{option}: {what}")
    return "\n".join(lines)
