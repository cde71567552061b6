"""One reconcile pass: gather the snapshot, decide, apply. Thin by design.

All judgement lives in `lifecycle.machine.decide` (every policy, in `PIPELINE`); this module
gathers one `Snapshot` from the watch-fed cache (`controller.cache`: no LIST or GET per pass),
keeping only children the job owns by UID (a re-created job with the same name must not adopt
its predecessor's pods that garbage collection has not removed yet), and applies the plan in
one order whatever the policies asked (`write_order`): the status first whenever the plan
deletes or cordons anything, changes the phase or asks for it; then deletions, creations, the
status if not written yet, annotation removals, the events, and side objects last. Writes go
straight to the API server, the status write with a resourceVersion precondition, and each is
remembered until the cache has seen it, so no pass decides on a view older than the
operator's own writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial

from trainium_operator.api.objects import Obj
from trainium_operator.builders.job import LABEL_ATTEMPT, LABEL_STAGE, JobRef, Stage
from trainium_operator.builders.upload import (
    LABEL_PROFILE_ATTEMPT,
    LABEL_PROFILE_REQUEST,
    is_upload_pod,
)
from trainium_operator.controller.admission_holds import AdmissionHolds, Mark
from trainium_operator.controller.cache import ClusterCache, Key
from trainium_operator.controller.job_memory import JobMemories
from trainium_operator.controller.views import Views
from trainium_operator.k8s.client import (
    AdmissionRejection,
    ClusterAPI,
    EventPoster,
    admission_rejection,
    api_error_message,
    is_forbidden,
    is_namespace_terminating,
    never_reached_server,
)
from trainium_operator.lifecycle import blockers, cleanup, machine
from trainium_operator.lifecycle.decision import Decision, NodePatch, PodDeletion
from trainium_operator.lifecycle.observed import (
    local_queue_view,
    node_view,
    observe,
    parse_time,
    podgroup_view,
    queue_view,
)
from trainium_operator.lifecycle.parse import parse_job
from trainium_operator.lifecycle.policies.profile_upload import UploadDefaults
from trainium_operator.lifecycle.policies.stragglers import (
    CORDON_BUDGET_SETTING,
    CordonBudget,
    cordoned_for_stragglers,
)
from trainium_operator.lifecycle.ranks import DEFAULT_INTERVAL_SECONDS as DEFAULT_PROGRESS_INTERVAL
from trainium_operator.lifecycle.ranks import RankSample
from trainium_operator.lifecycle.snapshot import PassSettings, Snapshot

log = logging.getLogger(__name__)
# A gang's pods are independent creates and deletes, issued together: a 512-node gang must
# not pay 512 sequential round trips to start, or to stop before its next attempt.
CHILD_WRITE_CONCURRENCY = 8


class _CreateError(Exception):
    def __init__(
        self, obj: Obj, error: Exception, *, pods_created: bool, pods_unsent: bool = False
    ):
        super().__init__(str(error))
        self.obj = obj
        self.error = error
        self.pods_created = pods_created  # whether any pod of the pass was created
        # Every pod create failed before reaching the API server: none can exist.
        self.pods_unsent = pods_unsent


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


def _stuck_bound(body: Obj) -> float:
    """How long a pod or a predecessor's child may linger before the operator escalates: the
    job's own bound, or the floor for a spec it cannot read."""
    parsed = parse_job(body)
    return cleanup.stuck_bound(parsed) if isinstance(parsed, JobRef) else cleanup.MIN_STUCK_SECONDS


