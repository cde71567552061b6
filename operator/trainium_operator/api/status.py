"""The TrainingJob status model: the CRD's status schema, the state machine and the UI share it.

The state machine edits status as a plain mapping (it records transitions field by field) and
every status it returns passes through `validated_status`, so a field the model does not
declare, or a value of the wrong type, is a bug caught before it reaches the API server.
"""

from __future__ import annotations

import enum
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from trainium_operator.api.model_base import ApiModel


class Phase(enum.StrEnum):
    """Where a job is; the CRD's status.phase enum is generated from this list."""

    PENDING = "Pending"
    COMPILING = "Compiling"
    TRAINING = "Training"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class ConditionType(enum.StrEnum):
    """The types of status.conditions the operator writes (one condition per type)."""

    ADMITTED = "Admitted"  # the API server took the job's pods (False: a refusal, named)
    COMPILED = "Compiled"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    # Something outside the job is in its way (a taken child name, an old pod that does not
    # go); lastTransitionTime is when the wait began, which bounds it.
    BLOCKED = "Blocked"
    # No rank of the training gang advanced for longer than the stall bound (status.stall).
    STALLED = "Stalled"
    # The newest S3 upload of a training attempt's profile (status.profileUploads).
    PROFILE_UPLOADED = "ProfileUploaded"


class FailureClass(enum.StrEnum):
    """The budget a failure is charged to: backoffLimit or infrastructureBackoffLimit."""

    APPLICATION = "Application"
    INFRASTRUCTURE = "Infrastructure"
    STALL = "Stall"  # no rank advanced (spec.health.onStall: Restart); its own budget
    # A persistent straggler's node replaced (spec.health.onStraggler: Replace); its own budget.
    STRAGGLER = "Straggler"
    # The gang's preflight found an unfit node or did not finish (spec.preflight); its own budget.
    PREFLIGHT = "Preflight"


Int32 = Annotated[int, Field(json_schema_extra={"format": "int32"})]
Count = Annotated[int, Field(ge=0, json_schema_extra={"format": "int32"})]
Int64 = Annotated[int, Field(json_schema_extra={"format": "int64"})]
# RFC 3339 as the machine writes it (seconds, "Z"); kept a string so a read-modify-write of
# the status round-trips byte for byte.
Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


class Condition(ApiModel):
    """A Kubernetes-style condition; one per type."""

    type: str
    """Condition type: Admitted, Compiled, Running, Restarting, Suspended, Succeeded, Failed,
    Blocked (something outside the job is in its way; lastTransitionTime is when the wait
    began), Stalled (no training rank advanced for longer than the stall bound) or
    ProfileUploaded (the newest upload of an attempt's profile to S3)."""
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    """CamelCase reason."""
    message: str | None = None
    """Human-readable detail."""
    last_transition_time: Timestamp | None = None
    observed_generation: Int64 | None = None


class StageStatus(ApiModel):
    """When a stage (compile or training) started and completed, and its gangs."""

    start_time: Timestamp | None = None
    completion_time: Timestamp | None = None
    first_attempt: Count | None = None
    """Attempt of the stage's first gang; a training attempt after it resumes from the newest
    checkpoint."""
    full_gang_attempt: Count | None = None
    """Newest attempt all of whose pods existed at once; a pod of it that vanishes restarts the
    whole gang instead of being re-created alone."""
    created_attempt: Count | None = None
    """Newest attempt whose pods the operator began creating (stored before the creates): if
    none of them exists later, the gang restarts as the next attempt instead of being created
    twice within one attempt (its pods may have run and been deleted unseen)."""


