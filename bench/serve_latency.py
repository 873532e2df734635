"""Latency and throughput of `sira serve` under a bounded load, with and without query-side expansion.

    python bench/serve_latency.py [--dataset beir:scifact] [--warehouse warehouses/scifact] [--preset sira]
                                  [--requests 200] [--concurrency 4] [--k 10] [--backend openai|local]
                                  [--output-json bench/results/serve_latency.json]

Builds what the warehouse lacks (`sira.pipelines.index.freshness.ensure_index`), starts `sira serve` as a subprocess
on a free loopback port, sends `--requests` searches per mode from the split's queries (in qid order, cycling) at
`--concurrency` requests in flight, then stops the server. Two modes: `plain` (expand: false) and
`expand` (expand: true). Client-side latency covers the whole HTTP round trip; the server's `timing_ms`
splits each search into expansion and scoring.

Expansion backend: `openai` (default) is the fake OpenAI-compatible server of tests/fake_openai.py, run in
this process; it answers at once, so the expansion figures are the online path's own overhead (HTTP call,
parsing, DF filter), not an LLM's latency. `--backend local` uses the embedded CPU model instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402

MODES = {"plain": False, "expand": True}
FAKE_MODEL = "fake-llm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None, "mean": None}
    a = np.asarray(values, dtype=np.float64)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "mean": float(a.mean())}


async def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float, log_path: Path) -> dict:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"sira serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    if resp.status == 200:
                        return await resp.json()
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(1.0)
    raise TimeoutError(f"sira serve not healthy after {timeout_s:.0f} s:\n{log_path.read_text()[-3000:]}")


async def load(url: str, texts: list[str], n: int, concurrency: int, k: int, expand: bool) -> dict:
    """n searches, at most `concurrency` in flight; per-request client latency and the server's timing."""
    import aiohttp

    gate = asyncio.Semaphore(concurrency)
    latency, expansion, scoring, statuses, sources = [], [], [], {}, {}

    async def one(session, text: str) -> None:
        async with gate:
            started = time.perf_counter()
            async with session.post(url + "/search", json={"query": text, "k": k, "expand": expand}) as resp:
                body = await resp.json()
            latency.append((time.perf_counter() - started) * 1000)
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
            if resp.status == 200:
                expansion.append(body["timing_ms"]["expansion"])
                scoring.append(body["timing_ms"]["scoring"])
                if "expansion" in body:
                    key = body["expansion"]["source"] + (" (error)" if body["expansion"]["error"] else "")
                    sources[key] = sources.get(key, 0) + 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(one(session, texts[i % len(texts)]) for i in range(n)))
        wall = time.perf_counter() - started
    return {"requests": n, "concurrency": concurrency, "statuses": statuses, "seconds": wall,
            "throughput_rps": n / wall, "latency_ms": percentiles(latency),
            "server_expansion_ms": percentiles(expansion), "server_scoring_ms": percentiles(scoring),
            **({"expansion_sources": sources} if expand else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="beir:scifact")
    parser.add_argument("--split", default="test")
    parser.add_argument("--warehouse", help="default: warehouses/<dataset name>")
    parser.add_argument("--preset", default="sira")
    parser.add_argument("--shards", type=int, default=4, help="when the index has to be built")
    parser.add_argument("--spark-master", default="local[*]")
    parser.add_argument("--requests", type=int, default=200, help="per mode")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=10, help="untimed requests per mode")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--backend", choices=("openai", "local"), default="openai",
                        help="openai: the in-process fake server (pure overhead); local: the embedded CPU model")
    parser.add_argument("--model", help="local: GGUF path or packaged model name")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--output-json", type=Path, default=REPO_ROOT / "bench/results/serve_latency.json")
    args = parser.parse_args()

    from sira.pipelines.tracking.console import console, progress_bar
    from sira.pipelines.index.freshness import ensure_index
    from sira.core.datasets import resolve_dataset

    dataset = resolve_dataset(args.dataset)
    warehouse = args.warehouse or str(REPO_ROOT / "warehouses" / dataset.name)
    manifest = ensure_index(args.dataset, warehouse, args.preset, args.shards, args.spark_master, log=console.log,
                            progress=progress_bar)
    queries = dataset.queries(args.split)
    texts = [queries[q] for q in sorted(queries)]

    fake = None
    serve_cmd = [sys.executable, "-m", "sira.jobs.cli", "serve", "--warehouse", warehouse,
                 "--index-version", str(manifest["index_version"]), "--max-concurrent", str(max(32, args.concurrency))]
    port = free_port()
    serve_cmd += ["--port", str(port)]
    if args.backend == "openai":
        sys.path.insert(0, str(REPO_ROOT / "tests"))
        from fake_openai import FakeOpenAI

        fake = FakeOpenAI()
        fake.start()
        serve_cmd += ["--backend", "openai", "--model", FAKE_MODEL, "--base-url", fake.base_url]
    else:
        serve_cmd += ["--backend", "local"] + (["--model", args.model] if args.model else [])

    url = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.mkdtemp(prefix="sira-serve-bench-")) / "serve.log"
    load_before = os.getloadavg()
    started = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(serve_cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        health = asyncio.run(wait_healthy(url, proc, args.startup_timeout, log_path))
        startup_s = time.perf_counter() - started
        print(f"server up in {startup_s:.1f} s: index v{health['index_version']}, {health['num_docs']} docs, "
              f"{health['shards']} shards", file=sys.stderr)
        results = {}
        for mode, expand in MODES.items():
            asyncio.run(load(url, texts[::-1], args.warmup, args.concurrency, args.k, expand))  # numba, sockets
            results[mode] = asyncio.run(load(url, texts, args.requests, args.concurrency, args.k, expand))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        if fake is not None:
            fake.stop()

    expansion_note = ("expansion latency is the fake OpenAI server's (tests/fake_openai.py, in process, answers at "
                      "once): it measures the online path's overhead, not an LLM") if args.backend == "openai" else \
        "expansion latency is the embedded CPU model's (llama.cpp, in the server process)"
    report = {
        "benchmark": "serve_latency",
        "created_at": datetime.now(timezone.utc).isoformat(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "serve_command": " ".join(serve_cmd[2:]),
        "dataset": dataset.name, "split": args.split, "num_queries": len(texts), "warehouse": warehouse,
        "index_version": manifest["index_version"], "preset": manifest["preset"], "num_docs": manifest["num_docs"],
        "shards": manifest["num_shards"], "k": args.k, "backend": args.backend, "startup_seconds": startup_s,
        "note": expansion_note + ". Client latency is the whole HTTP round trip; server_*_ms are the server's "
                "timing_ms (scoring = program build + scatter-gather over the shard actors + merge).",
        "results": results,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_average_start": load_before, "load_average_end": os.getloadavg()},
    }
    args.output_json.parent.mkdir(parents=True, exist_ok=True)
    args.output_json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    print(f"\n{dataset.name} ({manifest['num_docs']} docs, {manifest['num_shards']} shards), {args.requests} requests "
          f"per mode at concurrency {args.concurrency}, k={args.k}")
    print(f"{'mode':8} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'exp p50':>8} {'exp p99':>8} {'score p50':>9} "
          f"{'score p99':>9}  statuses")
    for mode, r in results.items():
        print(f"{mode:8} {r['throughput_rps']:7.1f} {r['latency_ms']['p50']:8.2f} {r['latency_ms']['p99']:8.2f} "
              f"{r['server_expansion_ms']['p50']:8.2f} {r['server_expansion_ms']['p99']:8.2f} "
              f"{r['server_scoring_ms']['p50']:9.2f} {r['server_scoring_ms']['p99']:9.2f}  {r['statuses']}")
    print(f"\n{expansion_note}.\nwrote {args.output_json}")


if __name__ == "__main__":
    main()
