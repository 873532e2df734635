"""How to reach an LLM (BackendConfig), shared by the backends' stages (sira.pipelines.enrichment.llm_backends) and the embedded
engine (sira.pipelines.enrichment.local_llm), which neither imports the other through it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sira.pipelines.enrichment.local_prompts import DEFAULT_LOCAL_MODEL, layout_version
from sira.core.defaults import DEFAULT_OPENAI_BASE_URL
from sira.core.proposers import EncoderProposerConfig

OUTPUT_TYPES = {"raw_output": "string", "input_tokens": "int64", "output_tokens": "int64", "latency_ms": "float64",
                "error": "string"}
OUTPUT_COLUMNS = tuple(OUTPUT_TYPES)
# Rows per engine call. An HTTP batch is only a unit of Ray's scheduling (the requests in flight are bounded by
# max_in_flight, across batches), and at a fleet's rate a small one costs more in Ray's overhead per row than the
# request itself; an engine's batch is what it holds in memory and what a killed job loses.
DEFAULT_PROPOSER = "encoder"  # embedded and CPU-only: what every job proposes with unless told otherwise
BATCH_SIZES = {"openai": 128, "vllm": 16, "local": 16, "encoder": 16}


class BackendConfig(BaseModel):
    """How to reach the LLM. Logged whole with every job that uses it (API keys are read from the
    environment variable named by `api_key_env`, never stored)."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["openai", "vllm", "local", "encoder"] = Field(
        DEFAULT_PROPOSER, description="the proposer (encoder and local run embedded, on CPU)")
    model: str | None = Field(None, description="model id / path; local: a GGUF path or a packaged model name")
    base_url: str = Field(DEFAULT_OPENAI_BASE_URL, description="openai: the endpoint's /v1 base URL")
    api_key_env: str = Field("OPENAI_API_KEY", description="openai: environment variable holding the key")
    temperature: float = Field(0.4, ge=0)
    seed: int = 42
    max_tokens: int = Field(160, gt=0)
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(3, ge=0)
    retry_base_s: float = Field(1.0, ge=0)
    qps: int | None = Field(None, ge=1, description="openai: most request starts per second, over all actors")
    max_in_flight: int = Field(512, gt=0, description="openai: most requests waiting for an answer at once, over all "
                                                      "actors (each actor adapts how many, up to its share)")
    batch_size: int | None = Field(None, gt=0, description="rows per engine call; None: the backend's BATCH_SIZES "
                                                            "entry")
    concurrency: int | None = Field(None, gt=0, description="engine replicas (vllm: one per GPU); None: local one "
                                                            "per CPU core of the Ray cluster, the others 1")
    structured_output: bool = True
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="vllm / local: extra engine arguments")
    sampling_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="vllm: extra SamplingParams (ignore_eos, min_tokens, top_p, ...); openai: "
                                          "extra request-body fields; they override the fields SIRA sets")
    encoder: EncoderProposerConfig = Field(default_factory=EncoderProposerConfig,
                                           description="encoder: the nearest-vocabulary proposer's settings")

    @model_validator(mode="after")
    def _backend_batch_size(self):
        if self.batch_size is None:
            self.batch_size = BATCH_SIZES[self.backend]
        return self

    @model_validator(mode="after")
    def _sampling_kwargs_need_an_engine_that_reads_them(self):
        if self.sampling_kwargs and self.backend not in ("openai", "vllm"):
            raise ValueError(f"sampling_kwargs {sorted(self.sampling_kwargs)} apply to the openai and vllm backends; "
                             f"backend {self.backend!r} decodes with its own settings")
        return self

    def model_id(self) -> str:
        """The model name recorded in the enrichment key."""
        if self.backend == "encoder":
            return f"encoder:{self.encoder.model}"
        if self.model:
            return self.model
        if self.backend == "local":
            return DEFAULT_LOCAL_MODEL
        raise ValueError(f"backend {self.backend!r} needs --model")

    def default_w(self) -> float:
        """The expansion weight measured for this proposer: encoder 0.25, LLMs the paper's 0.5."""
        from sira.core.program import DEFAULT_W
        from sira.core.proposers import ENCODER_DEFAULT_W

        return ENCODER_DEFAULT_W if self.backend == "encoder" else DEFAULT_W

    def resolve_w(self, w: float | None) -> float:
        """`w` when given (--expansion-weight), else this proposer's own default: the one place None is resolved."""
        return w if w is not None else self.default_w()

    def proposal_version(self, template_version: str) -> str:
        """What keys a proposal besides the model: the prompt's version, or the encoder settings' hash."""
        if self.backend == "encoder":
            return self.encoder.version()
        if self.backend == "local":  # the worked examples the local backend adds are part of its prompt
            return f"{template_version}-{layout_version()}"
        return template_version
