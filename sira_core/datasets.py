"""Corpus and benchmark sources, resolved lazily: nothing is read until it is iterated.

`beir:NAME` resolves to $SIRA_DATA_DIR/NAME, then ../shared/data/beir/NAME (beside the checkout or the
working directory), then ~/.cache/sira/beir/NAME, then a download of the public BEIR zip when online.
A corpus source may also be a BEIR folder, a JSONL(.gz) file or a Parquet file.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"
# Datasets whose queries are themselves corpus documents: a query's own id is removed from its ranking.
QUERIES_ARE_DOCUMENTS = frozenset({"arguana", "quora"})
_ID_KEYS = ("_id", "doc_id", "id", "docid")
# Ids are keys in every table and in each shard's memory: longer ones are bad data, not documents.
MAX_ID_CHARS = 1000
_UTF8_BOM = b"\xef\xbb\xbf"


class DatasetNotFound(FileNotFoundError):
    pass


def _candidate_roots() -> list[Path]:
    roots = []
    if os.environ.get("SIRA_DATA_DIR"):
        roots.append(Path(os.environ["SIRA_DATA_DIR"]))
    checkout = Path(__file__).resolve().parent.parent
    roots += [checkout.parent / "shared/data/beir", Path.cwd().parent / "shared/data/beir"]
    roots.append(Path.home() / ".cache/sira/beir")
    seen, out = set(), []
    for r in roots:
        if r not in seen:
            seen.add(r)
            out.append(r)
    return out


def _download_beir(name: str, dest_root: Path) -> Path:
    url = BEIR_URL.format(name=name)
    with urllib.request.urlopen(url, timeout=20) as resp:  # noqa: S310 (fixed https URL)
        payload = resp.read()
    dest_root.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(payload)) as zf:
        zf.extractall(dest_root)
    return dest_root / name


def resolve_beir(name: str, download: bool = True) -> Path:
    roots = _candidate_roots()
    for root in roots:
        if (root / name / "corpus.jsonl.gz").exists() or (root / name / "corpus.jsonl").exists():
            return root / name
    if download:
        try:
            return _download_beir(name, roots[-1])
        except (urllib.error.URLError, OSError, zipfile.BadZipFile) as exc:
            reason = f"download from {BEIR_URL.format(name=name)} failed ({exc})"
    else:
        reason = "download disabled"
    tried = "\n  ".join(str(r / name) for r in roots)
    raise DatasetNotFound(
        f"BEIR dataset {name!r} not found; {reason}.\nPut corpus.jsonl(.gz), queries.jsonl(.gz) and qrels/*.tsv "
        f"in one of:\n  {tried}\n(or set SIRA_DATA_DIR to a folder holding {name}/)"
    )


@dataclass(frozen=True)
class BeirDataset:
    """A folder in BEIR layout: corpus.jsonl[.gz], queries.jsonl[.gz], qrels/<split>.tsv."""

    name: str
    path: Path

    @property
    def corpus_path(self) -> Path:
        return _first_existing(self.path, "corpus.jsonl.gz", "corpus.jsonl")

    @property
    def queries_are_documents(self) -> bool:
        return self.name in QUERIES_ARE_DOCUMENTS

    def splits(self) -> list[str]:
        return sorted(p.stem for p in (self.path / "qrels").glob("*.tsv"))

    def qrels(self, split: str) -> dict[str, dict[str, int]]:
        path = self.path / "qrels" / f"{split}.tsv"
        if not path.exists():
            raise DatasetNotFound(f"{self.name}: no qrels for split {split!r} (have {self.splits()})")
        qrels: dict[str, dict[str, int]] = {}
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh, delimiter="\t")
            header = next(reader)
            if header[:2] != ["query-id", "corpus-id"]:
                raise ValueError(f"{path}: expected header query-id, corpus-id, score; got {header}")
            for lineno, row in enumerate(reader, start=2):
                if len(row) < 3:
                    raise ValueError(f"{path}:{lineno}: expected 3 columns, got {row}")
                qrels.setdefault(row[0], {})[row[1]] = int(row[2])
        return qrels

    def queries(self, split: str | None = None) -> dict[str, str]:
        """Query texts; with a split, only the queries judged in that split (in qrels order)."""
        path = _first_existing(self.path, "queries.jsonl.gz", "queries.jsonl")
        texts = {}
        for record, line in iter_lines(path):
            obj = json.loads(line)
            texts[str(obj["_id"])] = obj.get("text", "")
        if split is None:
            return texts
        qids = self.qrels(split)
        missing = [q for q in qids if q not in texts]
        if missing:
            raise ValueError(f"{self.name}/{split}: {len(missing)} judged queries have no text, e.g. {missing[:3]}")
        return {q: texts[q] for q in qids}

    def answers(self, split: str | None = None) -> dict[str, list[str]]:
        """Gold answer strings per query, for datasets whose queries carry them (`answers` / `answer`, at the top
        level or under `metadata`); empty when the dataset has none."""
        path = _first_existing(self.path, "queries.jsonl.gz", "queries.jsonl")
        out: dict[str, list[str]] = {}
        for _, line in iter_lines(path):
            obj = json.loads(line)
            meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
            value = next((src[k] for src in (obj, meta) for k in ("answers", "answer") if src.get(k)), None)
            if value:
                values = value if isinstance(value, list) else [value]
                out[str(obj["_id"])] = [str(v) for v in values if str(v).strip()]
        if split is not None:
            judged = self.qrels(split)
            out = {q: a for q, a in out.items() if q in judged}
        return out


def _first_existing(folder: Path, *names: str) -> Path:
    for n in names:
        if (folder / n).exists():
            return folder / n
    raise DatasetNotFound(f"{folder}: none of {names} found")


def resolve_dataset(spec: str) -> BeirDataset:
    """`beir:NAME` or a path to a folder in BEIR format."""
    if spec.startswith("beir:"):
        name = spec.split(":", 1)[1]
        return BeirDataset(name, resolve_beir(name))
    path = Path(spec)
    if not path.is_dir():
        raise DatasetNotFound(f"dataset {spec!r} is neither beir:NAME nor a folder in BEIR format")
    return BeirDataset(path.name, path)


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes without the newline) of a possibly gzipped text file."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        for n, line in enumerate(fh, start=1):
            line = line.rstrip(b"\r\n")
            if n == 1:
                line = line.removeprefix(_UTF8_BOM)  # files saved by Windows tools start with one
            if line.strip():
                yield n, line


@dataclass(frozen=True)
class RawRecord:
    """One record as read from a source, before validation."""

    source: str
    record: int
    payload: bytes | dict


@dataclass(frozen=True)
class CorpusSource:
    kind: str  # beir | jsonl | parquet
    path: Path
    name: str

    def records(self) -> Iterator[RawRecord]:
        src = str(self.path)
        if self.kind == "parquet":
            for first, batch in self.batches():
                for i, obj in enumerate(batch.to_pylist()):
                    yield RawRecord(src, first + i, obj)
        else:
            for n, line in iter_lines(self.path):
                yield RawRecord(src, n, line)

    def batches(self) -> Iterator[tuple[int, pa.RecordBatch]]:
        """A Parquet source's rows as Arrow batches, each with the record number of its first row (1-based)."""
        if self.kind != "parquet":
            raise ValueError(f"{self.path}: a {self.kind} source has records, not batches")
        row = 1
        # No pre-buffering: with it pyarrow reads ahead every row group of the file, so memory grows with it.
        for batch in pq.ParquetFile(self.path, pre_buffer=False).iter_batches(batch_size=10_000):
            yield row, batch
            row += batch.num_rows


