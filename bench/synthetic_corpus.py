"""A reproducible synthetic corpus for scale benchmarks, and its nightly change sets.

    python bench/synthetic_corpus.py --docs 1000000 --out /tmp/corpus.parquet [--seed 7]
    python bench/synthetic_corpus.py --docs 1000000 --out /tmp/night.parquet --changed-fraction 0.01

How the documents are made, so that lengths and vocabulary behave like a real corpus:
- **Sentences** come from the bundled BEIR corpora (scifact, nfcorpus, arguana: about 150,000 sentences of
  scientific abstracts, nutrition articles and debate arguments), split at sentence ends. A document is a
  run of sentences drawn uniformly at random, so word frequencies follow natural (Zipf-like) English of these
  domains and adjacent-word statistics (bigrams) are those of real sentences.
- **Lengths** follow the source documents' own word counts (a source document is drawn and its length
  taken), scaled by 0.75 so that the mean is about 150 words (sentences overshoot the target a little): 1,000,000 documents hold about 150 million words,
  the yardstick of ARCHITECTURE.md.
- **Vocabulary growth**: resampled sentences alone would freeze the vocabulary at the sources' ~100,000
  words, while a real corpus keeps meeting new words (Heaps' law: names, codes, typos). Each document
  therefore gets a Poisson(1.5) number of pseudo-words (syllable strings such as "kavurino") drawn from a
  Zipf(1.3) distribution over 50 million ranks, inserted between sentences.
- **Titles** are the title of a random source document (empty when that one has none, as in arguana).

Everything is a function of (seed, document number): document i is the same in every run and for every
corpus size, and generation streams in chunks (memory does not grow with --docs).

Nightly change sets (`--changed-fraction f`) describe the next snapshot of the same corpus: of the f*N
changed documents 60% are updated (new text, same id), 20% deleted and 20% inserted (new ids). The
snapshot file holds the whole next corpus, which is what `sira nightly --source` and `sira ingest --mode merge`
read.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

SOURCES = ("scifact", "nfcorpus", "arguana")
LENGTH_SCALE = 0.75
PSEUDO_WORDS_PER_DOC = 1.5
PSEUDO_ZIPF_A = 1.3
PSEUDO_RANKS = 50_000_000
CHUNK_DOCS = 20_000
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"] + ["an", "el", "in", "or", "us", "ix"]


@dataclass(frozen=True)
class SourcePool:
    sentences: list[str]
    sentence_words: np.ndarray  # words per sentence
    doc_lengths: np.ndarray  # words per source document
    titles: list[str]


@lru_cache(maxsize=1)
def source_pool() -> SourcePool:
    """Sentences, document lengths and titles of the bundled BEIR corpora."""
    from sira.core.datasets import resolve_dataset

    sentences, lengths, titles = [], [], []
    for name in SOURCES:
        path = resolve_dataset(f"beir:{name}").corpus_path
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                obj = json.loads(line)
                text = (obj.get("text") or "").strip()
                if not text:
                    continue
                lengths.append(len(text.split()))
                titles.append((obj.get("title") or "").strip())
                sentences.extend(s for s in _SENTENCE_END.split(text) if s)
    words = np.fromiter((s.count(" ") + 1 for s in sentences), dtype=np.int32, count=len(sentences))
    return SourcePool(sentences, words, np.asarray(lengths, dtype=np.int32), titles)


def pseudo_word(rank: int) -> str:
    """A pronounceable word for a Zipf rank: its base-|syllables| digits, two syllables at least."""
    n = len(_SYLLABLES)
    out = [_SYLLABLES[rank % n]]
    rank //= n
    while rank or len(out) < 2:
        out.append(_SYLLABLES[rank % n])
        rank //= n
    return "".join(out)


def _doc_rng(seed: int, doc_number: int, salt: int = 0) -> np.random.Generator:
    return np.random.default_rng([seed, salt, doc_number])


def make_document(pool: SourcePool, seed: int, doc_number: int, salt: int = 0) -> tuple[str, str]:
    """(title, text) of document `doc_number`; `salt` makes a different text for the same number (an update)."""
    rng = _doc_rng(seed, doc_number, salt)
    target = max(5, int(pool.doc_lengths[rng.integers(len(pool.doc_lengths))] * LENGTH_SCALE))
    parts: list[str] = []
    words = 0
    while words < target:
        i = int(rng.integers(len(pool.sentences)))
        parts.append(pool.sentences[i])
        words += int(pool.sentence_words[i])
    for _ in range(rng.poisson(PSEUDO_WORDS_PER_DOC)):
        rank = int(rng.zipf(PSEUDO_ZIPF_A)) - 1
        parts.insert(int(rng.integers(len(parts) + 1)), pseudo_word(rank % PSEUDO_RANKS))
    title = pool.titles[int(rng.integers(len(pool.titles)))]
    return title, " ".join(parts)


def doc_id_of(doc_number: int) -> str:
    return f"syn{doc_number:09d}"


@dataclass(frozen=True)
class ChangeSet:
    """Which documents a night changes: sorted document numbers."""

    updated: np.ndarray
    deleted: np.ndarray
    inserted: np.ndarray  # new numbers, >= the corpus size


def change_set(num_docs: int, changed_fraction: float, seed: int) -> ChangeSet:
    changed = int(round(num_docs * changed_fraction))
    n_updated, n_deleted = int(changed * 0.6), int(changed * 0.2)
    n_inserted = changed - n_updated - n_deleted
    rng = np.random.default_rng([seed, 0xC4A6])
    picked = rng.choice(num_docs, size=n_updated + n_deleted, replace=False)
    return ChangeSet(np.sort(picked[:n_updated]), np.sort(picked[n_updated:]),
                     np.arange(num_docs, num_docs + n_inserted))


def iter_documents(num_docs: int, seed: int, changes: ChangeSet | None = None) -> Iterator[tuple[str, str, str]]:
    """(doc_id, title, text) of the corpus, or of the next night's snapshot when `changes` is given."""
    pool = source_pool()
    updated = set(changes.updated.tolist()) if changes is not None else set()
    deleted = set(changes.deleted.tolist()) if changes is not None else set()
    numbers = range(num_docs) if changes is None else [*range(num_docs), *changes.inserted.tolist()]
    for n in numbers:
        if n in deleted:
            continue
        title, text = make_document(pool, seed, n, salt=1 if n in updated else 0)
        yield doc_id_of(n), title, text


def write_parquet(path: Path, docs: Iterator[tuple[str, str, str]], chunk: int = CHUNK_DOCS) -> int:
    """Stream documents into one Parquet file (doc_id, title, text) in row groups of `chunk`; returns the count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string())])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    written = 0
    with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        rows: list[tuple[str, str, str]] = []
        for row in docs:
            rows.append(row)
            if len(rows) == chunk:
                writer.write_table(pa.Table.from_arrays([pa.array(c) for c in zip(*rows)], schema=schema))
                written += len(rows)
                rows = []
        if rows:
            writer.write_table(pa.Table.from_arrays([pa.array(c) for c in zip(*rows)], schema=schema))
            written += len(rows)
    tmp.replace(path)  # a killed run leaves no half-written corpus behind its final name
    return written


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--changed-fraction", type=float, default=None,
                    help="write the next night's snapshot instead of the corpus")
    args = ap.parse_args(argv)
    changes = None if args.changed_fraction is None else change_set(args.docs, args.changed_fraction, args.seed)
    n = write_parquet(args.out, iter_documents(args.docs, args.seed, changes))
    print(json.dumps({"docs": n, "out": str(args.out)}))


if __name__ == "__main__":
    main()
