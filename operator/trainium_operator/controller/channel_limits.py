"""How much a pod and a job may send the health channel: token buckets sized from the job's
spec (never from a message), and the JWT pre-filter that refuses a token before any
TokenReview. Pure: the clock is the caller's.

A bucket counts rank reports, not requests: a pod of `processesPerNode` ranks may report each
of them once per report interval (a batch of 32 costs 32, a one-rank message 1), with a burst of
four intervals' worth (a pod answering a request says so at once, off its interval). The
interval is the spec's, never below `contract.MIN_INTERVAL_S`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

from trainium_operator.contract import channel as contract
from trainium_operator.controller.channel_auth import JobShape

# A pod's regular report plus the immediate answers one request brings (capturing, captured,
# a stack dump), each costing all its ranks once the pod sends one message for them.
BURST_INTERVALS = 4.0
MAX_BUCKETS = 100_000  # per limiter; the least recently used is dropped past it
MAX_CLAIMS_BYTES = 4096  # a JWT payload longer than this is not a pod-bound token of ours


@dataclass(slots=True)
class TokenBucket:
    """`rate` tokens a second, at most `burst` saved; starts full."""

    rate: float
    burst: float
    tokens: float
    updated: float

    def take(self, cost: float, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + max(now - self.updated, 0.0) * self.rate)
        self.updated = now
        if cost > self.tokens:
            return False
        self.tokens -= cost
        return True


class Limiter:
    """Token buckets by key (not thread-safe: the caller holds its lock). Bounded: past
    `max_buckets` keys the least recently used bucket is dropped (it was full or nearly: a
    key that sends keeps its bucket fresh)."""

    def __init__(self, max_buckets: int = MAX_BUCKETS) -> None:
        self._buckets: OrderedDict[Hashable, TokenBucket] = OrderedDict()
        self._max = max_buckets

    def take(self, key: Hashable, cost: float, rate: float, burst: float, now: float) -> bool:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(rate, burst, burst, now)
            while len(self._buckets) > self._max:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            bucket.rate, bucket.burst = rate, burst  # the spec may have changed
        return bucket.take(cost, now)

    def __len__(self) -> int:
        return len(self._buckets)


def pod_rate(shape: JobShape) -> tuple[float, float]:
    """(rank reports a second, burst) one pod of the job may send."""
    per_interval = float(shape.processes_per_node)
    return per_interval / shape.rate_interval_s, BURST_INTERVALS * per_interval


def job_rate(shape: JobShape) -> tuple[float, float]:
    """(rank reports a second, burst) all the pods of the job together may send."""
    per_interval = float(shape.world_size)
    return per_interval / shape.rate_interval_s, BURST_INTERVALS * per_interval


@dataclass(frozen=True, slots=True)
class PodClaims:
    """What a pod-bound ServiceAccount token says of itself (unverified: only a pre-filter)."""

    namespace: str
    pod_name: str
    pod_uid: str


def token_claims(token: str, now: float) -> PodClaims | str:
    """The pod a token claims to be bound to, or why it cannot be a live pod-bound token for
    our audience. Unverified (no signature check): it only spares the API server a TokenReview
    of a token that could never pass one; the review still decides."""
    if len(token) > contract.MAX_TOKEN_BYTES:
        return "the token is too long"
    parts = token.split(".")
    if len(parts) != 3 or len(parts[1]) > MAX_CLAIMS_BYTES:
        return "the token is not a JWT"
    try:
        payload = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = json.loads(payload)
    except (binascii.Error, ValueError, RecursionError):
        return "the token is not a JWT"
    if not isinstance(claims, dict):
        return "the token is not a JWT"
    audiences = claims.get("aud")
    if isinstance(audiences, str):
        audiences = [audiences]
    if not isinstance(audiences, list) or contract.AUDIENCE not in audiences:
        return f"the token is not for the audience {contract.AUDIENCE}"
    expiry = claims.get("exp")
    if not isinstance(expiry, int | float) or isinstance(expiry, bool) or expiry <= now:
        return "the token has expired"
    kubernetes = claims.get("kubernetes.io")
    pod = kubernetes.get("pod") if isinstance(kubernetes, dict) else None
    namespace = kubernetes.get("namespace") if isinstance(kubernetes, dict) else None
    name = pod.get("name") if isinstance(pod, dict) else None
    uid = pod.get("uid") if isinstance(pod, dict) else None
    if not all(isinstance(v, str) and v for v in (namespace, name, uid)):
        return "the token is not bound to a pod"
    assert isinstance(namespace, str)
    assert isinstance(name, str)
    assert isinstance(uid, str)
    return PodClaims(namespace, name, uid)
