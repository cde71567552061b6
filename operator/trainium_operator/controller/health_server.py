"""The operator's end of the health channel: an HTTP endpoint the training ranks POST their
progress to (profiler/channel_contract.py has the contract, lifecycle/channel_auth.py the
rule deciding who may report what).

Each message's bearer token is reviewed by the API server (TokenReview with our audience) once
per `TOKEN_TTL_SECONDS` per token: a rank sends the same token until the kubelet rotates it, so
4096 ranks reporting every 5 s cost about 70 reviews a minute, not 800 a second. Refusals are
remembered too (for less time), so a flood of bad tokens is not amplified onto the API server.
The newest accepted message of each rank is kept in memory (`ProgressStore`); nothing here
writes to the API server.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from trainium_operator.controller.cache import ClusterCache
from trainium_operator.k8s.reviews import Reviews
from trainium_operator.lifecycle.channel_auth import TokenIdentity, Verdict, authorize
from trainium_operator.lifecycle.profile_on_demand import capture_requests_for
from trainium_operator.lifecycle.progress import RankSample
from trainium_operator.lifecycle.stalls import requests_for
from trainium_operator.profiler import channel_contract as contract
from trainium_operator.profiler.channel_contract import ProgressMessage, parse_message

log = logging.getLogger(__name__)
Key = tuple[str, str]
TOKEN_TTL_SECONDS = 60.0
REFUSED_TOKEN_TTL_SECONDS = 10.0
MAX_CACHED_TOKENS = 50_000


@dataclass(frozen=True, slots=True)
class RankReport:
    message: ProgressMessage
    pod: str
    node: str
    received: datetime
    step_started: datetime | None = None

    def sample(self) -> RankSample:
        m = self.message
        return RankSample(
            rank=m.rank,
            attempt=m.attempt,
            world_size=m.world_size,
            step=m.step,
            step_times_ms=m.step_times_ms,
            received=self.received,
            node=self.node,
            samples=m.samples,
            tokens=m.tokens,
            step_started=self.step_started,
            stacks_dumped=m.stacks_dumped,
            profile_capturing=m.profile_capturing,
            profile_captured=m.profile_captured,
            final=m.final,
            last_checkpoint_step=m.last_checkpoint_step,
        )


def step_started(
    message: ProgressMessage, received: datetime, previous: RankReport | None
) -> datetime:
    """When the rank entered its current step: from the age its message gives (the rank's own
    monotonic clock, so it holds across an operator restart), else the first time the operator
    heard of this step (after a restart: the first message it gets)."""
    if message.step_age_ms is not None:
        return received - timedelta(milliseconds=message.step_age_ms)
    if (
        previous is not None
        and previous.step_started is not None
        and (previous.message.attempt, previous.message.step) == (message.attempt, message.step)
    ):
        return previous.step_started
    return received


def _answered_request(message: ProgressMessage, previous: RankReport | None) -> bool:
    def answers(m: ProgressMessage) -> tuple[str, str, str]:
        return (m.stacks_dumped, m.profile_capturing, m.profile_captured)

    now = answers(message)
    before = answers(previous.message) if previous is not None else ("", "", "")
    return any(new and new != old for new, old in zip(now, before, strict=True))


class ProgressStore:
    """The newest accepted message of every rank, by job (thread-safe)."""

    def __init__(self, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[Key, dict[int, RankReport]] = {}
        self._changed: set[Key] = set()
        self._urgent: set[Key] = set()

    def put(self, message: ProgressMessage, pod: str, node: str) -> None:
        key = (message.namespace, message.job)
        received = self._clock()
        with self._lock:
            ranks = self._jobs.setdefault(key, {})
            attempt = max((r.message.attempt for r in ranks.values()), default=message.attempt)
            # A newer gang replaces the old one's ranks; an old gang's late message is dropped.
            if message.attempt < attempt:
                return
            if message.attempt > attempt:
                ranks.clear()
            previous = ranks.get(message.rank)
            started = step_started(message, received, previous)
            ranks[message.rank] = RankReport(message, pod, node, received, started)
            self._changed.add(key)
            if _answered_request(message, previous):
                # A rank answered a request (stacks, a capture): the job's pass waiting for it
                # runs soon.
                self._urgent.add(key)

    def ranks(self, key: Key) -> dict[int, RankReport]:
        with self._lock:
            return dict(self._jobs.get(key, {}))

    def samples(self, key: Key) -> list[RankSample]:
        return [report.sample() for report in self.ranks(key).values()]

    def take_changed(self) -> list[Key]:
        """The jobs that heard from a rank since the last call."""
        with self._lock:
            changed, self._changed = sorted(self._changed), set()
        return changed

    def take_urgent(self) -> list[Key]:
        """The jobs a rank answered a request of since the last call."""
        with self._lock:
            urgent, self._urgent = sorted(self._urgent), set()
        return urgent

    def forget(self, key: Key) -> None:
        with self._lock:
            self._jobs.pop(key, None)
            self._changed.discard(key)
            self._urgent.discard(key)

    def jobs(self) -> list[Key]:
        with self._lock:
            return list(self._jobs)


class TokenCache:
    """TokenReview answers by token digest, each for a bounded time."""

    def __init__(
        self, review: Callable[[str], TokenIdentity], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._review = review
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[TokenIdentity, float]] = {}
        self.reviews = 0

    def cached(self, token: str) -> bool:
        """Whether `identity(token)` answers without a TokenReview (no blocking call)."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        with self._lock:
            entry = self._entries.get(digest)
            return entry is not None and entry[1] > self._clock()

    def identity(self, token: str) -> TokenIdentity:
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None and entry[1] > now:
                return entry[0]
        identity = self._review(token)
        self.reviews += 1
        ttl = TOKEN_TTL_SECONDS if identity.authenticated else REFUSED_TOKEN_TTL_SECONDS
        with self._lock:
            if len(self._entries) >= MAX_CACHED_TOKENS:
                self._entries = {d: e for d, e in self._entries.items() if e[1] > now}
                if len(self._entries) >= MAX_CACHED_TOKENS:
                    self._entries.clear()
            self._entries[digest] = (identity, now + ttl)
        return identity