class CompileCacheStatus(ApiModel):
    """What the native stack's compile stage left in the persistent NEFF cache, as each compile
    pod reported it in its termination message after its steps (contract/neff_cache.py). The
    operator does not read the volume: figures of pods that did not report are missing, never
    guessed, and nodesReported says how many did."""

    path: str | None = None
    """The cache directory of each node rank (<rank> stands for the node rank)."""
    programs: Count | None = None
    """Compiled programs (NEFF files) in the reporting nodes' caches."""
    bytes: Int64 | None = None
    """Their total size in bytes."""
    nodes_reported: Count = 0
    """Compile pods that could list their cache."""
    nodes: Count = 0
    """Compile pods of the gang."""
    summary: str | None = None
    """programs and size, e.g. "124 programs, 3.1 GiB" (with "k of n nodes" when partial)."""
    message: str | None = None
    """Why figures are missing, when they are."""


class CompileStageStatus(StageStatus):
    """The compile stage, with what it left in the cache where that can be read."""

    cache: CompileCacheStatus | None = None


class Workers(ApiModel):
    """Pods of the current stage."""

    ready: Count = 0
    total: Count = 0
    succeeded: Count = 0
    failed: Count = 0
    summary: str | None = None
    """ready/total"""


class Restarts(ApiModel):
    """Gang restarts by cause; total = application + infrastructure + stall + straggler +
    preflight."""

    total: Count = 0
    application: Count = 0
    infrastructure: Count = 0
    stall: Count = 0
    """Restarts of a stalled gang (spec.health.onStall: Restart; budget
    spec.health.maxStallRestarts)."""
    straggler: Count = 0
    """Restarts without a straggler's node (spec.health.onStraggler: Replace; budget
    spec.health.maxStragglerReplacements)."""
    preflight: Count = 0
    """Restarts after a gang's preflight failed (budget spec.preflight.maxRetries)."""
    preempted: Count = 0
    """Of the infrastructure restarts, those after Kueue preempted the gang for a
    higher-priority one: charged to no budget (the job queues again)."""
    unseen_gang: Count = 0
    """Of the infrastructure restarts, those of a gang an earlier operator instance recorded
    and no pod of which was found (the operator restarted between recording and creating it):
    charged to no budget."""


class LastFailure(ApiModel):
    """The failure that caused the latest restart or the job failure."""

    class_: FailureClass = Field(alias="class")
    stage: str | None = None
    pod: str | None = None
    node: str | None = None
    rank: Int32 | None = None
    exit_code: Int32 | None = None
    reason: str | None = None
    message: str | None = None
    time: Timestamp | None = None


UploadState = Literal["Pending", "Running", "Succeeded", "Failed", "NoProfile"]
# status.profileUploads keeps this many records (lifecycle.policies.profile_upload folds older
# ones).
MAX_PROFILE_UPLOAD_RECORDS = 20


class UploadReason(enum.StrEnum):
    """Why an upload ended as it did: classified by the operator from the upload pod's exit
    code and phase, never read from the pod's log or termination message."""

    UPLOADED = "Uploaded"
    NO_PROFILE = "NoProfile"
    REFUSED = "Refused"  # a symlink or a special file in the profile directory
    ACCESS_DENIED = "AccessDenied"
    BUCKET_MISSING = "BucketMissing"
    NO_CREDENTIALS = "NoCredentials"
    UNREACHABLE = "Unreachable"
    UPLOAD_FAILED = "UploadFailed"  # any other error of the uploader
    TIMEOUT = "Timeout"  # the pod's activeDeadlineSeconds passed
    POD_FAILED = "PodFailed"  # the pod ended without the uploader's own exit code
    POD_REFUSED = "PodRefused"  # the API server refused to create the pod
    NOT_ON_CLAIM = "NotOnClaim"  # the profile directory is not on the claim


class ProfileUpload(ApiModel):
    """The S3 upload of one ended training attempt's profile (spec.profile.s3Uri)."""

    attempt: Count
    state: UploadState | None = None
    reason: UploadReason | None = None
    """Why it ended so (set once it has)."""
    pod: str | None = None
    destination: str | None = None
    s3_uri: str | None = None
    """Set once the manifest (the commit marker) is in S3."""
    message: str | None = Field(default=None, max_length=512)
    """The operator's sentence for the reason (never the pod's own text)."""


