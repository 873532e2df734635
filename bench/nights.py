"""A month of nights on one warehouse: a full enriched build, then K consecutive `sira nightly` runs while
`sira serve` answers a steady trickle of searches and follows each newly published index version.

    python bench/nights.py --docs 1000000 --nights 30 --output-json bench/results/nights_1m.json
                           [--work-dir /tmp/sira-nights] [--seed 7] [--changed-fraction 0.01] [--poll-s S]
                           [--next-night-after-follow]
    python bench/nights.py --continue-from bench/results/nights_1m.json --nights 2 --output-json MORE.json

Everything runs through the real jobs with their default settings (the `sira` CLI in a subprocess of its own, each
process tree sampled for memory by bench/scale.py's TreeMemory), on the synthetic corpus of bench/synthetic_corpus.py,
with enrichment against bench/instant_openai.py (an OpenAI-compatible loopback server that answers at once, so
enrichment costs the pipeline, not a model; `--backend openai --model instant --base-url URL`).

1. Full enriched build on warehouse `nights`: `sira nightly --source corpus.parquet` on the empty warehouse (its
   steps ingest, enrich, index (enriched), retention timed by the job); its seconds (`full_build_seconds`) are the
   denominator of every night's fraction. `--full-build jobs` runs `sira ingest`, `sira enrich --backend openai` and
   `sira index` instead (their sum is the denominator); `sira index` records no enrichment model, so the first
   night finds no base of its kind and rebuilds in full.
2. `sira serve -w nights --port P` (its defaults: it follows newer published versions, checking every `--poll-s`
   seconds, serve's own FOLLOW_POLL_S by default). Once /health answers, one search is timed alone
   (`first_search_seconds`); then a thread sends 3 searches per second (POST /search, scifact
   test queries, k 10, 127.0.0.1, 10 s timeout) and records every request's time, status and the `index_version`
   that answered it (WORK/requests.jsonl); another thread
   polls corpus_stats (sira.pipelines.index.catalog.published_versions) every 0.5 s and notes when each index
   version first becomes visible: its publish time.
3. K nights: night i writes the next snapshot (the previous one with a fresh change set applied: change_set of
   bench/synthetic_corpus.py with seed `--seed + i - 1` picks rows of the previous snapshot by position, of the
   changed ones 60% get a new text (salt i), 20% are deleted, 20% are new documents numbered after the highest so
   far; change sets of synthetic_corpus.py alone do not compose over nights), then runs `sira nightly -w nights
   --source SNAPSHOT --backend openai ... --tracking-uri sqlite:///WORK/mlflow.db`. Night 1's snapshot is the one
   bench/scale.py's night makes. When K >= 3, night 2 changes nothing (it reads night 1's snapshot again) and night
   3 changes 5% of the documents; the others `--changed-fraction`. Per night: seconds per step (the nightly's
   step_seconds), seconds and fraction of the full build, the version's segments and tombstones, whether the build
   compacted (SegmentPolicy wrote one segment: segments == [index_version]) or merged small segments into its new
   one (`merged_segments`: the previous version's segments it lacks), follow_seconds (publish time to the
   first successful response answered by that version or a newer one) and the failed requests (non-200 or no
   answer) from the night's start to the next night's start. The next night starts as soon as one ends; with
   `--next-night-after-follow` it starts once serve has answered from the night's version (`waited_for_follow_s`),
   as nights a day apart do, so the follow is measured without the next night's ingest and Spark start beside it.
4. After the last night (unless `--skip-fresh-build`; and once serve answers from its version, or poll_s + 300 s passed): the last snapshot is
   built in full on a second warehouse `fresh` (as in step 1: ingest + enrich + index, same backend), then in a
   subprocess both newest enriched indexes are loaded (sira.pipelines.serving.shard_loader.load_searcher) and compared:
   `rankings_equal_full_rebuild` (top-100 doc ids and scores of the 300 scifact test queries, identical),
   `query_speed_after_nights_vs_fresh` (q/s at k 10 of the nights' searcher over the fresh one, the median of 5
   alternating repeats over all queries); `cold_load_seconds`: the nights' index loaded in a fresh process with an
   empty shard cache (SIRA_SHARD_CACHE, bench/scale.py's load worker).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import instant_openai  # noqa: E402
from sira.core.defaults import FOLLOW_POLL_S  # noqa: E402
from bench.scale import TreeMemory, _descendants, kill_tree, run_job, write_report  # noqa: E402
from bench.synthetic_corpus import (CHUNK_DOCS, change_set, doc_id_of, iter_documents, make_document,  # noqa: E402
                                    source_pool, write_parquet)

MODEL = "instant"
UNCHANGED_NIGHT, BIG_NIGHT, BIG_FRACTION = 2, 3, 0.05  # when --nights >= 3
REQUESTS_PER_S = 3.0
REQUEST_TIMEOUT_S = 10.0  # a search not answered within this counts as failed
PUBLISH_POLL_S = 0.5
COMPARE_K, SPEED_K, SPEED_REPEATS = 100, 10, 5


def log(msg: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def require_own_code() -> None:
    """Refuse to measure code other than this checkout's: a worktree with PYTHONPATH alone imported sira.core,
    sira.pipelines and sira.jobs from the main checkout (the editable install's mapping). Make benchmark worktrees
    with bench/worktree.sh."""
    import sira.core
    import sira.jobs
    import sira.pipelines

    for package in (sira.core, sira.pipelines, sira.jobs):
        where = Path(package.__path__[0]).resolve()
        if REPO_ROOT.resolve() not in where.parents:
            raise SystemExit(f"{package.__name__} is imported from {where}, not from this checkout ({REPO_ROOT}): "
                             "the run would measure other code. Make the worktree with bench/worktree.sh")


def git_commit() -> str:
    def git(*a):
        return subprocess.run(["git", *a], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30).stdout.strip()

    return git("rev-parse", "HEAD") + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def queries() -> list[str]:
    from sira.core.datasets import resolve_dataset

    return [text for _, text in sorted(resolve_dataset("beir:scifact").queries("test").items())]


# ---------------------------------------------------------------- snapshots ------------------------------------


def night_fraction(night: int, nights: int, default: float) -> float:
    if nights >= 3 and night == UNCHANGED_NIGHT:
        return 0.0
    if nights >= 3 and night == BIG_NIGHT:
        return BIG_FRACTION
    return default


def write_next_snapshot(prev: Path, out: Path, fraction: float, corpus_seed: int, night: int) -> dict:
    """`prev` with a fresh change set applied, streamed in row groups. Rows are picked by position; documents are
    numbered in id order (syn%09d, inserted ones appended), so new ones take numbers after the last row's."""
    import pyarrow.parquet as pq

    f = pq.ParquetFile(prev)
    rows = f.metadata.num_rows
    changes = change_set(rows, fraction, corpus_seed + night - 1)
    updated, deleted = set(changes.updated.tolist()), set(changes.deleted.tolist())
    last_id = f.read_row_group(f.num_row_groups - 1, columns=["doc_id"]).column(0)[-1].as_py()
    first_new = int(last_id.removeprefix("syn")) + 1
    pool = source_pool()

    def docs():
        pos = 0
        for batch in f.iter_batches(batch_size=CHUNK_DOCS, columns=["doc_id", "title", "text"]):
            for doc_id, title, text in zip(*(c.to_pylist() for c in batch.columns)):
                if pos in updated:  # salt = night: a document updated on two nights gets two new texts
                    title, text = make_document(pool, corpus_seed, int(doc_id.removeprefix("syn")), salt=night)
                if pos not in deleted:
                    yield doc_id, title, text
                pos += 1
        for n in range(first_new, first_new + len(changes.inserted)):
            yield (doc_id_of(n), *make_document(pool, corpus_seed, n))

    docs_written = write_parquet(out, docs())
    return {"docs": docs_written, "updated": len(updated), "deleted": len(deleted), "inserted": len(changes.inserted)}


# ---------------------------------------------------------------- watchers -------------------------------------


class Publications(threading.Thread):
    """Wall time at which each index version's corpus_stats row was first seen, and the row's layout facts."""

    def __init__(self, warehouse: Path):
        super().__init__(daemon=True)
        self.warehouse, self.seen, self.errors = str(warehouse), {}, 0
        self._done = threading.Event()

    def run(self) -> None:
        from sira.pipelines.index.catalog import published_versions

        while not self._done.is_set():
            try:
                rows = published_versions(self.warehouse)
            except Exception:  # noqa: BLE001 (a read racing a commit; the next poll sees it)
                self.errors += 1
                rows = []
            now = time.time()
            for r in rows:
                self.seen.setdefault(r["index_version"], {
                    "seen_at": now, "enriched": bool(r["enriched"]), "segments": list(r["segments"] or []),
                    "num_tombstones": r["num_tombstones"], "num_docs": r["num_docs"],
                    "built_at": r["built_at"].timestamp() if r["built_at"] else None})
            self._done.wait(PUBLISH_POLL_S)

    def stop(self) -> None:
        self._done.set()
        if self.ident is not None:  # started
            self.join()


def search(url: str, text: str, timeout: float) -> dict:
    """One POST /search: the time it was answered, its latency, status and the index version that answered."""
    body = json.dumps({"query": text, "k": 10}).encode()
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    started = time.time()
    status, version, error = None, None, None
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, version = resp.status, json.loads(resp.read())["index_version"]
    except urllib.error.HTTPError as exc:
        status, error = exc.code, exc.read()[:200].decode(errors="replace")
    except (OSError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:200]
    return {"t": time.time(), "latency_s": round(time.time() - started, 4), "status": status, "index_version": version,
            **({"error": error} if error else {})}


class Trickle(threading.Thread):
    """A steady trickle of searches against serve; stops when told, after `max_seconds` or `max_requests`."""

    def __init__(self, url: str, texts: list[str], max_seconds: float, rate: float = REQUESTS_PER_S):
        super().__init__(daemon=True)
        self.url, self.texts, self.rate = url, texts, rate
        self.deadline, self.max_requests = time.time() + max_seconds, int(max_seconds * rate)
        self.records: list[dict] = []
        self._done = threading.Event()

    def run(self) -> None:
        i = 0
        next_at = time.time()
        while not self._done.is_set() and time.time() < self.deadline and i < self.max_requests:
            self.records.append(search(self.url, self.texts[i % len(self.texts)], REQUEST_TIMEOUT_S))
            i += 1
            next_at += 1 / self.rate
            self._done.wait(max(0.0, next_at - time.time()))

    def stop(self) -> None:
        self._done.set()
        if self.ident is not None:  # started
            self.join()

    def first_answer(self, version: int, since: float) -> dict | None:
        """The first successful response at or after `since` answered by `version` or a newer one."""
        return next((r for r in list(self.records) if r["t"] >= since and r["status"] == 200
                     and r["index_version"] >= version), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(warehouse: Path, port: int, poll_s: float | None, log_path: Path, timeout: float) -> subprocess.Popen:
    """`sira serve` in a subprocess; returns once /health answers 200."""
    args = ["serve", "-w", str(warehouse), "--port", str(port), *(["--poll-s", str(poll_s)] if poll_s else [])]
    out = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "sira.jobs.cli", *args], cwd=REPO_ROOT, stdout=out,
                            stderr=subprocess.STDOUT)
    out.close()  # the child holds its own copy
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sira serve exited ({proc.returncode}); its log: {log_path}\n"
                               f"{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(1)
    stop_serve(proc)
    raise RuntimeError(f"sira serve did not answer /health within {timeout} s; its log: {log_path}")


