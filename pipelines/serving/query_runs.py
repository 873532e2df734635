"""`sira query`'s config (QueryConfig), its rows in the Delta runs table, and the query files it streams.

A run reads its query file line by line (`iter_queries`), in chunks of bounded size; each chunk's rows, the scored
queries (program, ranked hits, index version) and the rejected lines (with their reason), are appended in one
commit. Every row carries its line number, so the committed part of a run is a prefix of its file: a killed run
resumes after the last committed line (`QueryRun.resume`). The outputs (a TREC run and a Parquet run) are written
as the run goes, each commit's hits after its commit (`RunOutputs`), a resumed run's committed part first from the
table; memory is bounded by one commit's rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator, Literal, Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import ConfigDict, Field

from sira.core.retriever import program_weight
from sira.core.defaults import DEFAULT_DEPTH, DEPTH_HELP, QUERY_BATCH, QUERY_COMMIT_LINES, ExpansionParams
from sira.pipelines.enrichment.backend_config import BackendConfig

from sira.pipelines.storage.delta_io import open_data_file, table_exists, write_table
from sira.core import tables
from sira.core.datasets import iter_lines
from sira.core.trec_format import check_tag, trec_lines

# A Parquet run: one row per hit, what a reader of rankings needs without the programs (those are in the runs
# table, by program_id).
PARQUET_RUN_SCHEMA = pa.schema([
    pa.field("qid", pa.string(), nullable=False),
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("rank", pa.int32(), nullable=False),
    pa.field("score", pa.float32(), nullable=False),
    pa.field("program_id", pa.string(), nullable=False),
])


class QueryConfig(ExpansionParams):
    model_config = ConfigDict(extra="forbid")

    warehouse: str
    queries: str = Field(description="queries.jsonl[.gz] ({_id, text}), a TSV (qid<TAB>text) or a Delta table (qid, query)")
    out: Path = Field(description="TREC run file to write")
    parquet: Path | None = Field(None, description="Parquet run to write (qid, doc_id, rank, score, program_id); "
                                                   "default: the TREC file's path with .parquet")
    run_id: str | None = Field(None, description="default: the run file's name without extension")
    k: int = Field(DEFAULT_DEPTH, ge=1, le=10_000, description=DEPTH_HELP)
    expand: bool = True
    backend: BackendConfig = Field(default_factory=BackendConfig,
                                   description="query-side proposer")
    task: str | None = Field(None, description="prompt task; default: the one recorded for the warehouse at ingest")
    index_version: int | None = None
    preset: str | None = None
    batch_size: int = Field(QUERY_BATCH, gt=0, description="queries per scoring round")
    commit_every: int = Field(QUERY_COMMIT_LINES, gt=0, description="query-file lines per chunk: expanded together "
                                                                    "and committed to the runs table at once")
    scorer: Literal["workers", "actors", "local"] = Field(
        "workers", description="workers: query workers, each mapping every shard and scoring whole batches (one "
                               "per CPU of the Ray cluster, any number of nodes); actors: a Ray actor per shard, "
                               "scored scatter-gather; local: the shards memory-mapped in this process, one thread "
                               "(no Ray for plain queries)")
    workers: int = Field(0, ge=0, description="query workers (--scorer workers); 0: one per CPU of the Ray cluster")
    ray_address: str | None = None

    @property
    def parquet_path(self) -> Path:
        return self.parquet or self.out.with_suffix(".parquet")


@dataclass(frozen=True)
class QueryLine:
    """One line (or Delta row) of a query file: its id and text, or why it was rejected (then `raw` is the line)."""

    line: int
    qid: str
    text: str
    error: str | None = None


def iter_queries(spec: str, after: int = 0) -> Iterator[QueryLine]:
    """The queries of a queries.jsonl[.gz] ({_id, text} or {qid, query}), a qid<TAB>text TSV or a Delta table
    (qid, query), from the line after `after` on; a bad line is yielded with its reason instead of stopping."""
    from deltalake import DeltaTable

    path = Path(spec)
    if path.is_dir() and DeltaTable.is_deltatable(spec):
        yield from _delta_queries(spec, after)
        return
    if not path.exists():
        raise FileNotFoundError(f"queries {spec!r} not found (expected .jsonl[.gz], .tsv or a Delta table)")
    tsv = path.name.endswith((".tsv", ".tsv.gz"))
    for n, raw in iter_lines(path):
        if n > after:
            yield _parse_line(n, raw, tsv)


def _parse_line(n: int, raw: bytes, tsv: bool) -> QueryLine:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return QueryLine(n, "", raw.decode("utf-8", "replace"), f"not UTF-8: {exc.reason} at byte {exc.start}")
    if tsv:
        qid, sep, query = text.partition("\t")
        if not sep:
            return QueryLine(n, "", text, "expected qid<TAB>text")
    else:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            return QueryLine(n, "", text, f"not JSON: {exc.msg} at column {exc.colno}")
        if not isinstance(obj, dict):
            return QueryLine(n, "", text, f"expected a JSON object, got {type(obj).__name__}")
        qid, query = obj.get("_id", obj.get("qid", "")), obj.get("text", obj.get("query", ""))
        if not isinstance(qid, (str, int)) or not isinstance(query, str):
            return QueryLine(n, "", text, "the id must be a string or number and the text a string")
        qid = str(qid)
    return _checked(n, qid.strip(), query, text)


def _checked(n: int, qid: str, query: str, raw: str) -> QueryLine:
    if not qid:
        return QueryLine(n, "", raw, "no query id")
    if not query.strip():
        return QueryLine(n, qid, raw, "empty query text")
    return QueryLine(n, qid, query)


def _delta_queries(spec: str, after: int) -> Iterator[QueryLine]:
    from deltalake import DeltaTable

    n = 0
    for batch in DeltaTable(spec).to_pyarrow_dataset().to_batches(columns=["qid", "query"]):
        for qid, query in zip(batch["qid"].to_pylist(), batch["query"].to_pylist()):
            n += 1
            if n > after:
                yield _checked(n, str(qid or "").strip(), query or "", json.dumps({"qid": qid, "query": query}))


class SeenIds:
    """The query ids a run has taken, to reject a repeated one: 8 bytes per id in a sorted array, with a small set
    for the newest (a 10M-query run holds 80 MB, not its ids)."""

    MERGE_EVERY = 65_536

    def __init__(self) -> None:
        self._sorted = np.empty(0, np.uint64)
        self._recent: set[int] = set()

    @staticmethod
    def _key(qid: str) -> int:
        return int.from_bytes(hashlib.blake2b(qid.encode(), digest_size=8).digest(), "little")

    def __contains__(self, qid: str) -> bool:
        key = self._key(qid)
        i = np.searchsorted(self._sorted, np.uint64(key))
        return key in self._recent or (i < len(self._sorted) and int(self._sorted[i]) == key)

    def add(self, qid: str) -> None:
        self._recent.add(self._key(qid))
        if len(self._recent) >= self.MERGE_EVERY:
            self._sorted = np.union1d(self._sorted, np.fromiter(self._recent, np.uint64, len(self._recent)))
            self._recent.clear()


@dataclass
class Resumed:
    """Where a run stands in the runs table: its last committed line, the index version it scores on, the ids it
    took and its counts so far."""

    last_line: int = 0
    index_version: int | None = None
    seen: SeenIds = field(default_factory=SeenIds)
    scored: int = 0
    rejected: int = 0
    expansion: dict = field(default_factory=dict)  # the proposer's counters, added up over this invocation's chunks
    seconds: dict = field(default_factory=lambda: dict.fromkeys(("expansion", "scoring", "commits", "outputs"), 0.0))
    commit_seconds: list[float] = field(default_factory=list)  # each commit's append, in order (is its cost flat?)

    def commit_cost(self) -> dict:
        """The mean seconds of an append in the first and the last tenth of this invocation's commits."""
        n = len(self.commit_seconds)
        tenth = max(1, n // 10)
        mean = lambda xs: round(sum(xs) / len(xs), 4) if xs else None  # noqa: E731
        return {"commits": n, "first_tenth_s": mean(self.commit_seconds[:tenth]),
                "last_tenth_s": mean(self.commit_seconds[-tenth:])}


class QueryRun:
    """One run id's rows in the runs table of a warehouse."""

    def __init__(self, warehouse: str, run_id: str):
        self.uri, self.run_id = tables.table_uri(warehouse, tables.RUNS), run_id
        self.outputs: RunOutputs | None = None  # open_outputs: the TREC and Parquet files each commit adds to

    def _files(self) -> list[tuple[int, str]]:
        """(first line, path) of the table's data files that hold this run, in line order. Each commit of a run
        writes files of its own, so a file's rows are one stretch of the run's lines (Delta's per-file statistics
        say which run and which lines without opening it)."""
        if not table_exists(self.uri):
            return []
        from deltalake import DeltaTable

        table = DeltaTable(self.uri)
        if "line" not in table.schema().to_arrow().names:
            raise ValueError(f"{self.uri} was written by a sira query before runs recorded line numbers and cannot "
                             "take this run's rows: move that table aside (it stays a readable Delta table) or "
                             "query into another warehouse")
        actions = pa.table(table.get_add_actions(flatten=True))
        if actions.num_rows == 0:
            return []
        if "min.line" not in actions.column_names:  # statistics not written: every file is read for them
            raise ValueError(f"{self.uri}: its files carry no statistics of `line`; rewrite the table with them")
        found = []
        for path, lo, hi, first in zip(actions["path"].to_pylist(), actions["min.run_id"].to_pylist(),
                                       actions["max.run_id"].to_pylist(), actions["min.line"].to_pylist()):
            if lo is not None and lo <= self.run_id <= hi:
                found.append((first, path))
        return sorted(found)

    def rows(self, columns: Sequence[str]) -> Iterator[pa.Table]:
        """This run's rows, file by file in line order (each sorted by line)."""
        for _, path in self._files():
            t = open_data_file(self.uri, path).read(columns=sorted({*columns, "run_id", "line"}))
            yield t.filter(pc.equal(t["run_id"], self.run_id)).sort_by("line").select(list(columns))

    def resume(self, index_version: int | None) -> Resumed:
        """The committed part of the run; `index_version` (the version asked for, None: the newest) is checked
        against the one its committed queries were scored on: a run finishes on that index (a version published in
        between, the nightly build, would otherwise mix two indexes in one run)."""
        state, scored_on = Resumed(index_version=index_version), set()
        for t in self.rows(["line", "qid", "index_version", "error"]):
            state.last_line = max(state.last_line, t["line"][-1].as_py()) if t.num_rows else state.last_line
            scored = t.filter(pc.is_null(t["error"]))
            state.scored += scored.num_rows
            state.rejected += t.num_rows - scored.num_rows
            for qid in scored["qid"].to_pylist():
                state.seen.add(qid)
            scored_on |= set(scored["index_version"].to_pylist())
        if index_version is None and scored_on:
            state.index_version = max(scored_on)
        elif scored_on - {index_version}:
            on = ", ".join(f"v{v}" for v in sorted(scored_on))
            raise ValueError(f"run {self.run_id!r} has queries scored on index {on}, not v{index_version}: "
                             "resume it on its own version or start a new run id")
        return state

    def score_chunks(self, scorer: "ChunkScorer", proposer, state: Resumed, chunks: Iterator[list[QueryLine]],
                     index_version: int, advance: Callable[[int], None]) -> None:
        """Score chunk after chunk of lines and commit each (a repeated query id is rejected: the run keeps its
        first line); `state` moves past each committed chunk. One chunk is in flight while the next is expanded
        and submitted: with query workers, the driver's expansion and commits run beside the scoring."""
        pending = None
        for chunk in chunks:
            lines = self._take(state, chunk)
            todo = [q for q in lines if q.error is None]
            proposals = self._propose(proposer, state, [q.text for q in todo])
            t = time.perf_counter()
            handle = scorer.submit([q.qid for q in todo], [q.text for q in todo], proposals, advance)
            state.seconds["scoring"] += time.perf_counter() - t
            if pending is not None:
                self._finish(scorer, state, *pending, index_version, advance)
            pending = (lines, todo, handle)
        if pending is not None:
            self._finish(scorer, state, *pending, index_version, advance)

    @staticmethod
    def _take(state: Resumed, chunk: Sequence[QueryLine]) -> list[QueryLine]:
        lines = []
        for q in chunk:
            if q.error is None and q.qid in state.seen:
                q = replace(q, error="repeated query id (its first line is scored)")
            elif q.error is None:
                state.seen.add(q.qid)
            lines.append(q)
        return lines

    @staticmethod
    def _propose(proposer, state: Resumed, texts: list[str]) -> list | None:
        if proposer is None or not texts:
            return None
        t = time.perf_counter()
        proposals = proposer.propose(texts)
        for key, value in (proposer.summary or {}).items():
            state.expansion[key] = state.expansion.get(key, 0) + value if isinstance(value, (int, float)) else value
        state.seconds["expansion"] += time.perf_counter() - t
        return proposals

    def _finish(self, scorer: "ChunkScorer", state: Resumed, lines: list[QueryLine], todo: list[QueryLine], handle,
                index_version: int, advance: Callable[[int], None]) -> None:
        t = time.perf_counter()
        programs, results = scorer.collect(handle, advance)
        state.seconds["scoring"] += time.perf_counter() - t
        t = time.perf_counter()
        rows = self.commit(lines, dict(zip((q.qid for q in todo), programs)), results, index_version)
        state.commit_seconds.append(time.perf_counter() - t)
        state.seconds["commits"] += state.commit_seconds[-1]
        if self.outputs is not None:
            t = time.perf_counter()
            self.outputs.add(_hits_table(rows), len(todo), len(lines) - len(todo))
            state.seconds["outputs"] += time.perf_counter() - t
        state.last_line = lines[-1].line
        state.scored += len(todo)
        state.rejected += len(lines) - len(todo)

    def commit(self, lines: Sequence[QueryLine], programs: dict[str, str], results: pa.Table,
               index_version: int) -> pa.Table:
        """One chunk's rows in one append: each line in order, scored (`programs`: qid -> program JSON; `results`,
        the Retriever's table, its hits grouped by query in line order) or rejected; returns them. An append, not a
        MERGE: a MERGE reads the table it merges into, so each commit cost more as the run grew; the rows are new by
        construction (the lines after the last committed one)."""
        hits = pc.value_counts(results["qid"])
        per_qid = dict(zip(hits.field("values").to_pylist(), hits.field("counts").to_pylist()))
        counts = [per_qid.get(q.qid, 0) if q.error is None else 0 for q in lines]
        offsets = pa.array(np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int32))
        program = [programs[q.qid] if q.error is None else "" for q in lines]
        n = len(lines)
        rows = pa.table({
            "run_id": [self.run_id] * n, "line": [q.line for q in lines], "qid": [q.qid for q in lines],
            "query": [q.text[:tables.RAW_KEEP_CHARS] if q.error else q.text for q in lines], "program": program,
            "program_id": [program_id(p) if p else "" for p in program],
            "doc_ids": pa.ListArray.from_arrays(offsets, results["doc_id"].combine_chunks().cast(pa.string())),
            "scores": pa.ListArray.from_arrays(offsets, results["score"].combine_chunks().cast(pa.float32())),
            "index_version": [index_version] * n, "error": [q.error for q in lines],
            "created_at": [datetime.now(timezone.utc)] * n,
        }, schema=tables.RUNS_SCHEMA)
        write_table(self.uri, rows)
        return rows

    def open_outputs(self, trec: Path, parquet: Path | None, tag: str, state: Resumed) -> "RunOutputs":
        """The run's TREC and Parquet files, opened to be written as the run goes (a context: renamed into place
        when it ends without an error): a resumed run's committed part is written first, from the table, so the
        files hold exactly the committed lines however often the run was killed; each commit then adds its hits."""
        t = time.perf_counter()
        self.outputs = RunOutputs(trec, parquet, tag)
        try:
            for rows in self.rows(["qid", "doc_ids", "scores", "program_id", "error"]):
                scored = rows["error"].null_count  # a rejected line has its reason there
                self.outputs.add(_hits_table(rows), scored, rows.num_rows - scored)
        except BaseException:
            self.outputs.abort()
            raise
        state.seconds["outputs"] += time.perf_counter() - t
        return self.outputs


