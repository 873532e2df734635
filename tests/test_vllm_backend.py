"""The vLLM backend without a GPU: its Ray Data LLM config and its row contract. The end-to-end run needs
the `gpu` extra on a GPU worker (marker `gpu`, never run in CI)."""

import pytest

from pipelines.llm_backends import BackendConfig, vllm_postprocess, vllm_processor_config, vllm_sampling_params
from sira_core.enrichment import JSON_SCHEMA


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
