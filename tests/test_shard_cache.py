"""The local shard cache: written once per index version, memory-mapped afterwards; a stale, corrupt or
half-written entry (a writer killed mid-write) is never served but rebuilt from the loader (Delta)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sira.pipelines import shard_cache
from sira.pipelines.shard_cache import cached_shard, shard_dir
from sira.core.analysis import AnalyzerConfig
from sira.core.memory_index import build_searcher
from sira.core.presets import BM25Params, IndexPreset

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


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "drop the marker", "other format"])
def test_a_damaged_entry_is_rebuilt_not_served(tmp_path, reference, damage):
    load = CountingLoader(reference)
    cached_shard("/wh/a", MANIFEST, 0, load, tmp_path)
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
        from sira.pipelines import shard_cache
        from sira.core.memory_index import build_searcher
        from tests.test_shard_cache import DOCS, PRESET, MANIFEST
        searcher = build_searcher(DOCS, PRESET, num_shards=2)
        synced = []
        real_fsync = os.fsync
        def dying_fsync(fd):
            real_fsync(fd)
            synced.append(fd)
            if len(synced) == 2:
                os._exit(9)
        os.fsync = dying_fsync
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