def resolve_corpus(spec: str) -> CorpusSource:
    """`beir:NAME`, a BEIR folder, a .jsonl[.gz] file or a .parquet file."""
    if spec.startswith("beir:"):
        ds = resolve_dataset(spec)
        return CorpusSource("beir", ds.corpus_path, ds.name)
    path = Path(spec)
    if path.is_dir():
        return CorpusSource("beir", BeirDataset(path.name, path).corpus_path, path.name)
    if not path.exists():
        raise DatasetNotFound(f"corpus source {spec!r} does not exist (expected beir:NAME, a folder, .jsonl or .parquet)")
    if path.name.endswith((".jsonl", ".jsonl.gz", ".json", ".ndjson")):
        return CorpusSource("jsonl", path, path.name.split(".")[0])
    if path.suffix == ".parquet":
        return CorpusSource("parquet", path, path.stem)
    raise ValueError(f"corpus source {spec!r}: unknown format (expected .jsonl, .jsonl.gz or .parquet)")


class RecordError(ValueError):
    """A record that cannot become a document; the message is the reason kept in `rejected`."""


def parse_record(raw: RawRecord) -> tuple[str, str, str]:
    """(doc_id, title, text) of a raw record, or RecordError naming the problem."""
    if isinstance(raw.payload, bytes):
        try:
            line = raw.payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError(f"invalid UTF-8 at byte {exc.start}") from None
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            # Some messages end in "at" ("Unterminated string starting at"): the column completes them.
            raise RecordError(f"unparseable JSON: {exc.msg.removesuffix(' at')} at column {exc.colno}") from None
    else:
        obj = raw.payload
    if not isinstance(obj, dict):
        raise RecordError(f"expected a JSON object, got {type(obj).__name__}")
    doc_id = next((obj[k] for k in _ID_KEYS if obj.get(k) is not None and str(obj[k]).strip()), None)
    if doc_id is None:
        raise RecordError(f"missing id (one of {', '.join(_ID_KEYS)})")
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
        raise RecordError(f"id must be a string or integer, got {type(doc_id).__name__}")
    if len(str(doc_id)) > MAX_ID_CHARS:
        raise RecordError(f"id too long ({len(str(doc_id))} characters; the limit is {MAX_ID_CHARS})")
    title, text = obj.get("title") or "", obj.get("text")
    if text is None:
        text = obj.get("contents") or ""
    for field, value in (("title", title), ("text", text)):
        if not isinstance(value, str):
            raise RecordError(f"{field} must be a string, got {type(value).__name__}")
    if not (title.strip() or text.strip()):
        raise RecordError("empty text")
    return str(doc_id), title, text


