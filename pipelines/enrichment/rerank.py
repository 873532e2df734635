"""The `sira+rerank` stage: an LLM judges each query's first-stage top-k passages (0-100), judgments are cached in
the Delta `rerank_judgments` table, and each top-k block is reordered by them (sira.core.rerank has the prompt,
the parser and the merge rule).

Judgments run in the driver: `openai` requests go out concurrently (max_in_flight at most, paced by qps) through
the enrichment stage's OpenAIClient, with its timeouts, retries and backoff; the `local` model runs in-process. A
top-k rerank is a few thousand short calls per BEIR split, bound by the LLM server, not by the client. Results are
committed every `commit_every` judgments with a MERGE on (query_hash, doc_id, content_hash, model, prompt_version):
a rerun pays only for what is missing or failed.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Callable, Mapping

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sira.pipelines.storage.delta_io import merge_rows, read_table, table_exists
from sira.pipelines.enrichment.backend_config import DEFAULT_PROPOSER, BackendConfig
from sira.pipelines.enrichment.llm_backends import OpenAIClient, openai_request
from sira.pipelines.enrichment.expansion_cache import query_hash
from sira.core import tables
from sira.core.defaults import DEFAULT_OPENAI_BASE_URL
from sira.core.enrichment import document_input
from sira.core.rerank import RERANK_DEPTH, RERANK_JSON_SCHEMA, load_rerank_template, parse_score, render_judgment, \
    rerank_order

# {"score": 100} is about 7 tokens; the rest is room for a model's stray whitespace.
RERANK_MAX_TOKENS = 16
# llama.cpp grammar for the local model: exactly {"score": N} with N in 0..100 (its JSON-schema converter ignores
# minimum / maximum).
RERANK_GBNF = r'root ::= "{\"score\": " ("100" | [1-9] [0-9] | [0-9]) "}"'


def judge_backend(backend: str, model: str | None = None, base_url: str = DEFAULT_OPENAI_BASE_URL,
                  **kwargs) -> BackendConfig:
    """A BackendConfig for judging: the reference's temperature 0 and a short output unless told otherwise."""
    return BackendConfig(backend=backend, model=model, base_url=base_url,
                         **{"temperature": 0.0, "max_tokens": RERANK_MAX_TOKENS, **kwargs})


class RerankConfig(BaseModel):
    """The LLM reranker of the sira+rerank variant (logged whole with the run)."""

    model_config = ConfigDict(extra="forbid")

    backend: BackendConfig = Field(default_factory=lambda: judge_backend("local"),
                                   description="the judge: openai (any OpenAI-compatible endpoint) or local")
    depth: int = Field(RERANK_DEPTH, ge=1, description="first-stage hits judged per query; deeper hits keep their "
                                                       "order below them")
    commit_every: int = Field(256, gt=0, description="judgments per Delta commit")

    @field_validator("backend", mode="before")
    @classmethod
    def _judge_defaults(cls, backend):
        """A judge given by its fields (--rerank-backend, --rerank-model) gets a judge's sampling settings."""
        return judge_backend(**backend) if isinstance(backend, dict) else backend

    @field_validator("backend")
    @classmethod
    def _can_judge(cls, backend: BackendConfig) -> BackendConfig:
        if backend.backend == "openai" and backend.model is None:
            raise ValueError("an openai judge needs the endpoint's model id: --rerank-model")
        if backend.backend == "encoder":
            raise ValueError("the encoder backend cannot rerank (it proposes vocabulary, it does not judge "
                             "relevance): use --rerank-backend local or openai")
        if backend.backend == "vllm":
            raise ValueError("rerank with vLLM through its OpenAI-compatible server: `vllm serve MODEL`, then "
                             "--rerank-backend openai --base-url http://HOST:8000/v1 --rerank-model MODEL")
        return backend


def judge_beside_proposer(values):
    """A config's `rerank` given by its fields, judging on the backend of the config's query-side proposer: the judge
    takes the proposer's endpoint, and its model unless given one (a before-validator of the configs that hold both)."""
    rerank = values.get("rerank") if isinstance(values, dict) else None
    if not isinstance(rerank, dict) or not isinstance(rerank.get("backend"), dict):
        return values
    proposer = values.get("backend") or {}
    proposer = proposer.model_dump() if isinstance(proposer, BaseModel) else proposer
    judge = dict(rerank["backend"])
    if judge.get("backend") == proposer.get("backend", DEFAULT_PROPOSER) and judge.get("model") is None:
        judge["model"] = proposer.get("model")
    judge.setdefault("base_url", proposer.get("base_url", DEFAULT_OPENAI_BASE_URL))
    return {**values, "rerank": {**rerank, "backend": judge}}


