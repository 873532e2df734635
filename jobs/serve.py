"""`sira serve`: the online search API (pipelines/serving/serve.py) over one published index version; its config is
in sira.pipelines.serving.config."""

from __future__ import annotations

from sira.pipelines.serving.config import ONLINE_PROPOSER_DEFAULTS, ServeConfig, is_loopback  # noqa: F401
from sira.pipelines.tracking.console import console


def run(cfg: ServeConfig) -> None:
    from sira.pipelines.serving.serve import Limits, SearchService, build_app, serve_forever
    from sira.pipelines.storage.warehouse_info import warehouse_task

    limits = Limits(cfg.max_query_chars, cfg.max_k, cfg.max_concurrent, cfg.api_token())
    task = warehouse_task(cfg.warehouse, cfg.task)
    service = SearchService.start(cfg.warehouse, cfg.index_version, cfg.preset, cfg.backend, task, cfg.w,
                                  cfg.tau, cfg.ray_address, follow=cfg.following)
    m = service.manifest
    if limits.api_token is None and not is_loopback(cfg.host):
        console.log(f"[yellow]warning:[/yellow] binding {cfg.host} without --api-token-env: anyone who reaches "
                    "this port can search")
    expansion = f"expansion {service.proposer.model} ({task})" if service.proposer else "no expansion backend"
    try:
        serve_forever(build_app(service, limits, cfg.poll_s), cfg.host, cfg.port, on_ready=lambda url: console.log(
            f"serving index v{m['index_version']} ({m['preset']}, {m['num_docs']} docs, {m['num_shards']} shards, "
            f"{expansion}{', following newer versions' if service.follow else ''}) on {url}"))
    finally:
        service.stop_actors()