class RunOutputs:
    """A run's TREC file (`qid Q0 doc rank score tag`) and Parquet run, appended to in line order as `.part` files
    and renamed when the run is complete (`close`), so a reader never sees a half-written run. Written as the run
    goes rather than read back from the runs table at its end: at k=1000 the hits of 100,000 queries are 100M
    lines, which would otherwise be written while the workers stand idle."""

    SLICE = 1 << 20  # hits formatted at a time: a slice's TREC text is ~50 MB

    def __init__(self, trec: Path, parquet: Path | None, tag: str):
        import pyarrow.parquet as pq

        check_tag(tag)  # before any work: the run id makes the tag
        self.trec, self.parquet, self.tag = trec, parquet, tag
        self.counts = {"scored": 0, "rejected": 0, "hits": 0}
        trec.parent.mkdir(parents=True, exist_ok=True)
        self._trec_part = trec.with_name(trec.name + ".part")
        self._parquet_part = parquet.with_name(parquet.name + ".part") if parquet is not None else None
        self._out = open(self._trec_part, "wb")
        # Dictionary pages for the columns that repeat (a query's id and program on each of its hits), not doc ids:
        # their dictionary would overflow and fall back anyway, at twice the cost of writing them plain.
        self._writer = pq.ParquetWriter(self._parquet_part, PARQUET_RUN_SCHEMA, use_dictionary=["qid", "program_id"]) \
            if self._parquet_part is not None else None

    def add(self, hits: pa.Table, scored: int, rejected: int) -> None:
        """Hits (PARQUET_RUN_SCHEMA, in line and rank order) of `scored` queries, with `rejected` lines beside."""
        for start in range(0, hits.num_rows, self.SLICE):
            part = hits.slice(start, self.SLICE)
            self._out.write(trec_lines(part["qid"], part["doc_id"], part["rank"], part["score"], self.tag))
        if self._writer is not None and hits.num_rows:
            self._writer.write_table(hits)
        self.counts["scored"] += scored
        self.counts["rejected"] += rejected
        self.counts["hits"] += hits.num_rows

    def close(self) -> dict:
        """Finish both files and rename them into place; returns the counts (scored, rejected, hits)."""
        self._close_files()
        os.replace(self._trec_part, self.trec)
        if self._parquet_part is not None:
            os.replace(self._parquet_part, self.parquet)
        return self.counts

    def abort(self) -> None:
        """Close both files and leave them as `.part` (a rerun rewrites them from the committed rows)."""
        self._close_files()

    def _close_files(self) -> None:
        self._out.close()
        if self._writer is not None and self._writer.is_open:
            self._writer.close()

    def __enter__(self) -> "RunOutputs":
        return self

    def __exit__(self, kind, error, trace) -> None:
        self.close() if kind is None else self.abort()


