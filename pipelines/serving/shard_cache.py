"""A local cache of index shards in a memory-mappable format, written from Delta once per index version.

A restart or a second process opens the cached arrays with `np.load(mmap_mode="r")` instead of reading
and decoding Delta again: it loads in seconds, and processes on one machine share the pages (the OS page
cache holds one copy).

Layout, under the cache root ($SIRA_SHARD_CACHE, default ~/.cache/sira/shards; local disk, also for an
object-store warehouse):

    <root>/<warehouse key>/v<index version>-<manifest fingerprint>/shard-<s>.f<FORMAT_VERSION>/
        doc_id_offsets.npy doc_id_data.npy doc_lens.npy term_ids.npy indptr.npy doc_ords.npy impacts.npy
        term_max.npy tier_rows.npy tier_split.npy tier_max.npy  (ShardIndex.arrays(): plain .npy, readable by any
        numpy)
        complete.json  (format version, fingerprint, every file's size and CRC32, the version's segments and
        term-statistics versions; written last)
    <root>/<warehouse key>/segments/<segment_postings table id>/seg-<segment>-shard-<s>.f<FORMAT_VERSION>/
        doc_id_offsets.npy doc_id_data.npy doc_lens.npy term_ids.npy indptr.npy doc_ords.npy tfs.npy
        (sira.core.segments.SegmentShard: raw tfs, the same in every version that holds the segment) complete.json
    <root>/<warehouse key>/term-stats/<term_stats table id>/v<version>.f<FORMAT_VERSION>/
        term_ids.npy df_enriched.npy  (the term_stats rows one build wrote, by term id) complete.json

A version's shard is assembled from its segments' entries, its tombstones and its term statistics (summed over
their entries), so a searcher that follows a night reads from Delta only the segment and the statistics the night
wrote. Segments and term-statistics versions are immutable once published and numbered by the index version that
wrote them; the Delta table's id (new when a warehouse is created again at the same place) completes their key.

The warehouse key hashes the warehouse URI; the fingerprint hashes the whole manifest row (corpus_stats), so
a warehouse rebuilt under the same version number, or a changed table version, never matches an old entry.

Never serving a stale or half-written shard: a writer fills a temporary sibling folder, writes complete.json
last and renames the folder into place, so a killed writer leaves only a temporary folder (removed by a later
writer), never a shard folder; a crash that loses written pages leaves files that fail their checks. A reader
accepts a folder only when complete.json has the same format version and fingerprint and every file has its
recorded size and CRC32; otherwise the folder is removed and the shard rebuilt from Delta. Checksums are read
with plain file reads (1.3 GB/s), so checking does not make the mapping resident. One writer per shard at a time
(an advisory file lock); the others wait and then open what it wrote. After a write, versions of the same
warehouse other than the KEEP_VERSIONS newest are removed (deleting mapped files is safe on POSIX: a process still
using them keeps its mapping).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
import uuid
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from sira.pipelines.storage.processes import alive
from sira.core.bm25 import ShardIndex
from sira.core.segments import SegmentShard

log = logging.getLogger("sira.shard_cache")

CACHE_ENV = "SIRA_SHARD_CACHE"
FORMAT_VERSION = 3  # bump when the arrays or their meaning change: old folders are then never opened
KEEP_VERSIONS = 2  # index versions kept per warehouse: the one being served and the one switched to
MARKER = "complete.json"
_TMP_PREFIX = ".tmp-"


class CacheCorrupt(ValueError):
    """A cached shard folder that must not be served."""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "sira" / "shards")


def warehouse_key(warehouse: str) -> str:
    """A folder name for a warehouse: its last path component (readable) and a hash of its full URI."""
    uri = warehouse if "://" in warehouse else str(Path(warehouse).expanduser().resolve())
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in uri.rstrip("/").rsplit("/", 1)[-1])[:40]
    return f"{name}-{hashlib.sha256(uri.encode()).hexdigest()[:16]}"


def manifest_fingerprint(manifest: dict) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode()).hexdigest()[:16]


def shard_dir(warehouse: str, manifest: dict, shard: int, root: Path | str | None = None) -> Path:
    version = f"v{manifest['index_version']}-{manifest_fingerprint(manifest)}"
    return Path(root or cache_root()) / warehouse_key(warehouse) / version / f"shard-{shard}.f{FORMAT_VERSION}"


def cached_shard(warehouse: str, manifest: dict, shard: int, load: Callable[[str, dict, int], ShardIndex],
                 root: Path | str | None = None,
                 write_behind: Callable[[ShardIndex], None] | None = None) -> ShardIndex:
    """Shard `shard` of the manifest's index version, memory-mapped from the local cache; on a miss (or a
    folder that fails its checks) `load(warehouse, manifest, shard)` (shard_loader.load_shard) builds it and
    it is written to the cache first. With `write_behind`, a miss returns the shard as built (in memory) at once
    and a thread writes it, then hands `write_behind` the memory-mapped copy: a server that follows a new version
    answers from it without waiting for the write, and then holds the shared pages instead of its own."""
    folder = shard_dir(warehouse, manifest, shard, root)
    fingerprint = manifest_fingerprint(manifest)
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = folder.with_name(folder.name + ".lock")
    extra = {"segments": sorted(manifest.get("segments") or []),
             "term_stats_versions": [int(v) for v in manifest.get("term_stats_versions") or []]}
    with _locked(lock):
        if folder.exists():
            try:
                return open_shard(folder, shard, fingerprint)
            except CacheCorrupt as exc:
                log.warning("rebuilding cached shard %s: %s", folder, exc)
                _remove(folder)
        index = load(warehouse, manifest, shard)
        if write_behind is None:
            write_shard(folder, index, fingerprint, extra)
    if write_behind is not None:
        def write() -> None:
            try:
                try:  # lowest priority (Linux sets it per thread): the write must not slow shards still assembling
                    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
                except OSError:
                    pass
                with _locked(lock):
                    if not folder.exists():
                        write_shard(folder, index, fingerprint, extra)
                _prune(folder.parent.parent, keep=folder.parent)
                write_behind(open_shard(folder, shard, fingerprint, verify=False))
            except Exception:  # the shard in memory goes on serving; a later load writes the cache
                log.exception("writing cached shard %s", folder)

        threading.Thread(target=write, name=f"cache-shard-{shard}", daemon=True).start()
        return index
    _prune(folder.parent.parent, keep=folder.parent)
    return open_shard(folder, shard, fingerprint, verify=False)  # just written and checksummed


def write_shard(folder: Path, index: ShardIndex, fingerprint: str, extra: dict | None = None) -> None:
    """Write one shard folder atomically (temporary folder, marker last, rename); `extra` goes into its marker."""
    write_folder(folder, index.arrays(), {"fingerprint": fingerprint, "shard": index.shard, **(extra or {})})


def write_folder(folder: Path, arrays: dict[str, np.ndarray], identity: dict) -> None:
    """Write `arrays` as one cache folder atomically; `identity` goes into its marker and must match on open. Not
    fsynced: every other process checks each file's size and CRC32 before it serves it, so a folder a crash left
    with lost pages is rebuilt, never served, and syncing gigabytes would only delay this searcher."""
    _remove_dead_temporaries(folder.parent)
    tmp = folder.with_name(f"{_TMP_PREFIX}{folder.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        files = {}
        for name, array in arrays.items():
            path = tmp / f"{name}.npy"
            array = np.ascontiguousarray(array)
            with open(path, "wb") as fh:
                np.lib.format.write_array(fh, array, allow_pickle=False)
            files[name] = {"bytes": path.stat().st_size, "crc32": _crc32_written(path, array)}
        marker = {"format": FORMAT_VERSION, **identity, "files": files}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1), encoding="utf-8")
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def open_shard(folder: Path, shard: int, fingerprint: str, verify: bool = True) -> ShardIndex:
    """Memory-map a complete shard folder; CacheCorrupt when anything does not match its marker."""
    arrays = open_folder(folder, {"fingerprint": fingerprint, "shard": shard}, verify)
    try:
        return ShardIndex.from_arrays(shard, arrays)
    except (KeyError, ValueError) as exc:
        raise CacheCorrupt(f"inconsistent arrays: {exc}") from None


_VERIFIED: set[tuple[str, int, int, int]] = set()  # (file, inode, mtime, size) checked or written by this process


def open_folder(folder: Path, identity: dict, verify: bool = True) -> dict[str, np.ndarray]:
    """Memory-map the arrays of a complete cache folder whose marker holds `identity`; CacheCorrupt otherwise (or
    when a file is missing, has another size or, with `verify`, fails its checksum). The checksums are read once
    per process and folder: not again by the process that has just written it (`verify=False`), nor when a server
    that follows a night opens the segments it checked at its previous load (a file whose inode, time and size
    are those it had then)."""
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CacheCorrupt(f"no readable {MARKER}: {exc}") from None
    written = {k: marker.get(k) for k in ("format", *identity)}
    if written != {"format": FORMAT_VERSION, **identity}:
        raise CacheCorrupt("written for " + ", ".join(f"{k} {v}" for k, v in written.items()))
    arrays = {}
    for name, expected in marker["files"].items():
        path = folder / f"{name}.npy"
        seen = path.stat() if path.exists() else None
        if seen is None or seen.st_size != expected["bytes"]:
            raise CacheCorrupt(f"{path.name}: {seen and seen.st_size} bytes, {expected['bytes']} expected")
        key = (str(path), seen.st_ino, seen.st_mtime_ns, seen.st_size)
        if verify and key not in _VERIFIED and _crc32(path) != expected["crc32"]:
            raise CacheCorrupt(f"{path.name}: checksum mismatch")
        _VERIFIED.add(key)
        try:
            arrays[name] = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:  # removed since the check by a pruning process, or unreadable
            raise CacheCorrupt(f"{path.name}: {exc}") from None
    return arrays


def cached_segments(warehouse: str, table_id: str, segments: list[int], shard: int,
                    read: Callable[[list[int]], dict[int, SegmentShard]], root: Path | str | None = None
                    ) -> list[SegmentShard]:
    """Shard `shard`'s part of each of `segments`, memory-mapped from the cache; the segments it lacks are read
    together by `read(missing)` (from Delta) and cached first."""
    return _cached_entries(
        Path(root or cache_root()) / warehouse_key(warehouse) / "segments" / table_id, f"shard-{shard}.lock",
        segments, lambda segment: f"seg-{segment}-shard-{shard}",
        lambda segment: {"table_id": table_id, "segment": segment, "shard": shard}, read, SegmentShard.arrays,
        lambda segment, arrays: SegmentShard.from_arrays(segment, shard, arrays))


def cached_term_stats(warehouse: str, table_id: str, versions: list[int],
                      read: Callable[[list[int]], dict[int, tuple[np.ndarray, np.ndarray]]],
                      root: Path | str | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(term ids ascending, df_enriched) of the term_stats rows of each of `versions`, memory-mapped from the cache;
    the versions it lacks are read together by `read(missing)` and cached first."""
    return _cached_entries(
        Path(root or cache_root()) / warehouse_key(warehouse) / "term-stats" / table_id, "term-stats.lock",
        versions, lambda version: f"v{version}", lambda version: {"table_id": table_id, "version": version}, read,
        lambda stats: {"term_ids": stats[0], "df_enriched": stats[1]},
        lambda version, arrays: (arrays["term_ids"], arrays["df_enriched"]))


