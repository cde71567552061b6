"""One reconcile pass: read the job and its children, decide, apply. Thin by design.

All judgement lives in `lifecycle.machine.decide`; this module reads the watch-fed cache
(`controller.cache`: no LIST or GET per pass), filters children by owner UID (a re-created job
with the same name must not adopt its predecessor's pods that garbage collection has not
removed yet), and applies the decision in a safe order: the status before any deletion or node
patch (terminal decisions included) and before creations where the decision asks, then
deletions, creations, events. Writes go straight to the API server, the status write with a
resourceVersion precondition, and each is remembered until the cache has seen it, so no pass
decides on a view older than the operator's own writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from trainium_operator.api.status import validated_status
from trainium_operator.builders.job import JobRef
from trainium_operator.builders.upload import (
    LABEL_PROFILE_ATTEMPT,
    LABEL_PROFILE_REQUEST,
    is_upload_pod,
)
from trainium_operator.controller.admission_holds import AdmissionHolds, Mark
from trainium_operator.controller.cache import ClusterCache
from trainium_operator.k8s.client import (
    AdmissionRejection,
    ClusterAPI,
    EventPoster,
    admission_rejection,
    api_error_message,
    is_forbidden,
    is_namespace_terminating,
)
from trainium_operator.lifecycle import admission, blockers, cleanup, machine
from trainium_operator.lifecycle.decision import Decision, EventRecord, NodePatch
from trainium_operator.lifecycle.goodput import with_goodput
from trainium_operator.lifecycle.observed import (
    node_view,
    observe,
    parse_time,
    podgroup_view,
    queue_view,
)
from trainium_operator.lifecycle.parse import dropped_pod_fields_message, parse_job
from trainium_operator.lifecycle.profile_on_demand import (
    apply_on_demand_profile,
    on_demand_upload_refused,
    plan_on_demand_upload,
)
from trainium_operator.lifecycle.profile_upload import UploadDefaults, plan_upload, upload_refused
from trainium_operator.lifecycle.progress import (
    DEFAULT_INTERVAL_SECONDS as DEFAULT_PROGRESS_INTERVAL,
)
from trainium_operator.lifecycle.progress import RankSample, with_progress
from trainium_operator.lifecycle.stalls import apply_stall_policy
from trainium_operator.lifecycle.stragglers import (
    CORDON_BUDGET_SETTING,
    CordonBudget,
    CordonDecision,
    apply_straggler_policy,
    cordoned_for_stragglers,
)

Obj = dict[str, Any]
log = logging.getLogger(__name__)
CREATE_CONCURRENCY = 8


class _CreateError(Exception):
    def __init__(self, obj: Obj, error: Exception):
        super().__init__(str(error))
        self.obj = obj
        self.error = error


PREDECESSOR_RETRY_SECONDS = 5.0
CACHE_WAIT_SECONDS = 0.2  # the watches deliver an own write in milliseconds


class ForeignChildError(RuntimeError):
    """A child's name is taken by an object this job does not own (a deleted predecessor's
    pod still terminating, or an unrelated object): adopting it would run someone else's pod as
    ours. `existing` is that object as the API server has it."""

    def __init__(self, obj: Obj, existing: Obj):
        owners = [r.get("uid") for r in existing["metadata"].get("ownerReferences") or []]
        super().__init__(f"{obj['kind']} {obj['metadata']['name']} is owned by {owners}")
        self.obj = obj
        self.existing = existing


class JobGoneError(LookupError):
    """The TrainingJob no longer exists (or is being deleted): nothing is left to reconcile."""


class PermissionDeniedError(RuntimeError):
    """The operator's ServiceAccount lacks an RBAC rule; retrying soon will not help."""


def _upload_refused(
    current: Obj, attempt: int, pod: str, reason: str, *, generation: int, now: datetime
) -> Decision:
    status, message = upload_refused(current, attempt, pod, reason, generation=generation, now=now)
    return Decision(status=status, events=[EventRecord("Warning", "ProfileUploadFailed", message)])


