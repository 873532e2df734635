"""`sira serve` in process: the HTTP API over shard actors on real loopback sockets (real Ray, Delta, Spark build)."""

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from conftest import TINY_DOCS, TINY_QUERIES
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.enrichment.expansion_cache import query_hash
from sira.core import tables
from sira.core.enrichment import load_template
from sira.core.program import RetrievalProgram

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CACHED_QUERY, CACHED_PHRASES = "blood pressure", ["hypertension", "mmhg"]
_http = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


def call(url: str, path: str, body=None, headers=None) -> tuple[int, dict]:
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with _http.open(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class RunningServer:
    """An app served from a background event loop on an ephemeral loopback port."""

    def __init__(self, app):
        from sira.pipelines.serving.serve import start_site

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sira-serve-test", daemon=True)
        self.thread.start()
        self.runner, self.url = asyncio.run_coroutine_threadsafe(start_site(app, "127.0.0.1", 0), self.loop).result(60)

    def stop(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, tiny_beir, spark):
    from sira.jobs import index as index_job
    from sira.jobs import ingest as ingest_job
    from sira.pipelines.enrichment.ray_enrich import commit

    wh = str(tmp_path_factory.mktemp("serve") / "tiny")
    ingest_job.run(ingest_job.IngestConfig(source=str(tiny_beir), warehouse=wh))
    index_job.run(index_job.IndexConfig(warehouse=wh, preset="sira", shards=2), spark=spark)
    # One expansion cached the way `sira query` leaves it: the server must answer it without calling the LLM.
    commit(wh, pa.Table.from_pylist([{
        "query_hash": query_hash(CACHED_QUERY), "query": CACHED_QUERY, "model": "fake-llm",
        "prompt_version": load_template("query", "generic").version, "backend": "openai", "phrases": CACHED_PHRASES,
        "raw_output": json.dumps({"keywords": CACHED_PHRASES}), "input_tokens": 1, "output_tokens": 1,
        "latency_ms": 1.0, "error": None, "enriched_at": datetime.now(timezone.utc)}], schema=tables.EXPANSIONS_SCHEMA),
        tables.EXPANSIONS)
    return wh


@pytest.fixture(scope="module")
def searcher(warehouse):
    from sira.pipelines.serving.shard_loader import load_searcher

    return load_searcher(warehouse)[0]


@pytest.fixture(scope="module")
def actors(warehouse):
    import ray

    from sira.pipelines.enrichment.ray_enrich import init_ray
    from sira.pipelines.serving.shard_actors import start_shard_actors
    from sira.pipelines.index.catalog import find_index

    init_ray()
    started = start_shard_actors(warehouse, find_index(warehouse))
    yield started
    for actor in started:
        ray.kill(actor)


def serve(warehouse, actors, limits, **service_kwargs) -> RunningServer:
    from sira.pipelines.serving.serve import SearchService, build_app

    return RunningServer(build_app(SearchService.start(warehouse, actors=actors, **service_kwargs), limits))


@pytest.fixture(scope="module")
def plain(warehouse, actors):
    """No token, no expansion backend, small query limit."""
    from sira.pipelines.serving.serve import Limits

    server = serve(warehouse, actors, Limits(max_query_chars=200, max_k=50, max_concurrent=32))
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def guarded(warehouse, actors, fake_openai_server):
    """A bearer token, the fake OpenAI server as proposer, and room for only two searches in flight."""
    from sira.pipelines.serving.serve import Limits

    backend = BackendConfig(backend="openai", model="fake-llm", base_url=fake_openai_server.base_url, timeout_s=5,
                            max_retries=1, retry_base_s=0.01)
    server = serve(warehouse, actors, Limits(max_concurrent=2, api_token=TOKEN), backend=backend, task="generic",
                   tau=0.25)
    yield server.url
    server.stop()


def test_health(plain):
    status, body = call(plain, "/health")
    assert status == 200
    assert (body["status"], body["num_docs"], body["shards"], body["expansion"]) == ("ok", len(TINY_DOCS), 2, None)
    assert body["index_version"] >= 1


def test_search_ranks_exactly_like_the_in_process_searcher(plain, searcher):
    for query in TINY_QUERIES.values():
        for k in (3, 12):
            status, body = call(plain, "/search", {"query": query, "k": k})
            assert status == 200, body
            assert [(h["doc_id"], h["score"]) for h in body["hits"]] == \
                [(h.doc_id, h.score) for h in searcher.search(query, k)]
            assert body["program"]["query"] == query and body["program"]["expansions"] == []
            assert set(body["timing_ms"]) == {"expansion", "scoring"} and body["timing_ms"]["expansion"] < 1


def test_must_and_exclude(plain, searcher):
    status, body = call(plain, "/search", {"query": "blood", "k": 12, "exclude": ["pressure"]})
    assert status == 200 and body["program"]["exclude"] == ["pressur"]
    assert [h["doc_id"] for h in body["hits"]] == \
        [h.doc_id for h in searcher.search("blood", 12, exclude_terms=["pressur"])]
    assert {"d06", "d08"}.isdisjoint(h["doc_id"] for h in body["hits"])
    status, body = call(plain, "/search", {"query": "blood", "must": ["glucose"]})
    assert status == 200 and {h["doc_id"] for h in body["hits"]} == {"d05", "d12"}


def test_expand_through_the_proposer_then_the_df_filter(guarded, searcher, fake_openai):
    fake_openai.answers = {"heart attack risk": ["myocardial infarction", "zebrafish", "blood"]}
    status, body = call(guarded, "/search", {"query": "heart attack risk", "k": 5, "expand": True}, AUTH)
    assert status == 200, body
    assert len(fake_openai.requests) == 1
    assert fake_openai.requests[0].body["model"] == "fake-llm"
    assert {e["phrase"]: e["reason"] for e in body["program"]["expansions"]} == \
        {"myocardial infarction": "kept", "zebrafish": "unseen", "blood": "too common"}
    assert body["expansion"] == {"source": "backend", "error": None}
    expected = searcher.search(RetrievalProgram.model_validate(body["program"]), k=5)
    assert [(h["doc_id"], h["score"]) for h in body["hits"]] == [(h.doc_id, h.score) for h in expected]
    assert body["timing_ms"]["expansion"] > 0

    # A query in the Delta expansions cache costs no LLM call.
    status, body = call(guarded, "/search", {"query": CACHED_QUERY, "expand": True}, AUTH)
    assert status == 200 and len(fake_openai.requests) == 1 and body["expansion"]["source"] == "cache"
    assert [e["phrase"] for e in body["program"]["expansions"]] == CACHED_PHRASES


def test_a_failing_backend_degrades_to_the_plain_query(guarded, searcher, fake_openai):
    fake_openai.reset("http500")
    status, body = call(guarded, "/search", {"query": "insulin and blood glucose", "expand": True}, AUTH)
    assert status == 200 and "HTTP 500" in body["expansion"]["error"] and body["program"]["expansions"] == []
    assert [h["doc_id"] for h in body["hits"]] == [h.doc_id for h in searcher.search("insulin and blood glucose")]


INVALID = [  # (body, status, words the error must contain)
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe\x00garbage", 400, "not valid JSON"),
    ([1, 2], 400, "JSON object"),
    ({"k": 3}, 400, "query: Field required"),
    ({"query": 42}, 400, "query"),
    ({"query": "   "}, 400, "empty"),
    ({"query": "heart", "k": 0}, 400, "k must be between 1 and 50"),
    ({"query": "heart", "k": 51}, 400, "k must be between 1 and 50"),
    ({"query": "heart", "k": "5"}, 400, "k"),
    ({"query": "heart", "kk": 5}, 400, "kk"),
    ({"query": "x" * 201}, 400, "201 characters; the limit is 200"),
    ({"query": "heart", "must": ["the"]}, 400, "no index terms"),
    ({"query": "heart", "expand": True}, 400, "no expansion backend"),
    (b"{" + b" " * 200_000 + b"}", 413, "limit"),
]


@pytest.mark.parametrize("body,status,words", INVALID, ids=[str(i) for i in range(len(INVALID))])
def test_invalid_requests_get_a_clear_4xx_and_the_server_keeps_answering(plain, body, status, words):
    got, answer = call(plain, "/search", body)
    assert (got, set(answer)) == (status, {"error"}) and words in answer["error"], answer
    assert call(plain, "/search", {"query": "heart"})[0] == 200


def test_token_and_unknown_routes(guarded):
    for headers, words in (({}, "missing bearer token"), ({"Authorization": "Bearer wrong"}, "invalid token"),
                           ({"Authorization": TOKEN}, "missing bearer token")):
        status, body = call(guarded, "/search", {"query": "heart"}, headers)
        assert (status, body) == (401, {"error": body["error"]}) and words in body["error"]
    assert call(guarded, "/search", {"query": "heart"}, AUTH)[0] == 200
    assert call(guarded, "/health")[0] == 200  # probes need no token
    status, body = call(guarded, "/nowhere")
    assert status == 404 and "error" in body


def test_more_than_max_concurrent_in_flight_get_429(guarded, fake_openai):
    fake_openai.reset("ok", delay_s=1.5)
    with ThreadPoolExecutor(4) as pool:
        slow = [pool.submit(call, guarded, "/search", {"query": f"slow {i}", "expand": True}, AUTH) for i in range(2)]
        deadline = time.monotonic() + 10
        while call(guarded, "/health")[1]["in_flight"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # until both slow searches wait on the fake LLM
        status, body = call(guarded, "/search", {"query": "heart"}, AUTH)
        assert status == 429 and "in flight" in body["error"]
        assert [f.result()[0] for f in slow] == [200, 200]
    assert call(guarded, "/search", {"query": "heart"}, AUTH)[0] == 200


def test_a_concurrent_burst_with_invalid_requests_mixed_in(plain, searcher):
    """50 requests, 8 at a time, every third one invalid: all answered, each as it would be alone, none 5xx."""
    queries = list(TINY_QUERIES.values())
    requests = [INVALID[i % len(INVALID)][:2] if i % 3 == 0
                else ({"query": queries[i % len(queries)], "k": 1 + i % 10}, 200) for i in range(50)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda r: call(plain, "/search", r[0]), requests))
    assert [status for status, _ in answers] == [status for _, status in requests]
    for (_, body), (request, status) in zip(answers, requests):
        if status == 200:
            assert [h["doc_id"] for h in body["hits"]] == \
                [h.doc_id for h in searcher.search(request["query"], request["k"])]
