"""The serving commands' configs: `sira serve`'s (where it listens, its limits, the index version it serves and
whether it follows newer ones, the online proposer with the defaults a waiting user needs) and `sira search`'s.
Light (no scorer, no engine), so the command line loads them at start."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from pydantic import ConfigDict, Field, field_validator, model_validator

from sira.core.defaults import (FOLLOW_POLL_S, SEARCH_K, SERVE_MAX_CONCURRENT, SERVE_MAX_K, SERVE_MAX_QUERY_CHARS,
                                 ExpansionParams)
from sira.pipelines.enrichment.backend_config import BackendConfig

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


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class SearchConfig(ExpansionParams):
    """`sira search`: one query (or a retrieval program) against a published index version."""

    model_config = ConfigDict(extra="forbid")

    warehouse: str
    text: str | None = Field(None, description="the query (or give --program)")
    program: Path | None = Field(None, description="run a retrieval program (JSON file) instead of a query")
    k: int = Field(SEARCH_K, ge=1, le=10_000)
    index_version: int | None = Field(None, description="default: the newest published version")
    preset: str | None = Field(None, description="newest version of this preset")
    must: list[str] = Field(default_factory=list, description="a term or phrase every hit must hold (repeatable)")
    exclude: list[str] = Field(default_factory=list, description="a term or phrase no hit may hold (repeatable)")
    expand: bool = Field(False, description="add the proposer's expected-response vocabulary (DF-validated)")
    backend: BackendConfig = Field(default_factory=BackendConfig, description="--expand: the query-side proposer")
    task: str | None = Field(None, description="--expand: prompt task (default: the one recorded at ingest)")

    @model_validator(mode="after")
    def _one_query(self) -> "SearchConfig":
        if (self.text is None) == (self.program is None):
            raise ValueError("give either a query text or --program FILE")
        return self