def stop_serve(proc: subprocess.Popen) -> None:
    """SIGTERM (serve finishes what is in flight and shuts its Ray down), then SIGKILL what is left of its tree."""
    tree = _descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.wait()
    for pid in tree[1:]:  # children that outlived it (reparented, so no longer in its tree)
        try:
            os.kill(pid, 9)
        except OSError:
            pass


# ---------------------------------------------------------------- builds ---------------------------------------


def backend_args(base_url: str) -> list[str]:
    return ["--backend", "openai", "--model", MODEL, "--base-url", base_url]


def nightly_args(wh: Path, source: Path, base_url: str, work: Path, out: Path) -> list[str]:
    return ["nightly", "-w", str(wh), "--source", str(source), *backend_args(base_url),
            "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}", "--output-json", str(out)]


def full_build(mode: str, corpus: Path, wh: Path, base_url: str, work: Path, name: str, timeout: float) -> dict:
    """ingest + enrich (openai backend) + index on an empty warehouse, timed per step: `sira nightly` (mode
    "nightly": its step_seconds) or the three single-step jobs (mode "jobs")."""
    shutil.rmtree(wh, ignore_errors=True)
    logs = work / "logs"
    if mode == "nightly":
        out = logs / f"{name}.json"
        run = run_job(nightly_args(wh, corpus, base_url, work, out), logs / f"{name}.log", timeout=timeout)
        summary = json.loads(out.read_text())
        steps = {k: round(v, 2) for k, v in summary["step_seconds"].items()}
        log(f"{name} build (sira nightly on an empty warehouse): {run['seconds']:.1f} s; steps {steps}")
        return {"mode": mode, "seconds": run["seconds"], "step_seconds": steps, "run": run, "summary": summary}
    runs = {}
    for step, args in (("ingest", ["ingest", str(corpus), "-w", str(wh)]),
                       ("enrich", ["enrich", "-w", str(wh), *backend_args(base_url)]),
                       ("index", ["index", "-w", str(wh)])):
        out = logs / f"{name}-{step}.json"
        runs[step] = run_job([*args, "--output-json", str(out)], logs / f"{name}-{step}.log", timeout=timeout)
        runs[step]["summary"] = json.loads(out.read_text())
    steps = {k: r["seconds"] for k, r in runs.items()}
    log(f"{name} build (sira ingest, enrich, index): {sum(steps.values()):.1f} s; steps {steps}")
    return {"mode": mode, "seconds": round(sum(steps.values()), 2), "step_seconds": steps, "runs": runs}


