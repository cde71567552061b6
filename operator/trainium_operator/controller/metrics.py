"""The operator's Prometheus /metrics: its counters as text, and the server that serves them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from trainium_operator.controller.health_server import HealthChannel
from trainium_operator.k8s.client import RequestCounter


@dataclass
class PassCounts:
    """Reconcile passes run, and those that raised (the /metrics and the queue probe)."""

    reconciles: int = 0
    errors: int = 0


def metrics_text(
    counts: PassCounts, known_jobs: int, requests: RequestCounter, health: HealthChannel | None
) -> str:
    """Prometheus text exposition of the operator's counters."""
    lines = [
        "# HELP trainium_operator_reconciles_total Reconcile passes run.",
        "# TYPE trainium_operator_reconciles_total counter",
        f"trainium_operator_reconciles_total {counts.reconciles}",
        "# HELP trainium_operator_reconcile_errors_total Reconcile passes that raised.",
        "# TYPE trainium_operator_reconcile_errors_total counter",
        f"trainium_operator_reconcile_errors_total {counts.errors}",
        "# HELP trainium_operator_known_jobs TrainingJobs the operator watches.",
        "# TYPE trainium_operator_known_jobs gauge",
        f"trainium_operator_known_jobs {known_jobs}",
        "# HELP trainium_operator_api_requests_total Kubernetes API requests by verb and resource.",
        "# TYPE trainium_operator_api_requests_total counter",
    ]
    for key, value in sorted(dict(requests.counts).items()):
        verb, resource = key.split(" ", 1)
        lines.append(
            f'trainium_operator_api_requests_total{{verb="{verb}",resource="{resource}"}} {value}'
        )
    if health is not None:
        lines += [
            "# HELP trainium_operator_health_messages_total Health-channel messages by outcome.",
            "# TYPE trainium_operator_health_messages_total counter",
        ]
        for outcome, value in sorted(health.counted().items()):
            lines.append(f'trainium_operator_health_messages_total{{outcome="{outcome}"}} {value}')
        tokens = health.tokens
        accepted, refused = tokens.sizes()
        lines += [
            "# HELP trainium_operator_health_token_reviews_total Health-channel tokens by "
            "what decided them: a TokenReview, the pre-filter (none needed), or the per-pod "
            "review limit (none allowed).",
            "# TYPE trainium_operator_health_token_reviews_total counter",
            f'trainium_operator_health_token_reviews_total{{decided_by="review"}} {tokens.reviews}',
            f'trainium_operator_health_token_reviews_total{{decided_by="prefilter"}} '
            f"{tokens.prefiltered}",
            f'trainium_operator_health_token_reviews_total{{decided_by="review_limit"}} '
            f"{tokens.review_limited}",
            "# HELP trainium_operator_health_cached_tokens Health-channel token reviews "
            "remembered, by verdict.",
            "# TYPE trainium_operator_health_cached_tokens gauge",
            f'trainium_operator_health_cached_tokens{{verdict="accepted"}} {accepted}',
            f'trainium_operator_health_cached_tokens{{verdict="refused"}} {refused}',
            "# HELP trainium_operator_health_stored_ranks Ranks whose newest message is kept.",
            "# TYPE trainium_operator_health_stored_ranks gauge",
            f"trainium_operator_health_stored_ranks {health.store.size()}",
        ]
    return "\n".join(lines) + "\n"


async def serve(text: Callable[[], str], port: int) -> None:
    """Serves `text()` at /metrics on `port` until cancelled."""

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=text(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "0.0.0.0", port)
    await site.start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
