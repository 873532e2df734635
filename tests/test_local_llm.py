"""The `local` backend: the embedded llama.cpp model on real scifact documents, through LocalLLMActor directly
(no Ray), and its error paths. Skipped where the `local` extra is not installed."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from conftest import require_local_model
from pipelines import local_llm
from pipelines.llm_backends import OUTPUT_COLUMNS, BackendConfig
from sira_core.enrichment import document_input, load_template, parse_phrases


def scifact_docs(n: int) -> list[dict]:
    from sira_core.datasets import DatasetNotFound, resolve_beir

    try:
        path = resolve_beir("scifact", download=False) / "corpus.jsonl.gz"
    except DatasetNotFound:
        pytest.skip("scifact not available locally")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(next(fh)) for _ in range(n)]


@pytest.fixture(scope="module")
def actor():
    require_local_model()
    return local_llm.LocalLLMActor(BackendConfig(backend="local").model_dump_json())


@pytest.mark.integration
def test_actor_enriches_real_documents(actor):
    template = load_template("doc", "fact_check")
    docs = scifact_docs(2)
    batch = pd.DataFrame({"doc_id": [d["_id"] for d in docs],
                          "prompt": [template.render(document_input(d["title"], d["text"]), 3) for d in docs]})
    out = actor(batch)
    assert list(out.columns) == ["doc_id", "prompt", *OUTPUT_COLUMNS]
    assert out["doc_id"].tolist() == batch["doc_id"].tolist()
    for row in out.to_dict("records"):
        assert row["input_tokens"] > 0 and row["output_tokens"] > 0 and row["latency_ms"] > 0
        phrases, parse_error = parse_phrases(row["raw_output"], max_words=3)
        # Either usable phrases or a recorded reason (a tiny model may run past max_tokens).
        assert phrases or row["error"] or parse_error
        assert all(isinstance(p, str) and 1 <= len(p.split()) <= 3 for p in phrases)


@pytest.mark.integration
def test_bad_rows_become_errors_not_exceptions(actor):
    too_long = "Document:\n" + "glucose insulin " * 4000  # far beyond the context window
    out = actor(pd.DataFrame({"doc_id": ["empty", "huge"], "prompt": ["  ", too_long]}))
    rows = out.set_index("doc_id").to_dict("index")
    assert rows["empty"]["error"] == "empty prompt"
    assert "context window" in rows["huge"]["error"]
    for row in rows.values():
        assert row["raw_output"] is None and row["output_tokens"] == 0


def test_missing_model_names_the_fix(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="neither a GGUF file nor a packaged model"):
        local_llm.resolve_model(str(tmp_path / "missing.gguf"))
    monkeypatch.setitem(local_llm.PACKAGED_MODELS, "ghost",
                        local_llm.PackagedModel("no_such_package_sira", "ghost.gguf", "chat"))
    with pytest.raises(FileNotFoundError, match=r"install the `local` extra"):
        local_llm.resolve_model("ghost")


def test_prompt_formats_put_examples_before_the_document():
    prompt = load_template("doc", "generic").render("Aspirin lowers fever.", 3)
    text = local_llm.completion_text(prompt, fewshot=True)
    assert text.endswith("Document:\nAspirin lowers fever.\n\nJSON output:\n")
    assert text.count("Document:\n") == 1 + len(local_llm.FEWSHOT_EXAMPLES)
    assert local_llm.completion_text(prompt, fewshot=False) == prompt.rstrip() + local_llm.COMPLETION_CUE
    messages = local_llm.chat_messages(prompt, fewshot=True)
    assert [m["role"] for m in messages] == ["user", "assistant"] * len(local_llm.FEWSHOT_EXAMPLES) + ["user"]
    assert messages[-1]["content"] == prompt