def worker_json(module_args: list[str], log_path: Path, timeout: float, env: dict | None = None) -> dict:
    run = run_job(["-m", *module_args], log_path, env=env, timeout=timeout)
    line = [ln for ln in log_path.read_text().splitlines() if ln.startswith("{")][-1]
    return {**json.loads(line), "wall_seconds": run["seconds"]}


def compare_worker(nights_wh: str, fresh_wh: str) -> None:
    """Subprocess: both newest enriched indexes, their top-100 rankings and q/s at k 10; prints a JSON line."""
    import numpy as np

    from sira.pipelines.serving.shard_loader import load_searcher

    (a, ma), (b, mb) = (load_searcher(w, preset="sira", enriched=True) for w in (nights_wh, fresh_wh))
    texts = queries()
    qa, qb = [a.compile(t) for t in texts], [b.compile(t) for t in texts]
    differing, max_diff = 0, 0.0
    for ra, rb in zip(a.rank_many(qa, COMPARE_K), b.rank_many(qb, COMPARE_K)):
        same_ids = ra.doc_ids.to_pylist() == rb.doc_ids.to_pylist()
        if same_ids:
            max_diff = max(max_diff, float(np.max(np.abs(ra.scores - rb.scores), initial=0.0)))
        differing += not (same_ids and np.array_equal(ra.scores, rb.scores))
    speeds = {"nights": [], "fresh": []}
    for searcher, compiled in ((a, qa), (b, qb)):
        searcher.rank_many(compiled, SPEED_K)  # compile and touch the mapped pages once
    for _ in range(SPEED_REPEATS):  # alternating, so a busy moment of the machine hits both
        for name, searcher, compiled in (("nights", a, qa), ("fresh", b, qb)):
            started = time.perf_counter()
            searcher.rank_many(compiled, SPEED_K)
            speeds[name].append(len(compiled) / (time.perf_counter() - started))
    print(json.dumps({
        "queries": len(texts), "queries_differing": differing, "max_abs_score_diff_same_ids": max_diff,
        "rankings_equal": differing == 0,
        "qps_nights": statistics.median(speeds["nights"]), "qps_fresh": statistics.median(speeds["fresh"]),
        "qps_runs": speeds,
        "nights_index": {k: ma[k] for k in ("index_version", "num_docs", "avgdl", "segments", "num_tombstones")},
        "fresh_index": {k: mb[k] for k in ("index_version", "num_docs", "avgdl", "segments", "num_tombstones")},
    }))