class ProfileUploadCounts(ApiModel):
    """Uploads of attempts older than those status.profileUploads lists, by outcome."""

    succeeded: Count = 0
    failed: Count = 0
    no_profile: Count = 0


class ProfileUploadSummary(ApiModel):
    """The upload of the current attempt's profile to S3."""

    state: UploadState | None = None
    reason: UploadReason | None = None
    pod: str | None = None
    attempt: Count | None = None
    destination: str | None = None
    message: str | None = Field(default=None, max_length=512)


class ProfileStatus(ApiModel):
    """Where the profiler writes (when spec.profile.enabled), and where the profile is in S3
    once its upload is complete."""

    path: str | None = None
    claim_name: str | None = None
    s3_uri: str | None = None
    """The attempt's profile in S3; set once its manifest (the commit marker) is uploaded."""
    upload: ProfileUploadSummary | None = None


class ProgressStatus(ApiModel):
    """The training gang's live progress, from its ranks' health-channel messages
    (spec.health); written at most once per the operator's progress interval (10 s)."""

    attempt: Count | None = None
    """The gang attempt these figures are of."""
    step: Int64 | None = None
    """The slowest rank's current step."""
    max_step: Int64 | None = None
    """The fastest rank's current step."""
    slowest_rank: Int32 | None = None
    fastest_rank: Int32 | None = None
    ranks_reporting: Count | None = None
    world_size: Count | None = None
    total_steps: Int64 | None = None
    """spec.health.totalSteps, when set."""
    step_time_p50_ms: float | None = None
    """Median step time over the ranks' recent steps (up to 16 each)."""
    last_checkpoint_step: Int64 | None = None
    """The newest checkpoint step every reporting rank that says one has completed
    (profiler.checkpoint_saved); a restart loses the steps after it (status.goodput)."""
    steps_per_second: float | None = None
    samples_per_second: float | None = None
    """Of the whole gang, where the script reports samples (profiler.report)."""
    tokens_per_second: float | None = None
    eta: Timestamp | None = None
    """When the slowest rank reaches totalSteps at the current step time."""
    last_progress_time: Timestamp | None = None
    """When a rank last started a new step (as far as the operator heard)."""
    update_time: Timestamp | None = None
    """When the operator last wrote these figures."""
    step_summary: str | None = None
    """step/totalSteps (the STEP column)."""
    rate_summary: str | None = None
    """steps/s (the RATE column)."""
    eta_summary: str | None = None
    """Time left (the ETA column)."""


StackState = Literal["Requested", "Captured", "Partial", "Missing"]


class StallStacks(ApiModel):
    """The Python stacks the ranks of a stalled gang were asked to write before any action."""

    request_id: str
    requested_time: Timestamp | None = None
    path: str | None = None
    """Directory of the files, one per rank: <path>/rank-<RANK>.txt (on the job's claim)."""
    state: StackState | None = None
    """Requested (waiting for the ranks), Captured (every reporting rank wrote its file),
    Partial (some did before the bound), Missing (none did)."""
    ranks_expected: Count | None = None
    ranks_captured: Count | None = None
    missing_ranks: list[Int32] = Field(default_factory=list)
    """Reporting ranks that did not answer (the first 16)."""
    complete_time: Timestamp | None = None


class StoppedRank(ApiModel):
    """A rank that stopped first: the lowest step, the oldest start of it."""

    rank: Int32
    node: str | None = None
    step: Int64 | None = None
    step_start_time: Timestamp | None = None


