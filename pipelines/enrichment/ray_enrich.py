"""The Ray Data proposal dataflow: rows -> prompt -> LLM backend -> parse -> a Delta proposals table
(`enrichment` for documents, `expansions` for queries).

Results are committed in chunks of `commit_every` rows, or sooner when `commit_interval_s` has passed since the last
commit (a slow backend), so a job killed at any point keeps what it committed, and a rerun neither redoes nor
duplicates it. A chunk's new keys are appended (an append costs the same however large the table is; a MERGE scans
it); only the rows that replace a recorded error go through a MERGE. The job's small files are compacted as it goes
and at its end, followed by a checkpoint, so neither the next commit nor the next reader pays for a long log or many
files.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sira.pipelines.storage.delta_io import data_files, merge_rows, open_data_file, read_table, table_exists
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.enrichment.llm_backends import build_stage
from sira.core import tables
from sira.core.analysis import index_text
from sira.core.enrichment import PromptTemplate, document_input, parse_phrases

# The column of a to-do table that says the proposals table holds an errored row for this key, which the new
# answer replaces (a MERGE); every other row is a key the table does not hold yet (an append).
REPLACES_ERROR = "replaces_error"
COMMIT_EVERY = 10_000
COMMIT_INTERVAL_S = 30.0
# Compaction rewrites files below this size: a file that reached it is never rewritten again, so one compaction
# costs at most this much plus the new files, however large the table grows.
COMPACT_TARGET_BYTES = 16 * 2**20
COMPACT_EVERY_COMMITS = 50


DOC_COLUMNS = ["doc_id", "title", "text", "content_hash"]
# As the table's readers see them: a writer may have stored the strings as string_view (delta-rs's MERGE does), which
# Arrow's joins do not take.
DOC_SCHEMA = pa.schema([(c, pa.string()) for c in DOC_COLUMNS])
KEY_SCHEMA = pa.schema([("doc_id", pa.string()), ("content_hash", pa.string())])


@dataclass(frozen=True)
class FileTodo:
    """The documents to do of one docs data file: their row positions there (ascending) and REPLACES_ERROR."""

    uri: str
    path: str
    positions: np.ndarray
    replaces_error: np.ndarray

    def read(self) -> Iterator[pa.Table]:
        """Their DOC_COLUMNS and REPLACES_ERROR, a table (a copy) per batch of the file read."""
        offset = 0
        for batch in open_data_file(self.uri, self.path).iter_batches(batch_size=8192, columns=DOC_COLUMNS):
            lo, hi = np.searchsorted(self.positions, [offset, offset + batch.num_rows])
            if lo < hi:
                part = pa.Table.from_batches([batch]).cast(DOC_SCHEMA).take(pa.array(self.positions[lo:hi] - offset))
                yield part.append_column(REPLACES_ERROR, pa.array(self.replaces_error[lo:hi], pa.bool_()))
            offset += batch.num_rows


@dataclass(frozen=True)
class DocsTodo:
    """The documents a corpus enrichment has to do, by position in the data files of one docs table version. The
    pipeline's read tasks read their texts a file at a time (`FileTodo.read`): no process holds the corpus's text,
    5 GB at 5M documents. Files in path order, documents in file order."""

    files: tuple[FileTodo, ...]

    @property
    def num_rows(self) -> int:
        return sum(len(f.positions) for f in self.files)

    def limit(self, n: int) -> DocsTodo:
        """The first `n` documents."""
        out = []
        for f in self.files:
            if n <= 0:
                break
            out.append(FileTodo(f.uri, f.path, f.positions[:n], f.replaces_error[:n]))
            n -= len(out[-1].positions)
        return DocsTodo(tuple(out))


def docs_to_enrich(warehouse: str, model: str, prompt_version: str, retry_errors: bool = True) -> tuple[DocsTodo, int]:
    """Docs whose current content has no enrichment for (model, prompt_version) yet, with REPLACES_ERROR; and how
    many were skipped. Only the keys are read here (doc_id, content_hash: about 60 bytes a document)."""
    uri = tables.table_uri(warehouse, tables.ENRICHMENT)
    done, errored = None, None
    if table_exists(uri):
        done = read_table(uri, columns=["doc_id", "content_hash", "model", "prompt_version", "error"])
        done = done.filter(pc.and_(pc.equal(done["model"], model), pc.equal(done["prompt_version"], prompt_version)))
        errored = done.filter(pc.is_valid(done["error"])) if retry_errors else None
        if retry_errors:
            done = done.filter(pc.is_null(done["error"]))
    return docs_todo(warehouse, done, errored)


def docs_todo(warehouse: str, done: pa.Table | None, errored: pa.Table | None = None) -> tuple[DocsTodo, int]:
    """The current docs whose (doc_id, content_hash) is not among `done`'s, by position in the docs table's files,
    with REPLACES_ERROR (their key is among `errored`'s); and how many were done."""
    docs_uri = tables.table_uri(warehouse, tables.DOCS)
    paths = data_files(docs_uri)
    keys = []
    for i, path in enumerate(paths):
        part = open_data_file(docs_uri, path).read(columns=["doc_id", "content_hash"]).cast(KEY_SCHEMA)
        keys.append(part.append_column("file", pa.array(np.full(part.num_rows, i, np.int32)))
                    .append_column("pos", pa.array(np.arange(part.num_rows, dtype=np.int64))))
    docs = pa.concat_tables(keys) if keys else pa.table({"doc_id": pa.array([], pa.string()), "content_hash": pa.array(
        [], pa.string()), "file": pa.array([], pa.int32()), "pos": pa.array([], pa.int64())})
    del keys
    todo = docs if done is None else docs.join(done.select(["doc_id", "content_hash"]).cast(KEY_SCHEMA),
                                               keys=["doc_id", "content_hash"], join_type="left anti")
    todo = with_replaces_error(todo, errored, ("doc_id", "content_hash")).sort_by([("file", "ascending"),
                                                                                  ("pos", "ascending")])
    files, ids = [], todo.column("file").to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if len(ids) else np.empty(0, np.int64)
    ends = np.r_[starts[1:], len(ids)]
    positions, replaces = todo.column("pos").to_numpy(), todo.column(REPLACES_ERROR).to_numpy(zero_copy_only=False)
    for a, z in zip(starts, ends):
        files.append(FileTodo(docs_uri, paths[ids[a]], positions[a:z].copy(), replaces[a:z].copy()))
    return DocsTodo(tuple(files)), docs.num_rows - todo.num_rows


def with_replaces_error(todo: pa.Table, errored: pa.Table | None, key: tuple[str, ...]) -> pa.Table:
    """`todo` with the REPLACES_ERROR column: whether its key is among the keys of `errored` (None: none is)."""
    if errored is None or errored.num_rows == 0:
        return todo.append_column(REPLACES_ERROR, pa.array(np.zeros(todo.num_rows, bool)))
    marks = errored.select(list(key)).append_column(REPLACES_ERROR, pa.array([True] * errored.num_rows, pa.bool_()))
    todo = todo.join(marks, keys=list(key), join_type="left outer")
    return todo.set_column(todo.schema.get_field_index(REPLACES_ERROR), REPLACES_ERROR,
                           pc.fill_null(todo[REPLACES_ERROR], False))


def commit(warehouse: str, rows: pa.Table, table: str = tables.ENRICHMENT) -> None:
    """Upsert one chunk into a proposals table (enrichment or expansions): new keys are inserted; an errored
    row is replaced by its retry. For rows from anywhere (an import); a job's own chunks go through ProposalWriter."""
    schema, key = PROPOSAL_TABLES[table]
    rows = rows.select(schema.names).cast(schema)
    merge_rows(tables.table_uri(warehouse, table), rows, key, replace_when="t.error IS NOT NULL")


PROPOSAL_TABLES = {
    tables.ENRICHMENT: (tables.ENRICHMENT_SCHEMA, tables.ENRICHMENT_KEY),
    tables.EXPANSIONS: (tables.EXPANSIONS_SCHEMA, tables.EXPANSIONS_KEY),
}


class ProposalWriter:
    """Commits one job's chunks to a proposals table, one row per key throughout: rows marked REPLACES_ERROR are
    MERGEd (replacing the errored row), the others appended. The marks describe the table as the job found it, so
    once another writer is seen to have committed (an import, a second job), every later chunk is MERGEd whole. (A
    commit of the same key that lands between this writer's check and its append is the one case it cannot see in
    time.) Every COMPACT_EVERY_COMMITS commits, and at close(), the small files are compacted; close() also writes a
    checkpoint."""

    def __init__(self, warehouse: str, table: str):
        self.uri = tables.table_uri(warehouse, table)
        self.schema, self.key = PROPOSAL_TABLES[table]
        self._table = None
        self._seen = self._version()  # the version this writer last left the table at
        self._marks_hold = True
        self.commits = 0

    def _version(self) -> int:
        """The table's latest version (-1: no table yet), read incrementally."""
        from deltalake import DeltaTable

        if self._table is None:
            if not table_exists(self.uri):
                return -1
            self._table = DeltaTable(self.uri)
        else:
            self._table.update_incremental()
        return self._table.version()

    def _saw_others(self, made: int) -> None:
        """Compare the table's version with this writer's own `made` commits since it last looked."""
        version = self._version()
        if version != self._seen + made:
            self._marks_hold = False
        self._seen = version

    def write(self, chunk: pa.Table) -> dict:
        """Commit `chunk` (rows with the table's columns and REPLACES_ERROR); returns what it did and how long it took."""
        from deltalake import write_deltalake

        started = time.perf_counter()
        self._saw_others(0)
        rows = chunk.select(self.schema.names).cast(self.schema)
        replaces = chunk[REPLACES_ERROR] if self._marks_hold else pa.array([True] * rows.num_rows, pa.bool_())
        new, retried = rows.filter(pc.invert(replaces)), rows.filter(replaces)
        if new.num_rows:
            write_deltalake(self._table if self._table is not None else self.uri, new, mode="append")
        if retried.num_rows:
            merge_rows(self.uri, retried, self.key, replace_when="t.error IS NOT NULL")
        self._saw_others(bool(new.num_rows) + bool(retried.num_rows))
        self.commits += 1
        if self.commits % COMPACT_EVERY_COMMITS == 0:
            self._compact()
        return {"rows": rows.num_rows, "appended": new.num_rows, "merged": retried.num_rows,
                "table_version": self._seen, "seconds": time.perf_counter() - started}

    def close(self) -> None:
        if self.commits:
            self._compact()
            self._table.create_checkpoint()

    def _compact(self) -> None:
        from deltalake.exceptions import CommitFailedError

        self._saw_others(0)
        try:
            compacted = self._table.optimize.compact(target_size=COMPACT_TARGET_BYTES)
        except CommitFailedError:
            return  # another writer changed the files: the next compaction takes them
        self._saw_others(1 if compacted["numFilesAdded"] or compacted["numFilesRemoved"] else 0)


def enrich(
    warehouse: str,
    todo: DocsTodo | pa.Table,
    template: PromptTemplate,
    backend: BackendConfig,
    max_n: int,
    commit_every: int = COMMIT_EVERY,
    on_progress: Callable[[int], None] = lambda n: None,
    vocabulary=None,
    analyzer_json: str | None = None,
    commit_interval_s: float = COMMIT_INTERVAL_S,
    on_commit: Callable[[dict], None] = lambda stats: None,
    after_commit: Callable[[pa.Table], None] = lambda chunk: None,
) -> dict:
    """Corpus side: propose phrases for each doc of `todo` (from docs_to_enrich) and commit them to `enrichment`.
    An LLM reads the rendered prompt; the encoder proposer reads the document itself."""
    if backend.backend == "encoder":
        def render(row: dict) -> str:
            return index_text(row["title"], row["text"])
    else:
        def render(row: dict) -> str:
            return template.render(document_input(row["title"], row["text"]), max_n)
    return propose(warehouse, tables.ENRICHMENT, todo, ("doc_id", "content_hash"), render,
                   backend.proposal_version(template.version), backend, max_n, commit_every, on_progress,
                   vocabulary, analyzer_json, commit_interval_s, on_commit, after_commit)


def propose(
    warehouse: str,
    table: str,
    todo: pa.Table | DocsTodo,
    carry: tuple[str, ...],
    render: Callable[[dict], str],
    prompt_version: str,
    backend: BackendConfig,
    max_words: int,
    commit_every: int = COMMIT_EVERY,
    on_progress: Callable[[int], None] = lambda n: None,
    vocabulary=None,
    analyzer_json: str | None = None,
    commit_interval_s: float = COMMIT_INTERVAL_S,
    on_commit: Callable[[dict], None] = lambda stats: None,
    after_commit: Callable[[pa.Table], None] = lambda chunk: None,
) -> dict:
    """Run prompt -> proposer -> parse over `todo` (rows with the `carry` columns, what `render` reads and
    REPLACES_ERROR) with Ray Data and commit results in chunks to `table` (its key is `carry` + model +
    prompt_version); returns counters. `on_commit` gets each commit's ProposalWriter.write statistics,
    `after_commit` the chunk it committed (with the encoder's `embedding` column)."""
    if isinstance(todo, pa.Table) and REPLACES_ERROR not in todo.column_names:
        raise ValueError(f"propose needs the {REPLACES_ERROR!r} column (with_replaces_error); got {todo.column_names}")
    model, backend_name = backend.model_id(), backend.backend
    passed = [*carry, REPLACES_ERROR]

    def make_prompts(batch: pa.Table) -> pa.Table:
        prompts = [render(row) for row in batch.to_pylist()]
        return batch.select(passed).append_column("prompt", pa.array(prompts, pa.string()))

    def parse(batch: pa.Table) -> pa.Table:
        return parsed_answers(batch, passed, max_words, {"model": model, "prompt_version": prompt_version,
                                                         "backend": backend_name})

    counters = {"enriched": 0, "errors": 0, "input_tokens": 0, "output_tokens": 0, "commits": 0, "commit_seconds": 0.0}
    if todo.num_rows == 0:
        return counters
    # Input blocks of one backend batch: a map task emits its output only when its whole block is done, so one big
    # block would hold every result back until the end (a killed job would lose them all), and it would keep every
    # engine but one idle (an actor takes a block at a time). Whole batches, not rows: Ray Data's per-row maps cost
    # more than the work they do here.
    rows = max(1, min(commit_every, backend.batch_size))
    ds = input_dataset(todo, rows).map_batches(make_prompts, batch_size=None, batch_format="pyarrow", num_cpus=0.1)
    ds = build_stage(backend, vocabulary, analyzer_json)(ds)
    # Parsed here, as the answers arrive to be committed: parsing costs less than handing each block to one more
    # Ray task (a worker process, object store copies), and this process touches every row anyway.
    answers = (parse(block) for block in ds.iter_batches(batch_size=None, batch_format="pyarrow"))
    writer = ProposalWriter(warehouse, table)
    for chunk in in_chunks(answers, commit_every, commit_interval_s):
        stats = writer.write(chunk)
        after_commit(chunk)
        errors = chunk.num_rows - pc.sum(pc.is_null(chunk["error"]).cast(pa.int64())).as_py()
        counters["enriched"] += chunk.num_rows - errors
        counters["errors"] += errors
        counters["input_tokens"] += pc.sum(chunk["input_tokens"]).as_py() or 0
        counters["output_tokens"] += pc.sum(chunk["output_tokens"]).as_py() or 0
        counters["commits"] += 1
        counters["commit_seconds"] += stats["seconds"]
        on_commit(stats)
        on_progress(chunk.num_rows)
    writer.close()
    return counters


def parsed_answers(batch: pa.Table, passed: list[str], max_words: int, labels: dict[str, str]) -> pa.Table:
    """A block of backend answers as proposals rows: the `passed` columns, `labels` (model, prompt_version,
    backend) on every row, each answer's phrases (parsed from its raw output; the encoder gives phrases and weights
    as they are), its token counts and latency, and its error (a failed call or an unusable output)."""
    errors = batch.column("error").to_pylist()
    raw = batch.column("raw_output").cast(pa.string()).to_pylist()
    proposed = batch.column("proposed").to_pylist() if "proposed" in batch.column_names else [None] * len(raw)
    weights = batch.column("weights").to_pylist() if "weights" in batch.column_names else [None] * len(raw)
    out_phrases, out_weights, out_errors = [], [], []
    for error, text, phrases, w in zip(errors, raw, proposed, weights):
        if error:
            phrases, w = [], None
        elif phrases is not None:
            phrases, w = list(phrases), [float(x) for x in w]
        else:
            phrases, error = parse_phrases(text, max_words=max_words)
        out_phrases.append(phrases)
        out_weights.append(w)
        out_errors.append(error or None)
    n = batch.num_rows
    columns = {c: batch.column(c) for c in passed}
    columns.update({name: pa.array([value] * n, pa.string()) for name, value in labels.items()})
    columns.update(
        phrases=pa.array(out_phrases, pa.list_(pa.string())), weights=pa.array(out_weights, pa.list_(pa.float32())),
        raw_output=pa.array(raw, pa.string()),
        input_tokens=pc.fill_null(batch.column("input_tokens").cast(pa.int64()), 0),
        output_tokens=pc.fill_null(batch.column("output_tokens").cast(pa.int64()), 0),
        latency_ms=pc.fill_null(batch.column("latency_ms").cast(pa.float64()), 0.0),
        error=pa.array(out_errors, pa.string()),
        enriched_at=pa.array([datetime.now(timezone.utc)] * n, pa.timestamp("us", tz="UTC")))
    if "embedding" in batch.column_names:  # the encoder's vector of each text, kept for the dense variants
        columns["embedding"] = batch.column("embedding")
    return pa.table(columns)


def input_dataset(todo: pa.Table | DocsTodo, rows: int):
    """A Ray dataset of `todo` in blocks of `rows` rows. A DocsTodo is read by Ray tasks, a docs file each, as the
    pipeline consumes it; a table (query sets, a test's rows) is cut into blocks here."""
    import ray

    if isinstance(todo, DocsTodo):
        # Read tasks merge what they read into big blocks (a docs file's worth); the stream is cut into blocks of
        # `rows` again. Fractional CPUs: read tasks that take whole ones deadlock the pipeline on 2 cores.
        return ray.data.read_datasource(_docs_datasource(todo), override_num_blocks=len(todo.files), concurrency=2,
                                        num_cpus=0.25).repartition(target_num_rows_per_block=rows)
    # Copies, not slices: a slice keeps the buffers of the whole table, and Ray sizes, budgets and ships a block by
    # its buffers. A take from a table of many chunks concatenates them all first, every time: combined once.
    todo = todo.combine_chunks()
    blocks = [todo.take(pa.array(range(start, min(start + rows, todo.num_rows))))
              for start in range(0, todo.num_rows, rows)]
    # from_blocks, not from_arrow: from_arrow asks a remote task for each block's metadata (200k documents: 1,563
    # tasks, 14 s before the first request on 2 cores); from_blocks reads it here.
    return ray.data.from_blocks(blocks)


def _docs_datasource(todo: DocsTodo):
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class DocsTodoDatasource(Datasource):
        def estimate_inmemory_data_size(self) -> int | None:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context=None):
            # One task per file; each captures its own file's positions only.
            return [ReadTask(lambda f=f: f.read(), BlockMetadata(num_rows=len(f.positions), size_bytes=None,
                                                                      exec_stats=None, input_files=None))
                    for f in todo.files]

    return DocsTodoDatasource()


