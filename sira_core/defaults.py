"""The one home of the defaults that several jobs share. A job's config, the CLI and the library read them from here;
a proposer's expansion weight is the proposer's own (sira.core.proposers), not listed here."""

from __future__ import annotations

# The DF filter on both sides: a phrase is kept when its rarest term occurs in at most TAU * |C| documents. The
# corpus side (index --tau) and the query side (search/eval/serve --tau) take the same default.
DEFAULT_TAU = 0.05
# Document shards of an index.
DEFAULT_SHARDS = 4
# Spark master of the index job: every core of this machine.
DEFAULT_SPARK_MASTER = "local[*]"
# The OpenAI-compatible endpoint (vLLM's default port) when --base-url is not given.
DEFAULT_OPENAI_BASE_URL = "http://127.0.0.1:8000/v1"
