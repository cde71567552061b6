"""Authentication and authorization of the profile UI in a cluster (`--auth kubernetes`).

Each request carries its user's own bearer token (`Authorization: Bearer ...`: a
ServiceAccount token, or the OIDC ID token the cluster trusts, typically set by an
authenticating proxy such as oauth2-proxy). The UI asks the API server who that is
(TokenReview) and, per namespace, whether that user may `get` TrainingJobs there
(SubjectAccessReview), exactly as if the user had run `kubectl get tj -n <ns>`. The UI's own
ServiceAccount is used only to list jobs and read profiles; what a user is shown is filtered
by the user's rights, never by the UI's.

A profile's namespace is where the operator put it: the first segment of its id in the layout
`<namespace>/<job>/<attempt>[/on-demand/<request id>]` (`ui.profile_id`), never what its
manifest says: the manifest is written by the training pod. The cluster UI serves no profile
outside that layout.

Review results are cached briefly (bounded, short TTL) so a page load costs one review per
namespace and user, not one per row or request.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from trainium_operator.api import spec as spec_model
from trainium_operator.k8s.client import load_api_client
from trainium_operator.k8s.reviews import (
    AccessReviewResult,
    ResourceQuestion,
    ReviewedUser,
    Reviews,
    TokenReviewResult,
)
from trainium_operator.ui.profile_id import layout_namespace

AUTH_NONE = "none"
AUTH_KUBERNETES = "kubernetes"
AUTH_MODES = (AUTH_NONE, AUTH_KUBERNETES)
ALL_NAMESPACES = ""  # a SubjectAccessReview without a namespace asks about every namespace
DEFAULT_CACHE_TTL_S = 10.0
DEFAULT_CACHE_ENTRIES = 4096
K = TypeVar("K")
V = TypeVar("V")


class ReviewClient(Protocol):
    """What the UI asks the API server (k8s.reviews.Reviews; a fake in the unit tests)."""

    def review_token(self, token: str, audiences: tuple[str, ...] = ()) -> TokenReviewResult: ...

    def review_access(
        self, user: ReviewedUser, question: ResourceQuestion
    ) -> AccessReviewResult: ...


@dataclass(frozen=True, slots=True)
class Verdict:
    """200 lets the request through; anything else is the status to answer with."""

    status: int
    reason: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


ALLOW = Verdict(200)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def authentication_verdict(token: str | None, review: TokenReviewResult | None) -> Verdict:
    """401 without a token or when the API server did not authenticate it."""
    if token is None:
        return Verdict(401, "no bearer token: send Authorization: Bearer <your Kubernetes token>")
    if review is None or not review.authenticated or review.user is None:
        detail = f" ({review.error})" if review is not None and review.error else ""
        return Verdict(401, f"the cluster did not authenticate the bearer token{detail}")
    return ALLOW


def read_question(namespace: str) -> ResourceQuestion:
    """What reading a namespace's jobs and profiles takes: `get` on its TrainingJobs."""
    return ResourceQuestion("get", spec_model.GROUP, spec_model.PLURAL, namespace)


def profile_namespace(identifier: str) -> str:
    """The namespace of a profile id in the operator's layout (its first segment);
    ALL_NAMESPACES for any other id (only a cluster-wide reader could pass that check)."""
    return layout_namespace(identifier) or ALL_NAMESPACES


def profile_verdict(
    user: ReviewedUser, readable: dict[str, bool], namespaces: Iterable[str]
) -> Verdict:
    """Allowed when every namespace the profile belongs to is readable to the user."""
    for namespace in namespaces:
        if not readable.get(namespace, False):
            where = f"namespace {namespace!r}" if namespace else "every namespace"
            return Verdict(
                403,
                f"{user.name} may not get {spec_model.PLURAL}.{spec_model.GROUP} in {where}",
            )
    return ALLOW


class TtlCache(Generic[K, V]):
    """A bounded map whose entries expire `ttl` seconds after they were stored (LRU beyond
    `max_entries`)."""

    def __init__(
        self, ttl: float, max_entries: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl, self.max_entries, self.clock = ttl, max_entries, clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        found = self._entries.get(key)
        if found is None:
            return None
        stored, value = found
        if self.clock() - stored >= self.ttl:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._entries[key] = (self.clock(), value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def _token_key(token: str) -> str:
    # The cache never holds a token itself, only its hash.
    return hashlib.sha256(token.encode()).hexdigest()


class KubernetesAccess:
    """Reviews of tokens and namespace reads through the API server, cached briefly. The
    blocking review calls run in threads; the caches are touched only on the event loop."""

    def __init__(
        self,
        reviews: ReviewClient,
        *,
        audiences: tuple[str, ...] = (),
        ttl: float = DEFAULT_CACHE_TTL_S,
        max_entries: int = DEFAULT_CACHE_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reviews = reviews
        self.audiences = audiences
        self.tokens: TtlCache[str, TokenReviewResult] = TtlCache(ttl, max_entries, clock)
        self.reads: TtlCache[tuple[ReviewedUser, str], bool] = TtlCache(ttl, max_entries, clock)

    async def authenticate(self, token: str) -> TokenReviewResult:
        key = _token_key(token)
        cached = self.tokens.get(key)
        if cached is not None:
            return cached
        result = await asyncio.to_thread(self.reviews.review_token, token, self.audiences)
        self.tokens.put(key, result)
        return result

    async def may_read(self, user: ReviewedUser, namespace: str) -> bool:
        cached = self.reads.get((user, namespace))
        if cached is not None:
            return cached
        result = await asyncio.to_thread(self.reviews.review_access, user, read_question(namespace))
        self.reads.put((user, namespace), result.allowed)
        return result.allowed

    async def readable(self, user: ReviewedUser, namespaces: Iterable[str]) -> dict[str, bool]:
        """Whether the user may read each namespace (reviews of uncached ones in parallel)."""
        wanted = sorted(set(namespaces))
        answers = await asyncio.gather(*(self.may_read(user, ns) for ns in wanted))
        return dict(zip(wanted, answers, strict=True))


def kubernetes_access(
    kubeconfig: str | None = None,
    *,
    audiences: tuple[str, ...] = (),
    ttl: float = DEFAULT_CACHE_TTL_S,
) -> KubernetesAccess:
    """Reviews through the API server of the UI's own config (in-cluster, or `kubeconfig`)."""
    return KubernetesAccess(Reviews(load_api_client(kubeconfig)), audiences=audiences, ttl=ttl)
