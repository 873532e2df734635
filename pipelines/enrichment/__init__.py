"""The proposers and the dataflows that run them: LLM backends (OpenAI-compatible, vLLM, embedded llama.cpp) and
the encoder as Ray Data stages, corpus-side enrichment of the docs (the `enrichment` table), query-side expansion
and its cache (the `expansions` table), LLM reranking, and proposals moved between warehouses. In: documents and
queries. Out: proposal tables, read by the index build and the query path.
"""
