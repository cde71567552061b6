"""Asking the API server who a bearer token belongs to and what that user may do.

The profile UI authenticates its users as Kubernetes' own dashboards and aggregated API servers
do (delegated authentication): a TokenReview (authentication.k8s.io/v1) of the token the
request carried, then a SubjectAccessReview (authorization.k8s.io/v1) per question about the
reviewed user. The API server answers both with its own authenticators (ServiceAccount tokens,
the OIDC issuer it trusts, webhooks) and authorizers (RBAC, ...), so the UI holds no user
database and no policy of its own. The caller needs `create` on both review resources.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes import client

from trainium_operator.api.objects import Obj
from trainium_operator.k8s.client import RequestCounter


@dataclass(frozen=True, slots=True)
class ReviewedUser:
    """The identity a TokenReview returned: what a SubjectAccessReview asks about."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()  # sorted, hashable (a cache key)


@dataclass(frozen=True, slots=True)
class TokenReviewResult:
    authenticated: bool
    user: ReviewedUser | None = None  # always set when authenticated
    error: str = ""  # why the API server did not authenticate the token, when it says
    audiences: tuple[str, ...] = ()  # those of the reviewed audiences the token is for


@dataclass(frozen=True, slots=True)
class ResourceQuestion:
    """May the user `verb` `resource` (of `group`) in `namespace` ("" = every namespace)?"""

    verb: str
    group: str
    resource: str
    namespace: str


@dataclass(frozen=True, slots=True)
class AccessReviewResult:
    allowed: bool
    reason: str = ""


def token_review_body(token: str, audiences: tuple[str, ...]) -> Obj:
    spec: Obj = {"token": token}
    if audiences:
        spec["audiences"] = list(audiences)
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}


def token_review_result(status: Obj) -> TokenReviewResult:
    """A TokenReview's status as our result; unauthenticated unless it says otherwise."""
    if not status.get("authenticated"):
        return TokenReviewResult(False, None, str(status.get("error") or ""))
    user = status.get("user") or {}
    extra = user.get("extra") or {}
    reviewed = ReviewedUser(
        name=str(user.get("username") or ""),
        uid=str(user.get("uid") or ""),
        groups=tuple(str(g) for g in user.get("groups") or ()),
        extra=tuple(sorted((str(k), tuple(str(v) for v in vs or ())) for k, vs in extra.items())),
    )
    if not reviewed.name:  # an authenticator that names nobody cannot be authorized
        return TokenReviewResult(False, None, "the token review named no user")
    audiences = tuple(str(a) for a in status.get("audiences") or ())
    return TokenReviewResult(True, reviewed, audiences=audiences)


def subject_access_review_body(user: ReviewedUser, question: ResourceQuestion) -> Obj:
    spec: Obj = {
        "user": user.name,
        "groups": list(user.groups),
        "resourceAttributes": {
            "verb": question.verb,
            "group": question.group,
            "resource": question.resource,
            "namespace": question.namespace,
        },
    }
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {key: list(values) for key, values in user.extra}
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": spec,
    }


def access_review_result(status: Obj) -> AccessReviewResult:
    """Allowed only when the authorizers said so and none denied it explicitly."""
    allowed = bool(status.get("allowed")) and not status.get("denied")
    reason = str(status.get("reason") or status.get("evaluationError") or "")
    return AccessReviewResult(allowed, reason)


class Reviews:
    """TokenReviews and SubjectAccessReviews over one ApiClient (blocking calls)."""

    def __init__(self, api_client: client.ApiClient, counter: RequestCounter | None = None):
        self.api_client = api_client
        self.authentication = client.AuthenticationV1Api(api_client)
        self.authorization = client.AuthorizationV1Api(api_client)
        self.counter = counter or RequestCounter()

    def _status(self, response: Any) -> Obj:
        body: Obj = self.api_client.sanitize_for_serialization(response)
        status: Obj = body.get("status") or {}
        return status

    def review_token(self, token: str, audiences: tuple[str, ...] = ()) -> TokenReviewResult:
        self.counter.add("create", "tokenreviews")
        response = self.authentication.create_token_review(token_review_body(token, audiences))
        return token_review_result(self._status(response))

    def review_access(self, user: ReviewedUser, question: ResourceQuestion) -> AccessReviewResult:
        self.counter.add("create", "subjectaccessreviews")
        response = self.authorization.create_subject_access_review(
            subject_access_review_body(user, question)
        )
        return access_review_result(self._status(response))
