"""The README and docs/: short enough to read, links that resolve, and numbers that are the committed results'."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, REPO / "CONTRIBUTING.md", REPO / "RELIABILITY.md", *sorted((REPO / "docs").glob("*.md"))]
RESULTS = REPO / "bench" / "results"


def table_rows(text: str, header_start: str) -> dict[str, list[str]]:
    """The rows of the Markdown table whose header line starts with `header_start`, by their first cell."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_the_readme_is_short_and_starts_with_the_two_commands():
    text = README.read_text("utf-8")
    assert len(text.splitlines()) <= 150
    first_block = text.split("```")[1]
    assert "make run" in first_block and "make test" in first_block


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_and_results_files_named_in_the_docs_exist(page):
    text = page.read_text("utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)\)", text):
        if "://" not in target:
            assert (page.parent / target).exists(), f"{page.name} links {target}"
    for named in re.findall(r"bench/results/[\w./*-]+\.(?:json|png|parquet)", text):
        # NAME stands for each dataset of the table beside it
        assert list(REPO.glob(named.replace("NAME", "*"))), f"{page.name} names {named}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_dates_in_the_docs(page):
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", page.read_text("utf-8"))


def bench_medians():
    """bench/medians.py as a module (bench/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_medians", REPO / "bench" / "medians.py")
    medians = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(medians)
    return medians


def ndcg(path: Path, variant: str | None = None) -> str:
    summary = json.loads(path.read_text("utf-8"))
    if variant is not None:
        summary = summary["variants"][variant]
    return f"{summary['metrics']['ndcg@10']:.4f}"


def test_the_readme_tables_are_the_committed_results():
    text = README.read_text("utf-8")
    variants = table_rows(text, "| dataset | bm25 | doc")
    bm25 = table_rows(text, "| dataset | `pyserini-flat` (ours)")
    assert set(variants) == set(bm25) == {"scifact", "nfcorpus", "arguana"}
    for dataset in variants:
        run = RESULTS / f"run_{dataset}_encoder.json"
        assert variants[dataset] == [ndcg(run, v) for v in ("bm25", "doc", "query", "sira", "dense", "hybrid",
                                                             "sira+dense")]
        assert bm25[dataset][0] == ndcg(RESULTS / f"eval_{dataset}_pyserini-flat_test.json")
        assert bm25[dataset][2] == ndcg(run, "bm25")


def test_the_readme_scale_table_is_the_committed_results():
    rows = table_rows(README.read_text("utf-8"), "| figure | ours | target | results file |")

    def result(row: str) -> dict:
        return json.loads((RESULTS / rows[row][2].strip("`")).read_text("utf-8"))

    build = "index build, docs/s per core: unigrams (x bm25s); `sira` preset (bigrams)"
    d = result(build)
    assert rows[build][0] == (f"{d['index_docs_per_s_per_core']:,.0f} ({d['index_ratio_vs_bm25s_per_core']:.3f}x); "
                              f"{d['index_docs_per_s_per_core_sira_preset']:,.0f}")
    bulk = "`sira query`, 100k queries, 2 workers, against bm25s 2 threads: k=100; k=1000 (the smaller)"
    d = result(bulk)
    assert d["docs"] == 1_000_000 and d["queries"] == 100_000
    assert rows[bulk][0] == f"{d['ratio_vs_bm25s_threads2_k100']:.2f}x; {d['ratio_vs_bm25s_threads2_k1000']:.2f}x"
    month = "30 default nights, 1% changed: mean / worst fraction of a full enriched build"
    d = result(month)["chain"]
    assert d["nights"] == 30 and rows[month][0] == f"{d['night_fraction_mean']:.3f} / {d['night_fraction_max']:.3f}"
    after = "after the 30 nights: q/s against a fresh build (rankings)"
    d = result(after)
    assert rows[after][0] == (f"{d['query_speed_after_nights_vs_fresh']:.2f}x "
                              f"({'equal' if d['rankings_equal_full_rebuild'] else 'differ'})")
    # The searcher's rows: median (range) of the runs bench/medians.py summarised, recomputed from them.
    medians = bench_medians()
    cold = "cold load, 15 segments, no shard cache: seconds, median (range) of 5; against c1e2cb0"
    d = result(cold)
    assert medians.summarize(d["runs"], tuple(d["keys"])) == d["summary"] and len(d["runs"]) == 5
    s, x = d["summary"]["seconds"], d["summary"]["speedup_vs_baseline"]
    assert rows[cold][0] == f"{s['median']:.1f} s ({s['min']:.1f}-{s['max']:.1f}); {x['median']:.2f}x"
    follow = "follow: a night's publish to the server's first answer, median (range) of 4 nights a day apart"
    d = result(follow)
    seconds = [n["follow_seconds"] for n in d["nights"]]
    assert len(seconds) == 4 and "--next-night-after-follow" in d["command"]
    assert rows[follow][0] == f"{statistics.median(seconds):.1f} s ({min(seconds):.1f}-{max(seconds):.1f})"
    for row, key, unit in (
            ("k=10 q/s against bm25s (the smaller of plain and expanded)", "query_ratio_vs_bm25s_numba", "x"),
            ("k=1000 q/s against bm25s (the smaller)", "k1000_ratio_vs_bm25s_numba", "x"),
            ("bm25s's resident memory over ours", "memory_ratio_vs_bm25s", "")):
        triple = result(row)
        assert len(triple["runs"]) >= 3 and medians.summarize(triple["runs"]) == triple["summary"]
        assert all(run["corpus"]["num_docs"] == 1_000_000 for run in triple["runs"])
        m = triple["summary"][key]
        assert rows[row][0] == f"{m['median']:.2f}{unit} ({m['min']:.2f}-{m['max']:.2f})", row


def test_the_docs_medians_of_make_bench_are_recomputed_from_the_committed_runs():
    """bench/medians.py's summary of the dd3d740 triple is what its runs give, and docs/benchmarks.md quotes it."""
    medians = bench_medians()
    triple = json.loads((RESULTS / "query_speed_dd3d740.json").read_text("utf-8"))
    assert len(triple["runs"]) >= 3 and medians.summarize(triple["runs"]) == triple["summary"]
    text = (REPO / "docs" / "benchmarks.md").read_text("utf-8")
    for dataset in ("scifact", "arguana"):
        s = triple["summary"][f"datasets.{dataset}.k10.ratio_vs_bm25s_numba"]
        assert f"{dataset} **{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})**" in text


