"""A shard's doc ids as one Arrow large_string array, and as its two buffers (offsets, UTF-8 bytes): what a cache
writes to disk and memory-maps back, and what merge_top_k compares."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def as_doc_id_array(doc_ids) -> pa.LargeStringArray:
    """Doc ids as one Arrow large_string array (offsets + UTF-8 bytes: no Python object per document)."""
    if isinstance(doc_ids, pa.ChunkedArray):
        doc_ids = doc_ids.combine_chunks()
    if not isinstance(doc_ids, pa.Array):
        doc_ids = pa.array(doc_ids, type=pa.large_string())
    if doc_ids.type != pa.large_string():
        doc_ids = doc_ids.cast(pa.large_string())
    if doc_ids.null_count:
        raise ValueError("doc ids must not be null")
    return doc_ids


def doc_id_buffers(doc_ids: pa.LargeStringArray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 [n + 1] from 0, UTF-8 bytes uint8) of a large_string array, e.g. to write it to disk."""
    n = len(doc_ids)
    _, offsets_buf, data_buf = doc_ids.buffers()
    if offsets_buf is None:  # an empty array may come without buffers
        return np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.uint8)
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[doc_ids.offset : doc_ids.offset + n + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8)[offsets[0] : offsets[-1]] if data_buf is not None else \
        np.empty(0, dtype=np.uint8)
    return (offsets - offsets[0] if offsets[0] else offsets), data


def doc_ids_from_buffers(offsets: np.ndarray, data: np.ndarray) -> pa.LargeStringArray:
    """The inverse of doc_id_buffers, zero-copy (the arrays may be memory maps)."""
    return pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(data))