def _owned_by(obj: Obj, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def _gang_of(objects: list[Obj]) -> tuple[Stage, int] | None:
    """The stage and attempt of the gang whose pods `objects` include (a pass creates one)."""
    for obj in objects:
        if obj["kind"] == "Pod":
            labels = obj["metadata"]["labels"]
            return Stage(labels[LABEL_STAGE]), int(labels[LABEL_ATTEMPT])
    return None


def status_first(decision: Decision, current: Obj) -> bool:
    """The applier's write order, whatever the policies asked: the status is stored before any
    side effect when the plan deletes or cordons anything, deletes the job, changes the phase,
    or asks for it (a restart's new attempt). A pass that creates pods without it stores only
    their record first (`Decision.status_before_pods`, before the pods). A terminal
    decision whose deletes landed but whose status did not (a 409, an operator exit) would
    otherwise find no pods next pass and train a finished job again."""
    return bool(
        decision.status_first
        or decision.delete_pods
        or decision.delete_podgroups
        or decision.delete_foreign
        or decision.patch_nodes
        or decision.delete_job
        or decision.status.get("phase") != current.get("phase")
    )


class CordonReservations:
    """The cluster-wide cordon budget: the nodes the cache shows cordoned for stragglers plus
    those this process reserved in the last RESERVATION_SECONDS (the cache may not show them
    yet). The straggler policy only proposes a cordon from the budget its snapshot saw; the
    applier checks and reserves it under one lock (`reserve`), so two jobs reconciled at once
    never both take the budget's last node. Only the active replica reconciles (peering), so a
    process-local record is enough."""

    RESERVATION_SECONDS = 60.0

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic):
        self.limit = limit
        self.lock = threading.Lock()
        self._clock = clock
        self._reserved: dict[str, float] = {}

    def budget(self, nodes: Iterable[Obj]) -> CordonBudget:
        """The budget as it is now; a pass's snapshot reads it without the lock (the applier
        checks again under it)."""
        now = self._clock()
        self._reserved = {
            n: t for n, t in self._reserved.items() if now - t < self.RESERVATION_SECONDS
        }
        return CordonBudget(self.limit, cordoned_for_stragglers(nodes) | set(self._reserved))

    def reserve(self, cordons: Iterable[str], nodes: Iterable[Obj]) -> bool:
        """Checks a plan's proposed cordons against the budget as it is now and reserves them,
        in one step under the lock; False (nothing reserved) when the budget has no room for
        them any more (another job took it since the snapshot): the plan is not applied."""
        with self.lock:
            budget = self.budget(nodes)
            wanted = [n for n in cordons if n not in budget.cordoned]
            if len(budget.cordoned) + len(wanted) > self.limit:
                return False
            now = self._clock()
            for node in wanted:
                self._reserved[node] = now
            return True

    def release(self, cordons: Iterable[str]) -> None:
        """Gives back reservations whose plan was not applied (its status write failed)."""
        with self.lock:
            for node in cordons:
                self._reserved.pop(node, None)


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
        ranks_since: Callable[[], datetime] | None = None,
        progress_interval: float = DEFAULT_PROGRESS_INTERVAL,
        isolate_jobs: bool = True,
        straggler_cordon_budget: int = 0,
        reserved_service_accounts: frozenset[str] = frozenset(),
        kueue: bool = False,
        dra: bool = False,
        preflight_multi_node: bool = False,
        topology: frozenset[str] = frozenset(),
    ):
        self.cluster = cluster
        # Kueue's Workloads and LocalQueues are watched: jobs labelled for Kueue are queued by it.
        self.kueue = kueue
        # Nodes onStraggler: Replace may keep cordoned at once, cluster-wide; 0: none.
        self.cordons = CordonReservations(straggler_cordon_budget)
        # Where training ranks send progress (controller.health_server); None: nowhere.
        self.health_url = health_url
        # The ranks' newest messages of a job (controller.health_server.ProgressStore.samples)
        # and how often their figures may be written to its status (lifecycle.policies.progress).
        self.progress = progress
        self.progress_interval = progress_interval
        # Since when that store keeps messages (ProgressStore.since): a pass knows it may not
        # have heard from every rank yet (after a start or a failover).
        self.ranks_since = ranks_since
        self.cache = cache
        # True once every watch has delivered its first full LIST: until then a missing pod or
        # node is unknown, not gone.
        self.synced = synced
        # S3 profile uploads (lifecycle.policies.profile_upload): the chart-wide defaults.
        self.upload_defaults = upload_defaults or UploadDefaults()
        # Each job gets a NetworkPolicy admitting only its own pods (the chart's
        # networkPolicy.jobs).
        self.isolate_jobs = isolate_jobs
        # The chart's own ServiceAccounts: a job naming one is an invalid spec.
        self.reserved_service_accounts = reserved_service_accounts
        # The schedulers network topology is kept for (controller.topology): a job's default
        # placement applies only under those.
        self.pass_settings = PassSettings(
            self.upload_defaults,
            progress_interval,
            kueue=kueue,
            dra=dra,
            topology=topology,
            preflight_multi_node=preflight_multi_node,
        )
        self.events = EventPoster(cluster)
        self.clock = clock
        self.holds = AdmissionHolds()
        self.views = Views()
        # Per job: the dropped pod fields warned about, and the gangs this process created,
        # saw, or knows it never sent (lifecycle.failures: gang_was_whole, gang_never_seen).
        self.memory = JobMemories()
        self._pod_writers = ThreadPoolExecutor(
            max_workers=CHILD_WRITE_CONCURRENCY, thread_name_prefix="pod-write"
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

    def _create_all(
        self, objects: list[Obj], created_pods: list[str], before_pods: Callable[[], None]
    ) -> None:
        """Creates every object, adding the pods that exist now to `created_pods`; raises the
        first error with the object it was for. `before_pods` runs once the other objects
        exist, before the first pod is created."""
        # Service and PodGroup first: pods name the group, and the first pods to arrive
        # should find it.
        pods = [o for o in objects if o["kind"] == "Pod"]
        results = [self._create_one(o) for o in objects if o["kind"] != "Pod"]
        if not any(error for _, error in results):
            if pods:
                before_pods()
            results += list(self._pod_writers.map(self._create_one, pods))
        created_pods += [
            obj["metadata"]["name"]
            for obj, error in results
            if error is None and obj["kind"] == "Pod"
        ]
        pod_errors = [error for obj, error in results if obj["kind"] == "Pod"]
        unsent = bool(pods) and len(pod_errors) == len(pods)
        unsent = unsent and all(e is not None and never_reached_server(e) for e in pod_errors)
        for obj, error in results:
            if error is not None:
                raise _CreateError(
                    obj, error, pods_created=bool(created_pods), pods_unsent=unsent
                ) from error

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
            self.memory.forget((namespace, name))
            self._delete_orphans((namespace, name))
            raise JobGoneError(f"{namespace}/{name}")
        if body["metadata"].get("deletionTimestamp"):
            # Garbage collection removes the children through their owner references; we only
            # unblock pods whose node cannot confirm their deletion.
            return self._help_deletion(body)
        try:
            return self._reconcile(body)
        except _CreateError as failed:
            if isinstance(failed.error, ForeignChildError):
                return self._blocked_by_predecessor(body, failed.error, failed.pods_created)
            rejection = admission_rejection(failed.error)
            if rejection is not None:
                return self._rejected(body, failed.obj, rejection, since, failed.pods_created)
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

    def _delete_orphans(self, key: Key) -> None:
        """A deleted job's gang goes at once, together, as its restarts' do: garbage collection
        would delete it at the controller manager's rate (20 requests/s by default), about 6 s
        for 128 pods. Each delete names the pod's uid, so a pod of a job re-created under the
        same name is never touched; garbage collection still deletes whatever this misses."""
        namespace = key[0]
        pods = [
            pod
            for pod in self.cache.orphaned_pods(key)
            if not pod["metadata"].get("deletionTimestamp") and not is_upload_pod(pod)
        ]

        def delete(pod: Obj) -> None:
            meta = pod["metadata"]
            try:
                self.cluster.delete_pod(namespace, meta["name"], force=False, uid=meta["uid"])
            except Exception as error:  # garbage collection deletes it anyway
                log.info("%s/%s: left to garbage collection (%r)", namespace, meta["name"], error)

        list(self._pod_writers.map(delete, pods))

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

    def _record(self, body: Obj, finding: machine.Finding) -> float | None:
        """Records what applying a pass found out (its own writes were cut short) on the job
        as it is now (`machine.decide_finding`)."""
        meta = body["metadata"]
        fresh = self.cluster.get_training_job(meta["namespace"], meta["name"])
        if fresh is None:
            raise JobGoneError(f"{meta['namespace']}/{meta['name']}")
        current: Obj = fresh.get("status") or {}
        generation = int(fresh["metadata"].get("generation", 1))
        created = parse_time(fresh["metadata"].get("creationTimestamp"))
        plan = machine.decide_finding(current, generation, self.clock(), created, finding)
        return self._apply(fresh, current, plan)

    def _blocked_by_predecessor(
        self, body: Obj, error: ForeignChildError, pods_created: bool
    ) -> float | None:
        """A child's name is taken: wait for it, with a bound and an escalation
        (`lifecycle.blockers`)."""
        blocker = blockers.blocker_view(
            error.existing, {n.name: n for n in map(node_view, self.cache.nodes())}
        )
        return self._record(body, machine.ChildNameTaken(blocker, _stuck_bound(body), pods_created))

    def _rejected(
        self,
        body: Obj,
        obj: Obj,
        rejection: AdmissionRejection,
        since: Mark,
        pods_created: bool,
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
            machine.ChildRefused(rejection.reason, message, rejection.fatal, pods_created),
        )
        if rejection.fatal:
            return None  # only a spec change helps, and it wakes the job itself
        return self.holds.hold((meta["namespace"], meta["name"]), rejection.reason, since)

    def snapshot(self, body: Obj) -> Snapshot:
        """Everything one pass of this job decides from, read once from the cache."""
        meta = body["metadata"]
        now = self.clock()
        generation = int(meta.get("generation", 1))
        status: Obj = body.get("status") or {}
        created = parse_time(meta.get("creationTimestamp"))
        nodes = self.cache.nodes()
        parsed = parse_job(
            body, self.health_url, reserved_service_accounts=self.reserved_service_accounts
        )
        if isinstance(parsed, list):
            observed = observe(pods=[], podgroups=[], service_exists=False, nodes=[], now=now)
            return Snapshot(
                None, generation, status, observed, created=created, problems=tuple(parsed)
            )
        job = parsed
        key = (job.namespace, job.name)
        # Only children this job owns: a re-created job of the same name must not adopt its
        # predecessor's pods, PodGroups or Service that garbage collection has not removed yet.
        owned = [p for p in self.cache.pods(key) if _owned_by(p, job.uid)]
        # Profile upload pods are not part of any gang: their own policies look at them.
        uploads = tuple(p for p in owned if is_upload_pod(p))
        pods = [p for p in owned if not is_upload_pod(p)]
        podgroups = [g for g in self.cache.podgroups(key) if _owned_by(g, job.uid)]
        queue = None
        if job.kueue_queue is None and not any(podgroup_view(g).admitted for g in podgroups):
            # Only while Volcano has not let a gang in: then a missing or closed queue is the
            # likely reason, and Volcano itself (without its admission webhook) says nothing.
            name = job.spec.scheduling.queue
            queue = queue_view(name, self.cache.queue(name))
        workloads: list[Obj] = []
        local_queue = None
        if job.kueue_queue is not None and self.kueue:
            workloads = self.cache.workloads(key)
            local_queue = local_queue_view(
                job.kueue_queue, self.cache.local_queue(job.namespace, job.kueue_queue)
            )
        service = self.cache.service(job.namespace, job.service_name)
        policy = self.cache.network_policy(job.namespace, job.network_policy_name)
        observed = observe(
            pod_view=self.views.pod,
            node_view=self.views.node,
            pods=pods,
            podgroups=podgroups,
            service_exists=service is not None and _owned_by(service, job.uid),
            network_policy_missing=self.isolate_jobs
            and not (policy is not None and _owned_by(policy, job.uid)),
            nodes=nodes,
            now=now,
            queue=queue,
            workloads=workloads,
            local_queue=local_queue,
        )
        memory = self.memory.of(key, job.uid)
        for pod in observed.pods:
            memory.know_gang(pod.stage, pod.attempt)
        ranks = self.progress(key) if self.progress is not None and job.health_channel else None
        return Snapshot(
            job,
            generation,
            status,
            observed,
            created=created,
            annotations=dict(meta.get("annotations") or {}),
            ranks=tuple(ranks) if ranks is not None else None,
            ranks_since=self.ranks_since() if ranks is not None and self.ranks_since else None,
            upload_pods=uploads,
            cordon_budget=self.cordons.budget(nodes),
            dropped_fields_warned=memory.warned_dropped == job.dropped_pod_fields,
            unsent_gang=memory.unsent_gang,
            gangs_known_here=dict(memory.gangs_known),
            settings=self.pass_settings,
        )

    def _reconcile(self, body: Obj) -> float | None:
        snapshot = self.snapshot(body)
        plan = machine.decide(snapshot)
        job = snapshot.job
        if job is not None and job.dropped_pod_fields:
            # Warned once per job and operator process (lifecycle.policies.pod_fields).
            self.memory.of(
                (job.namespace, job.name), job.uid
            ).warned_dropped = job.dropped_pod_fields
        return self._apply(body, snapshot.status, plan)

    def _apply(self, body: Obj, current_status: Obj, decision: Decision) -> float | None:
        """Applies a plan in the one write order (module docstring); the order is not the
        policies' to choose."""
        meta = body["metadata"]
        namespace = meta["namespace"]
        key = (namespace, meta["name"])
        cordons = [patch.name for patch in decision.patch_nodes]
        if cordons and not self.cordons.reserve(cordons, self.cache.nodes()):
            # Another job took the budget's last room since this pass's snapshot: decide again
            # on the budget as it is now (nothing was written).
            return CACHE_WAIT_SECONDS
        status_written = False
        if status_first(decision, current_status) and decision.status != current_status:
            # A stale view fails here with 409 and nothing else happens.
            try:
                self._write_status(body, decision.status)
            except Exception:
                self.cordons.release(cordons)
                raise
            status_written = True
        for patch in decision.patch_nodes:
            # After the restart that decided it is stored, before its new gang can be placed.
            self._patch_node(body, patch)
        # All of them, together; the first error (if any) fails the pass after the others
        # were tried, and the next pass deletes what is left.
        list(self._pod_writers.map(partial(self._delete_pod, namespace), decision.delete_pods))
        self.cache.expect(key, deleted=[d.name for d in decision.delete_pods])
        for podgroup in decision.delete_podgroups:
            self.cluster.delete_podgroup(namespace, podgroup)
        for kind, name in decision.delete_foreign:
            self._delete_foreign(namespace, kind, name)
        # The job and its status as the server holds them for the pass's last status write.
        target, stored = body, current_status

        def store_pods_record() -> None:
            nonlocal target, stored
            if decision.status_before_pods is not None and not status_written:
                target = self._write_status(body, decision.status_before_pods)
                stored = decision.status_before_pods

        created: list[str] = []
        memory = self.memory.of(key, meta["uid"])
        gang = _gang_of(decision.create)
        try:
            self._create_all(decision.create, created, store_pods_record)
        except _CreateError as failed:
            # Only for the pass that began the attempt's creates (it stored the record): had
            # an earlier pass created some of its pods, they may have run.
            if failed.pods_unsent and decision.status_before_pods is not None:
                memory.unsent_gang = gang
            elif gang is not None and failed.obj["kind"] == "Pod" and not failed.pods_unsent:
                memory.know_gang(*gang)  # some creates may have reached the API server
            raise
        finally:
            # Only what exists: a refused pod the cache waited for would hold the job's next
            # pass (after a released hold) until the expectation expires.
            self.cache.expect(key, created=created)
        if gang is not None:
            # Sent: whatever happens to its pods now, this process knows they were created.
            memory.know_gang(*gang)
        if created:
            memory.unsent_gang = None
        if decision.status != stored and not status_written:
            # resourceVersion makes a stale pass fail with 409 and retry, never overwrite;
            # events follow the status so a retried pass does not post them twice.
            self._write_status(target, decision.status)
        for key_name, value in decision.remove_annotations:
            # After the status that recorded the request: a crash in between leaves the value
            # the status names, and the next pass only removes it.
            self.cluster.remove_training_job_annotation(namespace, meta["name"], key_name, value)
        for event in decision.events:
            log.info("%s/%s %s: %s", namespace, meta["name"], event.reason, event.message)
            self.events.post(body, event.type, event.reason, event.message, self.clock())
        for side in decision.side_create:
            # After the job's own events: a side object's creation (or refusal, recorded as
            # its own outcome) never delays what the job's status change says.
            self._create_side(body, side)
        if decision.delete_job:
            log.info("%s/%s: ttlSecondsAfterFinished elapsed, deleting", namespace, meta["name"])
            self.cluster.delete_training_job(namespace, meta["name"], meta["uid"])
        return decision.requeue_after

    def _delete_pod(self, namespace: str, deletion: PodDeletion) -> None:
        self.cluster.delete_pod(namespace, deletion.name, force=deletion.force)
        # Only an operator running with Kueue has the grant (the chart's kueue.enabled);
        # without it a Kueue that manages pods on its own keeps them, as before.
        if deletion.release_finalizer is not None and self.kueue:
            self.cluster.release_pod_finalizer(namespace, deletion.name, deletion.release_finalizer)

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
        """Deletes a predecessor's leftover child (lifecycle.blockers decided it)."""
        delete: dict[str, Callable[[str, str], None]] = {
            "Pod": lambda ns, n: self.cluster.delete_pod(ns, n, force=False),
            "PodGroup": self.cluster.delete_podgroup,
            "Service": self.cluster.delete_service,
            "NetworkPolicy": self.cluster.delete_network_policy,
        }
        delete[kind](namespace, name)

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
            labels = obj["metadata"]["labels"]
            attempt = (
                None if LABEL_PROFILE_REQUEST in labels else int(labels[LABEL_PROFILE_ATTEMPT])
            )
            self._record(body, machine.UploadPodRefused(name, reason, attempt))
            return
        self.cache.expect(key, created=[name])

    def _write_status(self, body: Obj, status: Obj) -> Obj:
        """Writes `status` and returns `body` as it now is on the server (its new
        resourceVersion), for a later write of the same pass."""
        meta = body["metadata"]
        # The whole status replaces the old one, under the resourceVersion the pass decided on.
        written = self.cluster.replace_training_job_status(body, status)
        if written is None:
            return body
        version = written["metadata"].get("resourceVersion")
        self.cache.expect((meta["namespace"], meta["name"]), job_version=version)
        return {**body, "metadata": {**meta, "resourceVersion": version}}
