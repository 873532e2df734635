"""The Spark index build: docs (+ the corpus-side enrichment) -> one published index version, incrementally.

An index version (layout 2, see sira.core.tables) is a list of immutable segments minus the version's tombstones,
with its own term statistics. One build (`build_index`) runs these steps, each a function below, and reports the
seconds of each (`step_seconds`: changes, analysis, original df, injections, segment plan, segment, term statistics,
tombstones and injections, publish):

0. `docs_changes`: on top of a base, the documents whose content came or went since the docs version the base was
   built from, read from the docs table's change data feed (what the night's MERGE changed): with them, the steps
   below touch the night's documents, not a scan of the whole corpus. Without a usable feed (not enabled, a
   rewrite in between) they compare the whole table with the kept analyses and the base instead.
1. `analyse_documents`: documents with no kept analysis for this analyzer are analysed (BatchAnalyzer inside
   mapInArrow); their new terms go to `term_dictionary` first, then the analysis to `doc_analysis`. A night
   analyses only what is new or changed, and also what went, from the texts its change feed holds.
2. `analyse_phrases` (enriched): the same for the DF-independent checks of each document's enrichment phrases.
3. `original_df`: DF in the original corpus (the corpus-side DF rule and `term_stats.df`).
4. `decide_injections` (enriched): the DF rule over every candidate phrase; each doc's injected terms and key. A
   night (`incremental_injections`) decides again only the documents whose decisions can change: content that
   came, enrichment rows that came or went, a candidate term that crossed the DF limit. The decisions are kept
   with the segment their document enters (`segment_injections`).
5. `plan_segments`: against the base (the newest published version of the same kind), the documents that leave
   (tombstones) and those that enter a new segment. A build that would leave more than SegmentPolicy.max_segments
   segments merges the small ones into its new segment: their live documents enter it as they are (analysis,
   injections and decisions carried, no statistic moves) and those segments leave the version, as Lucene's
   tiered merges do; when that leaves too many dead documents, every segment merges (a compaction that decides
   nothing again). A full build (one segment with every document, from the kept analysis, every decision made
   again) when there is no base, or when asked (`--full`).
6. `write_segment`: doc ordinals (doc-id order per shard), `segment_docs`, and postings inverted per block of
   POSTINGS_BLOCK_DOCS ordinals in Python (applyInArrow): no row, task or Python call holds a posting list
   longer than a block, however common the term.
7. `term_statistics`: df, df_enriched, cf; incrementally only what entered minus what left, as rows that readers
   add to the base's (up to SegmentPolicy.max_term_stats_versions builds, then whole again).
8. `publish`: the corpus_stats row, last: readers only see versions that have it. Every data row of a version
   is keyed by it (or by its new segment), and a rerun of a killed build replaces them (`replaceWhere`).

The published index equals a full rebuild's (tests/test_incremental_index.py compares the tables, term statistics
summed as readers sum them, and rankings).
"""
