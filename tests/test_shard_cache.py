"""The local shard cache: written once per index version, memory-mapped afterwards; a stale, corrupt or
half-written entry (a writer killed mid-write) is never served but rebuilt from the loader (Delta)."""

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from sira.pipelines.serving import shard_cache
from sira.pipelines.serving.shard_cache import cached_shard, shard_dir
from sira.core.analysis import AnalyzerConfig
from sira.core.memory_index import build_searcher
from sira.core.presets import BM25Params, IndexPreset
from sira.core.segments import SegmentShard

PRESET = IndexPreset(name="t", analyzer=AnalyzerConfig(stemmer="none", max_n=2), bm25=BM25Params())
DOCS = [(f"d{i:03d}", "", f"word{i % 7} common text number {i % 3} extra{i % 11}") for i in range(120)]
MANIFEST = {"index_version": 3, "num_shards": 2, "num_docs": 120, "postings_table_version": 5}
QUERIES = ["word3 common", "extra4 number", "text 2 word5"]


@pytest.fixture(scope="module")
def reference():
    return build_searcher(DOCS, PRESET, num_shards=2)


class CountingLoader:
    """Stands in for shard_loader.load_shard (the Delta read) and counts how often it runs."""

    def __init__(self, searcher):
        self.searcher = searcher
        self.calls = 0

    def __call__(self, warehouse, manifest, shard):
        self.calls += 1
        return self.searcher.shards[shard]


def ranked(shard, searcher):
    return [shard.top_k(searcher.compile(q), 50) for q in QUERIES]


def same_results(a, b):
    return all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b))


def test_first_load_writes_the_cache_and_later_loads_map_it(tmp_path, reference):
    load = CountingLoader(reference)
    first = cached_shard("/wh/a", MANIFEST, 1, load, tmp_path)
    again = cached_shard("/wh/a", MANIFEST, 1, load, tmp_path)
    assert load.calls == 1
    assert isinstance(again.impacts.base, np.memmap) and not again.impacts.flags.writeable
    assert again.doc_ids.to_pylist() == reference.shards[1].doc_ids.to_pylist()
    assert same_results(ranked(first, reference), ranked(reference.shards[1], reference))
    assert same_results(ranked(again, reference), ranked(reference.shards[1], reference))
    marker = json.loads((shard_dir("/wh/a", MANIFEST, 1, tmp_path) / "complete.json").read_text())
    for name, written in marker["files"].items():  # the checksums made from memory are the files' own
        assert shard_cache._crc32(shard_dir("/wh/a", MANIFEST, 1, tmp_path) / f"{name}.npy") == written["crc32"]


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "drop the marker", "other format"])
def test_a_damaged_entry_is_rebuilt_not_served(tmp_path, reference, damage):
    load = CountingLoader(reference)
    cached_shard("/wh/a", MANIFEST, 0, load, tmp_path)
    shard_cache._VERIFIED.clear()  # the next open as a later process makes it: nothing checked yet
    folder = shard_dir("/wh/a", MANIFEST, 0, tmp_path)
    impacts = folder / "impacts.npy"
    if damage == "flip a byte":
        data = bytearray(impacts.read_bytes())
        data[-3] ^= 0x40
        impacts.write_bytes(bytes(data))
    elif damage == "truncate":
        impacts.write_bytes(impacts.read_bytes()[:-8])
    elif damage == "drop the marker":
        (folder / "complete.json").unlink()
    else:
        marker = json.loads((folder / "complete.json").read_text())
        (folder / "complete.json").write_text(json.dumps({**marker, "format": 0}))
    shard = cached_shard("/wh/a", MANIFEST, 0, load, tmp_path)
    assert load.calls == 2
    assert same_results(ranked(shard, reference), ranked(reference.shards[0], reference))


