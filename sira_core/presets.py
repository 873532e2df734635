"""Named index presets: analysis + BM25 parameters, recorded whole with every index version."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sira.core.analysis import AnalyzerConfig


class BM25Params(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    k1: float = Field(1.5, gt=0)
    b: float = Field(0.75, ge=0, le=1)


class IndexPreset(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    analyzer: AnalyzerConfig
    bm25: BM25Params
    description: str = ""


PRESETS: dict[str, IndexPreset] = {
    p.name: p
    for p in (
        IndexPreset(
            name="pyserini-flat",
            description="Anserini/Pyserini BEIR 'flat': title + text as one field, Lucene EnglishAnalyzer "
            "(StandardTokenizer, possessives, 33 stopwords, Porter), k1 0.9, b 0.4",
            analyzer=AnalyzerConfig(
                fold=False, tokenizer="uax29", possessive=True, stopwords="lucene", stemmer="porter", max_n=1
            ),
            bm25=BM25Params(k1=0.9, b=0.4),
        ),
        IndexPreset(
            name="sira",
            description="SIRA paper: NFKD fold, split on non-alphanumerics, 127 stopwords, Snowball English, "
            "unigrams + word bigrams, k1 1.5, b 0.75",
            analyzer=AnalyzerConfig(
                fold=True, tokenizer="alnum", possessive=False, stopwords="nltk127", stemmer="english", max_n=2
            ),
            bm25=BM25Params(k1=1.5, b=0.75),
        ),
    )
}


def get_preset(name: str) -> IndexPreset:
    """A named preset, or a derived one: `NAME@n=K` is NAME with word n-grams up to K (the sweep's n-gram order)."""
    base, _, override = name.partition("@")
    try:
        preset = PRESETS[base]
    except KeyError:
        raise ValueError(f"unknown preset {base!r}; choose one of {sorted(PRESETS)}") from None
    if not override:
        return preset
    key, _, value = override.partition("=")
    if key != "n" or not value.isdigit() or not 1 <= int(value) <= 4:
        raise ValueError(f"preset {name!r}: the only override is @n=K with K in 1..4")
    analyzer = preset.analyzer.model_copy(update={"max_n": int(value)})
    return preset.model_copy(update={"name": name, "analyzer": analyzer,
                                     "description": f"{preset.description}; word n-grams up to {value}"})