def _on_demand_upload_refused(current: Obj, pod: str, reason: str) -> Decision:
    status, message = on_demand_upload_refused(current, pod, reason)
    return Decision(status=status, events=[EventRecord("Warning", "ProfileUploadFailed", message)])


def _stuck_bound(body: Obj) -> float:
    """How long a pod or a predecessor's child may linger before the operator escalates: the
    job's own bound, or the floor for a spec it cannot read."""
    parsed = parse_job(body)
    return cleanup.stuck_bound(parsed) if isinstance(parsed, JobRef) else cleanup.MIN_STUCK_SECONDS


def _owned_by(obj: Obj, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def _status_before_side_effects(decision: Decision) -> bool:
    """The applier's rule, whatever the policy asked: a pass that deletes or cordons anything
    stores its status first. A terminal decision whose deletes landed but whose status did not
    (a 409 from any metadata write, an operator exit) would otherwise find no pods next pass
    and train a finished job again."""
    return bool(
        decision.status_first
        or decision.delete_pods
        or decision.delete_podgroups
        or decision.delete_foreign
        or decision.patch_nodes
        or decision.delete_job
    )


class CordonReservations:
    """The cluster-wide cordon budget as the straggler policy sees it: the nodes the cache shows
    cordoned for stragglers plus those this process decided to cordon in the last
    RESERVATION_SECONDS (the cache may not show them yet). Deciding under one lock keeps two
    jobs reconciled at once from both taking the budget's last node; the lock is taken only by
    a decision that would cordon (`decide`), never for the straggler check itself. Only the
    active replica reconciles (peering), so a process-local record is enough."""

    RESERVATION_SECONDS = 60.0

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic):
        self.limit = limit
        self.lock = threading.Lock()
        self._clock = clock
        self._reserved: dict[str, float] = {}

    def budget(self, nodes: Iterable[Obj]) -> CordonBudget:
        """Call with `lock` held."""
        now = self._clock()
        self._reserved = {
            n: t for n, t in self._reserved.items() if now - t < self.RESERVATION_SECONDS
        }
        return CordonBudget(self.limit, cordoned_for_stragglers(nodes) | set(self._reserved))

    def reserve(self, nodes: Iterable[str]) -> None:
        """Call with `lock` held, after the decision that cordons `nodes`."""
        for node in nodes:
            self._reserved[node] = self._clock()

    def decide(self, cordon: CordonDecision, nodes: Callable[[], Iterable[Obj]]) -> None:
        """Runs a straggler decision that would cordon a node against the budget as it is now
        (`nodes`: the node cache), under the lock, and reserves the node it cordons."""
        with self.lock:
            node = cordon(self.budget(nodes()))
            if node is not None:
                self.reserve([node])