def cached_judgments(warehouse: str, model: str, prompt_version: str,
                     query_hashes: set[str]) -> dict[tuple[str, str, str], int]:
    """(query_hash, doc_id, content_hash) -> score of every successful judgment for (model, prompt_version)."""
    uri = tables.table_uri(warehouse, tables.RERANK)
    if not table_exists(uri):
        return {}
    t = read_table(uri, columns=["query_hash", "doc_id", "content_hash", "model", "prompt_version", "score", "error"])
    t = t.filter(pc.and_(pc.and_(pc.equal(t["model"], model), pc.equal(t["prompt_version"], prompt_version)),
                         pc.and_(pc.is_null(t["error"]), pc.is_in(t["query_hash"],
                                                                 value_set=pa.array(sorted(query_hashes), pa.string())))))
    return {(h, d, c): s for h, d, c, s in zip(t["query_hash"].to_pylist(), t["doc_id"].to_pylist(),
                                              t["content_hash"].to_pylist(), t["score"].to_pylist())}


def rerank_run(
    warehouse: str,
    queries: Mapping[str, str],
    run_hits: Mapping[str, Mapping[str, float]],
    cfg: RerankConfig,
    on_progress: Callable[[int], None] = lambda n: None,
) -> tuple[dict[str, dict[str, float]], dict]:
    """Rerank each query's top `cfg.depth` hits of `run_hits` (qid -> {doc_id: first-stage score}); returns the new
    run and the cost of the judgments made now.

    The new run's scores are rank-derived (the last hit scores 1, each hit above it one more), so every tool
    reads the same order; the 0-100 judgments are in the `rerank_judgments` table."""
    started = time.perf_counter()
    template = load_rerank_template()
    model, version = cfg.backend.model_id(), template.version
    first_stage = {qid: [d for d, _ in sorted(hits.items(), key=lambda kv: (-kv[1], kv[0]))]
                   for qid, hits in run_hits.items()}
    passages = _passages(warehouse, {d for order in first_stage.values() for d in order[:cfg.depth]})
    hashes = {qid: query_hash(queries[qid]) for qid in first_stage}
    cached = cached_judgments(warehouse, model, version, set(hashes.values()))
    pairs: dict[tuple[str, str, str], tuple[str, str]] = {}  # judgment key -> (query, passage)
    for qid, order in first_stage.items():
        for doc_id in order[:cfg.depth]:
            if doc_id in passages:  # else gone from the docs table since the index was built: nothing to judge
                content_hash, passage = passages[doc_id]
                pairs[(hashes[qid], doc_id, content_hash)] = (queries[qid], passage)
    todo = {key: pair for key, pair in pairs.items() if key not in cached}
    counters = {"judged": 0, "errors": 0, "cached": len(pairs) - len(todo), "input_tokens": 0, "output_tokens": 0}
    if todo:
        rows = [{"query_hash": h, "query": query, "doc_id": d, "content_hash": c,
                 "prompt": render_judgment(template, query, passage)} for (h, d, c), (query, passage) in todo.items()]
        for chunk in _judge(rows, cfg):
            result = pa.Table.from_pylist(
                [{**r, "model": model, "prompt_version": version, "backend": cfg.backend.backend,
                  "judged_at": datetime.now(timezone.utc)} for r in chunk])
            merge_rows(tables.table_uri(warehouse, tables.RERANK),
                       result.select(tables.RERANK_SCHEMA.names).cast(tables.RERANK_SCHEMA), tables.RERANK_KEY,
                       replace_when="t.error IS NOT NULL")
            errors = sum(1 for r in chunk if r["error"])
            counters["judged"] += len(chunk) - errors
            counters["errors"] += errors
            counters["input_tokens"] += sum(r["input_tokens"] for r in chunk)
            counters["output_tokens"] += sum(r["output_tokens"] for r in chunk)
            on_progress(len(chunk))
        cached = cached_judgments(warehouse, model, version, set(hashes.values()))
    reranked = {}
    for qid, order in first_stage.items():
        scores = {d: cached.get((hashes[qid], d, passages[d][0])) for d in order[:cfg.depth] if d in passages}
        final = rerank_order(order, scores, cfg.depth)
        reranked[qid] = {d: float(len(final) - rank) for rank, d in enumerate(final)}
    seconds = time.perf_counter() - started
    made = counters["judged"] + counters["errors"]
    return reranked, {**counters, "seconds": seconds, "judgments_per_second": made / seconds if made else None,
                      "model": model, "prompt_version": version, "backend": cfg.backend.backend, "depth": cfg.depth}