class StallStatus(ApiModel):
    """The latest stall of the training gang (lifecycle/policies/stalls.py)."""

    attempt: Count | None = None
    step: Int64 | None = None
    """The slowest rank's step when the stall was detected."""
    max_step: Int64 | None = None
    """The fastest rank's step then; a higher one later means progress resumed."""
    last_progress_time: Timestamp | None = None
    """When a rank last entered a new step before the stall."""
    detected_time: Timestamp | None = None
    bound_seconds: float | None = None
    """The bound that was exceeded: spec.health.stallTimeoutSeconds, or max(3 x the recent p50
    step time, 60 s); never below 3 report intervals."""
    stopped_ranks: list[StoppedRank] = Field(default_factory=list)
    """The ranks that stopped first (up to 8)."""
    more_stopped_ranks: Count | None = None
    """How many more ranks were at that lowest step."""
    stacks: StallStacks | None = None
    action: Literal["Report", "Restart", "Fail"] | None = None
    """spec.health.onStall, once taken (after the stacks were captured or their bound passed)."""
    action_time: Timestamp | None = None
    resolved_time: Timestamp | None = None
    """When a rank advanced again (onStall: Report)."""


class StragglerRank(ApiModel):
    rank: Int32
    node: str | None = None
    step_time_ms: float | None = None
    """The rank's median over its latest 16 steps."""
    ratio: float | None = None
    """That over the median of the other ranks' medians."""
    since: Timestamp | None = None
    """When this attempt first named the rank a straggler (without a break since)."""
    since_step: Int64 | None = None
    """The rank's step then (a replacement needs 16 more)."""


class StragglerReplacement(ApiModel):
    """One node given up for a straggler (spec.health.onStraggler: Replace)."""

    attempt: Count
    """The attempt that ran on it; the gang restarted as the next."""
    rank: Int32
    node: str
    step_time_ms: float | None = None
    ratio: float | None = None
    time: Timestamp | None = None
    """When the replacement was decided (recorded before the node is cordoned)."""
    cordon_seen: Timestamp | None = None
    """When a pass first saw the node cordoned for it; from then on no pass cordons the node
    again (an admin's `kubectl uncordon` stands)."""


class StragglersStatus(ApiModel):
    """Ranks persistently slower than the rest of the gang (lifecycle/policies/stragglers.py)."""

    attempt: Count | None = None
    gang_step_time_ms: float | None = None
    """The median of every rank's median step time."""
    ranks: list[StragglerRank] = Field(default_factory=list)
    """The stragglers now (up to 16), slowest first; empty once none is."""
    update_time: Timestamp | None = None
    replacements: list[StragglerReplacement] = Field(default_factory=list)
    """Nodes cordoned for stragglers (onStraggler: Replace), oldest first."""
    held: str | None = None
    """Why a persistent straggler's node is not replaced (the replacement budget is spent, no
    other node could take the gang, or its node is unknown); cleared when one is."""


class PreflightOutcome(enum.StrEnum):
    UNFIT = "Unfit"  # a node is below the bound: it is excluded
    TIMED_OUT = "TimedOut"  # the check did not finish on some node within its timeout
    FAILED = "Failed"  # the pods said unfit, but no node is below the bound by their reports


class PreflightNode(ApiModel):
    """A node the preflight judged unfit, in the operator's words (numbers from the node's own
    report; never the report's text)."""

    node: str
    reason: str
    """Devices (fewer devices than the instance type has, or not usable), DeviceThroughput or
    NetworkBandwidth (below the other nodes' median by more than spec.preflight.threshold)."""
    detail: str
    ratio: float | None = None
    """The node's figure over the other nodes' median."""


class PreflightPassed(ApiModel):
    """A gang whose preflight passed, read from its pods' reports once the gang ended."""

    attempt: Count
    stage: str
    seconds: float
    """How long the check ran (the longest any node reported): moved to goodput's
    preflightSeconds from the stage's part."""