class Reconciler:
    def __init__(
        self,
        cluster: ClusterAPI,
        cache: ClusterCache,
        synced: Callable[[], bool],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        upload_defaults: UploadDefaults | None = None,
        *,
        health_url: str | None = None,
        progress: Callable[[tuple[str, str]], list[RankSample]] | None = None,
        progress_interval: float = DEFAULT_PROGRESS_INTERVAL,
        isolate_jobs: bool = True,
        straggler_cordon_budget: int = 0,
        reserved_service_accounts: frozenset[str] = frozenset(),
    ):
        self.cluster = cluster
        # Nodes onStraggler: Replace may keep cordoned at once, cluster-wide; 0: none.
        self.cordons = CordonReservations(straggler_cordon_budget)
        # Where training ranks send progress (controller.health_server); None: nowhere.
        self.health_url = health_url
        # The ranks' newest messages of a job (controller.health_server.ProgressStore.samples)
        # and how often their figures may be written to its status (lifecycle.progress).
        self.progress = progress
        self.progress_interval = progress_interval
        self.cache = cache
        # True once every watch has delivered its first full LIST: until then a missing pod or
        # node is unknown, not gone.
        self.synced = synced
        # S3 profile uploads (lifecycle.profile_upload): the chart-wide defaults.
        self.upload_defaults = upload_defaults or UploadDefaults()
        # Each job gets a NetworkPolicy admitting only its own pods (the chart's
        # networkPolicy.jobs).
        self.isolate_jobs = isolate_jobs
        # The chart's own ServiceAccounts: a job naming one is an invalid spec.
        self.reserved_service_accounts = reserved_service_accounts
        self.events = EventPoster(cluster)
        self.clock = clock
        self.holds = AdmissionHolds()
        # Jobs warned about pod fields the allowlist dropped, with the fields warned about.
        self.warned_dropped: dict[str, tuple[str, ...]] = {}
        # A gang's pods are independent creates; issuing them together keeps a 16-node
        # job from paying 16 sequential round trips.
        self._creators = ThreadPoolExecutor(
            max_workers=CREATE_CONCURRENCY, thread_name_prefix="create"
        )

    def _create_one(self, obj: Obj) -> tuple[Obj, Exception | None]:
        try:
            if not self.cluster.create(obj):
                # 409: ours from an earlier pass, or another owner's object of the same name.
                meta = obj["metadata"]
                existing = self.cluster.read_child(obj["kind"], meta["namespace"], meta["name"])
                ours = {r["uid"] for r in meta.get("ownerReferences") or []}
                if existing is not None and not any(_owned_by(existing, uid) for uid in ours):
                    existing.setdefault("kind", obj["kind"])
                    return obj, ForeignChildError(obj, existing)
        except Exception as error:
            return obj, error
        return obj, None

    def _create_all(self, objects: list[Obj], created_pods: list[str]) -> None:
        """Creates every object, adding the pods that exist now to `created_pods`; raises the
        first error with the object it was for."""
        # Service and PodGroup first: pods name the group, and the first pods to arrive
        # should find it.
        pods = [o for o in objects if o["kind"] == "Pod"]
        results = [self._create_one(o) for o in objects if o["kind"] != "Pod"]
        if not any(error for _, error in results):
            results += list(self._creators.map(self._create_one, pods))
        created_pods += [
            obj["metadata"]["name"]
            for obj, error in results
            if error is None and obj["kind"] == "Pod"
        ]
        for obj, error in results:
            if error is not None:
                raise _CreateError(obj, error) from error

    def reconcile(self, namespace: str, name: str) -> float | None:
        held = self.holds.remaining((namespace, name))
        if held is not None:
            # Admission refused this job's child; only a change it watches for releases it.
            return held
        since = self.holds.mark(namespace)
        if not self.synced() or not self.cache.settled((namespace, name)):
            return CACHE_WAIT_SECONDS
        body = self.cache.job((namespace, name))
        if body is None:
            raise JobGoneError(f"{namespace}/{name}")
        if body["metadata"].get("deletionTimestamp"):
            # Garbage collection removes the children through their owner references; we only
            # unblock pods whose node cannot confirm their deletion.
            return self._help_deletion(body)
        try:
            return self._reconcile(body)
        except _CreateError as failed:
            if isinstance(failed.error, ForeignChildError):
                return self._blocked_by_predecessor(body, failed.error)
            rejection = admission_rejection(failed.error)
            if rejection is not None:
                return self._rejected(body, failed.obj, rejection, since)
            error: Exception = failed.error
        except Exception as caught:
            error = caught
        if is_namespace_terminating(error):
            # The namespace goes, and the job with it: nothing more to create or report.
            raise JobGoneError(f"{namespace}/{name} (its namespace is being deleted)") from error
        if not is_forbidden(error):
            raise error
        message = (
            f"{api_error_message(error)}; the operator's RBAC (Helm chart "
            "templates/_rbac.tpl) must grant it"
        )
        self.events.post(body, "Warning", "PermissionDenied", message, self.clock())
        raise PermissionDeniedError(message) from error

    def _help_deletion(self, body: Obj) -> float:
        meta = body["metadata"]
        namespace, uid = meta["namespace"], meta["uid"]
        key = (namespace, meta["name"])
        pods = [p for p in self.cache.pods(key) if _owned_by(p, uid) and not is_upload_pod(p)]
        if not pods:
            raise JobGoneError(f"{namespace}/{meta['name']}")
        observed = observe(
            pods=pods,
            podgroups=[],
            service_exists=False,
            nodes=self.cache.nodes(),
            now=self.clock(),
        )
        deletions = cleanup.while_deleting(observed, _stuck_bound(body))
        for deletion in deletions:
            self.cluster.delete_pod(namespace, deletion.name, force=deletion.force)
        self.cache.expect(key, deleted=[d.name for d in deletions])
        return PREDECESSOR_RETRY_SECONDS

    def _record(self, body: Obj, decide: Callable[[Obj, int], Decision]) -> float | None:
        """Writes an outcome found while applying (the pass's own writes were cut short) on the
        job as it is now: `decide(current status, generation)` builds it."""
        meta = body["metadata"]
        fresh = self.cluster.get_training_job(meta["namespace"], meta["name"])
        if fresh is None:
            raise JobGoneError(f"{meta['namespace']}/{meta['name']}")
        current: Obj = fresh.get("status") or {}
        generation = int(fresh["metadata"].get("generation", 1))
        return self._apply(fresh, current, decide(current, generation))

    def _blocked_by_predecessor(self, body: Obj, error: ForeignChildError) -> float | None:
        """A child's name is taken: wait for it, with a bound and an escalation
        (`lifecycle.blockers`)."""
        blocker = blockers.blocker_view(
            error.existing, {n.name: n for n in map(node_view, self.cache.nodes())}
        )
        bound = _stuck_bound(body)
        return self._record(
            body,
            lambda current, generation: blockers.blocked(
                current, generation, blocker, bound_seconds=bound, now=self.clock()
            ),
        )

    def _rejected(
        self, body: Obj, obj: Obj, rejection: AdmissionRejection, since: Mark
    ) -> float | None:
        """Admission refused a child: the status names the real cause; no timed retries."""
        message = (
            f"{obj['kind']} {obj['metadata']['name']} was refused by the API server: "
            f"{rejection.message}"
        )
        meta = body["metadata"]
        if not rejection.fatal:
            log.info(
                "%s/%s: %s; held until the spec, its namespace's quota, limits, accounts or "
                "labels, or the PriorityClasses change",
                meta["namespace"],
                meta["name"],
                message,
            )
        self._record(
            body,
            lambda current, generation: admission.admission_rejected(
                current,
                generation,
                rejection.reason,
                message,
                fatal=rejection.fatal,
                now=self.clock(),
            ),
        )
        if rejection.fatal:
            return None  # only a spec change helps, and it wakes the job itself
        return self.holds.hold((meta["namespace"], meta["name"]), rejection.reason, since)

    def _reconcile(self, body: Obj) -> float | None:
        now = self.clock()
        current_status: Obj = body.get("status") or {}
        parsed = parse_job(
            body, self.health_url, reserved_service_accounts=self.reserved_service_accounts
        )
        if isinstance(parsed, list):
            decision = machine.invalid(
                current_status, int(body["metadata"].get("generation", 1)), parsed, now
            )
            return self._apply(body, current_status, decision)
        job = parsed
        key = (job.namespace, job.name)
        # Only children this job owns: a re-created job of the same name must not adopt its
        # predecessor's pods, PodGroups or Service that garbage collection has not removed yet.
        owned = [p for p in self.cache.pods(key) if _owned_by(p, job.uid)]
        # Profile upload pods are not part of any gang: their own policy looks at them.
        uploads = [p for p in owned if is_upload_pod(p)]
        pods = [p for p in owned if not is_upload_pod(p)]
        podgroups = [g for g in self.cache.podgroups(key) if _owned_by(g, job.uid)]
        queue = None
        if not any(podgroup_view(g).admitted for g in podgroups):
            # Only while Volcano has not let a gang in: then a missing or closed queue is the
            # likely reason, and Volcano itself (without its admission webhook) says nothing.
            name = job.spec.scheduling.queue
            queue = queue_view(name, self.cache.queue(name))
        service = self.cache.service(job.namespace, job.service_name)
        policy = self.cache.network_policy(job.namespace, job.network_policy_name)
        observed = observe(
            pods=pods,
            podgroups=podgroups,
            service_exists=service is not None and _owned_by(service, job.uid),
            network_policy_missing=self.isolate_jobs
            and not (policy is not None and _owned_by(policy, job.uid)),
            nodes=self.cache.nodes(),
            now=now,
            queue=queue,
        )
        decision = machine.decide(job, current_status, observed)
        if job.dropped_pod_fields and self.warned_dropped.get(job.uid) != job.dropped_pod_fields:
            # Once per job and operator process: the job was admitted before the allowlist.
            self.warned_dropped[job.uid] = job.dropped_pod_fields
            message = dropped_pod_fields_message(job.dropped_pod_fields)
            decision.events.append(EventRecord("Warning", "PodFieldsDropped", message))
        ranks = self.progress(key) if self.progress is not None and job.health_channel else None
        if ranks is not None:
            # Before the upload plan: a stall may end the attempt in this pass.
            apply_stall_policy(job, decision, observed, ranks)
            # The check runs outside the cordon lock; only a decision to cordon takes it.
            cordon = apply_straggler_policy(
                job, decision, observed, ranks, cordon_limit=self.cordons.limit
            )
            if cordon is not None:
                self.cordons.decide(cordon, self.cache.nodes)
        annotations = body["metadata"].get("annotations") or {}
        apply_on_demand_profile(job, decision, annotations, ranks, now)
        plan_upload(job, decision, uploads, self.upload_defaults, now)
        plan_on_demand_upload(job, decision, uploads, self.upload_defaults)
        if ranks is not None:
            decision.status = with_progress(
                job, decision.status, ranks, now, self.progress_interval
            )
        decision.status = validated_status(decision.status)
        return self._apply(body, current_status, decision)

    def _apply(
        self,
        body: Obj,
        current_status: Obj,
        decision: Decision,
    ) -> float | None:
        meta = body["metadata"]
        namespace = meta["namespace"]
        key = (namespace, meta["name"])
        # Every status write carries the wall-time ledger up to now (lifecycle.goodput).
        decision.status = validated_status(
            with_goodput(
                current_status,
                decision.status,
                self.clock(),
                parse_time(meta.get("creationTimestamp")),
            )
        )
        status_written = False
        if _status_before_side_effects(decision) and decision.status != current_status:
            # A restart, a finish or a stage's first attempt is stored before its side effects;
            # a stale view fails here with 409 and nothing is deleted.
            self._write_status(body, decision.status)
            status_written = True
        for patch in decision.patch_nodes:
            # After the restart that decided it is stored, before its new gang can be placed.
            self._patch_node(body, patch)
        for deletion in decision.delete_pods:
            self.cluster.delete_pod(namespace, deletion.name, force=deletion.force)
        self.cache.expect(key, deleted=[d.name for d in decision.delete_pods])
        for podgroup in decision.delete_podgroups:
            self.cluster.delete_podgroup(namespace, podgroup)
        for kind, name in decision.delete_foreign:
            self._delete_foreign(namespace, kind, name)
        created: list[str] = []
        try:
            self._create_all(decision.create, created)
        finally:
            # Only what exists: a refused pod the cache waited for would hold the job's next
            # pass (after a released hold) until the expectation expires.
            self.cache.expect(key, created=created)
        if decision.status != current_status and not status_written:
            # resourceVersion makes a stale pass fail with 409 and retry, never overwrite;
            # events follow the status so a retried pass does not post them twice.
            self._write_status(body, decision.status)
        for key_name, value in decision.remove_annotations:
            # After the status that recorded the request: a crash in between leaves the value
            # the status names, and the next pass only removes it.
            self.cluster.remove_training_job_annotation(namespace, meta["name"], key_name, value)
        for event in decision.events:
            log.info("%s/%s %s: %s", namespace, meta["name"], event.reason, event.message)
            self.events.post(body, event.type, event.reason, event.message, self.clock())
        for side in decision.side_create:
            self._create_side(body, side)
        if decision.delete_job:
            log.info("%s/%s: ttlSecondsAfterFinished elapsed, deleting", namespace, meta["name"])
            self.cluster.delete_training_job(namespace, meta["name"], meta["uid"])
        return decision.requeue_after

    def _patch_node(self, body: Obj, patch: NodePatch) -> None:
        """A node patch the RBAC refuses is reported and skipped: the gang restarts anyway (it
        may land on the same node); any other error fails the pass, and the next one retries."""
        try:
            self.cluster.cordon_node(patch.name, patch.body)
        except Exception as error:
            if not is_forbidden(error):
                raise
            message = (
                f"could not cordon node {patch.name}: {api_error_message(error)}; the "
                "operator's RBAC must grant patch on nodes (the chart grants it with the "
                f"{CORDON_BUDGET_SETTING})"
            )
            log.warning(
                "%s/%s: %s", body["metadata"]["namespace"], body["metadata"]["name"], message
            )
            self.events.post(body, "Warning", "CordonFailed", message, self.clock())

    def _delete_foreign(self, namespace: str, kind: str, name: str) -> None:
        if kind == "Pod":
            self.cluster.delete_pod(namespace, name, force=False)
        elif kind == "PodGroup":
            self.cluster.delete_podgroup(namespace, name)
        elif kind == "Service":
            self.cluster.delete_service(namespace, name)
        elif kind == "NetworkPolicy":
            self.cluster.delete_network_policy(namespace, name)

    def _create_side(self, body: Obj, obj: Obj) -> None:
        """Creates an object beside the job (a profile upload pod) after the job's own writes.
        Its refusal is recorded as its own outcome (the upload Failed, a Warning) and never
        touches the job's phase, restarts or holds; a passing API error retries the pass."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        name = obj["metadata"]["name"]
        try:
            self.cluster.create(obj)
        except Exception as error:
            # Anything but a refusal (the API server away, the namespace being deleted) goes
            # to `reconcile`'s own handling, as a failed pass.
            rejection = admission_rejection(error)
            if rejection is None and not is_forbidden(error):
                raise
            reason = rejection.message if rejection is not None else api_error_message(error)
            log.warning("%s/%s: upload pod %s refused: %s", *key, name, reason)
            if LABEL_PROFILE_REQUEST in obj["metadata"]["labels"]:
                self._record(
                    body,
                    lambda current, _generation: _on_demand_upload_refused(current, name, reason),
                )
                return
            attempt = int(obj["metadata"]["labels"][LABEL_PROFILE_ATTEMPT])
            self._record(
                body,
                lambda current, generation: _upload_refused(
                    current, attempt, name, reason, generation=generation, now=self.clock()
                ),
            )
            return
        self.cache.expect(key, created=[name])

    def _write_status(self, body: Obj, status: Obj) -> None:
        meta = body["metadata"]
        # The whole status replaces the old one, under the resourceVersion the pass decided on.
        written = self.cluster.replace_training_job_status(body, status)
        if written is not None:
            version = written["metadata"].get("resourceVersion")
            self.cache.expect((meta["namespace"], meta["name"]), job_version=version)
