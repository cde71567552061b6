"""Who may report a job's progress: the pure check behind the health channel's endpoint.

The endpoint (controller/health_server.py) has the message, what the API server's TokenReview
said about its bearer token, the pod the token is bound to and the job, both from the watch
cache. A message is accepted only when every one of these holds:

- the API server authenticated the token for our audience (not any audience: a token meant
  for another service is refused even if valid);
- the token is a ServiceAccount token bound to a pod (the review's `extra` names the pod and its
  uid); a plain ServiceAccount token, or a user's, is refused;
- that pod exists now with that uid (a token of a deleted pod, or of a pod re-created under the
  same name, is refused) in the token's namespace;
- the pod is a training pod of the job the message names: the job label, an owner reference to
  the job's uid, the attempt and node rank of the message;
- the job exists with that uid and has the channel on.

The message's own claims (job, rank, ...) are therefore only believed where the pod's labels,
set by the operator, say the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainium_operator.api.objects import Obj
from trainium_operator.api.spec import TrainingJobSpec
from trainium_operator.builders.job import (
    LABEL_ATTEMPT,
    LABEL_JOB_NAME,
    LABEL_NODE_RANK,
    LABEL_STAGE,
    Stage,
)
from trainium_operator.contract import channel as contract
from trainium_operator.contract.channel import ProgressMessage
from trainium_operator.k8s.reviews import TokenReviewResult

# What the channel knows of a token: what a TokenReview said about it (k8s.reviews), or a
# refusal in the same form when the token was refused before any review.
TokenIdentity = TokenReviewResult


def claim(identity: TokenIdentity, key: str) -> str | None:
    """The token's single-valued `extra` claim `key` (the pod it is bound to), if any."""
    for name, values in identity.user.extra if identity.user else ():
        if name == key and len(values) == 1:
            return values[0]
    return None


def service_account_namespace(identity: TokenIdentity) -> str | None:
    """The namespace of the ServiceAccount the token authenticates as (None: not one)."""
    username = identity.user.name if identity.user else ""
    if not username.startswith(contract.SERVICE_ACCOUNT_PREFIX):
        return None
    namespace, _, account = username[len(contract.SERVICE_ACCOUNT_PREFIX) :].partition(":")
    return namespace if namespace and account else None


@dataclass(frozen=True, slots=True)
class Verdict:
    accepted: bool
    reason: str = ""  # why not, for the reply and the operator's log


def _refuse(reason: str) -> Verdict:
    return Verdict(False, reason)


def bound_pod(identity: TokenIdentity) -> tuple[str, str, str] | Verdict:
    """(namespace, pod name, pod uid) the token is bound to, or why it is not usable."""
    if not identity.authenticated:
        return _refuse(f"the token is not valid: {identity.error or 'not authenticated'}")
    # An empty list is no audience: the API server names the reviewed audiences it accepted.
    if contract.AUDIENCE not in identity.audiences:
        return _refuse(f"the token is not for the audience {contract.AUDIENCE}")
    namespace = service_account_namespace(identity)
    if namespace is None:
        return _refuse("the token is not a ServiceAccount token")
    pod_name = claim(identity, contract.CLAIM_POD_NAME)
    pod_uid = claim(identity, contract.CLAIM_POD_UID)
    if not pod_name or not pod_uid:
        return _refuse("the token is not bound to a pod")
    return namespace, pod_name, pod_uid


def authorize(
    message: ProgressMessage, identity: TokenIdentity, pod: Obj | None, job: Obj | None
) -> Verdict:
    """Whether `message` may be believed, given the token's identity, the pod the token is
    bound to (None: not in the cache) and the job the message names (None: not in the cache)."""
    bound = bound_pod(identity)
    if isinstance(bound, Verdict):
        return bound
    namespace, pod_name, pod_uid = bound
    if namespace != message.namespace:
        return _refuse(f"the token is of namespace {namespace}, the message of {message.namespace}")
    if pod is None:
        return _refuse(f"pod {namespace}/{pod_name} does not exist")
    meta = pod.get("metadata") or {}
    if meta.get("uid") != pod_uid or meta.get("namespace") != namespace:
        return _refuse(f"pod {namespace}/{pod_name} is not the pod the token was issued to")
    labels = meta.get("labels") or {}
    if labels.get(LABEL_JOB_NAME) != message.job or labels.get(LABEL_STAGE) != Stage.TRAIN.value:
        return _refuse(f"pod {pod_name} is not a training pod of job {message.job}")
    owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
    if message.uid not in owners:
        return _refuse(f"pod {pod_name} is not owned by job uid {message.uid}")
    if labels.get(LABEL_ATTEMPT) != str(message.attempt):
        return _refuse(f"pod {pod_name} is of attempt {labels.get(LABEL_ATTEMPT)}")
    if labels.get(LABEL_NODE_RANK) != str(message.node_rank):
        return _refuse(f"pod {pod_name} is node rank {labels.get(LABEL_NODE_RANK)}")
    if job is None or (job.get("metadata") or {}).get("uid") != message.uid:
        return _refuse(f"job {message.namespace}/{message.job} with uid {message.uid} is gone")
    health = (job.get("spec") or {}).get("health") or {}
    if health.get("enabled") is False:
        return _refuse(f"job {message.job} has spec.health.enabled false")
    return Verdict(True)


# -- what a pod's ranks may say: bound to the job's shape ------------------------------------
@dataclass(frozen=True, slots=True)
class JobShape:
    """A job's gang as its spec says (never as a message says): `nodes` pods of
    `processes_per_node` ranks each, reporting every `interval_s` seconds."""

    nodes: int
    processes_per_node: int
    interval_s: float

    @property
    def world_size(self) -> int:
        return self.nodes * self.processes_per_node

    def node_ranks(self, node_rank: int) -> range:
        """The global ranks of node `node_rank` (torchrun: node-major)."""
        first = node_rank * self.processes_per_node
        return range(first, first + self.processes_per_node)

    @property
    def rate_interval_s(self) -> float:
        """The interval the operator rate-limits by: the spec's, never below the floor."""
        return max(self.interval_s, contract.MIN_INTERVAL_S)


def job_shape(spec: TrainingJobSpec) -> JobShape:
    return JobShape(
        nodes=spec.nodes,
        processes_per_node=spec.effective_processes_per_node,
        interval_s=spec.health.report_interval_seconds,
    )


def check_shape(messages: Sequence[ProgressMessage], shape: JobShape, node_rank: int) -> Verdict:
    """Whether one message's ranks fit the job: its world size is the spec's, and every rank
    is one of the ranks of the node the sending pod is (`node_rank`, from the pod's label)."""
    if not messages:
        return _refuse("the message names no rank")
    if len(messages) > shape.processes_per_node:
        return _refuse(
            f"{len(messages)} ranks in one message; a pod has {shape.processes_per_node}"
        )
    allowed = shape.node_ranks(node_rank)
    for message in messages:
        if message.world_size != shape.world_size:
            return _refuse(
                f"worldSize {message.world_size} is not the job's {shape.world_size} "
                f"({shape.nodes} nodes x {shape.processes_per_node} processes)"
            )
        if message.rank not in allowed:
            return _refuse(
                f"rank {message.rank} is not a rank of node {node_rank} "
                f"({allowed.start}..{allowed.stop - 1})"
            )
    return Verdict(True)
