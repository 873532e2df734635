"""LLM backends as Ray Data stages: rows {key, prompt} -> rows + {raw_output, input_tokens, output_tokens,
latency_ms, error}. One contract, three engines:

- `openai`: any OpenAI-compatible endpoint, many requests in flight from async Ray Data actors (OpenAIChatActor).
- `vllm`:   Ray Data LLM's vLLMEngineProcessorConfig on GPU workers (the `gpu` extra installs vLLM).
- `local`:  an embedded llama.cpp model (the `local` extra), one actor on fractional CPUs.

A backend never fails the job for one bad row: transport errors, HTTP errors and junk become the row's
`error`, so the enrichment table records them and the next run retries exactly those rows.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from typing import Callable

from sira.pipelines.enrichment.backend_config import OUTPUT_TYPES, BackendConfig
from sira.core.enrichment import JSON_SCHEMA


def chat_messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def error_row(row: dict, error: str, latency_ms: float = 0.0) -> dict:
    return {**row, "raw_output": None, "input_tokens": 0, "output_tokens": 0, "latency_ms": latency_ms,
            "error": error}


# ---------------------------------------------------------------- openai (HTTP) ---------------------------------


class ErrorTolerantSession:
    """An aiohttp session that owns timeouts, retries and backoff, and turns a request that still fails into a
    payload carrying `sira_error`, so one bad row never fails the job. Every payload says in `sira_pushed_back`
    whether the server pushed back on an attempt (an overload status or a timeout). `max_connections` bounds the
    sockets it opens (aiohttp's default of 100 would cap the requests in flight silently)."""

    RETRYABLE = {408, 409, 425, 429, 500, 502, 503, 504}
    OVERLOADED = {429, 503, 504}

    def __init__(self, timeout_s: float, max_retries: int, retry_base_s: float, max_connections: int = 100):
        import aiohttp

        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_retries = max_retries
        self._retry_base_s = retry_base_s
        self._max_connections = max_connections
        self._session = None

    async def __aenter__(self):
        import aiohttp

        self._session = aiohttp.ClientSession(timeout=self._timeout,
                                              connector=aiohttp.TCPConnector(limit=self._max_connections))
        return self

    async def __aexit__(self, *exc):
        await self._session.close()

    async def request(self, url: str, headers: dict, data: str) -> dict:
        """POST `data`; the response's JSON object with `sira_latency_ms`, or {"sira_error", "sira_latency_ms"}."""
        import aiohttp

        started = time.perf_counter()
        problem = ""
        retry_after = 0.0
        pushed_back = False
        for attempt in range(self._max_retries + 1):
            if attempt:
                # Exponential backoff with jitter, or the server's Retry-After when it names one.
                backoff = self._retry_base_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.0)
                await asyncio.sleep(max(retry_after, backoff))
            try:
                async with self._session.post(url, headers=headers, data=data) as resp:
                    # Decoded leniently: a body in a wrong charset is an error row, not an exception that fails the job.
                    body = (await resp.read()).decode("utf-8", "replace")
                    if resp.status in self.RETRYABLE:
                        problem = f"HTTP {resp.status}"
                        pushed_back |= resp.status in self.OVERLOADED
                        retry_after = _seconds(resp.headers.get("Retry-After"))
                        continue
                    try:
                        payload = json.loads(body)
                    except json.JSONDecodeError:
                        return self._failed(f"HTTP {resp.status}: response is not JSON: {body[:80]!r}", started,
                                            pushed_back)
                    if resp.status >= 400:
                        return self._failed(f"HTTP {resp.status}: {str(payload)[:200]}", started, pushed_back)
                    if not isinstance(payload, dict):
                        return self._failed(f"response JSON is not an object: {body[:80]!r}", started, pushed_back)
                    payload["sira_latency_ms"] = (time.perf_counter() - started) * 1000
                    payload["sira_pushed_back"] = pushed_back
                    return payload
            except asyncio.TimeoutError:
                problem = f"timeout after {self._timeout.total:g} s"
                pushed_back = True
            except aiohttp.ClientError as exc:
                problem = f"{type(exc).__name__}: {exc}"
        return self._failed(f"{problem} (after {self._max_retries + 1} attempts)", started, pushed_back)

    @staticmethod
    def _failed(error: str, started: float, pushed_back: bool) -> dict:
        return {"sira_error": error, "sira_latency_ms": (time.perf_counter() - started) * 1000,
                "sira_pushed_back": pushed_back}


