"""What a `sira run` will do in a warehouse, and roughly for how long: the stages the warehouse still lacks (work
already there is skipped) and an estimate from rates measured on the 2-core reference machine, said up front."""

from __future__ import annotations

# Rough rates, used only for the estimate.
_SECONDS_PER_INDEX_BUILD = 75.0
# encoder: one actor per core on scifact's 5,183 docs and its 100,419 vocabulary entries.
_DOCS_PER_SECOND = {"encoder": 9.5, "local": 0.25, "openai": 5.0, "vllm": 50.0}
_VOCABULARY_ENTRIES_PER_SECOND = 450.0
_VOCABULARY_ENTRIES_PER_DOC = 20  # scifact's bigram vocabulary: 100,419 entries for 5,183 docs
# local: 10 scifact judgments by the packaged Gemma 3 270M on a busy machine; openai: the enrichment guess.
_JUDGMENTS_PER_SECOND = {"local": 0.12, "openai": 5.0}
# Query expansions per second (scifact-length queries); local: measured on scifact test, 2 cores, 2 engines.
_QUERIES_PER_SECOND = {"encoder": 20.0, "local": 0.5, "openai": 5.0, "vllm": 50.0}
# Documents embedded per second by the encoder alone (an actor per core): a guess above the enrichment's 9.5, which
# also searches the vocabulary.
_EMBEDDINGS_PER_SECOND = 12.0
# The encoder's cost per text against all-MiniLM-L6-v2's, on one core (bench/results/dense_encoders_scifact.json).
_ENCODER_COST = {"bge-small-en-v1.5": 1.47}


def plan(cfg, dataset_name: str, warehouse: str) -> tuple[list[str], float]:
    """`cfg` (a RunConfig): the stages it will run (work already in the warehouse is skipped) and a rough duration."""
    from sira.pipelines.index.freshness import fresh_index
    from sira.pipelines.storage.delta_io import table_version
    from sira.pipelines.enrichment.ray_enrich import docs_to_enrich
    from sira.core import tables
    from sira.core.enrichment import load_template, task_for_dataset
    from sira.core.variants import needs_embeddings, needs_expanded_queries
    from sira.pipelines.enrichment.embeddings import DOCUMENT_MAX_TOKENS

    stages, seconds = [], 10.0
    docs_version = table_version(tables.table_uri(warehouse, tables.DOCS))
    if docs_version is None:
        stages.append(f"ingest {cfg.dataset}")
        seconds += 15
    if docs_version is None or fresh_index(warehouse, cfg.preset, docs_version)[0] is None:
        stages.append("index (plain)")
        seconds += _SECONDS_PER_INDEX_BUILD
    if cfg.enriched:
        backend = cfg.corpus_backend
        version = backend.proposal_version(load_template("doc", cfg.task or task_for_dataset(dataset_name)).version)
        if docs_version is None:
            todo = _corpus_size(cfg.dataset)
        else:
            todo = docs_to_enrich(warehouse, backend.model_id(), version)[0].num_rows
        if todo:
            stages.append(f"enrich {todo} documents ({backend.backend})")
            cost = _ENCODER_COST.get(backend.encoder.model, 1.0) if backend.backend == "encoder" else 1.0
            seconds += todo / _DOCS_PER_SECOND.get(backend.backend, 1.0) * cost
            if backend.backend == "encoder":  # a first vocabulary
                seconds += todo * _VOCABULARY_ENTRIES_PER_DOC / _VOCABULARY_ENTRIES_PER_SECOND * cost
        enriching = todo if backend.backend == "encoder" and backend.encoder.max_tokens == DOCUMENT_MAX_TOKENS else 0
        if todo or fresh_index(warehouse, cfg.preset, docs_version, cfg.tau, backend.model_id(), version)[0] is None:
            stages.append("index (enriched)")
            seconds += _SECONDS_PER_INDEX_BUILD
    if needs_embeddings(cfg.variants):
        todo = _docs_to_embed(cfg, warehouse, docs_version) - (enriching if cfg.enriched else 0)
        if todo > 0:  # the rest come with the encoder's enrichment
            at = len(stages) - 1 if stages and stages[-1] == "index (enriched)" else len(stages)
            stages.insert(at, f"embed {todo} documents")
            seconds += todo / _EMBEDDINGS_PER_SECOND * _ENCODER_COST.get(cfg.corpus_backend.encoder.model, 1.0)
    if needs_expanded_queries(cfg.variants):
        todo = _queries_to_expand(cfg, dataset_name, warehouse)
        if todo:
            stages.append(f"expand {todo} queries ({cfg.backend.backend})")
            seconds += todo / _QUERIES_PER_SECOND.get(cfg.backend.backend, 1.0)
    if cfg.rerank is not None:
        from sira.core.datasets import resolve_dataset

        judgments = len(resolve_dataset(cfg.dataset).queries(cfg.split)) * cfg.rerank.depth
        stages.append(f"rerank: up to {judgments} judgments ({cfg.rerank.backend.backend})")
        seconds += judgments / _JUDGMENTS_PER_SECOND[cfg.rerank.backend.backend]
    stages.append("evaluate " + ", ".join(cfg.variants))
    seconds += 15 * len(cfg.variants)
    return stages, seconds


def _queries_to_expand(cfg, dataset_name: str, warehouse: str) -> int:
    """Queries of the split whose expansion is not cached yet (for this query-side proposer and prompt)."""
    from sira.pipelines.enrichment.expansion_cache import cached_expansions, query_hash
    from sira.core.datasets import DatasetNotFound, resolve_dataset
    from sira.core.enrichment import load_template, task_for_dataset

    try:
        texts = {query_hash(text) for text in resolve_dataset(cfg.dataset).queries(cfg.split).values()}
    except (DatasetNotFound, ValueError):
        return 0  # a bad split is reported by the stage that evaluates it, under its name; this is an estimate
    template = load_template("query", cfg.task or task_for_dataset(dataset_name))
    cached = cached_expansions(warehouse, cfg.backend.model_id(), cfg.backend.proposal_version(template.version))
    return len(texts - set(cached))


def _corpus_size(spec: str) -> int:
    from sira.core.datasets import iter_lines, resolve_dataset

    return sum(1 for _ in iter_lines(resolve_dataset(spec).corpus_path))


def _docs_to_embed(cfg, warehouse: str, docs_version: int | None) -> int:
    """Documents whose current content has no vector from the encoder yet."""
    from sira.pipelines.enrichment.embeddings import embedded_keys, encoder_id
    from sira.pipelines.enrichment.ray_enrich import docs_todo

    if docs_version is None:
        return _corpus_size(cfg.dataset)
    return docs_todo(warehouse, embedded_keys(warehouse, encoder_id(model=cfg.corpus_backend.encoder.model)))[0].num_rows
