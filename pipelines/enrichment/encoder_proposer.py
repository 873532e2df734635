"""The encoder proposer: corpus vocabulary embedded once per index version (cached in Delta), texts embedded
by the same encoder, nearest entries proposed with their cosine as weight.

As a Ray Data stage it has the LLM backends' contract (rows {key, prompt} -> rows + raw_output, token counts,
latency, error), plus the proposals themselves (`proposed`, `weights`), so `sira enrich` and `sira query` run
it through the same dataflow, tables and DF filters as an LLM.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sira.pipelines.tracking.console import progress_bar
from sira.pipelines.storage.delta_io import read_table, table_exists, write_table
from sira.pipelines.enrichment.encoder import SentenceEncoder
from sira.pipelines.serving.shard_loader import read_term_stats
from sira.core import tables
from sira.core.analysis import Analyzer, AnalyzerConfig, index_text
from sira.core.proposers import (DEFAULT_ENCODER, EncoderProposerConfig, Proposal, Vocabulary, held_terms, nearest_entries,
                                 surface_forms, vocabulary_entries)

if TYPE_CHECKING:
    from ray import ObjectRef

STAGE_BATCH = 64  # texts per Ray Data batch of the encoder stage

_ENCODERS: dict[tuple[str, int], SentenceEncoder] = {}


def shared_encoder(max_tokens: int = 256, model: str = DEFAULT_ENCODER) -> SentenceEncoder:
    """One encoder per process, model and input length (the weights are 90 to 130 MB)."""
    if (model, max_tokens) not in _ENCODERS:
        if model == DEFAULT_ENCODER:
            from sira.pipelines.enrichment.encoder import MiniLMEncoder

            _ENCODERS[model, max_tokens] = MiniLMEncoder(max_tokens=max_tokens)
        elif model == "bge-small-en-v1.5":
            from sira.pipelines.enrichment.onnx_bert import bge_small_encoder

            _ENCODERS[model, max_tokens] = bge_small_encoder(max_tokens)
        else:
            raise ValueError(f"no embedded encoder {model!r}: all-MiniLM-L6-v2 or bge-small-en-v1.5")
    return _ENCODERS[model, max_tokens]


def vocabulary_key(cfg: EncoderProposerConfig) -> str:
    """What decides the vocabulary's membership (not the proposals' count or threshold)."""
    blob = json.dumps({"encoder": cfg.model, "entries": cfg.entries, "tau": cfg.vocabulary_tau,
                       "min_bigram_df": cfg.min_bigram_df}, sort_keys=True)
    return hashlib.blake2b(blob.encode(), digest_size=6).hexdigest()


def load_vocabulary(
    warehouse: str, manifest: dict, cfg: EncoderProposerConfig, log: Callable[[str], None] = lambda s: None
) -> Vocabulary:
    """The vocabulary of one index version, from the Delta `vocabulary` cache or built now (and cached).

    Keyed by index version, so a new version gets its own membership; the embedding of a surface form never
    changes, so vectors already computed for any version are reused and only new surface forms are encoded."""
    version, key = int(manifest["index_version"]), vocabulary_key(cfg)
    uri = tables.table_uri(warehouse, tables.VOCABULARY)
    if table_exists(uri):
        cached = read_table(uri, filters=[("index_version", "=", version), ("vocabulary_key", "=", key)])
        if cached.num_rows:
            return _as_vocabulary(cached)
    started = time.perf_counter()
    analyzer = Analyzer(AnalyzerConfig.model_validate_json(manifest["analyzer_json"]))
    stats = read_term_stats(warehouse, manifest, ["term", "df"])
    term_dfs = dict(zip(stats.column("term").to_pylist(), stats.column("df").to_pylist()))
    docs = read_table(tables.table_uri(warehouse, tables.DOCS), manifest["docs_table_version"],
                      columns=["title", "text"])
    texts = (index_text(t, x) for t, x in zip(docs.column("title").to_pylist(), docs.column("text").to_pylist()))
    forms = surface_forms(texts, analyzer, bigrams=cfg.entries == "bigram")
    entries = vocabulary_entries(term_dfs, forms, int(manifest["num_docs"]), cfg)
    surfaces = [e.surface for e in entries]
    known = _known_vectors(uri, surfaces, cfg.model)
    todo = sorted({s for s in surfaces if s not in known})
    log(f"vocabulary v{version}: {len(entries)} entries, {len(todo)} to encode ({len(known)} cached)")
    if todo:
        with progress_bar(f"vocabulary v{version}", total=len(todo), unit="entries") as advance:
            vectors = shared_encoder(cfg.max_tokens, cfg.model).encode(todo, on_progress=advance)
        known.update(zip(todo, vectors))
    rows = pa.Table.from_pydict({
        "index_version": [version] * len(entries),
        "vocabulary_key": [key] * len(entries),
        "encoder": [cfg.model] * len(entries),
        "term": [e.term for e in entries],
        "surface": surfaces,
        "df": [e.df for e in entries],
        "embedding": [known[s].tolist() for s in surfaces],
    }, schema=tables.VOCABULARY_SCHEMA)
    if not entries:
        log(f"vocabulary v{version}: no term has 1 <= DF <= {cfg.vocabulary_tau}*|C|: nothing to propose")
        return _as_vocabulary(rows)
    write_table(uri, rows, mode="append", partition_by=["index_version"])
    log(f"vocabulary v{version}: cached in {time.perf_counter() - started:.1f} s")
    return _as_vocabulary(rows)


def _known_vectors(uri: str, surfaces: Sequence[str], model: str) -> dict[str, np.ndarray]:
    if not surfaces or not table_exists(uri):
        return {}
    t = read_table(uri, columns=["encoder", "surface", "embedding"])
    t = t.filter(pc.and_(pc.equal(t["encoder"], model), pc.is_in(t["surface"], pa.array(list(surfaces), pa.string()))))
    return {s: np.asarray(v, dtype=np.float32) for s, v in zip(t["surface"].to_pylist(), t["embedding"].to_pylist())}


def _as_vocabulary(rows: pa.Table) -> Vocabulary:
    rows = rows.sort_by("term")
    terms = rows.column("term").to_pylist()
    keep = [i for i in range(len(terms)) if i == 0 or terms[i] != terms[i - 1]]  # two racing builds appended twice
    rows = rows.take(pa.array(keep, pa.int64()))
    flat = pc.list_flatten(rows.column("embedding").combine_chunks()).to_numpy(zero_copy_only=False)
    vectors = flat.astype(np.float32).reshape(rows.num_rows, -1) if rows.num_rows else np.zeros((0, 384), np.float32)
    return Vocabulary(rows.column("term").to_pylist(), rows.column("surface").to_pylist(),
                      rows.column("df").to_numpy(), vectors)


class EncoderProposer:
    """A TermProposer: texts -> the nearest vocabulary entries each text lacks."""

    def __init__(self, vocabulary: Vocabulary, cfg: EncoderProposerConfig, analyzer: Analyzer):
        self.name = f"encoder:{cfg.model}"
        self.version = cfg.version()
        self.cfg, self.vocabulary, self.analyzer = cfg, vocabulary, analyzer
        self.encoder = shared_encoder(cfg.max_tokens, cfg.model)

    def propose(self, texts: Sequence[str]) -> list[Proposal]:
        return self.propose_with_vectors(texts)[0]

    def propose_with_vectors(self, texts: Sequence[str]) -> tuple[list[Proposal], np.ndarray]:
        """The proposals and the texts' vectors they came from (a document's is the dense variants' vector)."""
        held = [held_terms(self.analyzer, text) for text in texts]
        vectors = self.encoder.encode(list(texts))
        return nearest_entries(vectors, held, self.vocabulary, self.cfg), vectors

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self.encoder.tokenizer.encode_batch(list(texts))]