def _seconds(value: str | None) -> float:
    try:
        return min(float(value), 300.0) if value else 0.0
    except ValueError:  # an HTTP date: fall back to the backoff
        return 0.0


def openai_postprocess(resp: dict) -> dict:
    """An OpenAI chat-completions payload (from ErrorTolerantSession.request) -> the backend output columns."""
    latency = float(resp.get("sira_latency_ms", 0.0))
    if resp.get("sira_error"):
        return error_row({}, resp["sira_error"], latency)
    try:
        content = resp["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return error_row({}, f"malformed completion: {json.dumps(resp)[:120]}", latency)
    if content is not None and not isinstance(content, str):
        return error_row({}, f"malformed completion: content is a {type(content).__name__}, not text: "
                             f"{str(content)[:120]}", latency)
    usage = resp.get("usage") if isinstance(resp.get("usage"), dict) else {}
    return {"raw_output": content, "input_tokens": _token_count(usage.get("prompt_tokens")),
            "output_tokens": _token_count(usage.get("completion_tokens")), "latency_ms": latency, "error": None}


def _token_count(value) -> int:
    """A count from the server's usage block; one it cannot count is 0, never a failed row."""
    try:
        return max(int(value or 0), 0)
    except (TypeError, ValueError):
        return 0


def openai_request(cfg: BackendConfig) -> tuple[dict, dict]:
    """Headers and the chat-completions body (without messages) every OpenAI-compatible call sends."""
    headers = {"Content-Type": "application/json"}
    if os.environ.get(cfg.api_key_env):
        headers["Authorization"] = f"Bearer {os.environ[cfg.api_key_env]}"
    body = {"model": cfg.model_id(), "temperature": cfg.temperature, "seed": cfg.seed, "max_tokens": cfg.max_tokens}
    if cfg.structured_output:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "keywords", "schema": JSON_SCHEMA}}
    return headers, {**body, **cfg.sampling_kwargs}


class InFlightWindow:
    """How many requests may wait for an answer at once, adapted to the server the way TCP adapts its congestion
    window: it doubles every round of answers until the server first pushes back, then grows by one a round; a
    push-back halves it, once a round (the answers to requests sent before a halving say nothing about the halved
    window). It stays within [1, limit], so a fleet gets many requests in flight and a small server, whose queue
    grows, few."""

    def __init__(self, limit: int, start: int = 16):
        self.limit = limit
        self.size = float(min(start, limit))
        self.in_flight = 0
        self.halvings = 0
        self._doubling = True
        self._free = asyncio.Condition()

    async def acquire(self) -> int:
        """Wait for room; returns the halvings so far, to hand back to release()."""
        async with self._free:
            await self._free.wait_for(lambda: self.in_flight < int(self.size))
            self.in_flight += 1
            return self.halvings

    async def release(self, halvings_at_acquire: int, pushed_back: bool) -> None:
        async with self._free:
            self.in_flight -= 1
            if not pushed_back:
                self.size = min(float(self.limit), self.size + (1.0 if self._doubling else 1.0 / self.size))
            elif halvings_at_acquire == self.halvings:
                self.size, self._doubling, self.halvings = max(1.0, self.size / 2), False, self.halvings + 1
            self._free.notify(max(0, int(self.size) - self.in_flight))