def test_a_writer_killed_mid_write_leaves_nothing_that_is_served(tmp_path, reference):
    # A child process writes the cache and dies (os._exit, as under SIGKILL: no cleanup runs) after its
    # second file is on disk.
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from sira.pipelines.serving import shard_cache
        from sira.core.memory_index import build_searcher
        from tests.test_shard_cache import DOCS, PRESET, MANIFEST
        searcher = build_searcher(DOCS, PRESET, num_shards=2)
        written = []
        def dying_checksum(path, array):  # called once a file is written
            written.append(path)
            if len(written) == 2:
                os._exit(9)
        shard_cache._crc32_written = dying_checksum
        shard_cache.cached_shard("/wh/a", MANIFEST, 0, lambda w, m, s: searcher.shards[s], {str(tmp_path)!r})
    """)
    assert subprocess.run([sys.executable, "-c", script]).returncode == 9
    folder = shard_dir("/wh/a", MANIFEST, 0, tmp_path)
    leftovers = list(folder.parent.glob(".tmp-*"))
    assert leftovers and not folder.exists()
    load = CountingLoader(reference)
    shard = cached_shard("/wh/a", MANIFEST, 0, load, tmp_path)
    assert load.calls == 1 and not any(p.exists() for p in leftovers)
    assert same_results(ranked(shard, reference), ranked(reference.shards[0], reference))


def test_entries_are_keyed_by_warehouse_and_manifest_and_old_versions_go(tmp_path, reference, monkeypatch):
    monkeypatch.setattr(shard_cache, "KEEP_VERSIONS", 2)
    load = CountingLoader(reference)
    cached_shard("/wh/a", MANIFEST, 0, load, tmp_path)
    cached_shard("/wh/b", MANIFEST, 0, load, tmp_path)  # another warehouse
    rebuilt = {**MANIFEST, "postings_table_version": 6}  # same version number, other tables: stale entry
    cached_shard("/wh/a", rebuilt, 0, load, tmp_path)
    assert load.calls == 3
    assert not shard_dir("/wh/a", MANIFEST, 0, tmp_path).exists()  # the stale one is gone
    for version in (4, 5):
        cached_shard("/wh/a", {**MANIFEST, "index_version": version}, 0, load, tmp_path)
    kept = sorted(p.name.split("-")[0] for p in shard_dir("/wh/a", MANIFEST, 0, tmp_path).parent.parent.iterdir())
    assert kept == ["v4", "v5"]
    assert shard_dir("/wh/b", MANIFEST, 0, tmp_path).exists()


def segment(number: int, shard: int = 0) -> SegmentShard:
    """A small segment part (any content: the cache stores arrays, it does not read them)."""
    return SegmentShard(number, shard, pa.array([f"s{number}-a", f"s{number}-b"], pa.large_string()),
                        np.array([2, 3], np.int32), np.array([4, 7]), np.array([0, 1, 3]),
                        np.array([1, 0, 1], np.int32), np.array([2, 1, 1], np.int32))


class CountingReader:
    """Stands in for shard_loader.read_segments (the Delta read): records which segments it was asked for."""

    def __init__(self):
        self.asked = []

    def __call__(self, missing):
        self.asked.append(list(missing))
        return {s: segment(s) for s in missing}


def test_segments_are_read_once_and_a_damaged_one_is_read_again(tmp_path):
    read = CountingReader()
    first = shard_cache.cached_segments("/wh/a", "table-1", [1, 4], 0, read, tmp_path)
    again = shard_cache.cached_segments("/wh/a", "table-1", [1, 4, 6], 0, read, tmp_path)  # a night came: 6
    assert read.asked == [[1, 4], [6]]
    assert [p.segment for p in again] == [1, 4, 6] and again[0].doc_ids.to_pylist() == ["s1-a", "s1-b"]
    assert isinstance(again[1].tfs, np.memmap) and np.array_equal(first[1].tfs, segment(4).tfs)
    folder = next((tmp_path / shard_cache.warehouse_key("/wh/a") / "segments" / "table-1").glob("seg-4-shard-0.*"))
    data = bytearray((folder / "tfs.npy").read_bytes())
    data[-1] ^= 0x01
    replaced = folder / "tfs.npy.new"
    replaced.write_bytes(bytes(data))
    replaced.rename(folder / "tfs.npy")  # another file now: checked again, though this process checked the old one
    shard_cache.cached_segments("/wh/a", "table-1", [1, 4, 6], 0, read, tmp_path)
    assert read.asked[-1] == [4]
    # A warehouse created again at the same place has new table ids: nothing of the old one matches.
    shard_cache.cached_segments("/wh/a", "table-2", [1], 0, read, tmp_path)
    assert read.asked[-1] == [1]


def test_a_follow_reads_no_checksum_it_has_read_and_a_later_process_reads_them_again(tmp_path, monkeypatch):
    read = CountingReader()
    shard_cache.cached_segments("/wh/a", "table-1", [1, 4], 0, read, tmp_path)  # written here: nothing to read back
    checked = []
    real_crc32 = shard_cache._crc32
    monkeypatch.setattr(shard_cache, "_crc32", lambda path: checked.append(path.name) or real_crc32(path))
    shard_cache._VERIFIED.clear()  # a server started later: it checks what it maps
    shard_cache.cached_segments("/wh/a", "table-1", [1, 4], 0, read, tmp_path)
    assert len(checked) == 2 * len(segment(1).arrays())
    checked.clear()
    shard_cache.cached_segments("/wh/a", "table-1", [1, 4, 6], 0, read, tmp_path)  # it follows a night
    assert checked == [] and read.asked == [[1, 4], [6]]


def test_segments_and_statistics_go_when_no_kept_version_lists_them(tmp_path, reference, monkeypatch):
    monkeypatch.setattr(shard_cache, "KEEP_VERSIONS", 2)
    load = CountingLoader(reference)
    read = CountingReader()
    stats = lambda missing: {v: (np.array([1, 2]), np.array([v, v])) for v in missing}
    root = tmp_path / shard_cache.warehouse_key("/wh/a")
    for version, segments in ((3, [3]), (4, [3, 4]), (5, [3, 5]), (6, [6]), (7, [6, 7])):
        shard_cache.cached_segments("/wh/a", "t", segments, 0, read, tmp_path)
        shard_cache.cached_term_stats("/wh/a", "s", segments, stats, tmp_path)
        cached_shard("/wh/a", {**MANIFEST, "index_version": version, "segments": segments,
                               "term_stats_versions": segments}, 0, load, tmp_path)
        # What the two newest versions list stays: version 6 is a compaction, so after version 7 segment 3 goes.
        listed = {3: {3}, 4: {3, 4}, 5: {3, 4, 5}, 6: {3, 5, 6}, 7: {6, 7}}[version]
        assert {int(p.name.split("-")[1]) for p in root.glob("segments/t/seg-*")} == listed
        assert {int(p.name[1:].split(".")[0]) for p in root.glob("term-stats/s/v*")} == listed


def test_a_server_answers_from_memory_while_the_shard_is_written_behind(tmp_path, reference):
    load = CountingLoader(reference)
    mapped = []
    written = threading.Event()
    shard = cached_shard("/wh/a", MANIFEST, 1, load, tmp_path,
                         write_behind=lambda s: (mapped.append(s), written.set()))
    assert not isinstance(shard.impacts.base, np.memmap)  # the shard as built, before its files are written
    assert same_results(ranked(shard, reference), ranked(reference.shards[1], reference))
    assert written.wait(30)
    assert isinstance(mapped[0].impacts.base, np.memmap)
    assert same_results(ranked(mapped[0], reference), ranked(reference.shards[1], reference))
    again = cached_shard("/wh/a", MANIFEST, 1, load, tmp_path, write_behind=lambda s: None)
    assert load.calls == 1 and isinstance(again.impacts.base, np.memmap)
