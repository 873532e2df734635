"""What every step of an index build shares: the `Build` (its session, version, warehouse, kept frames and
timed steps), the policies it follows, the errors it raises, and the helpers that write a version's rows."""

from __future__ import annotations

import gc
import hashlib
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from sira.core import tables
from sira.core.defaults import DEFAULT_TAU
from sira.core.hashing import TERM_ID_SCHEME
from sira.core.presets import IndexPreset
from sira.pipelines.index.config import SegmentPolicy  # noqa: F401 (the build steps take it from here)
from sira.pipelines.storage.delta_io import table_version


class TermIdCollision(RuntimeError):
    pass


class MissingAnalysis(RuntimeError):
    """The kept analysis of a document an incremental build needs is gone (compacted away): build in full."""


def spark_ddl(schema: pa.Schema) -> str:
    """A Spark DDL string for an Arrow schema of sira.core.tables (the one place schemas are spelled)."""
    def sql(t: pa.DataType) -> str:
        if pa.types.is_list(t):
            return f"array<{sql(t.value_type)}>"
        if pa.types.is_struct(t):
            return "struct<" + ", ".join(f"{f.name}:{sql(f.type)}" for f in t) + ">"
        return {pa.string(): "string", pa.int64(): "bigint", pa.int32(): "int", pa.bool_(): "boolean",
                pa.float64(): "double", pa.timestamp("us", tz="UTC"): "timestamp"}[t]
    return ", ".join(f"{f.name} {sql(f.type)}" for f in schema)


def without_fields(schema: pa.Schema, *names: str) -> pa.Schema:
    return pa.schema([f for f in schema if f.name not in names])


def analyzer_key(analyzer_json: str) -> str:
    """Keys kept analyses: the analyzer's settings and the term-id scheme."""
    return hashlib.blake2b(f"{analyzer_json}|terms{TERM_ID_SCHEME}".encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class EnrichmentChoice:
    """Which enrichment rows an index injects: by default each document's newest successful one for its
    current content; `model` / `prompt_version` narrow that down."""

    tau: float = DEFAULT_TAU
    model: str | None = None
    prompt_version: str | None = None


@dataclass
class Build:
    spark: SparkSession
    warehouse: str
    preset: IndexPreset
    num_shards: int
    enrichment: EnrichmentChoice | None
    version: int
    docs_version: int
    log: Callable[[str], None]
    analyzer_json: str = ""
    analyzer_key: str = ""
    build_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    persisted: list = field(default_factory=list)
    # An incremental build's analyses of the documents whose content came or went since the base (set by
    # `original_df`; sign 1 came, -1 went), and in an enriched one also of those that enter again for their
    # injections alone (sign 0, `_with_unchanged_movers`): the entering and leaving documents are read from here,
    # not from the whole table.
    changed: DataFrame | None = None
    changed_rows: int = 0
    # With the night's changes: the analyses of the documents whose content came or went (CHANGES keys, sign, the
    # doc_analysis columns), made by `_analyse_changes` from the texts the change feed holds.
    moved: DataFrame | None = None
    live: DataFrame | None = None  # the base's segment_docs rows of its live documents (`live_docs`), once read
    seconds: dict = field(default_factory=dict)  # per step, reported with the build

    def __post_init__(self):
        self.analyzer_json = self.preset.analyzer.model_dump_json()
        self.analyzer_key = analyzer_key(self.analyzer_json)

    def uri(self, name: str) -> str:
        return tables.table_uri(self.warehouse, name)

    def read(self, name: str, version: int | None = None) -> DataFrame:
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(self.uri(name))

    def keep(self, df: DataFrame, level: StorageLevel = StorageLevel.DISK_ONLY) -> DataFrame:
        """Persist (on disk by default) until the build ends, with the shuffle files it was computed from: for a
        night's few rows; a corpus-sized frame is cut (`cut`)."""
        self.persisted.append(df.persist(level))
        return self.persisted[-1]

    def cut(self, df: DataFrame) -> DataFrame:
        """`df` computed once and stored on disk without its lineage, for a small frame that later plans join several
        times: a kept frame's plan is printed in full inside every plan that reads it, and adaptive execution prints
        the plan at each of its updates. Through the moved terms, an enriched night's term_stats plan had grown to
        180 MB of text (12 documents) and ran a 3 GB heap out of memory. And for a frame that reads a table the
        build writes afterwards: each write re-plans every kept frame that reads the table and drops its data, which
        the next use computes again (2-3 s of a night at 1M documents). And for every corpus-sized frame: its blocks,
        and the shuffle files it was computed from, are dropped once nothing refers to it (Spark's ContextCleaner,
        after a GC: see `step`), where a kept frame holds both until the build ends. A full enriched build that kept
        them held 3.5x its warehouse in Spark's local dir at its end (200k documents); at 5M the disk ran out. A
        local checkpoint: an executor lost before the build ends fails the build, which a rerun redoes."""
        return df.localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY)

    @contextmanager
    def step(self, name: str):
        started = time.perf_counter()
        self.spark.sparkContext.setJobDescription(f"sira index v{self.version}: {name}")  # names its jobs in Spark's UI
        try:
            yield
        finally:
            self.spark.sparkContext.setJobDescription(None)
        self.seconds[name] = round(time.perf_counter() - started, 2)
        if self.seconds[name] >= COLLECT_AFTER_STEP_SECONDS:
            collect_garbage(self.spark)

    def release(self) -> None:
        # Newest first: a frame unpersisted while a later one built on it is still cached makes Spark re-plan that
        # one (for a Delta scan, a file listing each time): 20 s at 1M documents, in the old order.
        for df in reversed(self.persisted):
            df.unpersist()
        self.persisted.clear()


