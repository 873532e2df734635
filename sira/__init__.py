"""SIRA: single-call expert retrieval with LLM-enriched BM25.

The installed distribution is one namespace, mapped from the repository's top-level folders:
    sira.core       (sira_core/)   the engine-free library: analysis, BM25, retrieval programs, DF filters, metrics
    sira.pipelines  (pipelines/)   the dataflows on Spark, Ray and Delta that the jobs run
    sira.jobs       (jobs/)        the jobs and the `sira` command line
"""