# ---------------------------------------------------------------- the month ------------------------------------


def run_nights(args, work: Path, logs: Path, corpus: Path, wh: Path, base_url: str, full_seconds: float,
               t0: float, first_night: int = 1) -> tuple[list[dict], dict]:
    port, texts = free_port(), queries()
    url = f"http://127.0.0.1:{port}/search"
    log(f"sira serve on 127.0.0.1:{port}")
    serve = start_serve(wh, port, args.poll_s, logs / "serve.log", timeout=args.job_timeout)
    serve_memory = TreeMemory(serve.pid, interval=1.0)
    serve_memory.start()
    publications = Publications(wh)
    trickle = Trickle(url, texts, max_seconds=(args.nights + 1) * args.job_timeout)
    poll_s = args.poll_s or FOLLOW_POLL_S
    nights: list[dict] = []
    snapshot = corpus
    try:
        # /health answers before the shard actors have compiled their scoring kernels (numba, cached on disk): the
        # first search pays for that, and is timed apart from the nights.
        first_search = search(url, texts[0], timeout=args.job_timeout)
        log(f"first search: {first_search['latency_s']:.1f} s (status {first_search['status']})")
        publications.start()
        trickle.start()
        for i in range(first_night, first_night + args.nights):
            fraction = night_fraction(i, args.nights, args.changed_fraction) if first_night == 1 else \
                args.changed_fraction
            started = time.time()
            made = None
            if fraction:
                nxt = work / f"snapshot-{i:02d}.parquet"
                made = write_next_snapshot(snapshot, nxt, fraction, args.seed, i)
                snapshot = nxt
            out = logs / f"night-{i:02d}.json"
            before = set(publications.seen)
            before_v = max((u for u in before if publications.seen[u]["enriched"]), default=None)
            run = run_job(nightly_args(wh, snapshot, base_url, work, out), logs / f"night-{i:02d}.log",
                          timeout=args.job_timeout)
            summary = json.loads(out.read_text())
            v = summary["index_version"]
            deadline = time.time() + 30  # the poller sees a published version within PUBLISH_POLL_S
            while v not in publications.seen and time.time() < deadline:
                time.sleep(0.1)
            pub = publications.seen.get(v, {})
            new = v not in before
            nights.append({
                "night": i, "changed_fraction": fraction, "snapshot": str(snapshot), "snapshot_written": made,
                "started_at_s": round(started - t0, 2), "ingested": summary["ingested"],
                "enriched": summary["enriched"], "seconds": run["seconds"], "nightly_seconds": summary["seconds"],
                "step_seconds": {k: round(s, 2) for k, s in summary["step_seconds"].items()},
                "fraction_of_full_build": round(run["seconds"] / full_seconds, 4),
                "index_version": v, "new_version": new, "segments": len(pub.get("segments", [])),
                "segment_list": pub.get("segments"), "num_tombstones": pub.get("num_tombstones"),
                "compacted": new and pub.get("segments") == [v],
                # segments of the version before that this one lacks: merged into its new segment (or compacted)
                "merged_segments": sorted(set(publications.seen.get(before_v, {}).get("segments") or [])
                                          - set(pub.get("segments") or [])) if new else [],
                "published_at_s": round(pub["seen_at"] - t0, 2) if new and pub else None,
                "expired_versions": summary["expired_versions"],
                # peak resident memory of each process group (driver, JVM, Python workers) and of the whole tree
                **{k: run[k] for k in run if k.startswith("peak_rss_")},
            })
            n = nights[-1]
            if args.next_night_after_follow and new and pub:
                n["waited_for_follow_s"] = wait_for_follow(trickle, v, pub["seen_at"], poll_s)
            log(f"night {i}/{first_night + args.nights - 1}: {fraction:.0%} changed, {n['seconds']:.1f} s "
                f"({n['fraction_of_full_build']:.1%} of the full build), v{v} "
                f"{'new' if new else 'unchanged'}, {n['segments']} segments, {n['num_tombstones']} tombstones"
                f"{', compacted' if n['compacted'] else ''}"
                f"{', merged ' + str(n['merged_segments']) if n['merged_segments'] and not n['compacted'] else ''}"
                f"; steps {n['step_seconds']}")
        # Let serve follow the last published version before the requests stop.
        last = max((n for n in nights if n["new_version"]), key=lambda n: n["index_version"], default=None)
        if last:
            wait_for_follow(trickle, last["index_version"], last["published_at_s"] + t0, poll_s)
    finally:
        trickle.stop()
        publications.stop()
        stop_serve(serve)
        serve_peaks = serve_memory.stop()
    for j, n in enumerate(nights):
        if n["new_version"]:
            pub_t = n["published_at_s"] + t0
            hit = trickle.first_answer(n["index_version"], pub_t)
            n["follow_seconds"] = round(hit["t"] - pub_t, 2) if hit else None
            n["followed_with_version"] = hit["index_version"] if hit else None
        else:
            n["follow_seconds"] = None
        start = n["started_at_s"] + t0
        end = nights[j + 1]["started_at_s"] + t0 if j + 1 < len(nights) else float("inf")
        window = [r for r in trickle.records if start <= r["t"] < end]
        n["requests"] = len(window)
        n["failed_requests"] = sum(r["status"] != 200 for r in window)
    records = trickle.records
    with open(work / "requests.jsonl", "w") as fh:
        fh.writelines(json.dumps({**r, "t": round(r["t"] - t0, 3)}) + "\n" for r in records)
    failed = [r for r in records if r["status"] != 200]
    latencies = sorted(r["latency_s"] for r in records if r["status"] == 200)
    serving = {
        "port": port, "poll_s": poll_s, "first_search_seconds": first_search["latency_s"],
        "first_search_status": first_search["status"], "requests": len(records), "failed_requests": len(failed),
        "requests_log": str(work / "requests.jsonl"),
        "failed_examples": [{**r, "t": round(r["t"] - t0, 3)} for r in failed[:10]],
        "latency_s_p50": latencies[len(latencies) // 2] if latencies else None,
        "latency_s_p99": latencies[int(len(latencies) * 0.99)] if latencies else None,
        "versions_answered": sorted({r["index_version"] for r in records if r["index_version"] is not None}),
        "publications": {str(v): {**p, "seen_at_s": round(p["seen_at"] - t0, 2)}
                         for v, p in sorted(publications.seen.items())},
        "publication_poll_errors": publications.errors,
        **serve_peaks,
    }
    return nights, serving


def wait_for_follow(trickle, version: int, published: float, poll_s: float) -> float:
    """Seconds waited until serve answered from `version` (or a newer one), at most poll_s + 300."""
    started = time.time()
    while time.time() < published + poll_s + 300 and not trickle.first_answer(version, published):
        time.sleep(0.2)
    return round(time.time() - started, 2)


NOT_COMPARED = {"rankings_equal_full_rebuild": None, "query_speed_after_nights_vs_fresh": None,
                "cold_load_seconds": None}


def against_fresh_build(args, work: Path, wh: Path, last_snapshot: Path, server) -> dict:
    """The results' keys of the last snapshot built fresh in full, rankings and query speed compared with the
    nights' index, and the nights' index loaded cold (no shard cache). A failure here (a full disk, say) is
    reported beside the nights' figures, which stand without it, instead of losing them."""
    logs, fresh_wh = work / "logs", work / "wh-fresh"
    try:
        log(f"fresh full build of the last snapshot ({last_snapshot.name})")
        fresh = full_build(args.full_build, last_snapshot, fresh_wh, server.base_url, work, "fresh", args.job_timeout)
        log("comparing rankings and query speed")
        compare = worker_json(["bench.nights", "--compare", str(wh), str(fresh_wh)], logs / "compare.log",
                              args.job_timeout)
        with tempfile.TemporaryDirectory(prefix="shard-cache-", dir=work) as cache:
            cold = worker_json(["bench.scale", "--load", str(wh)], logs / "cold-load.log", args.job_timeout,
                               env={"SIRA_SHARD_CACHE": cache})
    except Exception as exc:  # noqa: BLE001
        log(f"the comparison with a fresh build failed: {exc}")
        return {**NOT_COMPARED, "compare_error": str(exc)[-3000:]}
    log(f"rankings equal: {compare['rankings_equal']}; q/s nights/fresh "
        f"{compare['qps_nights'] / compare['qps_fresh']:.3f}; cold load {cold['seconds']:.1f} s")
    return {"rankings_equal_full_rebuild": compare["rankings_equal"],
            "query_speed_after_nights_vs_fresh": round(compare["qps_nights"] / compare["qps_fresh"], 4),
            "cold_load_seconds": round(cold["seconds"], 3), "fresh_build": fresh, "compare": compare,
            "cold_load": cold}


def nights_summary(nights: list[dict]) -> dict:
    """Mean and worst fraction of the full build, and the slowest follow, over `nights`."""
    fractions = [x["fraction_of_full_build"] for x in nights]
    follows = [x["follow_seconds"] for x in nights if x["follow_seconds"] is not None]
    return {"night_fraction_mean": round(statistics.mean(fractions), 4) if fractions else None,
            "night_fraction_max": max(fractions, default=None), "follow_seconds_max": max(follows, default=None)}


def chain_of(results: Path) -> list[dict]:
    """The nights of `results` and of the runs it continued, oldest first, each with the commit it ran at."""
    run = json.loads(results.read_text())
    earlier = chain_of(Path(run["continued_from"])) if run.get("continued_from") else []
    return earlier + [{**n, "git_commit": run["git_commit"]} for n in run["nights"]]


def chain_summary(nights: list[dict]) -> dict:
    """The month's figures over every night of a chain of continued runs."""
    return {"nights": len(nights), **nights_summary(nights),
            "failed_requests": sum(x["failed_requests"] for x in nights),
            "compactions": sum(bool(x["compacted"]) for x in nights),
            "merges": sum(bool(x.get("merged_segments")) and not x["compacted"] for x in nights),
            "commits": sorted({x["git_commit"][:7] for x in nights})}


def measure(args) -> dict:
    t0 = time.time()
    work = args.work_dir
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    n = args.docs
    corpus = work / f"corpus-{n}-s{args.seed}.parquet"
    if not corpus.exists():
        log(f"generating {n} documents -> {corpus}")
        write_parquet(corpus, iter_documents(n, args.seed))
    for old in work.glob("snapshot-*.parquet"):  # a night's snapshot depends on the one before
        old.unlink()
    (work / "mlflow.db").unlink(missing_ok=True)
    wh = work / "wh-nights"
    with instant_openai.start(max_seconds=(2 * args.nights + 8) * args.job_timeout) as server:
        log(f"instant OpenAI server at {server.base_url}; full enriched build")
        full = full_build(args.full_build, corpus, wh, server.base_url, work, "full", args.job_timeout)
        nights, serving = run_nights(args, work, logs, corpus, wh, server.base_url, full["seconds"], t0)
        last_snapshot = Path(nights[-1]["snapshot"]) if nights else corpus
        comparison = NOT_COMPARED if args.skip_fresh_build else \
            against_fresh_build(args, work, wh, last_snapshot, server)
        instant_stats = server.stop()
    unfollowed = [x["index_version"] for x in nights if x["new_version"] and x["follow_seconds"] is None]
    return {
        "docs": n,
        "nights": nights,
        **nights_summary(nights),
        "failed_requests": serving["failed_requests"],
        "full_build_seconds": full["seconds"],
        "versions_never_answered": unfollowed,
        "changed_fraction": args.changed_fraction,
        "seed": args.seed,
        "cores": os.cpu_count(),
        "command": "python bench/nights.py " + " ".join(sys.argv[1:]),
        "git_commit": git_commit(),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.time() - t0, 1),
        "full_build": full,
        "serving": serving,
        "instant_server": instant_stats,
        **comparison,
    }