class PreflightStatus(ApiModel):
    """The latest failed gang preflight (lifecycle/policies/preflight.py), the nodes the job
    avoids since, and the latest gang whose preflight passed."""

    attempt: Count | None = None
    stage: str | None = None
    outcome: PreflightOutcome | None = None
    seconds: float | None = None
    """How long the check ran (the longest any node reported): goodput's preflightSeconds."""
    reports: Count = 0
    """Nodes whose report was read (of spec.nodes)."""
    unfit: list[PreflightNode] = Field(default_factory=list)
    """The unfit nodes of that attempt (up to 16)."""
    excluded_nodes: list[str] = Field(default_factory=list)
    """Every node the job's later gangs avoid (node affinity NotIn), oldest first, up to 16."""
    cordoned: list[str] = Field(default_factory=list)
    """Of those, the nodes cordoned (spec.preflight.onUnfit: Cordon), oldest first."""
    held: str | None = None
    """Why an unfit node of the latest verdict was not cordoned (onUnfit: Cordon: the operator
    has no cordon budget, or it is spent)."""
    time: Timestamp | None = None
    passed: PreflightPassed | None = None


class GoodputStatus(ApiModel):
    """Where the job's wall time went (lifecycle/policies/goodput.py): every second since
    startTime is in exactly one of queued, compiling, training, restarting, suspended or lost,
    so they sum to wallSeconds. Accumulated from the stored status at each status write the job
    gets anyway (never one only to move asOf), so an operator restart neither loses nor counts
    twice any time. The figures are as of asOf, however old: from asOf to now the job was in
    the stored phase, and that time belongs to its part (what the next write adds)."""

    percent: float | None = None
    """Goodput: trainingSeconds over wall time less suspendedSeconds, in percent. An upper
    bound while lostUnknown > 0."""
    summary: str | None = None
    """percent as text, e.g. "87.5%", or "<=87.5%" while lostUnknown > 0 (the GOODPUT
    column)."""
    wall_seconds: float = 0
    """asOf - startTime."""
    queued_seconds: float = 0
    """In Pending: waiting for capacity, scheduling and pod start, before each gang runs."""
    compiling_seconds: float = 0
    """In Compiling: the compile stage's gang running (spec.compile)."""
    training_seconds: float = 0
    """Training that was kept: in Training, less the work restarts lost."""
    restarting_seconds: float = 0
    """In Restarting: stopping a failed gang before the next one is created."""
    suspended_seconds: float = 0
    """In Suspended (spec.runPolicy.suspend); not counted against goodput."""
    preflight_seconds: float = 0
    """The gang preflight's time (spec.preflight), moved from the stage's part: a failed
    check's when its gang restarts, a passed one's when its gang ends (from the pods' reports;
    a native compile pod's message is its cache summary instead, so its check stays in
    compilingSeconds)."""
    lost_seconds: float = 0
    """Training work that restarts lost: at each restart of a training gang, its steps after
    the last complete checkpoint (status.progress.lastCheckpointStep) times the recent p50
    step time. Only restarts where both are known count here."""
    lost_unknown: Count = 0
    """Training gangs that restarted without a known checkpoint step or step time: their lost
    work stays in trainingSeconds (never guessed)."""
    attempt: Count | None = None
    """The gang attempt attemptTrainingSeconds is of."""
    attempt_training_seconds: float = 0
    """Training time of that attempt: the most its restart can lose."""
    start_time: Timestamp | None = None
    """Where the accounting begins: the job's creation (or, for a job an operator without
    goodput started, the first pass of one with it)."""
    as_of: Timestamp | None = None
    """The figures include the time up to here (the last status write)."""


OnDemandProfileState = Literal["Requested", "Capturing", "Captured", "Incomplete"]


class OnDemandProfile(ApiModel):
    """The latest on-demand profile (the trainium.dev/profile-steps annotation: every rank
    captures its next N steps in full; lifecycle/policies/on_demand_profile.py)."""

    request_id: str
    attempt: Count | None = None
    steps: Count | None = None
    """How many steps each rank captures, from its next step on."""
    requested_time: Timestamp | None = None
    path: str | None = None
    """The profile's directory (on the job's claim): <node>/rank-<RANK>.trnprof and
    profile.json, as any profile."""
    state: OnDemandProfileState | None = None
    """Requested (the ranks are asked), Capturing (a rank records the window), Captured (every
    rank of the attempt wrote its file), Incomplete (the attempt ended first)."""
    ranks_expected: Count | None = None
    ranks_captured: Count | None = None
    missing_ranks: list[Int32] = Field(default_factory=list)
    """Ranks whose file is missing (the first 16), once Incomplete."""
    complete_time: Timestamp | None = None
    annotation: str | None = None
    """The annotation value this request consumed, until the operator has removed it."""
    upload: ProfileUploadSummary | None = None
    """Its own S3 upload once Captured, when an S3 URI is configured (attempt: unset)."""


