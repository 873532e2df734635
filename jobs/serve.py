"""`sira serve`: the online search API (pipelines/serving/serve.py) over one published index version."""

from __future__ import annotations

import ipaddress
import os

from pydantic import ConfigDict, Field, field_validator

from sira.pipelines.tracking.console import console
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.core.defaults import (FOLLOW_POLL_S, SERVE_MAX_CONCURRENT, SERVE_MAX_K, SERVE_MAX_QUERY_CHARS,
                                 ExpansionParams)

# A user waits on an online expansion: a short timeout, one retry, a short backoff (a failed expansion falls back to
# the plain query), unless the backend config sets its own.
ONLINE_PROPOSER_DEFAULTS = {"backend.timeout_s": 10.0, "backend.max_retries": 1, "backend.retry_base_s": 0.2}


class ServeConfig(ExpansionParams):
    model_config = ConfigDict(extra="forbid")

    warehouse: str
    host: str = Field("127.0.0.1", description="interface to bind; loopback unless told otherwise")
    port: int = Field(8080, ge=0, le=65535, description="0: any free port")
    index_version: int | None = Field(None, description="serve this version (pinned); None: the newest published")
    follow: bool | None = Field(None, description="switch to newer published versions of the same kind; "
                                                  "None: unless pinned to an --index-version")
    poll_s: float = Field(FOLLOW_POLL_S, gt=0,
                          description="seconds between checks for a newer version (SIGHUP: at once)")
    preset: str | None = None
    api_token_env: str | None = Field(None, description="environment variable holding the bearer token; "
                                                        "None: no authentication")
    max_query_chars: int = Field(SERVE_MAX_QUERY_CHARS, ge=1, description="longest query accepted")
    max_k: int = Field(SERVE_MAX_K, ge=1, le=100_000, description="deepest k a request may ask")
    max_concurrent: int = Field(SERVE_MAX_CONCURRENT, ge=1, description="searches in flight; more are answered 429")
    backend: BackendConfig | None = Field(None, description="query-side proposer for `expand`; None: no expansion")
    task: str | None = Field(None, description="prompt task; default: the one recorded for the warehouse at ingest")
    ray_address: str | None = None

    @field_validator("backend")
    @classmethod
    def _online(cls, backend: BackendConfig | None) -> BackendConfig | None:
        if backend is None:
            return None
        unset = {k.split(".")[1]: v for k, v in ONLINE_PROPOSER_DEFAULTS.items()
                 if k.split(".")[1] not in backend.model_fields_set}
        return backend.model_copy(update=unset)

    @property
    def following(self) -> bool:
        return self.index_version is None if self.follow is None else self.follow

    def api_token(self) -> str | None:
        if self.api_token_env is None:
            return None
        token = os.environ.get(self.api_token_env, "").strip()
        if not token:
            raise ValueError(f"--api-token-env {self.api_token_env}: that environment variable is not set or empty")
        return token


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def run(cfg: ServeConfig) -> None:
    from sira.pipelines.serving.serve import Limits, SearchService, build_app, serve_forever
    from sira.pipelines.storage.warehouse_info import warehouse_task

    limits = Limits(cfg.max_query_chars, cfg.max_k, cfg.max_concurrent, cfg.api_token())
    task = warehouse_task(cfg.warehouse, cfg.task)
    service = SearchService.start(cfg.warehouse, cfg.index_version, cfg.preset, cfg.backend, task, cfg.w,
                                  cfg.tau, cfg.ray_address, follow=cfg.following)
    m = service.manifest
    if limits.api_token is None and not _is_loopback(cfg.host):
        console.log(f"[yellow]warning:[/yellow] binding {cfg.host} without --api-token-env: anyone who reaches "
                    "this port can search")
    expansion = f"expansion {service.proposer.model} ({task})" if service.proposer else "no expansion backend"
    try:
        serve_forever(build_app(service, limits, cfg.poll_s), cfg.host, cfg.port, on_ready=lambda url: console.log(
            f"serving index v{m['index_version']} ({m['preset']}, {m['num_docs']} docs, {m['num_shards']} shards, "
            f"{expansion}{', following newer versions' if service.follow else ''}) on {url}"))
    finally:
        service.stop_actors()