class ChunkScorer(Protocol):
    """What scores a run's chunks: `submit` hands one over (and may score it there and then), `collect` returns its
    programs (JSON, in input order) and results (sira.core.retriever.RESULTS_SCHEMA); both report scored queries to
    `advance`. RetrieverChunks here; query workers: sira.pipelines.serving.query_workers.QueryWorkers."""

    def submit(self, qids: list[str], texts: list[str], proposals: list | None,
               advance: Callable[[int], None]) -> object: ...

    def collect(self, handle: object, advance: Callable[[int], None]) -> tuple[list[str], pa.Table]: ...

    def close(self) -> None: ...


class RetrieverChunks:
    """A Retriever (the shards in this process, or shard actors scatter-gather) as a ChunkScorer: a chunk is
    scored when submitted, in the Retriever's batches."""

    def __init__(self, retriever):
        self.retriever = retriever

    @property
    def nodes(self) -> list[str]:
        """The Ray node of each shard actor (none in process)."""
        return list(getattr(self.retriever.path.scorer, "nodes", ()))

    def submit(self, qids: list[str], texts: list[str], proposals: list | None,
               advance: Callable[[int], None]) -> tuple[list[str], pa.Table]:
        programs, results = self.retriever.run(dict(zip(qids, texts)), proposals=proposals,
                                               on_batch=lambda batch, *_: advance(len(batch)))
        return [p.model_dump_json() for p in programs], results

    def collect(self, handle: tuple[list[str], pa.Table], advance: Callable[[int], None]
                ) -> tuple[list[str], pa.Table]:
        return handle

    def close(self) -> None:
        """Nothing to release: the retriever's shard actors, if any, go with it."""