class EncoderActor:
    """Ray Data actor: {key..., prompt} batches -> proposals with the backends' output columns. The vocabulary
    comes as an object store reference: its vectors (150 MB for scifact) are read in place by every actor on a
    node, instead of travelling inside the stage's pickled constructor arguments to each actor."""

    def __init__(self, vocabulary: ObjectRef, cfg_json: str, analyzer_json: str):
        import ray

        self.proposer = EncoderProposer(ray.get(vocabulary), EncoderProposerConfig.model_validate_json(cfg_json),
                                        Analyzer(AnalyzerConfig.model_validate_json(analyzer_json)))

    def __call__(self, batch):
        texts = [str(t) for t in batch["prompt"]]
        started = time.perf_counter()
        try:
            proposals, vectors = self.proposer.propose_with_vectors(texts)
            tokens = self.proposer.token_counts(texts)
        except Exception as exc:  # a failed batch is recorded per row and retried by the next run
            proposals = [Proposal([], [], f"encoder: {type(exc).__name__}: {exc}") for _ in texts]
            vectors, tokens = np.zeros((len(texts), self.proposer.encoder.dim), np.float32), [0] * len(texts)
        per_row_ms = (time.perf_counter() - started) * 1000 / max(len(texts), 1)
        out = batch.drop(columns=["prompt"])
        out = out.assign(
            raw_output=[json.dumps({"phrases": p.phrases, "weights": [round(w, 4) for w in p.weights]})
                        if p.error is None else None for p in proposals],
            proposed=[p.phrases for p in proposals],
            weights=[p.weights for p in proposals],
            input_tokens=tokens,
            output_tokens=[0] * len(texts),
            latency_ms=[per_row_ms] * len(texts),
            error=[p.error for p in proposals],
            embedding=[v.tolist() for v in vectors],  # lists: Ray would make ndarrays a tensor extension type
        )
        return out


def encoder_stage(vocabulary: Vocabulary, cfg: EncoderProposerConfig, analyzer_json: str,
                  batch_size: int = STAGE_BATCH, concurrency: int | None = None) -> Callable:
    """The Ray Data stage; `concurrency` actors (None: one per CPU of the Ray cluster)."""
    def stage(ds):
        import ray
        from ray.data import ActorPoolStrategy

        # One actor per CPU: Ray limits each actor's BLAS to one thread (fractional num_cpus), so a single actor
        # leaves the other cores idle (scifact: 13.7 min with one actor on 2 cores). Fractional CPUs, as for the
        # local LLM: whole-CPU actors starve the read/write tasks on small machines.
        actors = concurrency or max(1, int(ray.cluster_resources().get("CPU", 1)))
        # The reference lives in the dataset's plan, so the vocabulary stays in the object store while it runs.
        return ds.map_batches(EncoderActor,
                              fn_constructor_args=(ray.put(vocabulary), cfg.model_dump_json(), analyzer_json),
                              batch_size=batch_size, batch_format="pandas",
                              compute=ActorPoolStrategy(size=actors), num_cpus=0.5)
    return stage