# A step this long made enough garbage (cut frames and shuffles no plan refers to) to free at its end; a night's short
# steps leave theirs to the build's end or Spark's periodic GC.
COLLECT_AFTER_STEP_SECONDS = 20.0


def collect_garbage(spark: SparkSession) -> None:
    """Let Spark free what no plan refers to any more: cut frames' blocks, shuffle files, broadcast relations. Its
    ContextCleaner drops each once a GC on the driver finds it unreachable, which in a heap that rarely fills waits
    for `spark.cleaner.periodicGC.interval`."""
    gc.collect()  # Python's references to Java plans go first (py4j detaches them)
    spark.sparkContext._jvm.System.gc()


def no_enrichment() -> dict:
    return {"enriched": False, "enrichment_table_version": None, "tau": None, "phrases_proposed": 0,
            "phrases_kept": 0, "enrichment_model": None, "enrichment_prompt_version": None}


# Rows per file of the appends whose size is known before they are written: a night's analyses and statistics (a few
# thousand documents, a few hundred thousand terms) go to one file each instead of one per shuffle partition, which
# cost a task each and left a dozen small files per table per night for every later scan to open.
ANALYSIS_ROWS_PER_FILE = 100_000  # term vectors: about 1-2 KB a document


TERM_ROWS_PER_FILE = 2_000_000  # dictionary and term_stats rows: a few dozen bytes each


def in_files(df: DataFrame, rows: int | None, rows_per_file: int) -> DataFrame:
    """`df` in about rows / rows_per_file partitions when `rows` is known (never more than it has)."""
    return df if rows is None else df.coalesce(max(1, -(-rows // rows_per_file)))


def replace_rows(df: DataFrame, uri: str, column: str, value: int, partition_by: list[str],
                 evolve: bool = False) -> int:
    """Write `df` as the rows of `column = value` (a version's or a segment's), replacing any a killed build left;
    `evolve`: a table written before a column was added gains it."""
    writer = df.write.format("delta").mode("overwrite").option("replaceWhere", f"{column} = {value}")
    if evolve:
        writer = writer.option("mergeSchema", "true")
    writer.partitionBy(*partition_by).save(uri)
    return table_version(uri)


# Up to this many rows, the small side of a join is sent to every task (a broadcast join) rather than the big side
# shuffled: a night's changed documents against the whole kept analysis, its new terms against the dictionary.
BROADCAST_ROWS = 2_000_000


def maybe_broadcast(df: DataFrame, rows: int | None) -> DataFrame:
    return F.broadcast(df) if rows is not None and rows <= BROADCAST_ROWS else df


# What a segment_docs row holds of a document's enrichment beyond its analysis: (type, value without any).
INJECTED_COLUMNS = {"inject_key": ("string", ""), "inj_term_ids": ("array<bigint>", None),
                    "inj_tfs": ("array<int>", None), "decisions_key": ("string", ""), "phrases_proposed": ("int", 0),
                    "phrases_kept": ("int", 0)}


def not_injected(column: str) -> Column:
    kind, value = INJECTED_COLUMNS[column]
    return F.lit(value).cast(kind)


def of_version(b: Build, rows: DataFrame, schema: pa.Schema) -> DataFrame:
    """`rows` as rows of this build's version: its index_version, then the table's other columns in schema order."""
    return rows.select(F.lit(b.version).cast("long").alias("index_version"),
                       *[c for c in schema.names if c != "index_version"])
