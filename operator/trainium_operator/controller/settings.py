"""Everything `trainium-operator run` is configured with, gathered by the CLI into one frozen
object and passed down; nothing below the CLI reads the environment.

The env names are the contract with the chart's Deployment (templates/deployment.yaml sets
them; `run`'s options fall back to them), kept here so the CLI and the chart's tests share them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from trainium_operator.contract.channel import PATH as HEALTH_CHANNEL_PATH
from trainium_operator.lifecycle.policies.profile_upload import UploadDefaults
from trainium_operator.lifecycle.ranks import DEFAULT_INTERVAL_SECONDS

LOG_FORMATS: Final = ("plain", "full", "json")  # `run --log-format`

# Default spec.profile.s3Uri of profiled jobs (the chart's profileUpload.s3Uri).
ENV_PROFILE_S3_URI = "TRAINIUM_PROFILE_S3_URI"
# The ServiceAccount every upload pod runs as (the chart's S3 upload account).
ENV_PROFILE_UPLOAD_SERVICE_ACCOUNT = "TRAINIUM_PROFILE_UPLOAD_SERVICE_ACCOUNT"
# "false" turns off the per-job NetworkPolicy (the chart's networkPolicy.jobs).
ENV_JOB_NETWORK_POLICY = "TRAINIUM_JOB_NETWORK_POLICY"
# The chart's own ServiceAccounts (operator, profile UI, profile upload), comma-separated: a
# job's pods never run as one of them. The chart's admission policy refuses them too; this is
# the operator's own check for when it is not there.
ENV_RESERVED_SERVICE_ACCOUNTS = "TRAINIUM_RESERVED_SERVICE_ACCOUNTS"
# The operator's own image, as the chart's Deployment runs it (upload pods run it too).
ENV_OPERATOR_IMAGE = "TRAINIUM_OPERATOR_IMAGE"
ENV_OPERATOR_IMAGE_PULL_POLICY = "TRAINIUM_OPERATOR_IMAGE_PULL_POLICY"
# "true": watch Kueue's objects and queue jobs labelled for Kueue there (the chart's kueue.enabled).
ENV_KUEUE = "TRAINIUM_KUEUE"
# "true": create a ResourceClaimTemplate for jobs with spec.deviceAllocation dra (dra.enabled).
ENV_DRA = "TRAINIUM_DRA"
# "true": multi-node jobs that leave spec.preflight.enabled unset get a gang preflight
# (the chart's preflight.multiNodeDefault).
ENV_PREFLIGHT_MULTI_NODE = "TRAINIUM_PREFLIGHT_MULTI_NODE"
# Comma-separated schedulers the operator writes network topology for: volcano (HyperNodes),
# kueue (Topology and ResourceFlavors); empty: none (the chart's topology.*).
ENV_TOPOLOGY = "TRAINIUM_TOPOLOGY"
# Comma-separated names of the chart's imagePullSecrets (they must exist in the job's namespace).
ENV_OPERATOR_IMAGE_PULL_SECRETS = "TRAINIUM_OPERATOR_IMAGE_PULL_SECRETS"


def name_list(text: str | None) -> tuple[str, ...]:
    """A comma-separated list of names as the chart writes one: blanks and spaces dropped."""
    return tuple(name.strip() for name in (text or "").split(",") if name.strip())


@dataclass(frozen=True)
class PeeringSettings:
    """Several replicas: the highest-priority one works, the others wait (kopf peering)."""

    name: str
    priority: int
    lifetime: int = 60  # seconds a crashed active replica blocks its standby


@dataclass(frozen=True)
class OwnPod:
    """The pod this operator process runs in (`run --pod-name/--pod-namespace`, which the
    chart fills from the downward API): with peering, the acting replica labels it so the
    health channel's Service routes to it (controller.health_role)."""

    namespace: str
    name: str


@dataclass(frozen=True)
class HealthSettings:
    """The health channel training ranks report progress to (controller.health_server)."""

    port: int
    url: str  # how training pods reach it

    @classmethod
    def local(cls, port: int, url: str | None = None) -> HealthSettings:
        return cls(port, url or f"http://127.0.0.1:{port}{HEALTH_CHANNEL_PATH}")


@dataclass(frozen=True)
class OperatorSettings:
    kubeconfig: str | None = None
    workers: int = 4
    namespaces: tuple[str, ...] = ()  # names or glob patterns; empty: all
    peering: PeeringSettings | None = None  # None: standalone
    liveness_endpoint: str | None = None
    metrics_port: int | None = None
    health: HealthSettings | None = None  # None: no health channel
    own_pod: OwnPod | None = None  # None: not run as a pod, or not told which (nothing labelled)
    progress_interval: float = DEFAULT_INTERVAL_SECONDS  # seconds between progress writes
    straggler_cordon_budget: int = 0  # nodes onStraggler: Replace may keep cordoned; 0: off
    isolate_jobs: bool = True  # a NetworkPolicy per job admitting only its own pods
    # Watch Kueue's Workloads and LocalQueues: jobs labelled kueue.x-k8s.io/queue-name are
    # queued by Kueue (the chart's kueue.enabled; Kueue's CRDs must be installed).
    kueue: bool = False
    # Create ResourceClaimTemplates for jobs with spec.deviceAllocation dra (the chart's
    # dra.enabled; resource.k8s.io/v1 must be served).
    dra: bool = False
    # Multi-node jobs that leave spec.preflight.enabled unset are preflighted.
    preflight_multi_node: bool = False
    # The schedulers the topology reconciler writes for (api/topology.SCHEDULERS); empty: off.
    topology: frozenset[str] = frozenset()
    reserved_service_accounts: frozenset[str] = frozenset()
    upload: UploadDefaults = field(default_factory=UploadDefaults)
    log_format: str = "plain"  # one of LOG_FORMATS
    verbose: bool = False
