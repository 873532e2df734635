"""The vLLM backend without a GPU: its Ray Data LLM config and its row contract. The end-to-end run needs
the `gpu` extra on a GPU worker (marker `gpu`, never run in CI)."""

import pytest

from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.enrichment.llm_backends import vllm_postprocess, vllm_processor_config, vllm_sampling_params
from sira.core.enrichment import JSON_SCHEMA


def test_processor_config_uses_prefix_caching_one_engine_per_gpu_and_keeps_going_on_errors():
    cfg = BackendConfig(backend="vllm", model="Qwen/Qwen3-8B", concurrency=4, batch_size=64,
                        engine_kwargs={"max_model_len": 8192})
    config = vllm_processor_config(cfg)
    assert config.model_source == "Qwen/Qwen3-8B"
    assert config.engine_kwargs["enable_prefix_caching"] is True and config.engine_kwargs["max_model_len"] == 8192
    assert config.concurrency == 4 and config.batch_size == 64 and config.should_continue_on_error


def test_sampling_params_follow_the_reference_decoding_and_ask_for_json():
    params = vllm_sampling_params(BackendConfig(backend="vllm", model="m"))
    assert params == {"temperature": 0.4, "seed": 42, "max_tokens": 160, "structured_outputs": {"json": JSON_SCHEMA}}
    assert "structured_outputs" not in vllm_sampling_params(BackendConfig(backend="vllm", model="m",
                                                                          structured_output=False))


def test_postprocess_maps_engine_rows_to_the_backend_contract():
    row = {"doc_id": "d1", "content_hash": "h", "prompt": "p", "messages": [], "sampling_params": {},
           "generated_text": '{"keywords": ["x"]}', "num_input_tokens": 120, "num_generated_tokens": 9,
           "time_taken_llm": 0.25, "__inference_error__": ""}
    out = vllm_postprocess(row)
    assert out == {"doc_id": "d1", "content_hash": "h", "prompt": "p", "raw_output": '{"keywords": ["x"]}',
                   "input_tokens": 120, "output_tokens": 9, "latency_ms": 250.0, "error": None}
    failed = vllm_postprocess({**row, "__inference_error__": "CUDA out of memory"})
    assert failed["error"] == "CUDA out of memory" and failed["raw_output"] is None


def test_vllm_backend_needs_a_model_name():
    with pytest.raises(ValueError, match="needs --model"):
        BackendConfig(backend="vllm").model_id()


def test_sampling_kwargs_reach_vllm_and_openai_and_are_refused_where_nothing_reads_them():
    from sira.pipelines.enrichment.llm_backends import openai_request

    fixed = {"ignore_eos": True, "min_tokens": 64, "max_tokens": 64}
    params = vllm_sampling_params(BackendConfig(backend="vllm", model="m", structured_output=False,
                                                sampling_kwargs=fixed))
    assert params == {"temperature": 0.4, "seed": 42, "max_tokens": 64, "ignore_eos": True, "min_tokens": 64}
    _, body = openai_request(BackendConfig(backend="openai", model="m", sampling_kwargs={"top_p": 0.9}))
    assert body["top_p"] == 0.9 and body["model"] == "m"
    with pytest.raises(ValueError, match="apply to the openai and vllm backends"):
        BackendConfig(backend="local", sampling_kwargs={"top_p": 0.9})


