"""Answering queries from published index versions: shards loaded from Delta into a local memory-mapped cache,
scored in this process or by Ray actors, the online proposer, hit details, and `sira serve` with its pages (web/).
In: published index versions. Out: rankings.
"""
