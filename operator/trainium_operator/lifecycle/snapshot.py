"""One reconcile pass's input and working state: the `Snapshot` the reconciler gathers (or the
dry run builds) and the `Pass` every policy of `machine.PIPELINE` reads and edits.

A snapshot is everything a pass may decide from, read once: the job as stored, its children,
the nodes, the ranks' newest health messages, the job's annotations, its profile upload pods,
the cluster-wide cordon budget as the cache shows it, the operator's settings and the time.
Nothing in a policy reads anything else, so the same snapshot always gives the same plan.

Policy modules import `Pass` for their signatures only (under TYPE_CHECKING): this module
imports the settings types of two of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from trainium_operator.api.objects import Obj
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.observed import Observed
from trainium_operator.lifecycle.policies.profile_upload import UploadDefaults
from trainium_operator.lifecycle.policies.stragglers import CordonBudget
from trainium_operator.lifecycle.ranks import DEFAULT_INTERVAL_SECONDS, RankSample
from trainium_operator.lifecycle.status_edit import StatusEdit


@dataclass(frozen=True, slots=True)
class PassSettings:
    """The operator's settings a pass decides with (from `trainium-operator run`'s flags)."""

    upload_defaults: UploadDefaults = field(default_factory=UploadDefaults)
    # Seconds between writes of status.progress (lifecycle.policies.progress).
    progress_interval: float = DEFAULT_INTERVAL_SECONDS
    # The operator watches Kueue's Workloads and LocalQueues (`run --kueue`): jobs labelled
    # kueue.x-k8s.io/queue-name are queued by Kueue; without it they wait, saying so.
    kueue: bool = False
    # The operator creates ResourceClaimTemplates (`run --dra`, the chart's dra.enabled): jobs
    # with spec.deviceAllocation dra get their devices through DRA; without it they wait.
    dra: bool = False
    # The schedulers this operator keeps network topology for (`run --topology`): a job that
    # asks for no placement gets its instance type's default only where topology exists.
    topology: frozenset[str] = frozenset()
    # Multi-node jobs that leave spec.preflight.enabled unset are preflighted (`run
    # --preflight-multi-node`, the chart's preflight.multiNodeDefault).
    preflight_multi_node: bool = False


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one pass decides from."""

    job: JobRef | None  # None: the stored spec is refused (`problems` says why)
    generation: int
    status: Obj  # the status as stored (the pass's starting point)
    observed: Observed
    created: datetime | None = None  # metadata.creationTimestamp
    problems: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    # The ranks' newest health-channel messages; None: the job has no health channel here.
    ranks: tuple[RankSample, ...] | None = None
    # Since when the operator keeps the ranks' messages (its start, or its failover to this
    # replica): until every rank reported since, `ranks` may hold only some. None: long enough.
    ranks_since: datetime | None = None
    upload_pods: tuple[Obj, ...] = ()
    # Nodes cordoned for stragglers, cluster-wide, as this process knows them now; the applier
    # checks a proposed cordon against the budget again under its lock.
    cordon_budget: CordonBudget = field(default_factory=lambda: CordonBudget(0))
    # This operator process already warned about the pod fields the allowlist dropped.
    dropped_fields_warned: bool = False
    # The stage and attempt whose pod creates this process sent nowhere (the API server was
    # unreachable) after storing the gang's createdAttempt: no pod of it exists.
    unsent_gang: tuple[Stage, int] | None = None
    # Per stage, the newest attempt whose pods this operator process created (or sent creates
    # for) or saw; empty after a failover (lifecycle.failures.gang_never_seen).
    gangs_known_here: Mapping[Stage, int] = field(default_factory=dict)
    settings: PassSettings = field(default_factory=PassSettings)

    @property
    def now(self) -> datetime:
        return self.observed.now


@dataclass(slots=True)
class Pass:
    """One decision in the making: the snapshot, the status being edited and the plan."""

    snapshot: Snapshot
    status: StatusEdit
    plan: Decision
    # The stage and attempt whose gang should run; set by the gang policies in turn.
    stage: Stage = Stage.TRAIN
    attempt: int = 0
    # Set by a policy that decided the job's course for this pass (it finished, failed,
    # restarted, is suspended or refused): the gang policies after it do not run.
    settled: bool = False

    @property
    def job(self) -> JobRef:
        job = self.snapshot.job
        if job is None:
            raise LookupError("the job's spec is refused: no policy that needs it runs")
        return job

    @property
    def observed(self) -> Observed:
        return self.snapshot.observed

    @property
    def now(self) -> datetime:
        return self.snapshot.observed.now

    def settle(self) -> None:
        self.settled = True