class OpenAIClient:
    """Chat completions for many prompts at once from one event loop: the requests waiting for an answer are bounded
    by an InFlightWindow of at most `max_in_flight`, request starts are paced at `qps` (None: not paced), and each
    request goes through ErrorTolerantSession. `ask` returns the backend output columns of one prompt. `body`
    replaces the request body of `openai_request` (the reranker asks with its own schema).

    Besides an overload status or a timeout, an answer slower than half the timeout counts as a push-back: a server
    queue that long is about to time requests out."""

    def __init__(self, cfg: BackendConfig, max_in_flight: int, qps: float | None = None, body: dict | None = None):
        self.url = cfg.base_url.rstrip("/") + "/chat/completions"
        self.headers, default_body = openai_request(cfg)
        self.body = default_body if body is None else body
        self.window = InFlightWindow(max_in_flight)
        self._session = ErrorTolerantSession(cfg.timeout_s, cfg.max_retries, cfg.retry_base_s, max_in_flight)
        self._slow_ms = cfg.timeout_s * 1000 / 2
        self._interval = 1.0 / qps if qps else 0.0
        self._next_start = 0.0

    async def __aenter__(self) -> "OpenAIClient":
        await self._session.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        await self._session.__aexit__(*exc)

    async def ask(self, prompt: str) -> dict:
        halvings = await self.window.acquire()
        payload = {}
        try:
            if self._interval:
                now = asyncio.get_running_loop().time()
                slot = max(now, self._next_start)
                self._next_start = slot + self._interval
                await asyncio.sleep(slot - now)
            data = json.dumps({**self.body, "messages": chat_messages(prompt)})
            payload = await self._session.request(self.url, self.headers, data)
        finally:
            await self.window.release(halvings, payload.get("sira_pushed_back", False)
                                      or payload.get("sira_latency_ms", 0.0) > self._slow_ms)
        return openai_postprocess(payload)


class OpenAIChatActor:
    """The `openai` stage as a Ray Data actor: an Arrow batch of {..., prompt} rows -> the same rows, without the
    prompt (nothing downstream reads it, and it is most of a row's bytes), plus the backend output columns. Its
    batches share one client (one connection pool, one in-flight bound), so requests of the next batch start while
    the stragglers of the last one are still out."""

    def __init__(self, config_json: str, max_in_flight: int, qps: float | None):
        self.cfg = BackendConfig.model_validate_json(config_json)
        self.max_in_flight, self.qps = max_in_flight, qps
        self.client: OpenAIClient | None = None

    async def __call__(self, batch):
        if self.client is None:  # made on the event loop Ray runs this actor's calls on, shared by them all
            self.client = OpenAIClient(self.cfg, self.max_in_flight, self.qps)
            await self.client.__aenter__()
        outputs = await asyncio.gather(*(self.client.ask(p) for p in batch.column("prompt").to_pylist()))
        return with_output_columns(batch.drop_columns(["prompt"]), outputs)


def with_output_columns(batch, outputs: list[dict]):
    """An Arrow batch with the backend output columns of `outputs` (one dict per row) appended."""
    import pyarrow as pa

    for name, dtype in OUTPUT_TYPES.items():
        batch = batch.append_column(name, pa.array([o[name] for o in outputs], dtype))
    return batch


