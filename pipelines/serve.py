"""`sira serve`: the online search API over one published index version (aiohttp.web).

    POST /search  {"query": str, "k": 10, "expand": false, "must": [str], "exclude": [str]}
                  -> {"hits": [{"doc_id", "score"}], "program": {RetrievalProgram}, "timing_ms": {...}}
    GET  /health  -> {"status", "index_version", "num_docs", "shards", ...}

Shards live in Ray actors (pipelines.shard_actors) and are queried scatter-gather: every actor returns its
top-k for the compiled query and sira_core.search.merge_ranked merges them by (score desc, doc id asc), so a
response ranks exactly like the in-process Searcher. Limits answer 4xx JSON `{"error": ...}`: 400 invalid
request, 401 missing / wrong bearer token (when one is configured; /health stays open for probes), 413 body
too large, 429 more than `max_concurrent` searches in flight. A request never takes the server down.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import signal
import time
from dataclasses import dataclass, field
from typing import Callable

import ray
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipelines.llm_backends import BackendConfig
from pipelines.online_proposer import OnlineProposer
from sira_core.analysis import Analyzer, AnalyzerConfig
from sira_core.dfstats import DFTable, query_side_filter
from sira_core.program import DEFAULT_W, RetrievalProgram
from sira_core.search import compile_query, merge_ranked

log = logging.getLogger("sira.serve")

MAX_CONSTRAINTS = 32  # must / exclude entries per request
HEALTH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Limits:
    max_query_chars: int = 2000
    max_k: int = 1000
    max_concurrent: int = 32
    api_token: str | None = None  # None: no authentication

    @property
    def max_body_bytes(self) -> int:
        # A maximal query even when every character is JSON-escaped (a surrogate pair is 12 bytes), plus room
        # for the other fields and the constraints.
        return 12 * self.max_query_chars + 64 * 1024


class SearchRequest(BaseModel):
    # Strict: "10" is not a k and 1 is not a query; unknown fields are typos, not options to ignore.
    model_config = ConfigDict(extra="forbid", strict=True)

    query: str
    k: int = 10
    expand: bool = False
    must: list[str] = Field(default_factory=list, max_length=MAX_CONSTRAINTS)
    exclude: list[str] = Field(default_factory=list, max_length=MAX_CONSTRAINTS)


class BadRequest(ValueError):
    """The request is invalid: answered 400 with this message."""


@dataclass
class SearchService:
    """One index version held by shard actors, the analyzer, and (optionally) the query-side proposer."""

    manifest: dict
    actors: list
    analyzer: Analyzer
    proposer: OnlineProposer | None = None
    df_table: DFTable | None = None
    w: float = DEFAULT_W
    tau: float = 0.05
    in_flight: int = field(default=0, init=False)

    @classmethod
    def start(cls, warehouse: str, index_version: int | None = None, preset: str | None = None,
              backend: BackendConfig | None = None, task: str = "generic", w: float = DEFAULT_W, tau: float = 0.05,
              ray_address: str | None = None, actors: list | None = None) -> "SearchService":
        """Find the index version, start one actor per shard (or use `actors`), load what expansion needs."""
        from pipelines.ray_enrich import init_ray
        from pipelines.shard_actors import start_shard_actors
        from pipelines.shard_loader import find_index, load_df_table

        manifest = find_index(warehouse, index_version, preset)
        proposer = OnlineProposer(warehouse, backend, task, manifest) if backend is not None else None
        df_table = load_df_table(warehouse, manifest) if proposer is not None else None
        if actors is None:
            init_ray(ray_address)
            actors = start_shard_actors(warehouse, manifest)
        analyzer = Analyzer(AnalyzerConfig.model_validate_json(manifest["analyzer_json"]))
        return cls(manifest, actors, analyzer, proposer, df_table, w, tau)

    def stop_actors(self) -> None:
        for actor in self.actors:
            ray.kill(actor)

    async def search(self, req: SearchRequest) -> dict:
        if req.expand and self.proposer is None:
            raise BadRequest("expand: this server has no expansion backend (start it with --backend openai|local|encoder)")
        try:  # constraints without index terms are the caller's mistake; check before paying for an expansion
            RetrievalProgram.build("", self.analyzer, must=req.must, exclude=req.exclude)
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        started = time.perf_counter()
        decisions, expansion, weights = (), None, None
        if req.expand:
            proposal = await self.proposer.propose(req.query)
            decisions = query_side_filter(proposal.phrases, self.analyzer, self.df_table.lookup,
                                          self.manifest["num_docs"], self.tau)
            # A failed expansion degrades to the plain query (the program shows no expansions) rather than failing
            # the search; the response says why.
            expansion = {"source": proposal.source, "error": proposal.error}
            weights = proposal.weight_of()
        expanded = time.perf_counter()
        program = RetrievalProgram.build(
            req.query, self.analyzer, decisions, w=self.w, must=req.must, exclude=req.exclude,
            proposer=self.proposer.model if req.expand else "", index_version=self.manifest["index_version"],
            prompt_version=self.proposer.prompt_version if req.expand else None, weights=weights)
        compiled = compile_query(program.parts())
        constraints = [(program.must, program.exclude)]
        per_shard = await asyncio.gather(*(a.top_k.remote([compiled], req.k, constraints) for a in self.actors))
        hits = merge_ranked([ranked[0] for ranked in per_shard], req.k)
        scored = time.perf_counter()
        out = {
            "hits": [{"doc_id": doc_id, "score": score} for doc_id, score in hits],
            "program": program.model_dump(),
            "timing_ms": {"expansion": (expanded - started) * 1000, "scoring": (scored - expanded) * 1000},
        }
        if expansion is not None:
            out["expansion"] = expansion
        return out

    async def health(self) -> tuple[int, dict]:
        m = self.manifest
        body = {"index_version": m["index_version"], "num_docs": m["num_docs"], "shards": len(self.actors),
                "preset": m["preset"], "enriched": bool(m["enriched"]), "in_flight": self.in_flight,
                "expansion": None if self.proposer is None else
                {"backend": self.proposer.backend.backend, "model": self.proposer.model,
                 "prompt_version": self.proposer.prompt_version, "cached_queries": len(self.proposer.cache)}}
        try:
            await asyncio.wait_for(asyncio.gather(*(a.num_docs.remote() for a in self.actors)), HEALTH_TIMEOUT_S)
        except (ray.exceptions.RayError, asyncio.TimeoutError) as exc:
            return 503, {"status": "unavailable", "error": f"a shard actor does not answer: {type(exc).__name__}",
                         **body}
        return 200, {"status": "ok", **body}


# ---------------------------------------------------------------- HTTP ----------------------------------------------

SERVICE = web.AppKey("service", SearchService)
LIMITS = web.AppKey("limits", Limits)


def error(status: int, message: str, headers: dict | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler) -> web.StreamResponse:
    """Every error is JSON {"error": ...}; nothing a client sends ends in a traceback or a dead server."""
    try:
        return await handler(request)
    except web.HTTPException as exc:  # 404, 405, 413 raised by aiohttp itself
        if exc.status < 400:
            raise
        return error(exc.status, exc.text or exc.reason)
    except ray.exceptions.RayError as exc:
        log.exception("shard actor failed")
        return error(503, f"a shard is unavailable: {type(exc).__name__}")
    except Exception as exc:  # noqa: BLE001 (the server must keep answering)
        log.exception("unexpected error")
        return error(500, f"internal error: {type(exc).__name__}")


def _authorized(request: web.Request, token: str) -> str | None:
    """None when the bearer token is right, else why not."""
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return "missing bearer token (Authorization: Bearer <token>)"
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return "invalid token"
    return None


def parse_search_request(body: bytes, limits: Limits) -> SearchRequest:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRequest("body must be a JSON object like {\"query\": \"...\", \"k\": 10}")
    try:
        req = SearchRequest.model_validate(obj)
    except ValidationError as exc:
        raise BadRequest("; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                                   for e in exc.errors(include_url=False))) from None
    if not req.query.strip():
        raise BadRequest("query is empty")
    if len(req.query) > limits.max_query_chars:
        raise BadRequest(f"query is {len(req.query)} characters; the limit is {limits.max_query_chars}")
    if not 1 <= req.k <= limits.max_k:
        raise BadRequest(f"k must be between 1 and {limits.max_k}, got {req.k}")
    for name, texts in (("must", req.must), ("exclude", req.exclude)):
        if any(len(t) > limits.max_query_chars for t in texts):
            raise BadRequest(f"{name}: an entry is longer than {limits.max_query_chars} characters")
    return req


async def handle_search(request: web.Request) -> web.Response:
    service, limits = request.app[SERVICE], request.app[LIMITS]
    if limits.api_token is not None and (why := _authorized(request, limits.api_token)):
        return error(401, why, {"WWW-Authenticate": "Bearer"})
    if service.in_flight >= limits.max_concurrent:
        return error(429, f"more than {limits.max_concurrent} searches in flight; retry later", {"Retry-After": "1"})
    service.in_flight += 1
    try:
        if request.content_length is not None and request.content_length > limits.max_body_bytes:
            return error(413, f"body is {request.content_length} bytes; the limit is {limits.max_body_bytes}")
        req = parse_search_request(await request.read(), limits)
        return web.json_response(await service.search(req))
    except BadRequest as exc:
        return error(400, str(exc))
    finally:
        service.in_flight -= 1


async def handle_health(request: web.Request) -> web.Response:
    status, body = await request.app[SERVICE].health()
    return web.json_response(body, status=status)


def build_app(service: SearchService, limits: Limits) -> web.Application:
    app = web.Application(client_max_size=limits.max_body_bytes, middlewares=[json_errors])
    app[SERVICE] = service
    app[LIMITS] = limits
    app.router.add_post("/search", handle_search)
    app.router.add_get("/health", handle_health)
    if service.proposer is not None:
        # The proposer's HTTP session / model thread belong to the serving event loop.
        app.on_startup.append(lambda _: service.proposer.start())
        app.on_cleanup.append(lambda _: service.proposer.close())
    return app


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Start serving `app`; returns the runner (await runner.cleanup() to stop) and the bound URL (port 0: any)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, site.name


def serve_forever(app: web.Application, host: str, port: int, on_ready: Callable[[str], None]) -> None:
    """Serve until SIGINT / SIGTERM, then finish the requests in flight and stop."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runner, url = await start_site(app, host, port)
        on_ready(url)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
