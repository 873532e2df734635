"""The pages of `sira serve` and the JSON endpoints they use, against a real `sira serve` process (its own Ray,
shard actors, a bearer token) on a small warehouse with corpus-side enrichment and two evaluated runs, driven in
Chromium through Playwright."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from conftest import JOB_ENV, REPO, TINY_DOCS, TINY_QRELS, TINY_QUERIES, write_beir_folder

pytestmark = pytest.mark.integration

TOKEN = "w3b-t0ken"
# A document whose title and text are markup: the pages must show it as text.
MARKUP_DOC = {"_id": "d13", "title": "<i>Markup</i> & <b>tags</b>",
              "text": "Hypertension notes <script>window.__pwned = 1</script> "
                      "<img src=x onerror=\"window.__pwned = 2\">"}
# Corpus side: d03 (stroke) learns "heart attack", d09 (café) learns "espresso" (both pass the DF filter).
ENRICHMENT = {"d03": ["heart attack", "cerebrovascular accident"], "d09": ["espresso"]}
# Query side, cached as `sira eval` leaves it: the server and the eval runs read the same proposals.
EXPANSIONS = {
    "heart attack risk": ["myocardial infarction", "zebrafish", "blood", "Myocardial infarctions"],
    "insulin and blood glucose": ["pancreas hormone"],
    "blood pressure": ["hypertension", "mmhg"],
    "cafe caffeine": ["espresso"],
    "zzzz unknownword": ["zebrafish"],
}
XSS_QUERY = '<img src=x onerror="window.__pwned = 3"><script>window.__pwned = 4</script> blood'
_http = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


def call(url: str, path: str, body=None, token: str | None = TOKEN, accept: str = "application/json"):
    headers = {"Accept": accept, "Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers=headers)
    try:
        with _http.open(req, timeout=60) as resp:
            raw, status, got = resp.read(), resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        raw, status, got = exc.read(), exc.code, dict(exc.headers)
    is_json = got.get("Content-Type", "").startswith("application/json")
    return status, json.loads(raw) if is_json else raw.decode(), got


def _commit_proposals(warehouse: str) -> None:
    from sira.pipelines.storage.delta_io import read_table
    from sira.pipelines.enrichment.expansion_cache import query_hash
    from sira.pipelines.enrichment.ray_enrich import commit
    from sira.core import tables
    from sira.core.enrichment import load_template

    now = datetime.now(timezone.utc)
    hashes = dict(zip(*read_table(tables.table_uri(warehouse, tables.DOCS), columns=["doc_id", "content_hash"])
                      .to_pydict().values()))
    common = {"model": "fake-llm", "backend": "openai", "weights": None, "input_tokens": 1, "output_tokens": 1,
              "latency_ms": 1.0, "error": None, "enriched_at": now}
    commit(warehouse, pa.Table.from_pylist([
        {"doc_id": d, "content_hash": hashes[d], "prompt_version": load_template("doc", "generic").version,
         "phrases": p, "raw_output": json.dumps({"keywords": p}), **common} for d, p in ENRICHMENT.items()],
        schema=tables.ENRICHMENT_SCHEMA), tables.ENRICHMENT)
    commit(warehouse, pa.Table.from_pylist([
        {"query_hash": query_hash(q), "query": q, "prompt_version": load_template("query", "generic").version,
         "phrases": p, "raw_output": json.dumps({"keywords": p}), **common} for q, p in EXPANSIONS.items()],
        schema=tables.EXPANSIONS_SCHEMA), tables.EXPANSIONS)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, spark, fake_openai_server):
    """The tiny corpus (plus MARKUP_DOC) with its enrichment, evaluated as doc (the enriched index) and sira (the
    same index, the cached expansions): (warehouse, dataset folder, {variant: eval summary}). One index build."""
    from sira.jobs import eval as eval_job
    from sira.jobs import ingest as ingest_job
    from sira.pipelines.enrichment.backend_config import BackendConfig

    root = tmp_path_factory.mktemp("web")
    data = write_beir_folder(root / "data" / "tiny", docs=TINY_DOCS + [MARKUP_DOC])
    wh = str(root / "tiny")
    ingest_job.run(ingest_job.IngestConfig(source=str(data), warehouse=wh))
    _commit_proposals(wh)
    backend = BackendConfig(backend="openai", model="fake-llm", base_url=fake_openai_server.base_url)
    summaries = {variant: eval_job.run(eval_job.EvalConfig(dataset=str(data), warehouse=wh, variant=variant, shards=2,
                                                           tau=0.25, backend=backend)) for variant in ("doc", "sira")}
    return wh, data, summaries


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(evaluated, fake_openai_server, tmp_path_factory):
    """`sira serve` in its own process (its own local Ray), with a bearer token and the fake LLM as proposer."""
    wh = evaluated[0]
    port = _free_port()
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    env = {**JOB_ENV, "SIRA_WEB_TEST_TOKEN": TOKEN, "COLUMNS": "200"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sira.jobs.cli", "serve", "-w", wh, "--port", str(port), "--api-token-env",
             "SIRA_WEB_TEST_TOKEN", "--backend", "openai", "--model", "fake-llm", "--base-url",
             fake_openai_server.base_url, "--tau", "0.25"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, f"sira serve exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"sira serve did not answer /health:\n{log.read_text()}"
            try:
                if call(url, "/health", token=None)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_name(summary: dict) -> str:
    return Path(summary["run_file"]).stem


# ---------------------------------------------------------------- the JSON API -----------------------------------


def test_pages_are_open_and_load_nothing_from_elsewhere(server):
    for path, kind in (("/", "text/html"), ("/compare", "text/html"), ("/static/app.css", "text/css"),
                       ("/static/app.js", "javascript"), ("/static/search.js", "javascript"),
                       ("/static/compare.js", "javascript")):
        status, text, headers = call(server, path, token=None, accept="text/html,*/*;q=0.8")
        assert status == 200 and kind in headers["Content-Type"], (path, status)
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        assert not re.search(r"(https?:)?//[a-z0-9]", text.replace("http://127.0.0.1", "")), path  # no CDN, no URL
        assert "innerHTML" not in text and "insertAdjacentHTML" not in text and "document.write" not in text


def test_json_endpoints_need_the_token(server, evaluated):
    base, run = run_name(evaluated[2]["doc"]), run_name(evaluated[2]["sira"])
    for path, body in (("/search", {"query": "heart"}), ("/runs", None), (f"/compare?base={base}&run={run}", None),
                       (f"/compare/query?base={base}&run={run}&qid=q1", None)):
        for token in (None, "wrong"):
            status, answer, headers = call(server, path, body, token=token)
            assert status == 401 and set(answer) == {"error"} and headers["WWW-Authenticate"] == "Bearer", path
    assert call(server, "/health", token=None)[0] == 200


def test_search_explains_each_hit_like_the_searcher(server, evaluated):
    from sira.pipelines.serving.shard_loader import load_searcher
    from sira.core.program import RetrievalProgram

    searcher, manifest = load_searcher(evaluated[0])
    status, body, _ = call(server, "/search", {"query": "heart attack risk", "k": 6, "explain": True})
    assert status == 200, body
    assert (body["index_version"], body["enriched"], body["proposer"]) == (manifest["index_version"], True, None)
    expected = searcher.search(RetrievalProgram.model_validate(body["program"]), k=6, explain=True)
    assert [(h["doc_id"], h["score"]) for h in body["hits"]] == [(h.doc_id, h.score) for h in expected]
    for hit, want in zip(body["hits"], expected):
        assert {c["term"]: c["score"] for c in hit["contributions"]} == want.contributions
        assert sum(c["original"] + c["expansion"] for c in hit["contributions"]) == pytest.approx(hit["score"])
        assert all(c["expansion"] == 0 for c in hit["contributions"])  # no expansion asked
    hits = {h["doc_id"]: h for h in body["hits"]}
    # d03 (stroke) holds "heart attack" only through its injected phrase; d01 in its own text.
    d03 = {c["term"]: c for c in hits["d03"]["contributions"]}
    assert set(d03) == {"heart", "attack", "heart attack"}
    assert all(c["enrichment_only"] and c["injected"] == ["heart attack"] for c in d03.values())
    assert hits["d03"]["injected"] == ["heart attack", "cerebrovascular accident"] and hits["d03"]["title"] == "Stroke"
    assert not any(c["enrichment_only"] for c in hits["d01"]["contributions"]) and hits["d01"]["injected"] == []
    assert {"text": "heart", "match": True} in hits["d01"]["snippet"]
    assert "".join(s["text"] for s in hits["d01"]["snippet"]) == TINY_DOCS[0]["text"]


def test_expansion_with_its_weight_told_apart_from_the_original_part(server, evaluated):
    from sira.pipelines.serving.shard_loader import load_searcher
    from sira.core.program import RetrievalProgram

    searcher, _ = load_searcher(evaluated[0])
    query = {"query": "heart attack risk", "k": 5, "expand": True, "w": 2, "explain": True}
    status, body, _ = call(server, "/search", query)
    assert status == 200, body
    assert {e["phrase"]: e["reason"] for e in body["program"]["expansions"]} == {
        "myocardial infarction": "kept", "zebrafish": "unseen", "blood": "too common",
        "Myocardial infarctions": "duplicate"}
    assert body["program"]["w"] == 2 and body["expansion"]["source"] == "cache"
    assert body["proposer"]["backend"] == "openai" and body["proposer"]["model"] == "fake-llm"
    assert body["df_filter"] == {"tau": 0.25, "num_docs": 13, "max_df": 3.25}
    expected = searcher.search(RetrievalProgram.model_validate(body["program"]), k=5, explain=True)
    assert [(h["doc_id"], h["score"]) for h in body["hits"]] == [(h.doc_id, h.score) for h in expected]
    d01 = {c["term"]: c for c in body["hits"][0]["contributions"]}
    assert body["hits"][0]["doc_id"] == "d01"
    assert d01["myocardi infarct"]["original"] == 0 and d01["myocardi infarct"]["expansion"] > 0
    assert d01["myocardi infarct"]["expansions"] == ["myocardial infarction"]
    assert d01["heart"]["expansion"] == 0 and d01["heart"]["original"] == d01["heart"]["score"]


BAD = [  # (path, body, status, words the error must hold)
    ("/search", {"query": "heart", "k": 101, "explain": True}, 400, "explain: k must be at most 100"),
    ("/search", {"query": "heart", "w": -1}, 400, "w"),
    ("/search", {"query": "heart", "w": "0.5"}, 400, "w"),
    ("/search", {"query": "heart", "explain": "yes"}, 400, "explain"),
    ("/runs?x=1", None, 200, None),
    ("/compare", None, 400, "missing query parameter(s) base, run"),
    ("/compare?base=nope&run=nope", None, 404, "no run 'nope'"),
    ("/compare?base=../../etc/passwd&run=x", None, 404, "no run"),
    ("/compare?base={base}&run={run}&metric=bogus", None, 400, "metric 'bogus'"),
    ("/compare/query?base={base}&run={run}", None, 400, "qid"),
    ("/compare/query?base={base}&run={run}&qid=q99", None, 404, "not judged"),
    ("/compare/query?base={base}&run={run}&qid=q1&k=0", None, 400, "k must be"),
]


@pytest.mark.parametrize("path,body,status,words", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_requests_get_a_clear_4xx(server, evaluated, path, body, status, words):
    path = path.format(base=run_name(evaluated[2]["doc"]), run=run_name(evaluated[2]["sira"]))
    got, answer, _ = call(server, path, body)
    assert got == status, answer
    if words:
        assert set(answer) == {"error"} and words in answer["error"], answer


def test_compare_gives_the_numbers_of_sira_compare(server, evaluated, tmp_path):
    from typer.testing import CliRunner

    from sira.jobs.cli import app

    wh, data, summaries = evaluated
    status, body, _ = call(server, "/runs")
    assert status == 200 and [r["name"] for r in body["runs"]] == sorted(run_name(s) for s in summaries.values())
    by_variant = {r["variant"]: r for r in body["runs"]}
    assert by_variant["sira"]["metrics"] == summaries["sira"]["metrics"] and by_variant["sira"]["dataset"] == "tiny"

    base, run = run_name(summaries["doc"]), run_name(summaries["sira"])
    status, web, _ = call(server, f"/compare?base={base}&run={run}")
    assert status == 200, web
    out = tmp_path / "compare.json"
    result = CliRunner().invoke(app, ["compare", summaries["doc"]["run_file"], summaries["sira"]["run_file"],
                                      "-d", str(data), "--output-json", str(out)])
    assert result.exit_code == 0, result.output
    cli = json.loads(out.read_text())
    numbers = ("metric", "queries", "base", "run", "delta", "p_value", "permutations", "seed", "wins", "losses",
               "ties", "per_query")
    assert {k: web[k] for k in numbers} == {k: cli[k] for k in numbers}
    assert web["texts"] == TINY_QUERIES
    assert (web["base_run"], web["run_file"]) == (base, run)


def test_a_query_in_both_runs(server, evaluated):
    base, run = run_name(evaluated[2]["doc"]), run_name(evaluated[2]["sira"])
    status, body, _ = call(server, f"/compare/query?base={base}&run={run}&qid=q1&k=5")
    assert status == 200, body
    assert body["query"] == "heart attack risk" and [j["doc_id"] for j in body["judged"]] == ["d01", "d02"]
    sira_run = [ln.split() for ln in Path(evaluated[2]["sira"]["run_file"]).read_text().splitlines()
                if ln.startswith("q1 ")][:5]
    assert [(h["rank"], h["doc_id"]) for h in body["run"]["hits"]] == [(int(r[3]), r[2]) for r in sira_run]
    for h in body["base"]["hits"] + body["run"]["hits"]:
        assert h["relevance"] == TINY_QRELS["q1"].get(h["doc_id"])
    assert body["base"]["program"]["expansions"] == []
    assert [e["phrase"] for e in body["run"]["program"]["expansions"]] == EXPANSIONS["heart attack risk"]


# ---------------------------------------------------------------- in the browser ---------------------------------


def chromium_path() -> str | None:
    """Debian's chromium (what `make test` installs), or the browser SIRA_CHROMIUM names."""
    for candidate in (os.environ.get("SIRA_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


@pytest.fixture(scope="module")
def page(server):
    """One Chromium tab for the browser tests (the token lives in its sessionStorage); every request it makes is
    recorded."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("no Chromium found (install Debian's `chromium`, as `make test` does, or set SIRA_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        tab.requests = []
        tab.on("request", lambda r: tab.requests.append(r.url))
        tab.set_default_timeout(20_000)
        yield tab
        browser.close()


def signed_in(page, server: str, path: str = "/") -> None:
    page.goto(server + path)
    if page.evaluate("sessionStorage.getItem('sira-token')") != TOKEN:
        page.fill("#token", TOKEN)
        page.click("#token-form button")


def test_search_page_without_then_with_the_token(page, server):
    page.goto(server + "/")
    page.evaluate("sessionStorage.clear()")
    page.fill("#query", "heart attack risk")
    page.press("#query", "Enter")
    page.wait_for_selector("#notice:not([hidden])")
    assert "API token" in page.text_content("#notice")
    page.fill("#token", TOKEN)
    page.click("#token-form button")  # the search runs again with the token
    page.wait_for_selector("#hits li.hit")
    assert page.is_hidden("#notice")
    assert page.text_content("#program-query") == "heart attack risk"
    assert page.locator("#original-terms .chip").all_text_contents() == ["heart", "attack", "risk", "heart attack",
                                                                        "attack risk"]
    assert page.locator("#hits li.hit").count() == 6  # every document that holds a query term
    d03 = page.locator('li.hit[data-doc-id="d03"]')
    assert d03.locator(".title").text_content() == "Stroke"
    assert d03.locator(".term.enrichment .badge").first.text_content() == "enrichment only"
    assert d03.locator(".seg.enrichment").count() == 3
    assert "proposer none" in page.text_content("#meta")
    assert page.locator("#expansions").is_hidden()
    assert all(url.startswith(server) for url in page.requests)


def test_toggling_expansion_changes_the_program(page, server):
    signed_in(page, server, "/?q=heart+attack+risk")
    page.wait_for_selector("#hits li.hit")
    before = page.text_content("#program")
    page.check("#expand")  # searches again
    page.wait_for_selector("#expansions:not([hidden]) tbody tr")
    rows = {r.locator(".phrase").text_content(): r for r in page.locator("#expansions tbody tr").all()}
    assert set(rows) == set(EXPANSIONS["heart attack risk"])
    assert rows["myocardial infarction"].locator(".decision").text_content() == "kept"
    assert "absent from the index" in rows["zebrafish"].locator(".why").text_content()
    assert "too common" in rows["blood"].locator(".why").text_content()
    assert "3.25" in rows["blood"].locator(".why").text_content()
    assert "duplicate" in rows["Myocardial infarctions"].locator(".why").text_content()
    assert page.text_content("#program") != before
    assert "openai fake-llm" in page.text_content("#meta")
    assert page.locator('li.hit[data-doc-id="d01"] .seg.expansion').count() > 0
    assert "expand=1" in page.url
    page.uncheck("#expand")
    page.wait_for_selector("#expansions", state="hidden")
    assert all(url.startswith(server) for url in page.requests)


def test_markup_in_a_query_or_a_document_is_shown_as_text(page, server):
    signed_in(page, server)
    page.fill("#query", XSS_QUERY)
    page.press("#query", "Enter")
    # Waiting through a locator, not wait_for_function: a predicate that must be polled is evaluated with eval(),
    # which the page's Content-Security-Policy refuses.
    from playwright.sync_api import expect

    expect(page.locator("#program-query")).to_have_text(XSS_QUERY)
    page.fill("#query", "hypertension notes")
    page.press("#query", "Enter")
    page.wait_for_selector('li.hit[data-doc-id="d13"]')
    assert page.locator('li.hit[data-doc-id="d13"] .title').text_content() == MARKUP_DOC["title"]
    assert "<script>" in page.locator('li.hit[data-doc-id="d13"] .snippet').text_content()
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#result img, #result script, #result i").count() == 0


def test_compare_view_and_a_query_side_by_side(page, server, evaluated):
    base, run = run_name(evaluated[2]["doc"]), run_name(evaluated[2]["sira"])
    _, web, _ = call(server, f"/compare?base={base}&run={run}")
    signed_in(page, server, "/compare")
    page.wait_for_selector("#summary:not([hidden]) #queries tbody tr")
    assert page.input_value("#base") == base and page.input_value("#run") == run
    assert [page.text_content(s) for s in ("#wins", "#losses", "#ties")] == \
        [str(web["wins"]), str(web["losses"]), str(web["ties"])]
    rows = page.locator("#queries tbody tr")
    assert rows.count() == web["queries"]
    deltas = [web["per_query"][q]["run"] - web["per_query"][q]["base"]
              for q in [r.get_attribute("data-qid") for r in rows.all()]]
    assert deltas == sorted(deltas, reverse=True)
    _, detail, _ = call(server, f"/compare/query?base={base}&run={run}&qid=q1")
    page.locator('#queries tr[data-qid="q1"]').click()
    page.wait_for_selector("#detail:not([hidden]) #side-run li")
    assert "heart attack risk" in page.text_content("#detail-title")
    for side in ("base", "run"):
        assert page.locator(f"#side-{side} .ranking li").evaluate_all("lis => lis.map(li => li.dataset.docId)") == \
            [h["doc_id"] for h in detail[side]["hits"]]
    assert page.locator('#side-base li[data-doc-id="d01"] .rel').text_content() == "\u27131"
    assert "myocardial infarction" in page.text_content("#side-run .mini-program")
    assert "qid=q1" in page.url
    page.click('#filters button[data-filter="loss"]')
    assert page.locator("#queries tbody tr:visible").count() == web["losses"]
    assert all(url.startswith(server) for url in page.requests)