def test_the_docs_cold_load_at_15_segments_is_the_median_of_its_committed_runs():
    medians = bench_medians()
    triple = json.loads((RESULTS / "cold_load_1m_15_segments_329f1b7.json").read_text("utf-8"))
    assert len(triple["runs"]) >= 3 and medians.summarize(triple["runs"], tuple(triple["keys"])) == triple["summary"]
    assert all(len(run["segments"]) == 15 and run["num_docs"] == 1_000_000 for run in triple["runs"])
    s = triple["summary"]["seconds"]
    text = (REPO / "docs" / "benchmarks.md").read_text("utf-8")
    assert f"**{s['median']:.1f} s ({s['min']:.1f}-{s['max']:.1f})**" in text
    nights = json.loads((RESULTS / "nights_1m_15_329f1b7.json").read_text("utf-8"))
    follows = [n["follow_seconds"] for n in nights["nights"][3:14]]
    assert f"{min(follows):.1f}-{max(follows):.1f} s on nights 4-14" in text
    assert f"{nights['nights'][14]['follow_seconds']:.1f} s on night 15" in text
    assert f"0 of {sum(n['requests'] for n in nights['nights']):,}" in text and nights["failed_requests"] == 0


def test_the_docs_cold_load_and_follow_at_d0111fd_are_the_committed_runs():
    medians = bench_medians()
    rounds = json.loads((RESULTS / "cold_load_1m_15_segments_d0111fd.json").read_text("utf-8"))
    assert len(rounds["runs"]) >= 3 and medians.summarize(rounds["runs"], tuple(rounds["keys"])) == rounds["summary"]
    assert all(len(run["segments"]) == 15 and run["num_docs"] == 1_000_000 and run["commit"] == "d0111fd"
               and run["baseline_commit"] == "c1e2cb0" for run in rounds["runs"])
    text = (REPO / "docs" / "benchmarks.md").read_text("utf-8")
    new, base, speedup = (rounds["summary"][k] for k in ("seconds", "baseline_seconds", "speedup_vs_baseline"))
    assert f"d0111fd **{new['median']:.1f} s ({new['min']:.1f}-{new['max']:.1f})**" in text
    assert f"against {base['median']:.1f} s ({base['min']:.1f}-{base['max']:.1f}) for c1e2cb0" in text
    assert f"**{speedup['median']:.2f}x ({speedup['min']:.2f}-{speedup['max']:.2f})**" in text
    nights = json.loads((RESULTS / "nights_1m_more_d0111fd.json").read_text("utf-8"))
    assert nights["git_commit"].startswith("d0111fd") and "--next-night-after-follow" in nights["command"]
    assert "Follow " + ", ".join(f"{n['follow_seconds']:.1f} s" for n in nights["nights"]) in text
    assert f"0 of {nights['serving']['requests']:,} requests failed" in text and nights["failed_requests"] == 0


