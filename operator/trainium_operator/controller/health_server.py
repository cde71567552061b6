"""The operator's end of the health channel: an HTTP endpoint the training ranks POST their
progress to (contract/channel.py has the contract, controller/channel_auth.py the
rule deciding who may report what, controller/channel_limits.py how much).

It runs on its own thread and event loop, never kopf's: a flood of messages slows the channel,
not the reconcile passes. A message is answered in this order, the cheapest refusal first:
its body's shape (400), the bearer token (a cached review, else the JWT pre-filter, else one
TokenReview on a small executor of its own, single-flight per token and rate-limited per
claimed pod: 401/429/503), the pod and job it names (403), the job's shape (worldSize and the
sending node's ranks from the spec: 403), then the pod's and the job's token buckets (429).

Each token's review is remembered for `TOKEN_TTL_SECONDS`: a pod sends the same token until the
kubelet rotates it. Refusals are remembered in a map of their own, so a flood of bad tokens
only ever evicts other bad tokens, never a good pod's review. The newest accepted message of
each rank is kept in memory (`ProgressStore`, at most the job's world size of ranks per job);
nothing here writes to the API server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from trainium_operator.contract import channel as contract
from trainium_operator.contract.channel import ProgressMessage, parse_messages
from trainium_operator.controller.cache import ClusterCache
from trainium_operator.controller.channel_auth import (
    JobShape,
    TokenIdentity,
    Verdict,
    authorize,
    check_shape,
    claim,
    job_shape,
    service_account_namespace,
)
from trainium_operator.controller.channel_limits import (
    Limiter,
    PodClaims,
    job_rate,
    pod_rate,
    token_claims,
)
from trainium_operator.k8s.reviews import Reviews
from trainium_operator.lifecycle.parse import parse_job
from trainium_operator.lifecycle.policies.on_demand_profile import capture_requests_for
from trainium_operator.lifecycle.policies.stalls import requests_for
from trainium_operator.lifecycle.ranks import RankSample

log = logging.getLogger(__name__)
Key = tuple[str, str]
TOKEN_TTL_SECONDS = 60.0
REFUSED_TOKEN_TTL_SECONDS = 10.0
MAX_CACHED_TOKENS = 50_000  # accepted reviews
MAX_REFUSED_TOKENS = 10_000  # refused reviews: a flood cycles these only
MAX_TOKENS_PER_POD = 4  # the kubelet's current and previous token, and room
# TokenReviews per claimed pod: a pod's ranks share one token per kubelet rotation.
REVIEWS_PER_POD_PER_SECOND = 0.2
REVIEW_BURST_PER_POD = 4.0
REVIEW_WORKERS = 4  # threads of their own: reconcile passes never wait behind a review
MAX_PENDING_REVIEWS = 64  # past it a message needing a review is answered 503 at once
REVIEW_TIMEOUT_SECONDS = 5.0
# The most stored ranks of any job, whatever its spec: 512 nodes x 128 processes.
MAX_STORED_RANKS = 512 * contract.MAX_RANKS_PER_MESSAGE
MAX_CONNECTIONS = 512
CONNECTION_SECONDS = 10.0  # a connection's whole life: headers, body and answer (slow-loris)
KEEPALIVE_SECONDS = 5.0
BODY_SECONDS = 5.0


class ReviewLimitedError(Exception):
    """Too many TokenReviews for one claimed pod: the rank retries later (429)."""


def rank_sample(
    message: ProgressMessage, node: str, received: datetime, started: datetime | None
) -> RankSample:
    """What the store keeps of a rank's message: built once as it arrives, so a pass reads
    the job's ranks without converting every rank's message again."""
    return RankSample(
        rank=message.rank,
        attempt=message.attempt,
        world_size=message.world_size,
        step=message.step,
        step_times_ms=message.step_times_ms,
        received=received,
        node=node,
        samples=message.samples,
        tokens=message.tokens,
        step_started=started,
        stacks_dumped=message.stacks_dumped,
        profile_capturing=message.profile_capturing,
        profile_captured=message.profile_captured,
        final=message.final,
        last_checkpoint_step=message.last_checkpoint_step,
    )


def step_started(
    message: ProgressMessage, received: datetime, previous: RankSample | None
) -> datetime:
    """When the rank entered its current step: from the age its message gives (the rank's own
    monotonic clock, so it holds across an operator restart), else the first time the operator
    heard of this step (after a restart: the first message it gets)."""
    if message.step_age_ms is not None:
        return received - timedelta(milliseconds=message.step_age_ms)
    if (
        previous is not None
        and previous.step_started is not None
        and (previous.attempt, previous.step) == (message.attempt, message.step)
    ):
        return previous.step_started
    return received


def _answered_request(message: ProgressMessage, previous: RankSample | None) -> bool:
    def answers(m: ProgressMessage | RankSample) -> tuple[str, str, str]:
        return (m.stacks_dumped, m.profile_capturing, m.profile_captured)

    now = answers(message)
    before = answers(previous) if previous is not None else ("", "", "")
    return any(new and new != old for new, old in zip(now, before, strict=True))


class ProgressStore:
    """The newest accepted message of every rank, by job (thread-safe). A job keeps at most
    the ranks its caller allows (the job's world size), never more than MAX_STORED_RANKS."""

    def __init__(self, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[Key, dict[int, RankSample]] = {}
        self._changed: set[Key] = set()
        self._urgent: set[Key] = set()
        # Since when this store keeps what the ranks send (its start, or the replica's latest
        # change of role): until every rank reported again, it knows only some of them.
        self.since = clock()

    def restart(self) -> None:
        """Forgets every rank's message and starts keeping them anew (a change of role: what a
        replica heard before it acted, or while it acted, is nobody's now)."""
        with self._lock:
            self._jobs.clear()
            self._changed.clear()
            self._urgent.clear()
            self.since = self._clock()

    def put(self, message: ProgressMessage, node: str, max_ranks: int = MAX_STORED_RANKS) -> int:
        """Stores one rank's message; how many were stored (0 or 1)."""
        return self.put_many((message,), node, max_ranks)

    def put_many(
        self,
        messages: Sequence[ProgressMessage],
        node: str,
        max_ranks: int = MAX_STORED_RANKS,
    ) -> int:
        """Stores the ranks of one message (one job, one attempt); how many were stored. A rank
        new to a job that already keeps `max_ranks` ranks is dropped."""
        if not messages:
            return 0
        first = messages[0]
        key = (first.namespace, first.job)
        limit = min(max_ranks, MAX_STORED_RANKS)
        received = self._clock()
        stored = 0
        with self._lock:
            ranks = self._jobs.setdefault(key, {})
            attempt = max((r.attempt for r in ranks.values()), default=first.attempt)
            # A newer gang replaces the old one's ranks; an old gang's late message is dropped.
            if first.attempt < attempt:
                return 0
            if first.attempt > attempt:
                ranks.clear()
            for message in messages:
                previous = ranks.get(message.rank)
                if previous is None and len(ranks) >= limit:
                    continue
                started = step_started(message, received, previous)
                ranks[message.rank] = rank_sample(message, node, received, started)
                stored += 1
                if _answered_request(message, previous):
                    # A rank answered a request (stacks, a capture): the job's pass waiting
                    # for it runs soon.
                    self._urgent.add(key)
            if stored:
                self._changed.add(key)
        return stored

    def ranks(self, key: Key) -> dict[int, RankSample]:
        with self._lock:
            return dict(self._jobs.get(key, {}))

    def samples(self, key: Key) -> list[RankSample]:
        with self._lock:
            return list(self._jobs.get(key, {}).values())

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

    def size(self) -> int:
        """Stored ranks of all jobs."""
        with self._lock:
            return sum(len(ranks) for ranks in self._jobs.values())


@dataclass(slots=True)
class _Flight:
    """One TokenReview in progress, which every concurrent request with the token waits for."""

    done: threading.Event = field(default_factory=threading.Event)
    identity: TokenIdentity | None = None
    error: BaseException | None = None


class TokenCache:
    """TokenReview answers by token digest, each for a bounded time.

    Accepted and refused answers live in separate maps, each evicting its own oldest first:
    a flood of bad tokens never evicts a good pod's review. A pod keeps at most
    MAX_TOKENS_PER_POD accepted tokens (a tenant minting tokens for its own pod cycles its own
    entries). Before a review, the token's claims are pre-filtered (`token_claims`: our
    audience, not expired, bound to a pod) and the pod checked against the watch cache
    (`pod_known`), and reviews are rate-limited per claimed pod; concurrent requests with one
    token share one review."""

    def __init__(
        self,
        review: Callable[[str], TokenIdentity],
        clock: Callable[[], float] = time.monotonic,
        *,
        pod_known: Callable[[PodClaims], bool | None] = lambda _claims: None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._review = review
        self._clock = clock
        self._wall_clock = wall_clock
        self.pod_known = pod_known
        self._lock = threading.Lock()
        self._accepted: OrderedDict[str, tuple[TokenIdentity, float, str]] = OrderedDict()
        self._refused: OrderedDict[str, tuple[TokenIdentity, float]] = OrderedDict()
        self._pod_tokens: dict[str, deque[str]] = {}
        self._flights: dict[str, _Flight] = {}
        self._review_limits = Limiter()
        self.reviews = 0
        self.prefiltered = 0
        self.review_limited = 0

    @staticmethod
    def _digest(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def cached(self, token: str) -> bool:
        """Whether `identity(token)` answers without a TokenReview (no blocking call)."""
        return self.known(token, count=False) is not None

    def known(self, token: str, *, count: bool = True) -> TokenIdentity | None:
        """The answer without a TokenReview (a cached review, or the pre-filter's refusal), or
        None when only a review can tell."""
        digest = self._digest(token)
        now = self._clock()
        with self._lock:
            entry = self._accepted.get(digest)
            if entry is not None and entry[1] > now:
                return entry[0]
            refused = self._refused.get(digest)
            if refused is not None and refused[1] > now:
                return refused[0]
        claims = token_claims(token, self._wall_clock())
        if isinstance(claims, str):
            self.prefiltered += count
            return TokenIdentity(False, error=claims)
        if self.pod_known(claims) is False:
            self.prefiltered += count
            return TokenIdentity(
                False,
                error=f"the token's pod {claims.namespace}/{claims.pod_name} is not running",
            )
        return None

    def identity(self, token: str) -> TokenIdentity:
        """The token's identity (blocking: may run a TokenReview). ReviewLimitedError: too many
        reviews for the pod the token claims."""
        known = self.known(token)
        if known is not None:
            return known
        digest = self._digest(token)
        with self._lock:
            flight = self._flights.get(digest)
            leader = flight is None
            if flight is None:
                claims = token_claims(token, self._wall_clock())
                assert isinstance(claims, PodClaims)  # known() would have refused it
                if not self._review_limits.take(
                    claims.pod_uid,
                    1.0,
                    REVIEWS_PER_POD_PER_SECOND,
                    REVIEW_BURST_PER_POD,
                    self._clock(),
                ):
                    self.review_limited += 1
                    raise ReviewLimitedError(f"too many token reviews for pod {claims.pod_name}")
                flight = self._flights[digest] = _Flight()
        if not leader:
            if not flight.done.wait(REVIEW_TIMEOUT_SECONDS) or flight.identity is None:
                raise flight.error or TimeoutError("the token review did not answer in time")
            return flight.identity
        try:
            identity = self._review(token)
            self.reviews += 1
            flight.identity = identity
            self._remember(digest, identity)
            return identity
        except BaseException as error:
            flight.error = error
            raise
        finally:
            flight.done.set()
            with self._lock:
                self._flights.pop(digest, None)

    def _remember(self, digest: str, identity: TokenIdentity) -> None:
        now = self._clock()
        pod_uid = claim(identity, contract.CLAIM_POD_UID) or ""
        with self._lock:
            if not identity.authenticated:
                self._refused[digest] = (identity, now + REFUSED_TOKEN_TTL_SECONDS)
                self._refused.move_to_end(digest)
                while len(self._refused) > MAX_REFUSED_TOKENS:
                    self._refused.popitem(last=False)
                return
            self._accepted[digest] = (identity, now + TOKEN_TTL_SECONDS, pod_uid)
            self._accepted.move_to_end(digest)
            tokens = self._pod_tokens.setdefault(pod_uid, deque())
            if digest not in tokens:
                tokens.append(digest)
            while len(tokens) > MAX_TOKENS_PER_POD:
                self._accepted.pop(tokens.popleft(), None)
            while len(self._accepted) > MAX_CACHED_TOKENS:
                _, (_, _, uid) = self._accepted.popitem(last=False)
                self._forget_pod_token(uid)
            # Oldest first (one TTL for all): drop the expired ones at the front.
            while self._accepted:
                oldest, (_, expiry, uid) = next(iter(self._accepted.items()))
                if expiry > now:
                    break
                del self._accepted[oldest]
                self._forget_pod_token(uid)

    def _forget_pod_token(self, pod_uid: str) -> None:
        tokens = self._pod_tokens.get(pod_uid)
        if tokens is None:
            return
        for digest in list(tokens):
            if digest not in self._accepted:
                tokens.remove(digest)
        if not tokens:
            del self._pod_tokens[pod_uid]

    def sizes(self) -> tuple[int, int]:
        """(accepted, refused) reviews remembered."""
        with self._lock:
            return len(self._accepted), len(self._refused)


def reviewer(reviews: Reviews) -> Callable[[str], TokenIdentity]:
    """A TokenReview for our audience, as the identity channel_auth reads."""

    def review(token: str) -> TokenIdentity:
        return reviews.review_token(token, (contract.AUDIENCE,))

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
    # accepted / refused / malformed / unavailable / rate_limited / review_limited / ...
    counts: Counter[str] = field(default_factory=Counter)
    clock: Callable[[], float] = time.monotonic
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _shapes: dict[Key, tuple[tuple[str, int], JobShape | None]] = field(default_factory=dict)
    _pod_limits: Limiter = field(default_factory=Limiter)
    _job_limits: Limiter = field(default_factory=Limiter)
    # Whether this replica keeps the ranks' messages: False while it stands by (another replica
    # writes status), when each message is answered 503 with Retry-After (controller.health_role).
    accepting: bool = True

    def __post_init__(self) -> None:
        # The pre-filter checks a token's claimed pod against this channel's watch cache.
        self.tokens.pod_known = self.pod_known

    def set_accepting(self, accepting: bool) -> None:
        """A change of role: the store starts empty either way."""
        self.accepting = accepting
        self.store.restart()

    def count(self, outcome: str, amount: int = 1) -> None:
        with self._lock:
            self.counts[outcome] += amount

    def counted(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def receive(self, token: str, body: bytes) -> tuple[int, Verdict]:
        """(HTTP status, verdict) for one message (blocking: may run a TokenReview)."""
        status, verdict, _ = self._receive(token, body)
        return status, verdict

    @staticmethod
    def _shared(values: set[str]) -> str:
        """The answer every rank of a message gave, or "" (a request goes to them all again;
        each rank answers a request once)."""
        return next(iter(values)) if len(values) == 1 else ""

    def answer(self, token: str, body: bytes) -> tuple[int, bytes]:
        """(HTTP status, reply body) for one message: the verdict, and for an accepted one what
        the operator asks of the rank (its job's status says: a stalled gang's stack request)."""
        status, verdict, messages = self._receive(token, body)
        requests: dict[str, Any] = {}
        if messages:
            first = messages[0]
            job = self.cache.job((first.namespace, first.job))
            dumped = self._shared({m.stacks_dumped for m in messages})
            captured = self._shared({m.profile_captured for m in messages})
            requests = {
                **requests_for(job, first.attempt, dumped),
                **capture_requests_for(job, first.attempt, captured),
            }
        return status, contract.reply_json(
            accepted=verdict.accepted, reason=verdict.reason, requests=requests
        )

    def needs_review(self, token: str) -> bool:
        """Whether answering a message with this token may block on a TokenReview."""
        return (
            bool(token) and len(token) <= contract.MAX_TOKEN_BYTES and not self.tokens.cached(token)
        )

    def pod_known(self, claims: PodClaims) -> bool | None:
        """Whether the token's claimed pod is in the watch cache with that uid (None: the
        cache is not filled yet, so it cannot say)."""
        if not self.synced():
            return None
        pod = self.cache.pod(claims.namespace, claims.pod_name)
        return pod is not None and (pod.get("metadata") or {}).get("uid") == claims.pod_uid

    def shape(self, job: dict[str, Any]) -> JobShape | None:
        """The job's shape from its spec (parsed once per uid and generation)."""
        meta = job.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        version = (str(meta.get("uid") or ""), int(meta.get("generation") or 0))
        with self._lock:
            cached = self._shapes.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        parsed = parse_job(job)
        shape = None if isinstance(parsed, list) else job_shape(parsed.spec)
        with self._lock:
            if len(self._shapes) >= MAX_STORED_RANKS:
                self._shapes.clear()
            self._shapes[key] = (version, shape)
        return shape

    def forget(self, key: Key) -> None:
        self.store.forget(key)
        with self._lock:
            self._shapes.pop(key, None)

    def _refused(
        self, status: int, reason: str, outcome: str = "refused"
    ) -> tuple[int, Verdict, tuple[ProgressMessage, ...]]:
        self.count(outcome)
        return status, Verdict(False, reason), ()

    def _receive(self, token: str, body: bytes) -> tuple[int, Verdict, tuple[ProgressMessage, ...]]:
        """receive(), and the message's ranks when it was accepted."""
        try:
            messages = parse_messages(body)
        except ValueError as error:
            return self._refused(400, str(error), "malformed")
        if not token:
            return self._refused(401, "no bearer token")
        if len(token) > contract.MAX_TOKEN_BYTES:
            return self._refused(401, "the bearer token is too long")
        try:
            identity = self.tokens.identity(token)
        except ReviewLimitedError as error:
            return self._refused(429, str(error), "review_limited")
        except Exception as error:  # the API server is unavailable: the rank retries later
            if getattr(error, "status", None) == 403:
                log.error(
                    "health channel: the operator may not create tokenreviews "
                    "(authentication.k8s.io); every rank is refused until its RBAC allows it"
                )
            else:
                log.info("health channel: token review failed: %r", error)
            return self._refused(503, "the token could not be reviewed now", "unavailable")
        first = messages[0]
        pod_name = claim(identity, contract.CLAIM_POD_NAME) or ""
        namespace = service_account_namespace(identity) or ""
        pod = self.cache.pod(namespace, pod_name) if pod_name and namespace else None
        job = self.cache.job((first.namespace, first.job))
        verdict = authorize(first, identity, pod, job)
        if not verdict.accepted and identity.authenticated and not self.synced():
            return self._refused(503, "the operator is starting; retry", "unavailable")
        if verdict.accepted:
            assert job is not None
            shape = self.shape(job)
            verdict = (
                Verdict(False, f"job {first.job}'s spec is not valid")
                if shape is None
                else check_shape(messages, shape, first.node_rank)
            )
        if not verdict.accepted:
            log.info(
                "health channel: refused a message for %s/%s: %s",
                first.namespace,
                first.job,
                verdict.reason,
            )
            self.count("refused")
            return (401 if not identity.authenticated else 403), verdict, ()
        assert pod is not None
        assert shape is not None
        limited = self._rate_limited(pod, (first.namespace, first.job), shape, len(messages))
        if limited:
            return self._refused(429, limited, "rate_limited")
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        self.store.put_many(messages, node, shape.world_size)
        self.count("accepted")
        return 200, verdict, messages

    def _rate_limited(self, pod: dict[str, Any], job: Key, shape: JobShape, cost: int) -> str:
        """Why the message is over its pod's or its job's budget, or "" when it is not."""
        pod_uid = str((pod.get("metadata") or {}).get("uid") or "")
        now = self.clock()
        with self._lock:
            if not self._pod_limits.take(pod_uid, cost, *pod_rate(shape), now):
                return (
                    f"pod over its budget: {shape.processes_per_node} rank reports per "
                    f"{shape.rate_interval_s:g} s"
                )
            if not self._job_limits.take(job, cost, *job_rate(shape), now):
                return (
                    f"job over its budget: {shape.world_size} rank reports per "
                    f"{shape.rate_interval_s:g} s"
                )
        return ""


def bearer(header: str | None) -> str:
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip()
    return ""


class BoundedServer(web.Server):
    """aiohttp's low-level server with a cap on open connections and on each connection's
    life (headers, body and answer within CONNECTION_SECONDS: a slow sender is cut off)."""

    def __init__(
        self,
        handler: Any,
        *,
        max_connections: int,
        lifetime: float,
        on_refused: Callable[[], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self._max_connections = max_connections
        self._lifetime = lifetime
        self._on_refused = on_refused
        self._deadlines: dict[RequestHandler, asyncio.TimerHandle] = {}

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if len(self._deadlines) >= self._max_connections:
            self._on_refused()
            transport.abort()
            return
        loop = asyncio.get_running_loop()
        self._deadlines[handler] = loop.call_later(self._lifetime, transport.abort)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        deadline = self._deadlines.pop(handler, None)
        if deadline is not None:
            deadline.cancel()
        super().connection_lost(handler, exc)

    @property
    def open_connections(self) -> int:
        return len(self._deadlines)


async def _read_body(request: web.BaseRequest, limit: int) -> bytes | None:
    """The request's body, or None when it is larger than `limit`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.read(limit + 1)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)


def handler(
    channel: HealthChannel, reviews: concurrent.futures.Executor
) -> Callable[[web.BaseRequest], Any]:
    """The endpoint's request handler: cheap answers inline on the channel's loop, those that
    need a TokenReview on `reviews` (at most MAX_PENDING_REVIEWS waiting)."""
    pending = 0

    def reply(status: int, reason: str) -> web.Response:
        body = contract.reply_json(accepted=False, reason=reason)
        return web.Response(status=status, body=body, content_type="application/json")

    async def progress(request: web.BaseRequest) -> web.StreamResponse:
        nonlocal pending
        if request.path != contract.PATH:
            return reply(404, "not found")
        if request.method != "POST":
            return reply(405, "POST only")
        if not channel.accepting:
            # A standby replica, still routed to until the Service's endpoints catch up: the
            # rank retries within a second (profiler/channel.py), by then at the acting one.
            channel.count("standby")
            response = reply(503, "this operator replica stands by; retry")
            response.headers["Retry-After"] = str(contract.RETRY_AFTER_S)
            return response
        length = request.content_length
        if length is not None and length > contract.MAX_BATCH_BODY_BYTES:
            channel.count("malformed")
            return reply(413, f"the message is larger than {contract.MAX_BATCH_BODY_BYTES} bytes")
        try:
            body = await asyncio.wait_for(
                _read_body(request, contract.MAX_BATCH_BODY_BYTES), BODY_SECONDS
            )
        except TimeoutError:
            channel.count("malformed")
            return reply(408, "the message took too long to arrive")
        except (ConnectionResetError, HttpProcessingError):
            # The sender went away mid-message (a rank killed, or one that never meant to
            # finish): nothing to answer, and not the operator's error to log.
            channel.count("cut_off")
            return reply(400, "the message was cut off")
        if body is None:
            channel.count("malformed")
            return reply(413, f"the message is larger than {contract.MAX_BATCH_BODY_BYTES} bytes")
        token = bearer(request.headers.get("Authorization"))
        if not channel.needs_review(token):
            # The common case (a token seen in the last minute) and the pre-filter's refusals:
            # microseconds of CPU, no I/O, so no thread hop.
            status, answer = channel.answer(token, body)
        elif pending >= MAX_PENDING_REVIEWS:
            channel.count("unavailable")
            return reply(503, "too many token reviews in progress; retry")
        else:
            pending += 1
            try:
                loop = asyncio.get_running_loop()
                status, answer = await loop.run_in_executor(reviews, channel.answer, token, body)
            finally:
                pending -= 1
        return web.Response(status=status, body=answer, content_type="application/json")

    return progress


class ServerThread:
    """The endpoint on a thread and event loop of its own (not kopf's)."""

    def __init__(self, channel: HealthChannel, host: str, port: int) -> None:
        self.channel = channel
        self.host, self.port = host, port
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.server: BoundedServer | None = None
        self._stop: asyncio.Event | None = None
        self._reviews = concurrent.futures.ThreadPoolExecutor(
            REVIEW_WORKERS, thread_name_prefix="health-review"
        )
        self.thread = threading.Thread(target=self._run, name="health-channel", daemon=True)

    def start(self) -> ServerThread:
        self.thread.start()
        self.started.wait(30)
        if self.error is not None:
            raise self.error
        return self

    def stop(self) -> None:
        if self._stop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(10)
        self._reviews.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as error:
            self.error = error
            log.exception("health channel stopped")
        finally:
            self.started.set()
            self.loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self.server = BoundedServer(
            handler(self.channel, self._reviews),
            max_connections=MAX_CONNECTIONS,
            lifetime=CONNECTION_SECONDS,
            on_refused=lambda: self.channel.count("connection_refused"),
            keepalive_timeout=KEEPALIVE_SECONDS,
            max_line_size=4096,
            max_field_size=contract.MAX_TOKEN_BYTES + 64,
            max_headers=32,
        )
        runner = web.ServerRunner(self.server, access_log=None)  # 4096 ranks: no line each
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, backlog=MAX_CONNECTIONS)
        await site.start()
        log.info("health channel listening on %s:%d%s", self.host, self.port, contract.PATH)
        self.started.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()


async def serve(channel: HealthChannel, host: str, port: int) -> None:
    """Serves the endpoint (on its own thread) until cancelled."""
    server = await asyncio.to_thread(ServerThread(channel, host, port).start)
    try:
        await asyncio.Event().wait()
    finally:
        await asyncio.to_thread(server.stop)