def openai_stage(cfg: BackendConfig) -> Callable:
    def stage(ds):
        from ray.data import ActorPoolStrategy

        actors = cfg.concurrency or 1
        per_actor = -(-cfg.max_in_flight // actors)
        return ds.map_batches(
            OpenAIChatActor,
            fn_constructor_kwargs={"config_json": cfg.model_dump_json(), "max_in_flight": per_actor,
                                   "qps": cfg.qps / actors if cfg.qps else None},
            batch_size=cfg.batch_size,
            batch_format="pyarrow",
            # Twice the batches it takes to fill the actor's in-flight bound: a batch returns with its slowest answer,
            # and the others keep the bound busy meanwhile.
            compute=ActorPoolStrategy(size=actors,
                                      max_concurrent_calls_per_actor=2 * -(-per_actor // cfg.batch_size)),
            # The stage only waits on sockets; a whole-CPU actor starves the map tasks on small machines.
            num_cpus=0.1,
        )

    return stage


# ---------------------------------------------------------------- vllm (GPU) ---------------------------------------


def vllm_postprocess(row: dict) -> dict:
    keep = {k: v for k, v in row.items()
            if k not in ("messages", "sampling_params", "generated_text", "generated_tokens", "num_input_tokens",
                         "num_generated_tokens", "prompt_token_ids", "time_taken_llm", "params", "metrics",
                         "request_id", "__inference_error__", "embeddings", "batch_uuid")}
    error = row.get("__inference_error__") or None
    if error:
        return error_row(keep, str(error)[:500])
    return {**keep, "raw_output": row.get("generated_text"), "input_tokens": int(row.get("num_input_tokens") or 0),
            "output_tokens": int(row.get("num_generated_tokens") or 0),
            "latency_ms": float(row.get("time_taken_llm") or 0.0) * 1000, "error": None}


def vllm_sampling_params(cfg: BackendConfig) -> dict:
    params = {"temperature": cfg.temperature, "seed": cfg.seed, "max_tokens": cfg.max_tokens}
    if cfg.structured_output:
        params["structured_outputs"] = {"json": JSON_SCHEMA}
    return {**params, **cfg.sampling_kwargs}


def vllm_processor_config(cfg: BackendConfig):
    from ray.data.llm import vLLMEngineProcessorConfig

    return vLLMEngineProcessorConfig(
        model_source=cfg.model_id(),
        # Prefix caching pays off because every prompt starts with the same instructions (document last).
        engine_kwargs={"enable_prefix_caching": True, "max_model_len": 4096, **cfg.engine_kwargs},
        concurrency=cfg.concurrency or 1,
        batch_size=cfg.batch_size,
        should_continue_on_error=True,
    )


def vllm_stage(cfg: BackendConfig) -> Callable:
    """Needs the `gpu` extra (vLLM, transformers) where the processor is built."""
    from ray.data.llm import build_processor

    sampling = vllm_sampling_params(cfg)
    return build_processor(
        vllm_processor_config(cfg),
        preprocess=lambda row: {**row, "messages": chat_messages(row["prompt"]), "sampling_params": sampling},
        postprocess=vllm_postprocess,
        builder_kwargs={"chat_template_kwargs": {"enable_thinking": False}},
    )


# ---------------------------------------------------------------- local (embedded CPU) -----------------------------


def local_stage(cfg: BackendConfig) -> Callable:
    import ray

    from sira.pipelines.enrichment.local_llm import LocalLLMActor

    def stage(ds):
        from ray.data import ActorPoolStrategy

        # One model per core, each on one thread: two 1-thread llama.cpp engines gave 1.6x the documents/s of
        # one 2-thread engine on 2 cores (prompt evaluation and sampling do not scale linearly with threads).
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        actors = cfg.concurrency or cpus
        return ds.map_batches(
            LocalLLMActor,
            fn_constructor_kwargs={"config_json": cfg.model_dump_json(), "threads": max(1, cpus // actors)},
            batch_size=cfg.batch_size,
            batch_format="pandas",
            compute=ActorPoolStrategy(size=actors),
            # Fractional CPUs: on small machines a whole-CPU actor starves the read/write tasks (deadlock).
            num_cpus=0.5,
        )

    return stage


STAGES = {"openai": openai_stage, "vllm": vllm_stage, "local": local_stage}


def build_stage(cfg: BackendConfig, vocabulary=None, analyzer_json: str | None = None) -> Callable:
    """A callable that maps a Ray Dataset of {..., prompt} rows to rows with the backend output columns.
    The encoder proposer reads the text itself as its prompt and needs the index's vocabulary."""
    if cfg.backend == "encoder":
        from sira.pipelines.enrichment.encoder_proposer import encoder_stage

        if vocabulary is None or analyzer_json is None:
            raise ValueError("the encoder backend needs the vocabulary of a published index")
        return encoder_stage(vocabulary, cfg.encoder, analyzer_json, batch_size=cfg.batch_size)
    return STAGES[cfg.backend](cfg)
