"""`sira serve`: the online search API over published index versions (aiohttp.web), and the pages that look
inside it (pipelines/serving/web: one plain HTML page with a search and a compare view, CSS and small scripts, served from
the package; nothing is fetched from elsewhere).

    POST /search  {"query": str, "k": 10, "expand": false, "w": null, "must": [str], "exclude": [str],
                   "explain": false}
                  -> {"hits": [{"doc_id", "score"}], "program": {RetrievalProgram}, "index_version", "preset",
                      "enriched", "proposer", "timing_ms": {...}}; with "explain" (k <= MAX_EXPLAIN_K) each hit
                      also has "title", "snippet", "contributions" (per term: original / expansion part,
                      enrichment_only) and "injected" (sira.pipelines.serving.hit_details)
    GET  /health  -> {"status", "index_version", "num_docs", "shards", ...}
    GET  /runs    -> {"runs": [...]}: the runs `sira eval` / `sira run` wrote in the warehouse (sira.pipelines.tracking.runs)
    GET  /compare?base=RUN&run=RUN[&metric=ndcg@10]  -> `sira compare` of the two runs (the same numbers) with
                  each query's text; a browser (Accept: text/html) gets the compare page instead
    GET  /compare/query?base=RUN&run=RUN&qid=Q[&k=10]  -> that query's two rankings, relevance and programs
    GET  /        the search page;  GET /static/...  its CSS and scripts (no token needed for either)

Searches go through sira.core.query_path over shards that live in Ray actors (sira.pipelines.serving.shard_actors), queried
scatter-gather, so a response ranks exactly like the in-process Searcher. Limits answer 4xx JSON
`{"error": ...}`: 400 invalid request, 401 missing / wrong bearer token (when one is configured, on every JSON
endpoint but /health, which stays open for probes; the pages and their static files are open, and ask for the
token), 404 unknown run or query, 413 body too large, 429 more than `max_concurrent` requests in flight. A request
never takes the server down.

Unless pinned to a version, the server follows the newest published version of the kind it serves (see
SearchService): `sira nightly` publishes, the server switches without downtime.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import signal
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Awaitable, Callable

import ray
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sira.pipelines.serving.hit_details import hit_details
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.serving.online_proposer import OnlineProposal, OnlineProposer
from sira.pipelines.tracking.runs import RunNotFound, compare_runs, list_runs, query_detail
from sira.core import tables
from sira.core.defaults import (DEFAULT_TAU, FOLLOW_POLL_S, SEARCH_K, SERVE_MAX_CONCURRENT, SERVE_MAX_K,
                                 SERVE_MAX_QUERY_CHARS)
from sira.core.program import RetrievalProgram
from sira.core.query_path import QueryPath
from sira.core.retriever import Retriever

log = logging.getLogger("sira.serve")

MAX_CONSTRAINTS = 32  # must / exclude entries per request
MAX_W = 100.0  # the largest expansion weight a request may set
MAX_EXPLAIN_K = 100  # explaining reads each hit's text and injections from Delta
MAX_DETAIL_K = 100
HEALTH_TIMEOUT_S = 10.0
WEB_DIR = Path(__file__).parent / "web"
# The pages load only what this server serves: no inline script, nothing from another origin.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@dataclass(frozen=True)
class Limits:
    max_query_chars: int = SERVE_MAX_QUERY_CHARS
    max_k: int = SERVE_MAX_K
    max_concurrent: int = SERVE_MAX_CONCURRENT
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
    k: int = SEARCH_K
    expand: bool = False
    w: float | None = Field(None, ge=0, le=MAX_W, description="weight of the expansion part; None: the server's")
    must: list[str] = Field(default_factory=list, max_length=MAX_CONSTRAINTS)
    exclude: list[str] = Field(default_factory=list, max_length=MAX_CONSTRAINTS)
    explain: bool = False


class BadRequest(ValueError):
    """The request is invalid: answered 400 with this message."""


class TooLarge(BadRequest):
    """The body is over the limit: answered 413."""


@dataclass
class ServedIndex:
    """One index version as served: its manifest and its retriever: the query path over the shard actors holding
    it, and the proposer of query-side expansion (it reads the version's vocabulary)."""

    manifest: dict
    retriever: Retriever
    owns_actors: bool = True  # actors handed in by the caller are the caller's to stop
    in_flight: int = 0  # searches that started on this version and have not finished

    @property
    def path(self) -> QueryPath:
        return self.retriever.path

    @property
    def proposer(self) -> OnlineProposer | None:
        return self.retriever.proposer

    @property
    def actors(self) -> list:
        return self.path.scorer.actors


@dataclass
class SearchService:
    """Serves one index version at a time and, when following, switches to a newer published version of the same
    kind (preset, enriched) without downtime: the new version is loaded next to the old one, the switch is one
    assignment, searches already running finish on the version they started on, then the old one is stopped. A
    version is visible only once published (its corpus_stats row is written last), so a half-written index is
    never served. While switching, both versions are in memory."""

    warehouse: str
    current: ServedIndex
    backend: BackendConfig | None = None
    task: str = "generic"
    w: float | None = None  # None: the proposer's own default
    tau: float = DEFAULT_TAU
    follow: bool = False
    in_flight: int = field(default=0, init=False)
    switches: list = field(default_factory=list, init=False)  # [{"from", "to", "at"}]
    _switch_lock: asyncio.Lock | None = field(default=None, init=False)
    _published: object = field(default=None, init=False)  # corpus_stats as a DeltaTable, updated at each poll

    @classmethod
    def start(cls, warehouse: str, index_version: int | None = None, preset: str | None = None,
              backend: BackendConfig | None = None, task: str = "generic", w: float | None = None,
              tau: float = DEFAULT_TAU,
              ray_address: str | None = None, actors: list | None = None, follow: bool = False) -> "SearchService":
        """Find the index version, start one actor per shard (or use `actors`), load what expansion needs."""
        from sira.pipelines.enrichment.ray_enrich import init_ray
        from sira.pipelines.index.catalog import find_index

        if follow and index_version is not None:
            raise ValueError("a server pinned to --index-version cannot follow newer versions")
        manifest = find_index(warehouse, index_version, preset)
        if actors is None:
            init_ray(ray_address)
        service = cls(warehouse, None, backend, task, w, tau, follow)  # type: ignore[arg-type]
        service.current = service.load(manifest, actors)
        return service

    def load(self, manifest: dict, actors: list | None = None, into: list | None = None) -> ServedIndex:
        """Load one version (blocking: shard actors start, or the running ones in `into` load it too, and read their
        shards; a broken shard fails here)."""
        from sira.pipelines.serving.shard_actors import ShardActors, load_into, start_shard_actors
        from sira.pipelines.serving.shard_loader import load_query_path

        proposer = OnlineProposer(self.warehouse, self.backend, self.task, manifest) if self.backend else None
        owns = actors is None
        if into is not None and len(into) == manifest["num_shards"]:
            load_into(into, manifest)
            actors = into
        elif actors is None:
            actors = start_shard_actors(self.warehouse, manifest)
        shards = ShardActors(actors, manifest["index_version"])
        path = load_query_path(self.warehouse, manifest, shards, self.tau, expand=proposer is not None)
        return ServedIndex(manifest, Retriever(path, proposer, self.w), owns)

    # The served version's parts, for callers that do not care about switching.
    @property
    def manifest(self) -> dict:
        return self.current.manifest

    @property
    def actors(self) -> list:
        return self.current.actors

    @property
    def proposer(self) -> OnlineProposer | None:
        return self.current.proposer

    def stop_actors(self) -> None:
        if self.current.owns_actors:
            for actor in self.current.actors:
                ray.kill(actor)

    async def refresh(self) -> bool:
        """Switch to the newest published version of the served kind if there is a newer one; True if switched.
        Any failure while loading leaves the current version serving."""
        from sira.pipelines.index.catalog import IndexNotFound, find_index

        if self._switch_lock is None:
            self._switch_lock = asyncio.Lock()
        async with self._switch_lock:
            loop = asyncio.get_running_loop()
            old = self.current
            try:
                newest = await loop.run_in_executor(None, lambda: find_index(
                    self.warehouse, preset=old.manifest["preset"], enriched=bool(old.manifest["enriched"])))
            except IndexNotFound:
                return False
            if newest["index_version"] <= old.manifest["index_version"]:
                return False
            log.info("index v%d published: loading it next to v%d", newest["index_version"],
                     old.manifest["index_version"])
            # The server's own actors load the new version next to the old one: no process starts.
            new = await loop.run_in_executor(None, lambda: self.load(
                newest, into=old.actors if old.owns_actors else None))
            if new.proposer is not None:
                await new.proposer.start()
            self.current = new  # the switch: new searches use `new`; running ones keep the version they hold
            self.switches.append({"from": old.manifest["index_version"], "to": newest["index_version"],
                                  "at": time.time()})
            log.info("serving index v%d", newest["index_version"])
            while old.in_flight:
                await asyncio.sleep(0.02)
            await self._retire(old)
            return True

    async def _retire(self, old: ServedIndex) -> None:
        if old.proposer is not None:
            await old.proposer.close()
        if old.owns_actors:
            reused = old.actors is self.current.actors  # they serve the new version too: they drop the old one only
            for actor in old.actors:
                if reused:
                    actor.drop.remote(old.manifest["index_version"])
                else:
                    ray.kill(actor)

    def _published_table_version(self) -> int:
        """The corpus_stats table's version, read incrementally (a listing of its log's new entries): a poll that
        finds no new commit reads nothing else."""
        from deltalake import DeltaTable

        if self._published is None:
            self._published = DeltaTable(tables.table_uri(self.warehouse, tables.CORPUS_STATS))
        else:
            self._published.update_incremental()
        return self._published.version()

    async def follow_forever(self, poll_s: float) -> None:
        """Poll for newer published versions until cancelled; a version is looked for only after corpus_stats got a
        commit (a publish, or retention's unpublish)."""
        loop, seen = asyncio.get_running_loop(), None
        while True:
            await asyncio.sleep(poll_s)
            try:
                now = await loop.run_in_executor(None, self._published_table_version)
                if now != seen:
                    await self.refresh()
                    seen = now
            except Exception:  # noqa: BLE001 (a failed switch must not stop serving the current version)
                log.exception("switching to a newer index version failed; still serving v%d",
                              self.current.manifest["index_version"])

    async def search(self, req: SearchRequest) -> dict:
        index = self.current  # one version for the whole search, even if a switch happens meanwhile
        index.in_flight += 1
        try:
            return await self._search(index, req)
        finally:
            index.in_flight -= 1

    async def _search(self, index: ServedIndex, req: SearchRequest) -> dict:
        if req.expand and index.proposer is None:
            raise BadRequest("expand: this server has no expansion backend (start it with --backend openai|local|encoder)")
        try:  # constraints without index terms are the caller's mistake; check before paying for an expansion
            RetrievalProgram.build("", index.path.analyzer, must=req.must, exclude=req.exclude)
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        started = time.perf_counter()
        retriever = index.retriever if req.expand else replace(index.retriever, proposer=None)
        if req.w is not None:
            retriever = replace(retriever, w=req.w)
        # A failed expansion degrades to the plain query (the program shows no expansions) rather than failing the
        # search; the response says why.
        proposal = await index.proposer.ask(req.query) if req.expand else None
        expanded = time.perf_counter()
        [program] = retriever.programs([req.query], req.must, req.exclude, None if proposal is None else [proposal])
        # The scorer blocks on the shard actors: on a worker thread, so the event loop keeps answering.
        results = await asyncio.get_running_loop().run_in_executor(None, retriever.rank, [""], [program], req.k)
        hits = [{"doc_id": d, "score": s} for d, s in zip(results["doc_id"].to_pylist(), results["score"].to_pylist())]
        out = self._response(index, program, hits, proposal)
        out["timing_ms"] = {"expansion": (expanded - started) * 1000, "scoring": (time.perf_counter() - expanded) * 1000}
        if req.explain and hits:
            explained = time.perf_counter()
            await self._explain(index, program, hits)
            out["timing_ms"]["explain"] = (time.perf_counter() - explained) * 1000
        return out

    def _response(self, index: ServedIndex, program: RetrievalProgram, hits: list[dict],
                  proposal: OnlineProposal | None) -> dict:
        m = index.manifest
        out = {
            "hits": hits, "program": program.model_dump(),
            "index_version": m["index_version"], "preset": m["preset"], "enriched": bool(m["enriched"]),
            "proposer": None if proposal is None else {"backend": index.proposer.backend.backend,
                                                       "model": index.proposer.model,
                                                       "prompt_version": index.proposer.prompt_version},
        }
        if proposal is not None:  # df_filter: what each phrase's DFs were held against (keep: 0 < DF <= max_df)
            out["expansion"] = {"source": proposal.source, "error": proposal.error}
            out["df_filter"] = {"tau": self.tau, "num_docs": m["num_docs"], "max_df": self.tau * m["num_docs"]}
        return out

    async def _explain(self, index: ServedIndex, program: RetrievalProgram, hits: list[dict]) -> None:
        """Each hit's per-term contributions and where its terms came from, added to it."""
        loop = asyncio.get_running_loop()
        ids = [h["doc_id"] for h in hits]
        contributions = await loop.run_in_executor(None, index.path.contributions, program, ids)
        details = await loop.run_in_executor(None, hit_details, self.warehouse, index.manifest, index.path.analyzer,
                                             program, contributions)
        for h in hits:
            h.update(details[h["doc_id"]])

    async def health(self) -> tuple[int, dict]:
        index = self.current
        m = index.manifest
        body = {"index_version": m["index_version"], "num_docs": m["num_docs"], "shards": len(index.actors),
                "preset": m["preset"], "enriched": bool(m["enriched"]), "in_flight": self.in_flight,
                "follow": self.follow, "switches": len(self.switches),
                "expansion": None if index.proposer is None else
                {"backend": index.proposer.backend.backend, "model": index.proposer.model,
                 "prompt_version": index.proposer.prompt_version, "cached_queries": len(index.proposer.cache)}}
        try:
            await asyncio.wait_for(asyncio.gather(*(a.num_docs.remote() for a in index.actors)), HEALTH_TIMEOUT_S)
        except (ray.exceptions.RayError, asyncio.TimeoutError) as exc:
            return 503, {"status": "unavailable", "error": f"a shard actor does not answer: {type(exc).__name__}",
                         **body}
        return 200, {"status": "ok", **body}


# ---------------------------------------------------------------- HTTP ----------------------------------------------

SERVICE = web.AppKey("service", SearchService)
LIMITS = web.AppKey("limits", Limits)
FOLLOWER = web.AppKey("follower", asyncio.Task)


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
    if req.explain and req.k > MAX_EXPLAIN_K:
        raise BadRequest(f"explain: k must be at most {MAX_EXPLAIN_K}, got {req.k}")
    return req


async def api_call(request: web.Request, work: Callable[[], Awaitable[dict]]) -> web.Response:
    """A JSON endpoint's answer: the bearer token checked (when one is set), at most `max_concurrent` requests
    in flight, BadRequest -> 400 (413 for a body over the limit), RunNotFound -> 404."""
    service, limits = request.app[SERVICE], request.app[LIMITS]
    if limits.api_token is not None and (why := _authorized(request, limits.api_token)):
        return error(401, why, {"WWW-Authenticate": "Bearer"})
    if service.in_flight >= limits.max_concurrent:
        return error(429, f"more than {limits.max_concurrent} requests in flight; retry later", {"Retry-After": "1"})
    service.in_flight += 1
    try:
        return web.json_response(await work())
    except TooLarge as exc:
        return error(413, str(exc))
    except BadRequest as exc:
        return error(400, str(exc))
    except RunNotFound as exc:
        return error(404, str(exc))
    finally:
        service.in_flight -= 1


async def in_thread(fn: Callable, *args):
    """Blocking work (files, Delta, ranx) off the event loop; a ValueError is the request's fault (400), a missing
    file a 404."""
    try:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
    except FileNotFoundError as exc:  # a run's dataset gone from where it was judged
        raise RunNotFound(str(exc)) from None
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


async def handle_search(request: web.Request) -> web.Response:
    limits = request.app[LIMITS]

    async def work() -> dict:
        if request.content_length is not None and request.content_length > limits.max_body_bytes:
            raise TooLarge(f"body is {request.content_length} bytes; the limit is {limits.max_body_bytes}")
        return await request.app[SERVICE].search(parse_search_request(await request.read(), limits))

    return await api_call(request, work)


async def handle_health(request: web.Request) -> web.Response:
    status, body = await request.app[SERVICE].health()
    return web.json_response(body, status=status)


async def handle_runs(request: web.Request) -> web.Response:
    async def work() -> dict:
        return {"runs": await in_thread(list_runs, request.app[SERVICE].warehouse)}

    return await api_call(request, work)


def _params(request: web.Request, *names: str) -> list[str]:
    missing = [n for n in names if not request.query.get(n, "").strip()]
    if missing:
        raise BadRequest(f"missing query parameter(s) {', '.join(missing)}: {request.path}?"
                         + "&".join(f"{n}=..." for n in names) + " (GET /runs lists the runs)")
    return [request.query[n] for n in names]


def _int_param(request: web.Request, name: str, default: int, top: int) -> int:
    value = request.query.get(name, str(default))
    if not value.isdigit() or not 1 <= int(value) <= top:
        raise BadRequest(f"{name} must be a whole number between 1 and {top}, got {value!r}")
    return int(value)


def _wants_page(request: web.Request) -> bool:
    """A browser navigating here (it asks for HTML); scripts and other clients get JSON."""
    return "text/html" in request.headers.get("Accept", "")


async def handle_compare(request: web.Request) -> web.StreamResponse:
    if _wants_page(request):
        return page()

    async def work() -> dict:
        base, run = _params(request, "base", "run")
        return await in_thread(compare_runs, request.app[SERVICE].warehouse, base, run,
                               request.query.get("metric", "ndcg@10"))

    return await api_call(request, work)


async def handle_compare_query(request: web.Request) -> web.Response:
    async def work() -> dict:
        base, run, qid = _params(request, "base", "run", "qid")
        k = _int_param(request, "k", 10, MAX_DETAIL_K)
        return await in_thread(query_detail, request.app[SERVICE].warehouse, base, run, qid, k)

    return await api_call(request, work)


def page() -> web.FileResponse:
    """The one page: its script shows the search view, or the compare view at /compare."""
    return web.FileResponse(WEB_DIR / "index.html", headers={"Content-Type": "text/html; charset=utf-8",
                                                             "Cache-Control": "no-cache"})


async def handle_search_page(_: web.Request) -> web.StreamResponse:
    return page()


@web.middleware
async def security_headers(request: web.Request, handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers.update(SECURITY_HEADERS)
    return response


def build_app(service: SearchService, limits: Limits, poll_s: float = FOLLOW_POLL_S) -> web.Application:
    """The HTTP app; a following service polls for newer published versions every `poll_s` seconds."""
    app = web.Application(client_max_size=limits.max_body_bytes, middlewares=[security_headers, json_errors])
    app[SERVICE] = service
    app[LIMITS] = limits
    app.router.add_post("/search", handle_search)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/runs", handle_runs)
    app.router.add_get("/compare", handle_compare)
    app.router.add_get("/compare/query", handle_compare_query)
    app.router.add_get("/", handle_search_page)
    app.router.add_static("/static/", WEB_DIR, append_version=False)

    async def on_startup(_: web.Application) -> None:
        # The proposer's HTTP session / model thread belong to the serving event loop.
        if service.proposer is not None:
            await service.proposer.start()
        if service.follow:
            app[FOLLOWER] = asyncio.create_task(service.follow_forever(poll_s))

    async def on_cleanup(_: web.Application) -> None:
        if FOLLOWER in app:
            app[FOLLOWER].cancel()
        if service.proposer is not None:
            await service.proposer.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Start serving `app`; returns the runner (await runner.cleanup() to stop) and the bound URL (port 0: any)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, site.name


async def _refresh_logged(service: SearchService) -> None:
    try:
        await service.refresh()
    except Exception:  # noqa: BLE001
        log.exception("switching to a newer index version failed; still serving v%d", service.manifest["index_version"])


def serve_forever(app: web.Application, host: str, port: int, on_ready: Callable[[str], None]) -> None:
    """Serve until SIGINT / SIGTERM, then finish the requests in flight and stop; SIGHUP checks for a newer
    published index version at once."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        # SIGHUP: look for a newer published version now (`sira nightly` can signal after publishing).
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(_refresh_logged(app[SERVICE])))
        runner, url = await start_site(app, host, port)
        on_ready(url)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