class QueueingScheduler(enum.StrEnum):
    VOLCANO = "Volcano"
    KUEUE = "Kueue"


class QueueStatus(ApiModel):
    """Where the current gang queues and whether it is admitted."""

    scheduler: QueueingScheduler
    """Volcano (spec.scheduling.queue) or Kueue (the label kueue.x-k8s.io/queue-name)."""
    name: str
    """The Volcano queue, or the Kueue LocalQueue in the job's namespace."""
    admission: str
    """Pending (waiting in the queue), Admitted (the whole gang may run), or Kueue's
    QuotaReserved or Evicted."""
    workload: str | None = None
    """The current gang's PodGroup, or its Kueue Workload (kubectl describe workload)."""
    cluster_queue: str | None = None
    """The Kueue ClusterQueue that admitted the gang."""
    summary: str | None = None
    """<scheduler>/<queue>:<admission>, one word for kubectl get (volcano/default:Admitted)."""


class TrainingJobStatus(ApiModel):
    """Observed state, written by the operator."""

    phase: Phase | None = None
    """Where the job is."""
    reason: str | None = None
    """Reason of the latest transition."""
    message: str | None = None
    """Detail of the latest transition."""
    observed_generation: Int64 | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    attempt: Count | None = None
    """Gang attempt of the current stage, 0 for the first; only grows."""
    start_time: Timestamp | None = None
    completion_time: Timestamp | None = None
    compile: CompileStageStatus | None = None
    training: StageStatus | None = None
    workers: Workers | None = None
    queue: QueueStatus | None = None
    restarts: Restarts | None = None
    last_failure: LastFailure | None = None
    profile: ProfileStatus | None = None
    progress: ProgressStatus | None = None
    stall: StallStatus | None = None
    stragglers: StragglersStatus | None = None
    preflight: PreflightStatus | None = None
    goodput: GoodputStatus | None = None
    on_demand_profile: OnDemandProfile | None = None
    profile_uploads: list[ProfileUpload] = Field(
        default_factory=list,
        max_length=MAX_PROFILE_UPLOAD_RECORDS,
        description="The S3 upload of each ended training attempt's profile, the newest "
        f"{MAX_PROFILE_UPLOAD_RECORDS} (older ones are counted in profileUploadsOlder); "
        "written by the upload policy (lifecycle/policies/profile_upload.py), never by the state "
        "machine.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["attempt"],
        },
    )
    profile_uploads_older: ProfileUploadCounts | None = None
    """Uploads of attempts older than profileUploads lists, counted by outcome."""


def validated_status(data: dict[str, Any]) -> dict[str, Any]:
    """`data` checked against the model, returned unchanged (the machine's own mapping)."""
    TrainingJobStatus.model_validate(data)
    return data


def known_fields(
    data: dict[str, Any], model: type[BaseModel] = TrainingJobStatus
) -> dict[str, Any]:
    """A stored status without the fields this model does not declare (written by another
    operator version), so an upgrade or downgrade reads its predecessor's status instead of
    refusing it."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key not in data:
            continue
        value = data[key]
        nested = _model_of(field.annotation)
        if nested is not None and isinstance(value, dict):
            value = known_fields(value, nested)
        elif nested is not None and isinstance(value, list):
            value = [known_fields(v, nested) if isinstance(v, dict) else v for v in value]
        out[key] = value
    return out


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model inside `Model | None` or `list[Model]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None