def chunk_scorer(cfg: QueryConfig, manifest: dict) -> tuple[object | None, ChunkScorer]:
    """A run's proposer, the cached expansion dataflow (None: plain queries), and its chunk scorer: query workers
    or shard actors on the job's Ray, or the shards in this process."""
    from sira.pipelines.enrichment.ray_enrich import init_ray
    from sira.pipelines.serving.retrievers import CachedBatchProposer, open_retriever

    if cfg.scorer != "local" or cfg.expand:  # the expansion dataflow runs on Ray too
        init_ray(cfg.ray_address)
    proposer = CachedBatchProposer(cfg.warehouse, cfg.backend, cfg.task, manifest, cfg.ray_address) \
        if cfg.expand else None
    if cfg.scorer == "workers":
        from sira.pipelines.serving.query_workers import QueryWorkers, Scoring

        w = program_weight(proposer, cfg.w)
        how = Scoring(cfg.k, w, proposer.name, proposer.version) if proposer is not None else Scoring(cfg.k, w)
        return proposer, QueryWorkers(cfg.warehouse, manifest, how, cfg.batch_size, cfg.tau, cfg.expand, cfg.workers)
    retriever, _ = open_retriever(cfg.warehouse, manifest=manifest, scorer=cfg.scorer, proposer=proposer, tau=cfg.tau,
                                  w=cfg.w, k=cfg.k, batch_size=cfg.batch_size)
    return proposer, RetrieverChunks(retriever)


def _hits_table(rows: pa.Table) -> pa.Table:
    """One row per hit (qid, doc_id, rank, score, program_id) of rows with list columns doc_ids and scores."""
    lengths = pc.list_value_length(rows["doc_ids"]).fill_null(0)
    parent = pc.list_parent_indices(rows["doc_ids"])
    starts = np.concatenate([[0], np.cumsum(lengths.to_numpy())[:-1]]).astype(np.int64) if rows.num_rows else \
        np.empty(0, np.int64)
    positions = np.arange(len(parent), dtype=np.int64) - starts[parent.to_numpy()] if len(parent) else \
        np.empty(0, np.int64)
    return pa.table({
        "qid": rows["qid"].take(parent),
        "doc_id": pc.list_flatten(rows["doc_ids"]),
        "rank": pa.array(positions + 1, pa.int32()),
        "score": pc.list_flatten(rows["scores"]),
        "program_id": rows["program_id"].take(parent),
    }, schema=PARQUET_RUN_SCHEMA)


def program_id(program_json: str) -> str:
    """A short content hash of a program's JSON: rows with the same program share it."""
    return hashlib.blake2b(program_json.encode(), digest_size=8).hexdigest()