def _cached_entries(folder: Path, lock_name: str, numbers: list[int], name: Callable[[int], str],
                    identity: Callable[[int], dict], read: Callable[[list[int]], dict], to_arrays: Callable,
                    from_arrays: Callable[[int, dict], object]) -> list:
    """Each of `numbers`' entry under `folder` (`name(n)`.f<FORMAT_VERSION>, its marker holding `identity(n)`),
    memory-mapped; one that fails its checks is removed and read again with the missing ones, in one call of
    `read(missing)`, then written (`to_arrays`) before it is returned (`from_arrays`). One process at a time."""
    folder.mkdir(parents=True, exist_ok=True)

    def path(n: int) -> Path:
        return folder / f"{name(n)}.f{FORMAT_VERSION}"

    with _locked(folder / lock_name):
        found = {}
        for n in numbers:
            if path(n).exists():
                try:
                    found[n] = from_arrays(n, open_folder(path(n), identity(n)))
                except (CacheCorrupt, KeyError, ValueError) as exc:
                    log.warning("reading %s again: %s", path(n), exc)
                    _remove(path(n))
        missing = [n for n in numbers if n not in found]
        if missing:
            for n, entry in read(missing).items():
                write_folder(path(n), to_arrays(entry), identity(n))
                found[n] = from_arrays(n, open_folder(path(n), identity(n), verify=False))  # just checksummed
    return [found[n] for n in numbers]


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def _crc32_written(path: Path, array: np.ndarray) -> int:
    """The CRC32 of the .npy file just written from `array`: its header read back, its data from memory (reading
    the file again would copy every byte once more)."""
    with open(path, "rb") as fh:
        header = fh.read(path.stat().st_size - array.nbytes)
    return zlib.crc32(array.reshape(-1).view(np.uint8), zlib.crc32(header))


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released by the OS if this process dies
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove(folder: Path) -> None:
    """Move aside, then delete: no reader ever sees a half-deleted folder under the real name."""
    aside = folder.with_name(f"{_TMP_PREFIX}{folder.name}-removed-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(folder, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def _remove_dead_temporaries(parent: Path) -> None:
    """Temporary folders of writers that died (their pid is gone), and folders moved aside for deletion."""
    if not parent.exists():
        return
    for tmp in parent.glob(f"{_TMP_PREFIX}*"):
        fields = tmp.name.rsplit("-", 2)
        if "-removed-" in tmp.name or (len(fields) == 3 and fields[1].isdigit() and not alive(int(fields[1]))):
            shutil.rmtree(tmp, ignore_errors=True)


def _prune(warehouse_folder: Path, keep: Path) -> None:
    """Remove cached versions of this warehouse other than `keep` and the KEEP_VERSIONS newest (a version number
    cached under several fingerprints keeps only `keep`'s: the others are stale), then the segments and
    term-statistics versions that no remaining version lists, unless newer than all of them (a process may be
    assembling a newer version from them now)."""
    def number(p: Path) -> int:
        return int(p.name[1:].split("-", 1)[0])

    versions = [p for p in warehouse_folder.iterdir() if p.is_dir() and p.name.startswith("v")]
    newest = sorted({number(p) for p in versions}, reverse=True)[:KEEP_VERSIONS]
    kept = []
    for p in versions:
        if p != keep and (number(p) not in newest or number(p) == number(keep)):
            shutil.rmtree(p, ignore_errors=True)
        else:
            kept.append(p)
    listed = {"segments": set(), "term_stats_versions": set()}
    for marker in (m for p in kept for m in p.glob(f"shard-*/{MARKER}")):
        try:
            written = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for key, numbers in listed.items():
            numbers.update(written.get(key) or ())
    top = max((number(p) for p in kept), default=0)
    for kind, key, pattern in (("segments", "segments", "seg-*"), ("term-stats", "term_stats_versions", "v*")):
        for entry in warehouse_folder.glob(f"{kind}/*/{pattern}"):
            if entry.name.startswith(_TMP_PREFIX) or not entry.is_dir():
                continue
            n = int(entry.name.split("-")[1] if kind == "segments" else entry.name[1:].split(".")[0])
            if n not in listed[key] and n <= top:
                _remove(entry)
