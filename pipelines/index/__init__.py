"""The index: the Spark build of an index version from the docs and enrichment tables (segments, tombstones, term
statistics; see sira.pipelines.index.build), its catalog of published versions (corpus_stats), freshness (build what
is missing or stale) and retention. In: the docs and enrichment tables. Out: published index versions in Delta,
read by serving.
"""
