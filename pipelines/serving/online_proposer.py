"""The query-side proposer of the online path (`sira serve`): one query in, expansion phrases out.

It looks in the Delta `expansions` cache first (the rows `sira query` / `sira eval` wrote for the same model
and prompt version, read once when the server starts), and on a miss asks the backend:

- `openai`: one chat-completions request through ErrorTolerantSession (its timeouts, retries and backoff);
- `local`:  an in-process LocalLLMActor, loaded once, on one worker thread (llama.cpp serves one prompt at a
  time) so the event loop keeps answering other requests while it generates;
- `encoder`: the encoder proposer over the served index's vocabulary, on the same kind of worker thread.

Online answers are not written back to Delta: a request must not wait on a table commit, and several servers
would race on the MERGE. The bulk jobs fill the cache; the server only reads it.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.enrichment.llm_backends import (ErrorTolerantSession, chat_messages, openai_postprocess,
                                                   openai_request)
from sira.pipelines.enrichment.expansion_cache import QUERY_MAX_N, cached_expansions, query_hash
from sira.pipelines.storage.warehouse_info import warehouse_task
from sira.core.enrichment import load_template, parse_phrases
from sira.core.proposers import Proposal

ONLINE_BACKENDS = ("openai", "local", "encoder")


@dataclass(frozen=True)
class OnlineProposal(Proposal):
    """A proposal (an error means the backend failed or its output was unusable: no phrases) and where it came
    from."""

    source: str = "backend"  # cache | backend


class OnlineProposer:
    """A TermProposer (sira.core.proposers) one query at a time. In a server: start() inside its event loop, then
    `await ask(query)` per request, close() when done. Outside one, `propose(texts)` does all three (`sira search
    --expand`)."""

    def __init__(self, warehouse: str, backend: BackendConfig, task: str | None, manifest: dict | None = None):
        """`task`: the prompt task; None: the warehouse's (`warehouse_task`)."""
        if backend.backend not in ONLINE_BACKENDS:
            raise ValueError(f"online expansion needs backend openai, local or encoder, not {backend.backend!r} "
                             "(vllm runs as a batch dataflow: use it through `sira query`)")
        if backend.backend == "encoder" and manifest is None:
            raise ValueError("the encoder proposer needs the served index (its vocabulary)")
        self.backend = backend
        self.warehouse, self.manifest = warehouse, manifest
        self.template = load_template("query", warehouse_task(warehouse, task))
        self.model = backend.model_id()
        self.prompt_version = backend.proposal_version(self.template.version)
        self.default_w = backend.resolve_w(None)
        self.cache = cached_expansions(warehouse, self.model, self.prompt_version)
        self._session: ErrorTolerantSession | None = None
        self._llm = None
        self._worker: ThreadPoolExecutor | None = None

    @property
    def name(self) -> str:  # TermProposer's names for the model and the prompt version
        return self.model

    @property
    def version(self) -> str:
        return self.prompt_version

    async def start(self) -> None:
        if self.backend.backend == "openai":
            cfg = self.backend
            self._session = await ErrorTolerantSession(cfg.timeout_s, cfg.max_retries, cfg.retry_base_s).__aenter__()
        elif self.backend.backend == "encoder":
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sira-encoder")
            self._llm = await asyncio.get_running_loop().run_in_executor(self._worker, self._load_encoder)
        else:
            from sira.pipelines.enrichment.local_llm import LocalLLMActor

            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sira-local-llm")
            self._llm = await asyncio.get_running_loop().run_in_executor(
                self._worker, LocalLLMActor, self.backend.model_dump_json())

    def _load_encoder(self):
        from sira.pipelines.enrichment.encoder_proposer import EncoderProposer, load_vocabulary
        from sira.core.analysis import Analyzer, AnalyzerConfig

        vocabulary = load_vocabulary(self.warehouse, self.manifest, self.backend.encoder)
        analyzer = Analyzer(AnalyzerConfig.model_validate_json(self.manifest["analyzer_json"]))
        return EncoderProposer(vocabulary, self.backend.encoder, analyzer)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.__aexit__(None, None, None)
            self._session = None
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None

    def propose(self, texts: Sequence[str]) -> list[OnlineProposal]:
        """Each text's proposal, outside a running event loop (in one, on a thread of its own: a notebook)."""
        async def ask_all() -> list[OnlineProposal]:
            await self.start()
            try:
                return [await self.ask(text) for text in texts]
            finally:
                await self.close()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(ask_all())
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, ask_all()).result()

    async def ask(self, query: str) -> OnlineProposal:
        cached = self.cache.get(query_hash(query))
        if cached is not None:
            return OnlineProposal(list(cached.phrases), list(cached.weights), source="cache")
        if self.backend.backend == "encoder":
            try:
                p = (await asyncio.get_running_loop().run_in_executor(self._worker, self._llm.propose, [query]))[0]
            except Exception as exc:  # degrade to the plain query, as a failed LLM call does
                return OnlineProposal([], [], f"encoder: {type(exc).__name__}: {exc}")
            return OnlineProposal(p.phrases, p.weights, p.error)
        prompt = self.template.render(query, QUERY_MAX_N)
        if self.backend.backend == "openai":
            row = await self._ask_openai(prompt)
        else:
            row = await asyncio.get_running_loop().run_in_executor(self._worker, self._llm.generate, prompt)
        if row.get("error"):
            return OnlineProposal([], [], row["error"])
        phrases, error = parse_phrases(row.get("raw_output"), max_words=QUERY_MAX_N)
        return OnlineProposal(phrases, [1.0] * len(phrases), error)

    async def _ask_openai(self, prompt: str) -> dict:
        cfg = self.backend
        headers, body = openai_request(cfg)  # the same request the batch HTTP stage sends, for one prompt
        body["messages"] = chat_messages(prompt)
        return openai_postprocess(await self._session.request(cfg.base_url.rstrip("/") + "/chat/completions", headers,
                                                              json.dumps(body)))


def propose_once(warehouse: str, backend: BackendConfig, task: str, query: str,
                 manifest: dict | None = None) -> OnlineProposal:
    """One expansion outside a server: start, ask, close."""
    return OnlineProposer(warehouse, backend, task, manifest).propose([query])[0]