def measure_more_nights(args) -> dict:
    """`--continue-from EARLIER.json`: K more nights on the warehouse of an earlier run (its work dir, its last
    snapshot, its full build's seconds as the denominator), with a server that starts on its newest version: the
    follow and the nights' costs measured again after the code changed, without building twice in full. Rankings,
    query speed against a fresh build and the cold load are measured with --compare-after (null otherwise)."""
    t0 = time.time()
    earlier = json.loads(args.continue_from.read_text())
    work = Path(earlier["nights"][-1]["snapshot"]).parent
    logs = work / "logs"
    snapshot = Path(earlier["nights"][-1]["snapshot"])
    first = earlier["nights"][-1]["night"] + 1
    comparison = NOT_COMPARED
    with instant_openai.start(max_seconds=(args.nights + 4) * args.job_timeout) as server:
        nights, serving = run_nights(args, work, logs, snapshot, work / "wh-nights", server.base_url,
                                     earlier["full_build_seconds"], t0, first_night=first)
        if args.compare_after:
            comparison = against_fresh_build(args, work, work / "wh-nights", Path(nights[-1]["snapshot"]), server)
        instant_stats = server.stop()
    commit = git_commit()
    return {
        "docs": earlier["docs"], "nights": nights, "continued_from": str(args.continue_from), **nights_summary(nights),
        "failed_requests": serving["failed_requests"],
        "full_build_seconds": earlier["full_build_seconds"], "changed_fraction": args.changed_fraction,
        "cores": os.cpu_count(), "command": "python bench/nights.py " + " ".join(sys.argv[1:]),
        "git_commit": commit, "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.time() - t0, 1), "serving": serving, "instant_server": instant_stats, **comparison,
        # Every night since the full build, this run's and those of the runs it continued.
        "chain": chain_summary(chain_of(args.continue_from) + [{**n, "git_commit": commit} for n in nights]),
    }


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int)
    ap.add_argument("--nights", type=int, default=30)
    ap.add_argument("--changed-fraction", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/sira-nights"))
    ap.add_argument("--poll-s", type=float, default=None, help="serve's --poll-s (default: serve's own)")
    ap.add_argument("--full-build", choices=("nightly", "jobs"), default="nightly",
                    help="how the full builds run: `sira nightly` on an empty warehouse, or ingest + enrich + index")
    ap.add_argument("--job-timeout", type=float, default=4 * 3600, help="seconds any one job may run")
    ap.add_argument("--output-json", type=Path)
    ap.add_argument("--continue-from", type=Path, help="an earlier run's results JSON: K more nights on its warehouse")
    ap.add_argument("--compare-after", action="store_true",
                    help="with --continue-from: after the nights, build the last snapshot fresh and compare rankings, "
                         "query speed and the cold load (as a whole run does)")
    ap.add_argument("--next-night-after-follow", action="store_true",
                    help="start each night once serve answers from the previous night's version, as nights a day "
                         "apart do (by default the next night starts at once, and its start races the follow)")
    ap.add_argument("--skip-fresh-build", action="store_true",
                    help="no fresh build of the last snapshot, no comparison (its keys null): the nights alone")
    ap.add_argument("--compare", nargs=2, help=argparse.SUPPRESS)  # worker mode
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    require_own_code()
    if args.compare:
        return compare_worker(*args.compare)
    if args.continue_from:
        return write_report(measure_more_nights(args), args.output_json)
    if not args.docs or args.nights < 1:
        raise SystemExit("--docs and --nights >= 1 are required")
    write_report(measure(args), args.output_json)


if __name__ == "__main__":
    main()