def test_the_docs_medians_of_the_200k_searcher_are_the_committed_runs():
    triple = json.loads((RESULTS / "searcher_scale_200k_65520b2.json").read_text("utf-8"))
    text = (REPO / "docs" / "benchmarks.md").read_text("utf-8")
    plain, expanded = (triple["summary"][f"speed.{kind}_k10.ratio_vs_bm25s_numba"] for kind in ("plain", "expanded"))
    assert len(triple["runs"]) >= 3
    assert (f"k=10 **{plain['median']:.2f}x ({plain['min']:.2f}-{plain['max']:.2f}) / "
            f"{expanded['median']:.2f}x ({expanded['min']:.2f}-{expanded['max']:.2f})**") in text


def test_bge_smalls_own_settings_tables_are_the_committed_results():
    text = (REPO / "docs" / "embedded-models.md").read_text("utf-8")
    tested = table_rows(text, "| dataset | BM25 | shared settings (kept)")
    for name, cells in tested.items():
        rows = json.loads((RESULTS / f"encoder_test_bge_{name}.json").read_text("utf-8"))["results"]
        assert [c.split(" ")[0] for c in cells] == [f"{r['ndcg@10']:.4f}" for r in rows], name
    assert sorted(tested) == ["arguana", "nfcorpus", "scifact"]
    ranked = json.loads((RESULTS / "encoder_selection_summary_bge.json").read_text("utf-8"))["ranked"]
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| doc proposals | query proposals | "
                                                                       "vocabulary | w | min cosine"))
    first = [c.strip() for c in lines[header + 2].strip("|").split("|")]  # the best by mean delta
    best = ranked[0]
    assert first[:5] == [str(best["doc_n"]), str(best["query_n"]), "uni+bigram", str(best["w"]),
                         str(best["min_similarity"])]
    assert first[-1] == f"{best['mean_delta']:+}"


def test_the_docs_1m_searcher_table_is_the_committed_medians():
    text = (REPO / "docs" / "benchmarks.md").read_text("utf-8")
    rows = table_rows(text, "| 1M docs | 921e8a9 plain | 921e8a9 expanded | dc29eab plain")
    triples = [json.loads((RESULTS / f"searcher_scale_1m_{name}.json").read_text("utf-8"))["summary"]
               for name in ("921e8a9", "dc29eab_rerun")]
    for row, key in (("k=10", "k10.ratio_vs_bm25s_numba"), ("k=1000", "k1000.ratio_vs_bm25s_numba"),
                     ("k=10, pruned over exhaustive", "k10.pruning_speedup")):
        cells = [summary[f"speed.{kind}_{key}"] for summary in triples for kind in ("plain", "expanded")]
        assert rows[row] == [f"{m['median']:.2f} ({m['min']:.2f}-{m['max']:.2f})" for m in cells], row


def test_the_docs_night_of_two_commits_is_the_committed_run():
    pair = json.loads((RESULTS / "night_16_d0111fd_vs_3350e31.json").read_text("utf-8"))
    text = (REPO / "docs" / "benchmarks.md").read_text("utf-8")
    seconds = {k: run["summary"]["seconds"] for k, run in pair["runs"].items()}
    assert seconds == pair["seconds"] and [run["commit"] for run in pair["runs"].values()] == [
        "d0111fd", "3350e31", "d0111fd", "3350e31"]
    assert (f"d0111fd {seconds['a1']:.1f} s and {seconds['a2']:.1f} s, 3350e31 (the month's code) "
            f"{seconds['b1']:.1f} s and {seconds['b2']:.1f} s") in text
