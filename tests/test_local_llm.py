"""The `local` backend: the embedded llama.cpp model on real scifact documents, through LocalLLMActor directly
(no Ray), and its error paths. Skipped where the `local` extra is not installed."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from conftest import require_local_model
from sira.pipelines.enrichment import local_llm
from sira.pipelines.enrichment.backend_config import OUTPUT_COLUMNS, BackendConfig
from sira.core.enrichment import document_input, load_template, parse_phrases


def scifact_docs(n: int) -> list[dict]:
    from sira.core.datasets import DatasetNotFound, resolve_beir

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


def test_query_prompts_get_query_examples_and_the_layout_is_in_the_cache_key():
    prompt = load_template("query", "fact_check").render("Aspirin lowers fever.", 4)
    text = local_llm.completion_text(prompt, fewshot=True)
    assert text.endswith("Query:\nAspirin lowers fever.\n\nJSON output:\n") and "Document:" not in text
    assert text.count("Query:\n") == 1 + len(local_llm.FEWSHOT_QUERY_EXAMPLES)
    for example, answer in local_llm.FEWSHOT_QUERY_EXAMPLES:
        assert f"Query:\n{example}{local_llm.COMPLETION_CUE}{json.dumps({'keywords': answer})}" in text
    version = BackendConfig(backend="local").proposal_version("query-fact_check-abc")
    assert version == f"query-fact_check-abc-{local_llm.layout_version()}"
    assert BackendConfig(backend="openai", model="m").proposal_version("query-fact_check-abc") == "query-fact_check-abc"


@pytest.mark.parametrize("text, closed", [
    ('{"keywords": ["a", "b"', None),  # still open
    ("no list yet", None),
    ('{"keywords": ["a", "b"]', '{"keywords": ["a", "b"]}'),  # the model closed the list: close the object
    ('{"keywords": ["a", "b"]}\n\nDocument:\nnext', '{"keywords": ["a", "b"]}'),  # text after the list is cut
    ('{"keywords": ["a", "b", "A", "c", "b"', '{"keywords": ["a", "b", "A", "c", "b"]}'),  # second repeat: stop
    ('{"keywords": ["x \\" y", "z"]', '{"keywords": ["x \\" y", "z"]}'),  # escaped quote inside a phrase
    ('{"keywords": []', '{"keywords": []}'),
])
def test_closed_keyword_list(text, closed):
    assert local_llm.closed_keyword_list(text) == closed


def test_closed_keyword_list_stops_at_max_items():
    text = '{"keywords": [' + ", ".join(f'"p{i}"' for i in range(12))
    closed = local_llm.closed_keyword_list(text, max_items=10)
    assert json.loads(closed) == {"keywords": [f"p{i}" for i in range(10)]}


class ScriptedLlama:
    """Stands in for llama_cpp.Llama in the decoding-order tests: answers free decoding and grammar decoding
    with scripted texts and records which was asked (the real model is exercised by the integration tests)."""

    def __init__(self, free: str, constrained: str):
        self.free, self.constrained, self.calls, self.texts = free, constrained, [], []

    def create_completion(self, text, grammar=None, logits_processor=None, stopping_criteria=None, **_):
        constrained = grammar is not None or logits_processor is not None
        self.calls.append("grammar" if constrained else "free")
        self.texts.append(text)
        answer = self.constrained if constrained else self.free
        if stopping_criteria is not None:  # feed the answer token by token (one character per token here)
            watch = stopping_criteria[0]
            watch.llm = self
            prompt_ids = [0] * 5
            for i in range(len(answer) + 1):
                if stopping_criteria(prompt_ids + [ord(c) for c in answer[:i]], None):
                    answer = answer[:i]
                    break
        return {"choices": [{"text": answer, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": len(answer)}}

    def detokenize(self, ids):
        return "".join(chr(i) for i in ids).encode()


def scripted_actor(llm: ScriptedLlama, keywords: bool = True) -> local_llm.LocalLLMActor:
    actor = object.__new__(local_llm.LocalLLMActor)
    actor.cfg, actor.llm, actor.prompt_format, actor.grammar = BackendConfig(backend="local"), llm, "completion-fewshot", object()
    actor.keywords = keywords
    actor._grammar_processor = lambda grammar: ScriptedConstraint()
    return actor


class ScriptedConstraint:
    """Stands in for the grammar logits processor, which needs a real model's vocabulary."""

    def close(self):
        pass