def reviewer(reviews: Reviews) -> Callable[[str], TokenIdentity]:
    """A TokenReview for our audience, as the identity channel_auth reads."""

    def review(token: str) -> TokenIdentity:
        result = reviews.review_token(token, (contract.AUDIENCE,))
        if not result.authenticated or result.user is None:
            return TokenIdentity(False, error=result.error)
        return TokenIdentity(
            True,
            username=result.user.name,
            audiences=result.audiences,
            extra=result.user.extra,
        )

    return review


@dataclass
class HealthChannel:
    """What the endpoint needs: the cache to check pods and jobs, the token reviews, the store."""

    cache: ClusterCache
    tokens: TokenCache
    # True once every watch delivered its first LIST: before, a pod missing from the cache is
    # unknown, not absent (a restarted operator must not refuse its ranks: they retry).
    synced: Callable[[], bool] = lambda: True
    store: ProgressStore = field(default_factory=ProgressStore)
    counts: Counter[str] = field(default_factory=Counter)  # accepted / refused / malformed

    def receive(self, token: str, body: bytes) -> tuple[int, Verdict]:
        """(HTTP status, verdict) for one message (blocking: may run a TokenReview)."""
        status, verdict, _ = self._receive(token, body)
        return status, verdict

    def answer(self, token: str, body: bytes) -> tuple[int, bytes]:
        """(HTTP status, reply body) for one message: the verdict, and for an accepted one what
        the operator asks of the rank (its job's status says: a stalled gang's stack request)."""
        status, verdict, message = self._receive(token, body)
        requests: dict[str, Any] = {}
        if message is not None:
            job = self.cache.job((message.namespace, message.job))
            requests = {
                **requests_for(job, message.attempt, message.stacks_dumped),
                **capture_requests_for(job, message.attempt, message.profile_captured),
            }
        return status, contract.reply_json(
            accepted=verdict.accepted, reason=verdict.reason, requests=requests
        )

    def _receive(self, token: str, body: bytes) -> tuple[int, Verdict, ProgressMessage | None]:
        """receive(), and the message when it was accepted."""
        try:
            message = parse_message(body)
        except ValueError as error:
            self.counts["malformed"] += 1
            return 400, Verdict(False, str(error)), None
        if not token:
            self.counts["refused"] += 1
            return 401, Verdict(False, "no bearer token"), None
        try:
            identity = self.tokens.identity(token)
        except Exception as error:  # the API server is unavailable: the rank retries later
            self.counts["unavailable"] += 1
            if getattr(error, "status", None) == 403:
                log.error(
                    "health channel: the operator may not create tokenreviews "
                    "(authentication.k8s.io); every rank is refused until its RBAC allows it"
                )
            else:
                log.info("health channel: token review failed: %r", error)
            return 503, Verdict(False, "the token could not be reviewed now"), None
        pod_name = identity.claim(contract.CLAIM_POD_NAME) or ""
        namespace = identity.service_account_namespace or ""
        pod = self.cache.pod(namespace, pod_name) if pod_name and namespace else None
        job = self.cache.job((message.namespace, message.job))
        verdict = authorize(message, identity, pod, job)
        if not verdict.accepted and identity.authenticated and not self.synced():
            self.counts["unavailable"] += 1
            return 503, Verdict(False, "the operator is starting; retry"), None
        if not verdict.accepted:
            self.counts["refused"] += 1
            log.info(
                "health channel: refused a message for %s/%s: %s",
                message.namespace,
                message.job,
                verdict.reason,
            )
            return (401 if not identity.authenticated else 403), verdict, None
        assert pod is not None
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        self.store.put(message, pod_name, node)
        self.counts["accepted"] += 1
        return 200, verdict, message


def bearer(header: str | None) -> str:
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip()
    return ""


def application(channel: HealthChannel) -> web.Application:
    async def progress(request: web.Request) -> web.Response:
        body = await request.read()
        token = bearer(request.headers.get("Authorization"))
        if token and channel.tokens.cached(token):
            # The common case (a token seen in the last minute): microseconds of CPU, no I/O,
            # so no thread hop.
            status, reply = channel.answer(token, body)
        else:
            status, reply = await asyncio.to_thread(channel.answer, token, body)
        return web.Response(status=status, body=reply, content_type="application/json")

    app = web.Application(client_max_size=contract.MAX_BODY_BYTES)
    app.router.add_post(contract.PATH, progress)
    return app


async def serve(channel: HealthChannel, host: str, port: int) -> None:
    """Serves the endpoint until cancelled."""
    runner = web.AppRunner(application(channel), access_log=None)  # 4096 ranks: no line each
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("health channel listening on %s:%d%s", host, port, contract.PATH)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