def test_enrich_command_line_passes_engine_and_sampling_arguments_and_names_a_bad_pair(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from sira.jobs import enrich as enrich_job
    from sira.jobs.cli import app

    seen = {}

    def fake_run(cfg):  # the job itself is tested elsewhere; here only what the command line builds
        seen["cfg"] = cfg
        return {"documents": 0, "enriched": 0, "skipped": 0, "errors": 0, "input_tokens": 0, "output_tokens": 0,
                "docs_per_second": 0.0, "seconds": 0.0}

    monkeypatch.setattr(enrich_job, "run", fake_run)
    result = CliRunner().invoke(app, ["enrich", "-w", str(tmp_path), "--backend", "vllm", "--model", "m",
                                      "--free-output", "--sampling-arg", "ignore_eos=true",
                                      "--sampling-arg", "min_tokens=64", "--engine-arg", "gpu_memory_utilization=0.5",
                                      "--engine-arg", "quantization=fp8"])
    assert result.exit_code == 0, result.output
    backend = seen["cfg"].backend
    assert backend.structured_output is False
    assert backend.sampling_kwargs == {"ignore_eos": True, "min_tokens": 64}
    assert backend.engine_kwargs == {"gpu_memory_utilization": 0.5, "quantization": "fp8"}
    bad = CliRunner().invoke(app, ["enrich", "-w", str(tmp_path), "--backend", "vllm", "--model", "m",
                                   "--sampling-arg", "ignore_eos"])
    assert bad.exit_code == 2 and "expected KEY=VALUE, got 'ignore_eos'" in bad.output


def test_random_checkpoint_is_a_consistent_qwen3_with_a_chat_tokenizer(tmp_path):
    """What bench/vllm_gpu_proof.py hands vLLM on a GPU machine: every tensor Qwen3ForCausalLM loads, shaped by
    config.json, and a tokenizer whose chat template renders ChatML (vLLM itself needs the gpu extra)."""
    import importlib.util
    import json
    from pathlib import Path

    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    from conftest import TINY_DOCS

    path = Path(__file__).resolve().parent.parent / "bench" / "random_checkpoint.py"
    spec = importlib.util.spec_from_file_location("random_checkpoint", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    texts = [f"{d['title']} {d['text']}" for d in TINY_DOCS] * 20
    config, parameters = module.build(tmp_path, texts, vocab_size=400, hidden_size=64, layers=2, heads=4, kv_heads=2,
                                      head_dim=16, intermediate_size=96, max_positions=1024)
    assert json.loads((tmp_path / "config.json").read_text()) == config
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["vocab_size"] % 64 == 0

    tensors = load_file(tmp_path / "model.safetensors")
    assert sum(t.size for t in tensors.values()) == parameters
    assert tensors["model.embed_tokens.weight"].shape == (config["vocab_size"], 64)
    assert tensors["model.layers.1.self_attn.q_proj.weight"].shape == (4 * 16, 64)
    assert tensors["model.layers.1.self_attn.k_proj.weight"].shape == (2 * 16, 64)
    assert tensors["model.layers.0.self_attn.k_norm.weight"].shape == (16,)
    assert tensors["model.layers.0.mlp.down_proj.weight"].shape == (64, 96)
    assert "lm_head.weight" not in tensors  # tied to the embeddings
    assert len(tensors) == 2 + 2 * 11

    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tokenizer.get_vocab_size() <= config["vocab_size"]
    assert tokenizer.token_to_id("<|im_end|>") == config["eos_token_id"]
    text = "Insulin lowers blood glucose."
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    tok_config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    jinja2 = pytest.importorskip("jinja2")  # installed with the local extra (llama-cpp-python), as in CI
    rendered = jinja2.Template(tok_config["chat_template"]).render(
        messages=[{"role": "user", "content": "Document:\nx"}], add_generation_prompt=True, enable_thinking=False)
    assert rendered == "<|im_start|>user\nDocument:\nx<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(rendered).ids
    assert tokenizer.token_to_id("<|im_start|>") in ids and config["eos_token_id"] in ids


def test_gpu_proof_says_what_it_needs_where_vllm_is_missing():
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the proof itself runs under the gpu marker")
    script = Path(__file__).resolve().parent.parent / "bench" / "vllm_gpu_proof.py"
    proc = subprocess.run([sys.executable, str(script), "--docs", "10"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "needs the gpu extra" in proc.stderr


@pytest.mark.gpu
def test_gpu_proof_end_to_end(tmp_path):
    """On a GPU machine with the gpu extra: the whole prepared proof over a few hundred documents."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("vllm")
    script = Path(__file__).resolve().parent.parent / "bench" / "vllm_gpu_proof.py"
    proc = subprocess.run([sys.executable, str(script), "--docs", "300", "--output-tokens", "32", "--workdir",
                           str(tmp_path), "--output-json", str(tmp_path / "proof.json")], timeout=1800)
    assert proc.returncode == 0