def in_chunks(blocks: Iterable[pa.Table], rows: int, seconds: float) -> Iterator[pa.Table]:
    """`blocks` in chunks of at most `rows` rows; a block that arrives `seconds` or more after the last chunk was
    taken also ends a chunk, so a slow backend commits every so often too."""
    waiting: list[pa.Table] = []
    count, last = 0, time.monotonic()
    for block in blocks:
        waiting.append(block)
        count += block.num_rows
        while count >= rows:
            whole = pa.concat_tables(waiting)
            yield whole.slice(0, rows)
            waiting, count, last = [whole.slice(rows)], count - rows, time.monotonic()
        if count and time.monotonic() - last >= seconds:
            yield pa.concat_tables(waiting)
            waiting, count, last = [], 0, time.monotonic()
    if count:
        yield pa.concat_tables(waiting)


def ray_address(address: str | None) -> str:
    """Where a job's Ray runs: the address it was given (`--ray-address`), else `RAY_ADDRESS` (what `ray job submit`
    sets for its entrypoint), else a Ray of its own ("local").

    Never Ray's own default (no address): that attaches to the cluster `ray start` last recorded in
    /tmp/ray/ray_current_cluster, even one that has stopped since, where the job then waits for minutes."""
    return address or os.environ.get("RAY_ADDRESS") or "local"


def ray_is_up() -> bool:
    import ray

    return ray.is_initialized()


def stop_ray() -> None:
    """Disconnect from Ray; a Ray this process started (`init_ray` with no cluster) stops with its workers."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    target = ray_address(address)
    if target == "local":
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, ignore_reinit_error=True,
                 log_to_driver=False, configure_logging=False)
    else:
        try:
            ray.init(address=target, ignore_reinit_error=True, log_to_driver=False)
        except ConnectionError as exc:
            # Ray turns on token authentication by itself only for a cluster it finds ("auto"), never for an
            # address it is given, so a token-protected cluster refuses such a client until it is told.
            raise ConnectionError(
                f"could not connect to the Ray cluster at {target} ({exc}). If the cluster uses token "
                "authentication, set RAY_AUTH_MODE=token and give its token in RAY_AUTH_TOKEN, in the file named "
                "by RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token (infra/README.md)") from exc
    ray.data.DataContext.get_current().enable_progress_bars = False
