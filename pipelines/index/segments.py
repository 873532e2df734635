"""Steps 5-6 of an index build: which documents leave the version (tombstones) and which enter its new segment
(`SegmentPlan`, merges of small segments), the segment's doc ordinals and postings, and the decisions kept with it."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from sira.core import tables
from sira.pipelines.index.base import live_docs, read_live_docs
from sira.pipelines.index.changes import analyses_table, analysis_of, require_analysis, term_counts
from sira.pipelines.index.context import (BROADCAST_ROWS, Build, INJECTED_COLUMNS, SegmentPolicy, collect_garbage,
                                          maybe_broadcast, not_injected, of_version, replace_rows, spark_ddl,
                                          without_fields)
from sira.pipelines.index.injections import InjectionMoves, desired_documents
from sira.pipelines.index.workers import POSTINGS_OUT, invert_block


def carried_decisions(b: Build, plan: SegmentPlan) -> DataFrame:
    """The segment_injections rows (less `segment`) of the documents a merge carries, from the segments they were
    live in."""
    rows = b.read(tables.SEGMENT_INJECTIONS).where(F.col("segment").isin(plan.merged))
    carried = maybe_broadcast(plan.carried.select("segment", "doc_id"), plan.carried_rows)
    return rows.join(carried, ["segment", "doc_id"], "left_semi").drop("segment")


def moved_counts(base: dict, plan: SegmentPlan) -> dict:
    """The version's phrase counts: the base's, less those of the documents that left, plus those that entered."""
    def sums(df: DataFrame) -> tuple[int, int]:
        row = df.agg(F.sum("phrases_proposed"), F.sum("phrases_kept")).first()
        return int(row[0] or 0), int(row[1] or 0)

    (p_in, k_in), (p_out, k_out) = sums(plan.entering), sums(plan.leaving)
    return {"phrases_proposed": int(base["phrases_proposed"]) + p_in - p_out,
            "phrases_kept": int(base["phrases_kept"]) + k_in - k_out}


@dataclass
class SegmentPlan:
    entering: DataFrame  # desired rows of the documents the night brings into the new segment
    entering_rows: int | None  # how many, when counted
    leaving: DataFrame | None  # base segment_docs rows of the documents tombstoned now
    base: dict | None
    segments: list[int]
    tombstones: DataFrame | None  # (segment, shard, doc_ord) of every tombstone of the new version
    num_tombstones: int
    base_version: int | None
    # The live rows (desired columns and their old `segment`) of the merged segments' documents that stay: they
    # enter the new segment as they are.
    carried: DataFrame | None = None
    carried_rows: int = 0
    merged: list[int] = field(default_factory=list)

    def written(self) -> tuple[DataFrame, int | None]:
        """The rows the new segment holds (a `carried` column tells the merged ones) and how many."""
        if self.carried is None:
            return self.entering, self.entering_rows
        cols = ["doc_id", "content_hash", *INJECTED_COLUMNS]
        rows = self.entering.select(*cols, F.lit(False).alias("carried")).unionByName(
            self.carried.select(*cols, F.lit(True).alias("carried")))
        return rows, self.entering_rows + self.carried_rows


def plan_segments(b: Build, desired: DataFrame | None, base: dict | None, policy: SegmentPolicy,
                  moves: InjectionMoves | None = None) -> SegmentPlan:
    """What enters and leaves on top of `base`: what came and went (plain), `moves` (an enriched night's), or every
    `desired` document that differs from the base's; past the policy, segments merged into the new one
    (`_segments_to_merge`). Without a base, a full build's plan: every `desired` document."""
    key = ["doc_id", "content_hash", "inject_key", "decisions_key"]
    if base is not None:
        if moves is not None:
            live = b.live if b.live is not None else read_live_docs(b, base)
            leaving = b.cut(live.join(maybe_broadcast(moves.leaving_ids, moves.leaving_rows), "doc_id", "left_semi"))
            entering = moves.entering
        elif b.changed is not None and b.enrichment is None:
            # Plain: no document's injections change, so what enters is what came and what leaves is what went.
            moved = b.changed.select("doc_id", "content_hash", "sign")
            entering = b.keep(desired_documents(moved.where("sign = 1").drop("sign"), None))
            went = moved.where("sign = -1").drop("sign")
            # The base's documents are read once here: not kept (a corpus-sized write to disk for one read).
            live = b.live if b.live is not None else read_live_docs(b, base)
            # Cut, not kept: writing segment_docs (below) would drop a kept frame that reads it, and the term
            # statistics and tombstones would read the table again (2 s at 1M documents).
            leaving = b.cut(live.join(maybe_broadcast(went, b.changed_rows), ["doc_id", "content_hash"], "left_semi"))
        else:
            live = live_docs(b, base)
            leaving = b.keep(live.join(desired.select(*key), key, "left_anti"))
            entering = b.keep(desired.join(live.select(*key), key, "left_anti"))
        n_leaving, n_entering = leaving.count(), entering.count()
        held, dead = _segment_counts(b, base, leaving)
        merged = _segments_to_merge(held, dead, n_entering, policy)
        kept = [s for s in base["segments"] if s not in merged]
        n_dead = sum(dead.get(s, 0) for s in kept)
        n_carried = sum(held[s] - dead.get(s, 0) for s in merged)
        segments = kept + ([b.version] if n_entering or n_carried else [])
        b.log(f"incremental on v{base['index_version']}: {n_entering} documents enter segment {b.version}, "
              f"{n_leaving} leave; {n_dead} tombstones in {len(segments)} segments")
        tombstones = leaving.select("segment", "shard", "doc_ord")
        if base.get("num_tombstones"):
            old = b.read(tables.TOMBSTONES).where(
                F.col("index_version") == base["index_version"]).select("segment", "shard", "doc_ord")
            tombstones = old.unionByName(tombstones)
        carried = None
        if merged:  # the merged segments leave the version with their tombstones
            carried = _carried(b, base, merged, live, leaving, n_carried)
            tombstones = tombstones.where(~F.col("segment").isin(merged))
        plan = SegmentPlan(entering, n_entering, leaving, base, segments, tombstones, n_dead, base["index_version"],
                           carried, n_carried, merged)
        if b.enrichment is not None or merged:
            rows, n_rows = plan.written()
            _with_unchanged_movers(b, rows, n_rows)
        return plan
    b.log("full build: no earlier version of this kind, or --full")
    return SegmentPlan(desired, None, None, None, [b.version], None, 0, None)


def _segment_counts(b: Build, base: dict, leaving: DataFrame) -> tuple[dict[int, int], dict[int, int]]:
    """segment -> documents it holds, and segment -> those of them dead in the new version (the base's tombstones
    and those leaving now), for the base's segments."""
    held = {r[0]: r[1] for r in b.read(tables.SEGMENT_DOCS).where(F.col("segment").isin(list(base["segments"])))
            .groupBy("segment").count().collect()}
    dead: dict[int, int] = {}
    sources = [leaving]
    if base.get("num_tombstones"):
        sources.append(b.read(tables.TOMBSTONES).where(F.col("index_version") == base["index_version"]))
    for rows in sources:
        for segment, n in rows.groupBy("segment").count().collect():
            dead[segment] = dead.get(segment, 0) + n
    missing = [s for s in base["segments"] if s not in held]
    if missing:
        raise RuntimeError(f"{tables.SEGMENT_DOCS} holds no rows of segments {missing} of index version "
                           f"{base['index_version']}")
    return held, dead


def _segments_to_merge(held: dict[int, int], dead: dict[int, int], n_entering: int,
                       policy: SegmentPolicy) -> list[int]:
    """The base's segments whose live documents enter the new segment: none while the version stays within the
    policy; past it, the small ones (fewer live documents than policy.merge_below_fraction of the version's), and
    when that is not enough (too many dead documents in the big ones), every segment: a compaction that carries
    each live document's analysis, injections and decisions (none is decided again)."""
    live = {s: n - dead.get(s, 0) for s, n in held.items()}

    def within(merged: list[int]) -> bool:
        kept = [s for s in held if s not in merged]
        n_segments = len(kept) + (1 if n_entering or merged else 0)
        in_segments = sum(held[s] for s in kept) + n_entering + sum(live[s] for s in merged)
        return (n_segments <= policy.max_segments
                and sum(dead.get(s, 0) for s in kept) <= policy.max_dead_fraction * in_segments)

    if within([]):
        return []
    limit = policy.merge_below_fraction * (sum(live.values()) + n_entering)
    small = sorted(s for s, n in live.items() if n < limit)
    return small if small and within(small) else sorted(held)


def _carried(b: Build, base: dict, merged: list[int], live: DataFrame, leaving: DataFrame, rows: int) -> DataFrame:
    """The live rows of the merged segments' documents that stay (`rows` of them, as the counts said)."""
    place = ["segment", "shard", "doc_ord"]
    # Cut, not kept: writing segment_docs would drop a kept frame that reads it.
    carried = b.cut(live.where(F.col("segment").isin(merged)).join(leaving.select(*place), place, "left_anti"))
    got = carried.count()
    if got != rows:
        raise RuntimeError(f"segments {merged} hold {got} live documents, not the {rows} their "
                           f"{tables.SEGMENT_DOCS} rows and tombstones count")
    b.log(f"merge: segments {merged} merge into segment {b.version} with their {rows} live documents"
          + (" (all of them: a compaction that decides nothing again)" if merged == sorted(base["segments"]) else ""))
    return carried


def _with_unchanged_movers(b: Build, entering: DataFrame, rows: int) -> None:
    """Add to `b.changed` (sign 0) the kept analyses of the documents that enter the new segment with the content
    they had: their injections changed, or their segment merges into the new one. Read only when there are such
    documents."""
    key = ["doc_id", "content_hash"]
    came = b.changed.where("sign = 1").select(*key)
    unchanged = b.cut(maybe_broadcast(entering.select(*key), rows).join(came, key, "left_anti"))
    n = unchanged.count()
    if n:
        kept = require_analysis(b, unchanged, "documents whose injections changed",
                                 b.cut(maybe_broadcast(unchanged, n).join(analyses_table(b), key)))
        b.changed = b.changed.unionByName(kept.withColumn("sign", F.lit(0)))
        b.changed_rows += n
    b.log(f"segment: {n} documents enter it with the content they had (other injections, or merged)")


def write_segment(b: Build, entering: DataFrame, rows: int | None, whole_analysis: bool = False) -> dict:
    """Doc ordinals, segment_docs and the postings of the documents entering segment `b.version`; with
    `whole_analysis` they are every document with a kept analysis and no injected terms."""
    if whole_analysis:
        wide = analyses_table(b).select("*", *[not_injected(c).alias(c) for c in INJECTED_COLUMNS])
    else:
        wide = analysis_of(b, entering, rows)
    wide = wide.withColumn("shard", (F.col("doc_hash") % b.num_shards).cast("int"))
    wide = wide.withColumn("doc_len", (F.col("doc_len") + F.coalesce(
        F.aggregate("inj_tfs", F.lit(0), lambda acc, x: acc + x), F.lit(0))).cast("int"))
    ordinal = F.row_number().over(Window.partitionBy("shard").orderBy("doc_id")) - 1
    seg = b.cut(wide.withColumn("doc_ord", ordinal.cast("int"))
                .withColumn("block", (F.col("doc_ord") / tables.POSTINGS_BLOCK_DOCS).cast("int")))
    if rows is None or rows > BROADCAST_ROWS:
        # The ordinals' shuffle (every term vector) goes before the postings' shuffle (the same again) is written.
        del wide
        collect_garbage(b.spark)
    expected, got = rows if rows is not None else entering.count(), seg.count()
    if got != expected:
        raise RuntimeError(f"{tables.DOC_ANALYSIS} holds {got} analyses for the {expected} documents entering segment "
                           f"{b.version} (analyzer {b.analyzer_key}): a row is missing or repeated")
    v = F.lit(b.version).cast("long").alias("segment")
    docs_version = replace_rows(seg.select(v, *[c for c in tables.SEGMENT_DOCS_SCHEMA.names if c != "segment"]),
                            b.uri(tables.SEGMENT_DOCS), "segment", b.version, ["segment", "shard"], evolve=True)
    postings = (seg.select("shard", "block", "doc_ord", "term_ids", "tfs", "inj_term_ids", "inj_tfs")
                .groupBy("shard", "block").applyInArrow(invert_block, spark_ddl(POSTINGS_OUT)))
    postings_version = replace_rows(postings.select(v, *POSTINGS_OUT.names), b.uri(tables.SEGMENT_POSTINGS),
                                "segment", b.version, ["segment", "shard"])
    return {"seg": seg, "segment_docs_table_version": docs_version,
            "segment_postings_table_version": postings_version}


def final_vectors(b: Build, rows: DataFrame) -> DataFrame:
    """(doc_id, term_id, tf) of documents as indexed: their analysis plus their injected terms."""
    return (term_counts(rows).unionByName(term_counts(rows.where(F.col("inj_term_ids").isNotNull()),
                                                        "inj_term_ids", "inj_tfs"))
            .groupBy("doc_id", "term_id").agg(F.sum("tf").alias("tf")))


def write_tombstones(b: Build, plan: SegmentPlan) -> int:
    rows = plan.tombstones if plan.tombstones is not None else b.spark.createDataFrame(
        [], spark_ddl(without_fields(tables.TOMBSTONES_SCHEMA, "index_version")))
    return replace_rows(of_version(b, rows, tables.TOMBSTONES_SCHEMA), b.uri(tables.TOMBSTONES), "index_version",
                    b.version, ["index_version"])


def write_injections(b: Build, injections: DataFrame) -> int:
    """What the DF rule decided for every candidate phrase of the documents entering the new segment
    (sira.pipelines.serving.hit_details reads it back)."""
    rows = injections.select(F.lit(b.version).cast("long").alias("segment"),
                             *tables.SEGMENT_INJECTIONS_SCHEMA.names[1:])
    return replace_rows(rows, b.uri(tables.SEGMENT_INJECTIONS), "segment", b.version, ["segment"])