def _passages(warehouse: str, doc_ids: set[str]) -> dict[str, tuple[str, str]]:
    """doc_id -> (content_hash, the passage the judge reads: `title. text`, cut like the enrichment input)."""
    docs = read_table(tables.table_uri(warehouse, tables.DOCS), columns=["doc_id", "title", "text", "content_hash"])
    docs = docs.filter(pc.is_in(docs["doc_id"], value_set=pa.array(sorted(doc_ids), pa.string())))
    return {d: (h, document_input(t, x)) for d, t, x, h in zip(docs["doc_id"].to_pylist(), docs["title"].to_pylist(),
                                                                docs["text"].to_pylist(),
                                                                docs["content_hash"].to_pylist())}


def _judge(rows: list[dict], cfg: RerankConfig):
    """Yields chunks of `rows` (each with a `prompt`), every row given a score, the backend output columns and
    an error (the backend's, or the parser's). One bad judgment never stops the others."""
    judge = _LocalJudge(cfg.backend) if cfg.backend.backend == "local" else _OpenAIJudge(cfg.backend)
    for start in range(0, len(rows), cfg.commit_every):
        chunk = rows[start : start + cfg.commit_every]
        outputs = judge([r["prompt"] for r in chunk])
        judged = []
        for row, out in zip(chunk, outputs):
            score, parse_error = (None, None) if out.get("error") else parse_score(out.get("raw_output"))
            judged.append({**{k: v for k, v in row.items() if k != "prompt"}, "score": score,
                           "raw_output": out.get("raw_output"), "input_tokens": int(out.get("input_tokens") or 0),
                           "output_tokens": int(out.get("output_tokens") or 0),
                           "latency_ms": float(out.get("latency_ms") or 0.0),
                           "error": out.get("error") or parse_error})
        yield judged


class _OpenAIJudge:
    """Prompts -> backend output rows, through the enrichment stage's client and request body, with the relevance
    schema in place of the keyword one."""

    def __init__(self, cfg: BackendConfig):
        self.cfg = cfg
        _, self.body = openai_request(cfg)
        if cfg.structured_output:
            self.body["response_format"] = {"type": "json_schema",
                                            "json_schema": {"name": "relevance", "schema": RERANK_JSON_SCHEMA}}

    def __call__(self, prompts: list[str]) -> list[dict]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._ask_all(prompts))
        # Called from inside an event loop (a notebook): run on a loop of its own.
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, self._ask_all(prompts)).result()

    async def _ask_all(self, prompts: list[str]) -> list[dict]:
        cfg = self.cfg
        async with OpenAIClient(cfg, cfg.max_in_flight, cfg.qps, self.body) as client:
            return await asyncio.gather(*(client.ask(p) for p in prompts))


class _LocalJudge:
    """Prompts -> backend output rows from the embedded model, loaded once, decoding under the relevance grammar."""

    def __init__(self, cfg: BackendConfig):
        from sira.pipelines.enrichment.local_llm import LocalLLMActor  # first: it sets how llama.cpp's threads wait

        from llama_cpp import LlamaGrammar

        self.actor = LocalLLMActor(cfg.model_dump_json(), keywords=False)  # no keyword examples, one decoding
        # The actor's grammar is the keyword schema; a judgment is one bounded integer.
        self.actor.grammar = LlamaGrammar.from_string(RERANK_GBNF, verbose=False) if cfg.structured_output else None

    def __call__(self, prompts: list[str]) -> list[dict]:
        return [self.actor.generate(p) for p in prompts]
