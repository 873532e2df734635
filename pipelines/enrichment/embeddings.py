"""Document embeddings, the dense variants' corpus side: each document's vector from the embedded sentence encoder,
kept in the Delta `doc_embeddings` table by (doc_id, content_hash, encoder) and made incrementally, like the
enrichment: a run embeds only the documents whose current content has no vector yet.

Two writers fill it. The encoder proposer's enrichment encodes every document it enriches anyway, so its stage
hands the vectors on and they are appended after each enrichment commit (sira.pipelines.enrichment.ray_enrich).
`embed_documents` embeds whatever is still missing (an LLM enriched the corpus, or a job was killed between the two
commits) with the same Ray Data actor pool, in appended commits a killed job keeps.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sira.core import tables
from sira.core.analysis import index_text
from sira.core.proposers import DEFAULT_ENCODER, EncoderProposerConfig
from sira.pipelines.storage.delta_io import read_table, table_exists, write_table

# The encoder's input length for documents: the proposer's, so its enrichment's vectors are the dense variants'.
DOCUMENT_MAX_TOKENS = EncoderProposerConfig.model_fields["max_tokens"].default
EMBED_BATCH = 64  # documents per Ray Data batch of the embedding stage
EMBED_COMMIT_EVERY = 10_000


def encoder_id(max_tokens: int = DOCUMENT_MAX_TOKENS, model: str = DEFAULT_ENCODER) -> str:
    """The `encoder` column: the model and its input length (a vector depends on both)."""
    return f"{model}@{max_tokens}"


def embedding_rows(doc_ids: pa.Array, content_hashes: pa.Array, vectors: pa.Array, encoder: str) -> pa.Table:
    n = len(doc_ids)
    return pa.table({"doc_id": doc_ids, "content_hash": content_hashes, "encoder": pa.array([encoder] * n),
                     "embedding": vectors.cast(pa.list_(pa.float32())),
                     "embedded_at": pa.array([datetime.now(timezone.utc)] * n, pa.timestamp("us", tz="UTC"))},
                    schema=tables.DOC_EMBEDDINGS_SCHEMA)


def append_embeddings(warehouse: str, rows: pa.Table) -> None:
    """One commit of new rows: an append (its cost does not grow with the table; the keys are new by construction,
    the documents that had no vector)."""
    if rows.num_rows:
        write_table(tables.table_uri(warehouse, tables.DOC_EMBEDDINGS), rows, mode="append")


def keep_vectors(warehouse: str, max_tokens: int = DOCUMENT_MAX_TOKENS,
                 model: str = DEFAULT_ENCODER) -> Callable[[pa.Table], None]:
    """For the encoder's enrichment: after each committed chunk, its documents' vectors (the `embedding` column its
    stage hands on) are appended. A job killed between the two commits leaves vectors missing (embed_documents
    makes them), never a key twice."""
    encoder = encoder_id(max_tokens, model)

    def append(chunk: pa.Table) -> None:
        if "embedding" in chunk.column_names:
            ok = chunk.filter(pc.is_null(chunk["error"]))
            append_embeddings(warehouse, embedding_rows(ok["doc_id"], ok["content_hash"], ok["embedding"], encoder))
    return append


def embedded_keys(warehouse: str, encoder: str) -> pa.Table | None:
    uri = tables.table_uri(warehouse, tables.DOC_EMBEDDINGS)
    if not table_exists(uri):
        return None
    return read_table(uri, columns=["doc_id", "content_hash"], filters=[("encoder", "=", encoder)])


class EmbedActor:
    """Ray Data actor: docs batches (doc_id, title, text, content_hash) -> (doc_id, content_hash, embedding)."""

    def __init__(self, max_tokens: int, model: str = DEFAULT_ENCODER):
        from sira.pipelines.enrichment.encoder_proposer import shared_encoder

        self.encoder = shared_encoder(max_tokens, model)

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = [index_text(t, x) for t, x in zip(batch["title"].to_pylist(), batch["text"].to_pylist())]
        vectors = self.encoder.encode(texts)
        flat = pa.array(vectors.reshape(-1), pa.float32())
        return pa.table({"doc_id": batch["doc_id"], "content_hash": batch["content_hash"],
                         "embedding": pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1]).cast(
                             pa.list_(pa.float32()))})


def embed_documents(warehouse: str, log: Callable[[str], None], progress, max_tokens: int = DOCUMENT_MAX_TOKENS,
                    ray_address: str | None = None, commit_every: int = EMBED_COMMIT_EVERY,
                    model: str = DEFAULT_ENCODER) -> dict:
    """Embed the current documents that have no vector from this encoder yet; returns counters."""
    from sira.pipelines.enrichment.ray_enrich import docs_todo, in_chunks, init_ray, input_dataset

    encoder = encoder_id(max_tokens, model)
    todo, done = docs_todo(warehouse, embedded_keys(warehouse, encoder))
    log(f"embeddings: {todo.num_rows} documents to embed, {done} embedded ({encoder})")
    started, embedded, commits = time.perf_counter(), 0, 0
    if todo.num_rows:
        import ray
        from ray.data import ActorPoolStrategy

        init_ray(ray_address)
        actors = max(1, int(ray.cluster_resources().get("CPU", 1)))
        # Fractional CPUs: whole-CPU actors starve the read tasks on small machines (and deadlock them on 2 cores).
        ds = input_dataset(todo, EMBED_BATCH).map_batches(
            EmbedActor, fn_constructor_args=(max_tokens, model), batch_size=EMBED_BATCH, batch_format="pyarrow",
            compute=ActorPoolStrategy(size=actors), num_cpus=0.5)
        blocks = ds.iter_batches(batch_size=None, batch_format="pyarrow")
        with progress("embed", todo.num_rows, "docs") as advance:
            for chunk in in_chunks(blocks, commit_every, float("inf")):
                append_embeddings(warehouse, embedding_rows(chunk["doc_id"], chunk["content_hash"],
                                                            chunk["embedding"], encoder))
                embedded, commits = embedded + chunk.num_rows, commits + 1
                advance(chunk.num_rows)
    seconds = time.perf_counter() - started
    return {"encoder": encoder, "documents": todo.num_rows + done, "embedded": embedded, "skipped": done,
            "commits": commits, "seconds": seconds, "docs_per_second": embedded / seconds if embedded else 0.0}


def load_vectors(warehouse: str, docs_version: int, encoder: str) -> tuple[list[str], np.ndarray]:
    """The doc ids of docs table version `docs_version` and their vectors (documents x dim, float32), in doc-id
    order; LookupError naming how many documents have none (embed them first)."""
    docs = read_table(tables.table_uri(warehouse, tables.DOCS), docs_version, columns=["doc_id", "content_hash"])
    uri = tables.table_uri(warehouse, tables.DOC_EMBEDDINGS)
    rows = read_table(uri, columns=["doc_id", "content_hash", "embedding"], filters=[("encoder", "=", encoder)]) \
        if table_exists(uri) else None
    if rows is None or rows.num_rows == 0:
        raise LookupError(f"{warehouse} holds no {encoder} document vectors: embed the corpus first "
                          f"(`sira eval --variant dense` or `sira enrich --backend encoder` do)")
    # One row per key (a retried commit may have appended a key twice; its vectors are equal), then the docs' rows.
    rows = rows.append_column("row", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    first = rows.group_by(["doc_id", "content_hash"]).aggregate([("row", "min")])
    keys = pa.table({"doc_id": docs["doc_id"].cast(pa.string()), "content_hash": docs["content_hash"].cast(pa.string())})
    joined = keys.join(first.cast(pa.schema([("doc_id", pa.string()), ("content_hash", pa.string()),
                                             ("row_min", pa.int64())])), keys=["doc_id", "content_hash"],
                       join_type="left outer").sort_by("doc_id")
    missing = joined.filter(pc.is_null(joined["row_min"]))
    if missing.num_rows:
        raise LookupError(f"{missing.num_rows} of {joined.num_rows} documents of docs version {docs_version} have "
                          f"no {encoder} vector (e.g. {missing['doc_id'][0].as_py()!r}): embed them first")
    vectors = rows["embedding"].take(joined["row_min"]).combine_chunks()
    dim = len(vectors[0]) if len(vectors) else 0
    flat = pc.list_flatten(vectors).to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return joined["doc_id"].to_pylist(), flat.reshape(len(vectors), dim)
