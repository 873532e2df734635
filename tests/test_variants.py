"""The variant table (sira.core.variants): one place that says what each evaluation variant searches."""

from typing import get_args

import pytest

from sira.core import variants


def test_the_typed_names_are_the_tables_names():
    assert get_args(variants.VariantName) == tuple(variants.VARIANTS)
    assert get_args(variants.SingleCallVariant) == variants.SINGLE_CALL_VARIANTS == ("bm25", "doc", "query", "sira")
    assert variants.RERANK_VARIANT == "sira+rerank"


def test_what_each_variant_needs():
    assert not variants.needs_enriched_index(["bm25", "query"])
    assert variants.needs_enriched_index(["bm25", "doc"]) and variants.needs_enriched_index(["sira+rerank"])
    assert not variants.needs_expanded_queries(["bm25", "doc"])
    assert variants.needs_expanded_queries(["query"]) and variants.needs_expanded_queries(["sira+rerank"])
    assert variants.variant("sira+rerank").first_stage == "sira" and variants.variant("doc").first_stage == "doc"
    assert variants.needs_embeddings(["bm25", "hybrid"]) and not variants.needs_embeddings(["sira", "sira+rerank"])
    assert variants.variant("hybrid").first_stage == "bm25" and variants.variant("dense").first_stage is None
    assert variants.needs_enriched_index(["sira+dense"]) and not variants.needs_enriched_index(["dense", "hybrid"])
    assert variants.RUN_VARIANTS == ("bm25", "doc", "query", "sira", "dense", "hybrid", "sira+dense")
    with pytest.raises(ValueError, match="unknown variant 'colbert': one of bm25, doc, query, sira, sira\\+rerank, "
                                         "dense, hybrid, sira\\+dense"):
        variants.variant("colbert")
