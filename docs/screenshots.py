"""The screenshots of `sira serve`'s pages in the README (docs/search.png, docs/compare.png), made the way
tests/test_web.py drives the pages: Playwright with Debian's Chromium, against a real `sira serve`.

    python docs/screenshots.py                      # scifact, a 1,000-document slice, about 6 min on 2 cores

The slice keeps every document judged for a test query, and others drawn with a fixed seed up to --docs; `sira run`
evaluates bm25 and sira on it with the CPU defaults (the encoder proposer on both sides), `sira serve` serves the
enriched index with the encoder for expansion. The search view shows the test query that sira improves most over
bm25, expanded; the compare view, the same query opened. A second call reuses the warehouse.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def slice_dataset(spec: str, docs: int, folder: Path, split: str = "test", seed: int = 0) -> Path:
    """A BEIR folder with the split's judged documents and others up to `docs`, the split's queries and qrels."""
    from sira.core.datasets import iter_lines, resolve_dataset

    if (folder / "corpus.jsonl.gz").exists():
        return folder
    dataset = resolve_dataset(spec)
    qrels = dataset.qrels(split)
    judged = {d for rel in qrels.values() for d in rel}
    lines = [line.decode("utf-8") for _, line in iter_lines(dataset.corpus_path)]
    ids = [json.loads(line)["_id"] for line in lines]
    others = [i for i, d in enumerate(ids) if d not in judged]
    drawn = random.Random(seed).sample(others, max(0, docs - len(judged)))
    keep = {i for i, d in enumerate(ids) if d in judged} | set(drawn)
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / "corpus.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(lines[i] + "\n" for i in sorted(keep))
    queries = dataset.queries(split)
    with gzip.open(folder / "queries.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items())
    rows = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{r}" for q, rel in qrels.items() for d, r in rel.items()]
    (folder / "qrels" / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


def sira(*args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sira.jobs.cli", *args], cwd=REPO, **popen)


def get(url: str, body: dict | None = None) -> dict:
    """GET (POST with `body`) a JSON endpoint of the server."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, headers={"Accept": "application/json", "Content-Type": "application/json"})
    with opener.open(request, timeout=120) as resp:
        return json.loads(resp.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="beir:scifact")
    parser.add_argument("--docs", type=int, default=1000, help="documents in the slice")
    parser.add_argument("--warehouse", default="warehouses/screenshots", help="the slice and its warehouse go here")
    parser.add_argument("--out", default=str(REPO / "docs"))
    parser.add_argument("--chromium", default=os.environ.get("SIRA_CHROMIUM") or shutil.which("chromium"))
    args = parser.parse_args()

    root = Path(args.warehouse).resolve()
    data = slice_dataset(args.dataset, args.docs, root / "data" / args.dataset.split(":")[-1])
    wh = root / data.name
    if not list((wh / "runs").glob("*-sira-*.run.json")):
        if sira("run", "-d", str(data), "-w", str(wh), "--variants", "bm25,sira", "--shards", "2",
                "--no-tracking").wait():
            sys.exit("sira run failed")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = sira("serve", "-w", str(wh), "--port", str(port), "--backend", "encoder", start_new_session=True)
    try:
        for _ in range(600):
            try:
                get(url + "/health")
                break
            except OSError:
                time.sleep(0.5)
        runs = get(url + "/runs")["runs"]
        base = next(r["name"] for r in runs if r["variant"] == "bm25")
        run = next(r["name"] for r in runs if r["variant"] == "sira")
        comparison = get(url + "/compare?" + urllib.parse.urlencode({"base": base, "run": run}))
        gains = {q: s["run"] - s["base"] for q, s in comparison["per_query"].items()}
        qid = max(sorted(gains), key=gains.get)
        # The first search of a server compiles the scoring kernels: not what the page's timings should show.
        get(url + "/search", {"query": comparison["texts"][qid], "expand": True, "explain": True})
        shoot(args.chromium, Path(args.out), url, comparison["texts"][qid], base, run, qid)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)


def shoot(chromium: str, out: Path, url: str, query: str, base: str, run: str, qid: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 900}, device_scale_factor=1)
        page.set_default_timeout(120_000)
        page.goto(url + "/?" + urllib.parse.urlencode({"q": query, "expand": "1", "k": "5"}))
        page.wait_for_selector("#hits li.hit")
        page.screenshot(path=str(out / "search.png"), full_page=True)
        page.goto(url + "/compare?" + urllib.parse.urlencode({"base": base, "run": run, "qid": qid}))
        page.wait_for_selector("#detail:not([hidden]) #side-run li")
        page.screenshot(path=str(out / "compare.png"), full_page=False)
        browser.close()
    print(f"wrote {out / 'search.png'} and {out / 'compare.png'} (query {qid}: {query!r})")


if __name__ == "__main__":
    main()