def test_free_decoding_stops_when_the_list_closes_and_skips_the_grammar():
    llm = ScriptedLlama('{"keywords": ["renal impairment", "CKD"]}\n\nDocument:\ninvented next doc', "unused")
    row = scripted_actor(llm).generate("Document:\nMetformin in kidney disease.")
    assert llm.calls == ["free"]
    assert json.loads(row["raw_output"]) == {"keywords": ["renal impairment", "CKD"]}
    assert row["error"] is None and row["input_tokens"] == 7


def test_unparseable_free_decoding_falls_back_to_the_grammar():
    llm = ScriptedLlama("keywords: renal impairment, CKD", '{"keywords": ["renal impairment"]}')
    row = scripted_actor(llm).generate("Document:\nMetformin in kidney disease.")
    assert llm.calls == ["free", "grammar"]
    assert parse_phrases(row["raw_output"]) == (["renal impairment"], None)
    assert row["input_tokens"] == 14 and row["error"] is None  # both decodings are paid for


def test_a_copied_worked_example_is_an_error():
    copied = json.dumps({"keywords": local_llm.FEWSHOT_EXAMPLES[1][1]})
    row = scripted_actor(ScriptedLlama(copied, "unused")).generate("Document:\nWind turbines in winter.")
    assert row["error"] == "the output repeats a worked example's answer"


def test_local_stage_runs_one_single_thread_engine_per_core(monkeypatch):
    """The Ray stage's layout: with concurrency unset, one actor per Ray CPU, each told to use one thread."""
    import ray

    from sira.pipelines.enrichment import llm_backends

    seen = {}

    class FakeDataset:
        def map_batches(self, fn, **kwargs):
            seen.update(kwargs)
            return self

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 4.0})
    llm_backends.local_stage(BackendConfig(backend="local"))(FakeDataset())
    assert seen["compute"].max_size == 4 and seen["fn_constructor_kwargs"]["threads"] == 1
    llm_backends.local_stage(BackendConfig(backend="local", concurrency=2))(FakeDataset())
    assert seen["compute"].max_size == 2 and seen["fn_constructor_kwargs"]["threads"] == 2


def test_a_judge_prompt_is_decoded_once_under_its_grammar_without_keyword_examples():
    """The rerank judge's prompt has a `Query:` line too; it must not get the keyword examples or the
    keyword decoding."""
    llm = ScriptedLlama("unused", '{"score": 87}')
    from sira.core.rerank import load_rerank_template, render_judgment

    prompt = render_judgment(load_rerank_template(), "aspirin", "Aspirin lowers fever.")
    row = scripted_actor(llm, keywords=False).generate(prompt)
    assert llm.calls == ["grammar"] and row["raw_output"] == '{"score": 87}' and row["error"] is None
    assert "keywords" not in llm.texts[0]


@pytest.mark.integration
def test_grammar_on_top_tokens_decodes_what_llama_cpps_grammar_sampler_decodes(actor):
    """The constrained fallback checks tokens best-first instead of the whole vocabulary: same seeded sampling,
    same text as llama.cpp's own grammar sampler, on real documents (short answers keep the reference fast)."""
    template = load_template("doc", "fact_check")
    for doc in scifact_docs(3)[1:]:
        prompt = local_llm.completion_text(template.render(document_input(doc["title"], doc["text"]), 3), True)
        params = {"temperature": actor.cfg.temperature, "seed": actor.cfg.seed, "top_k": local_llm.TOP_K,
                  "max_tokens": 48, "stop": None}
        reference = actor.llm.create_completion(prompt, grammar=actor.grammar, **params)["choices"][0]["text"]
        constrain = local_llm._GrammarOnTopTokens(actor.llm, actor.grammar)
        try:
            from llama_cpp import LogitsProcessorList

            ours = actor.llm.create_completion(prompt, logits_processor=LogitsProcessorList([constrain]),
                                               **params)["choices"][0]["text"]
        finally:
            constrain.close()
        assert ours == reference and reference.lstrip().startswith("{")