# One character str.isspace() is false for (str.strip() keeps it): what a text that is not empty holds.
_NOT_SPACE = ("[^\\x{09}-\\x{0d}\\x{1c}-\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}"
              "\\x{205f}\\x{3000}]")


def parse_batch(batch: pa.RecordBatch) -> tuple[np.ndarray, pa.Array, pa.Array, pa.Array]:
    """`parse_record` over a batch of a columnar source at once: (ok, doc_ids, titles, texts), where ok marks the
    rows whose doc id, title and text these are, exactly as `parse_record` gives them. The rows it cannot vouch for
    (a null or blank id in the first id column, a null text, an empty text, an id too long, a column of another
    type) are left to `parse_record` one by one: it names their problem, or finds their id or text in another
    column. Per-row Python work at 1M documents was most of a night's ingest."""
    n = batch.num_rows
    names = batch.schema.names
    none = (np.zeros(n, dtype=bool), pa.nulls(n, pa.string()), pa.nulls(n, pa.string()), pa.nulls(n, pa.string()))
    id_key = next((k for k in _ID_KEYS if k in names), None)
    if id_key is None:
        return none
    ids = batch.column(id_key)
    if pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type):
        ok = pc.and_(pc.match_substring_regex(ids, _NOT_SPACE), pc.less_equal(pc.utf8_length(ids), MAX_ID_CHARS))
    elif pa.types.is_integer(ids.type):
        ok = pc.is_valid(ids)  # str(int) is never blank, and no 64-bit integer has 1,000 digits
    else:
        return none

    def text_column(name: str) -> pa.Array | None:
        col = batch.column(name)
        if pa.types.is_null(col.type):  # a column of nulls only
            return pa.nulls(n, pa.string())
        return col.cast(pa.string()) if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) else None

    title = text_column("title") if "title" in names else pa.nulls(n, pa.string())
    if "text" in names:
        text = text_column("text")
        if text is not None:
            ok = pc.and_(ok, pc.is_valid(text))  # a null text falls back to `contents`: parse_record's to say
    elif "contents" in names:
        text = text_column("contents")
    else:
        text = pa.nulls(n, pa.string())
    if title is None or text is None:
        return none
    title, text = pc.fill_null(title, ""), pc.fill_null(text, "")
    ok = pc.and_(ok, pc.or_(pc.match_substring_regex(title, _NOT_SPACE), pc.match_substring_regex(text, _NOT_SPACE)))
    return (pc.fill_null(ok, False).to_numpy(zero_copy_only=False), ids.cast(pa.string()), title, text)
