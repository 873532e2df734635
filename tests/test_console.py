"""The console of the jobs: progress lines where no bar can be drawn, and the engines' output in a log file."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time

import pytest

from conftest import JOB_ENV, REPO
from sira.pipelines.tracking import console as console_module
from sira.pipelines.tracking.console import duration, progress_bar, progress_line

# What the engines print on their own: Ray (Python and C++), Ray Data, Spark, Ivy, log4j, Python warnings.
ENGINE_NOISE = ("core_worker", "WARN", "Warning", "Ivy", ":: resolving", "found io.delta", "log4j", "Token authentication",
                "streaming_executor", "is too large", "deprecated")


def test_progress_line_has_count_rate_and_eta():
    assert progress_line("enrich", 1200, 5183, "docs", 120.0) == \
        "enrich: 1,200/5,183 docs (23%), 10.0 docs/s, ETA 6 min 38 s"
    assert progress_line("enrich", 1, 100, "docs", 4.0) == "enrich: 1/100 docs (1%), 0.25 docs/s, ETA 6 min 36 s"
    assert progress_line("enrich", 0, 100, "docs", 5.0) == "enrich: 0/100 docs (0%), 0.00 docs/s, ETA unknown"
    assert progress_line("ingest x", 500, None, "records", 2.0) == "ingest x: 500 records, 250.0 records/s, 2 s so far"
    assert progress_line("enrich", 12, 12, "docs", 4.0, finished=True) == \
        "enrich: 12/12 docs (100%), 3.0 docs/s, done in 4 s"
    assert [duration(s) for s in (0.4, 59.6, 61, 3900)] == ["0 s", "1 min 00 s", "1 min 01 s", "1 h 05 min"]


def test_progress_bar_prints_periodic_lines_when_not_a_terminal(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(console_module.console, "file", out)
    with progress_bar("enrich", total=10, unit="docs", interval_s=0.05) as advance:
        advance(4)
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3
    assert all(re.fullmatch(r"\[\d\d:\d\d:\d\d\] enrich: 4/10 docs \(40%\), [\d.]+ docs/s, ETA \d+ s", line)
               for line in lines[:-1])
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] enrich: 4/10 docs \(40%\), [\d.]+ docs/s, done in 0 s", lines[-1])


ENGINE_SCRIPT = """
import os, subprocess, sys, warnings
from pathlib import Path
from sira.pipelines.tracking.console import console, engine_logs
path = None if sys.argv[1] == "-" else Path(sys.argv[1])
with engine_logs(path):
    console.log("job line")
    os.write(2, b"native noise\\n")
    print("python noise", file=sys.stderr)
    warnings.warn("a warning")
    subprocess.run(["sh", "-c", "echo child noise >&2"], check=True)
console.log("after")
with engine_logs(None if path is None else path.with_name("quiet.log")):
    console.log("nothing from the engines")
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_engine_output_goes_to_a_log_file_named_at_the_end(tmp_path, verbose):
    log = tmp_path / "logs" / "job.log"
    done = subprocess.run([sys.executable, "-c", ENGINE_SCRIPT, "-" if verbose else str(log)], cwd=REPO,
                          capture_output=True, text=True, check=True)
    noise = ("native noise", "python noise", "a warning", "child noise")
    assert "job line" in done.stderr and "after" in done.stderr and "nothing from the engines" in done.stderr
    if verbose:
        assert all(n in done.stderr for n in noise) and not (tmp_path / "logs").exists()
        return
    assert not any(n in done.stderr + done.stdout for n in noise)
    assert all(n in log.read_text() for n in noise)
    assert re.search(r"engine logs: \S*job\.log", done.stderr.replace("\n", ""))
    assert [p.name for p in (tmp_path / "logs").iterdir()] == ["job.log"]  # an empty log is neither kept nor named
    assert done.stderr.count("engine logs:") == 1


@pytest.mark.integration
def test_sira_run_shows_plan_progress_and_results_and_logs_the_engines(tmp_path, tiny_beir):
    """A real `sira run` (its own JVM and Ray) with output to files: nothing the engines print reaches the console,
    the log file is named, and each counted stage prints a progress line with its count and rate."""
    wh = tmp_path / "wh"
    done = subprocess.run([sys.executable, "-m", "sira.jobs.cli", "run", "--dataset", str(tiny_beir), "-w", str(wh),
                           "--variants", "bm25,query", "--shards", "2", "--no-tracking",
                           "--output-json", str(tmp_path / "run.json")],
                          cwd=REPO, env=JOB_ENV, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    assert not [line for line in lines if any(n in line for n in ENGINE_NOISE)]
    assert "sira run tiny/test" in done.stderr and "nDCG@10" in done.stdout
    assert re.search(r"expand queries: 5/5 queries \(100%\), [\d.,]+ queries/s, done in", done.stderr)
    assert re.search(r"tiny/test queries: 5/5 queries \(100%\), [\d.,]+ queries/s, done in", done.stderr)
    [log] = (wh / "logs").glob("run-*.log")
    assert f"engine logs: {log}" in done.stderr.replace("\n", "")
    assert ":: resolving dependencies ::" in log.read_text()  # Spark's Ivy, at the JVM's start
    assert set(json.loads((tmp_path / "run.json").read_text())["variants"]) == {"bm25", "query"}
