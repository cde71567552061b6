"""Wiring: the operator's live state, built from its settings in one place, and started.

TrainingJobs and their pods, PodGroups and Services are watched by our own reflectors
(`k8s.informer`) with server-side label selectors, into one cache (`controller.cache`) the
reconciler reads; nodes too, and a node's change wakes only the jobs with pods on it. Workers
run the reconciler in threads. kopf runs the process (`controller.handlers`).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from trainium_operator.api import spec as spec_model
from trainium_operator.builders.job import LABEL_JOB_NAME
from trainium_operator.controller import health_server, metrics
from trainium_operator.controller import topology as topology_reconciler
from trainium_operator.controller.admission_holds import AdmissionHolds
from trainium_operator.controller.cache import ClusterCache
from trainium_operator.controller.health_role import ROLE_PERIOD_SECONDS, HealthRole
from trainium_operator.controller.health_server import (
    HealthChannel,
    ProgressStore,
    TokenCache,
    reviewer,
)
from trainium_operator.controller.job_memory import JobMemories
from trainium_operator.controller.peering import PeeringGate
from trainium_operator.controller.reconciler import (
    JobGoneError,
    PermissionDeniedError,
    Reconciler,
)
from trainium_operator.controller.settings import OperatorSettings
from trainium_operator.controller.topology import TopologyReconciler
from trainium_operator.controller.watch_scope import watch_scope
from trainium_operator.controller.workqueue import Key, RetryableError, WorkQueue
from trainium_operator.k8s.client import (
    LOCAL_QUEUES,
    NETWORK_POLICIES,
    PODGROUPS,
    QUEUES,
    WORKLOADS,
    Cluster,
    is_conflict,
    is_transient,
    load_api_client,
)
from trainium_operator.k8s.informer import (
    Reflector,
    WatchEvent,
    ownership_and_status,
    ownership_only,
    without_managed_fields,
)
from trainium_operator.k8s.reviews import Reviews
from trainium_operator.process_memory import release_freed_memory

log = logging.getLogger(__name__)
T = TypeVar("T")
RESYNC_SECONDS = 120.0
RELEASE_MEMORY_SECONDS = 120.0
URGENT_TICK_SECONDS = 0.25  # how soon a rank's answer to a request wakes its job
# On SIGTERM, passes already running get this long to finish their writes; then they are
# abandoned (every pass is idempotent and records a restart before its side effects, so the
# next replica repeats what one left half done, as after a crash). Kubernetes waits 30 s
# between SIGTERM and SIGKILL; a standby replica takes over sooner the earlier we exit.
SHUTDOWN_GRACE_SECONDS = 2.0
CONFLICT_RETRY_SECONDS = 0.2
PEERING_RECHECK_SECONDS = 5.0
TAKEOVER_CHECK_SECONDS = 1.0  # how soon a replica that starts acting passes every job
PERMISSION_RETRY_SECONDS = 30.0  # until someone fixes the RBAC
STAND_DOWN_SECONDS = 3.0  # the shutdown's relabel of the pod waits no longer for the API


class RunningPasses:
    """The reconcile passes (and peering reads) running in worker threads right now: they
    outlive a cancelled asyncio task, so a shutdown waits for them, with a bound."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: Counter[Key] = Counter()

    def run(self, key: Key, call: Callable[[], T]) -> T:
        with self._lock:
            self._keys[key] += 1
        try:
            return call()
        finally:
            with self._lock:
                self._keys[key] -= 1
                if not self._keys[key]:
                    del self._keys[key]

    def keys(self) -> list[Key]:
        with self._lock:
            return sorted(self._keys)

    async def wait(self, seconds: float) -> list[Key]:
        """Waits up to `seconds` for the running passes to end; returns those still running."""
        deadline = time.monotonic() + seconds
        while self.keys() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self.keys()


@dataclass
class JobTracker:
    """Which jobs the operator knows, and what a job's own watch events do to the queue."""

    queue: WorkQueue
    cache: ClusterCache
    holds: AdmissionHolds
    health: HealthChannel | None = None  # None: no health channel
    # The reconciler's: what it remembers of a job goes with the job.
    memory: JobMemories = field(default_factory=JobMemories)
    seen_generations: dict[Key, tuple[Any, ...]] = field(default_factory=dict)

    def job_gone(self, key: Key) -> None:
        """A pass found its job gone. The key is forgotten only if no job of that name exists
        now: a job deleted and created again under the same name during the pass is a new job,
        and its own event (queued while the pass ran) must still wake it."""
        if self.cache.job(key) is not None:
            return
        self.queue.forget(key)
        self.seen_generations.pop(key, None)

    def job_changed(self, key: Key, event_type: str, revision: tuple[Any, ...]) -> None:
        if event_type == "DELETED":
            self.queue.forget(key)
            self.memory.forget(key, revision[0])
            if self.health is not None:
                self.health.forget(key)
            self.seen_generations.pop(key, None)
            self.holds.release(key)
            if self.cache.orphaned_pods(key):
                # One last pass deletes its gang's pods (Reconciler._delete_orphans), then
                # forgets the job.
                self.queue.add(key)
            return
        # Our own status writes come back as events; only spec changes (a new generation),
        # deletion and first sight need a pass. Pod and node events cover the rest.
        if self.seen_generations.get(key) != revision:
            self.seen_generations[key] = revision
            self.holds.release(key)  # a new spec may fix an admission refusal
            self.queue.add(key)

    def wake(self, keys: list[Key]) -> None:
        for key in keys:
            self.queue.touch(key)

    def wake_spaced(self, keys: list[Key]) -> None:
        # A pod's ordinary change (scheduled, Running, its conditions, the operator's own
        # deletes coming back): a gang's hundreds of them are spaced out (WorkQueue.nudge;
        # cache.PodChange says which are not).
        for key in keys:
            self.queue.nudge(key)

    def wake_held(self, keys: list[Key]) -> None:
        # A job held after an admission refusal still owes a pass to its own pods and to a
        # node going (a rank failed, a node lost): the refusal must never stand between a
        # running gang and its restart. Its refused create is retried once in that pass.
        for key in keys:
            self.holds.release(key)
            self.queue.touch(key)  # at once: a failure's restart is not spaced out


@dataclass
class Operator:
    """The running operator: its settings and its live state (shared by the kopf handlers)."""

    settings: OperatorSettings
    cluster: Cluster
    cache: ClusterCache
    queue: WorkQueue
    reconciler: Reconciler
    jobs: JobTracker
    progress: ProgressStore | None  # None: no health channel
    health: HealthChannel | None
    gate: PeeringGate | None  # None: standalone (no peering)
    # The health channel's role under peering (acting or standing by, the pod's label); None:
    # standalone or no channel, where the replica always acts.
    role: HealthRole | None = None
    # The opt-in topology reconciler (`--topology`) and what wakes it; None: off.
    topology: TopologyReconciler | None = None
    topology_changed: asyncio.Event = field(default_factory=asyncio.Event)
    reflectors: list[Reflector] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    role_task: asyncio.Task[None] | None = None
    counts: metrics.PassCounts = field(default_factory=metrics.PassCounts)
    passes: RunningPasses = field(default_factory=RunningPasses)

    def metrics_text(self) -> str:
        return metrics.metrics_text(
            self.counts, len(self.queue.known), self.cluster.counter, self.health
        )


def build_operator(settings: OperatorSettings) -> Operator:
    """The operator's live state from its settings; nothing runs until `start`."""
    cluster = Cluster(load_api_client(settings.kubeconfig))
    cache = ClusterCache()
    queue = WorkQueue()
    reflectors: list[Reflector] = []
    synced = partial(_all_synced, reflectors)

    health_settings = settings.health
    progress = ProgressStore() if health_settings is not None else None
    reconciler = Reconciler(
        cluster,
        cache,
        synced=synced,
        upload_defaults=settings.upload,
        health_url=health_settings.url if health_settings is not None else None,
        progress=progress.samples if progress is not None else None,
        ranks_since=(lambda: progress.since) if progress is not None else None,
        progress_interval=settings.progress_interval,
        isolate_jobs=settings.isolate_jobs,
        straggler_cordon_budget=settings.straggler_cordon_budget,
        reserved_service_accounts=settings.reserved_service_accounts,
        kueue=settings.kueue,
        dra=settings.dra,
        preflight_multi_node=settings.preflight_multi_node,
        topology=settings.topology,
    )
    peering = settings.peering
    health = None
    if progress is not None:
        reviews = Reviews(cluster.api_client, cluster.counter)
        health = HealthChannel(
            cache,
            TokenCache(reviewer(reviews)),
            store=progress,
            synced=synced,
            # A peered replica keeps messages once its role check finds it acting.
            accepting=peering is None,
        )
    gate = (
        PeeringGate(cluster, peering.name, peering.priority, not settings.namespaces)
        if peering is not None
        else None
    )
    role = (
        HealthRole(
            health,
            partial(_acts, gate, settings.namespaces),
            cluster if settings.own_pod is not None else None,
            settings.own_pod,
        )
        if health is not None and gate is not None
        else None
    )
    return Operator(
        settings=settings,
        cluster=cluster,
        cache=cache,
        queue=queue,
        reconciler=reconciler,
        jobs=JobTracker(queue, cache, reconciler.holds, health, memory=reconciler.memory),
        progress=progress,
        health=health,
        gate=gate,
        role=role,
        topology=(
            TopologyReconciler(cluster, cache.nodes, settings.topology)
            if settings.topology
            else None
        ),
        reflectors=reflectors,
    )


def start(operator: Operator) -> None:
    """Starts the workers, the watches and the servers on the running event loop."""
    settings, queue = operator.settings, operator.queue
    tasks = operator.tasks
    for _index in range(settings.workers):
        tasks.append(asyncio.create_task(queue.run_worker(partial(_process, operator))))
    tasks.append(asyncio.create_task(_resync(queue)))
    _start_watches(operator, asyncio.get_running_loop())
    tasks.append(
        asyncio.create_task(_release_freed_memory(partial(_all_synced, operator.reflectors)))
    )
    if operator.topology is not None:
        tasks.append(
            asyncio.create_task(
                topology_reconciler.run(
                    operator.topology,
                    operator.topology_changed,
                    ready=partial(_all_synced, operator.reflectors),
                    may_work=partial(_may_write_topology, operator),
                )
            )
        )
    if settings.metrics_port:
        tasks.append(
            asyncio.create_task(metrics.serve(operator.metrics_text, settings.metrics_port))
        )
    health, progress = operator.health, operator.progress
    if settings.health is not None and health is not None and progress is not None:
        tasks.append(
            asyncio.create_task(health_server.serve(health, "0.0.0.0", settings.health.port))
        )
        tasks.append(
            asyncio.create_task(_wake_on_progress(progress, queue, settings.progress_interval))
        )
    if operator.role is not None:
        operator.role_task = asyncio.create_task(_keep_role(operator.role))
    if operator.gate is not None:
        tasks.append(asyncio.create_task(_wake_on_takeover(operator.gate, queue)))


async def _wake_on_takeover(gate: PeeringGate, queue: WorkQueue) -> None:
    """A replica that starts acting passes every job of that peering at once. While it stood
    by, its jobs came back only every PEERING_RECHECK_SECONDS: a job nothing happens to (a
    gang on a node that went NotReady, a requeue the replica before planned) waited that long
    for its first pass, and through a series of failovers, each replica stopped sooner, for
    as long as the series lasted."""
    unreadable: set[str] = set()  # warned once until the peering reads again
    while True:
        # Reading keeps the gate fresh; the gate itself notes a refusal turned into leave
        # (PeeringGate.took_over), whichever read saw it first: this one or a pass's.
        for scope in sorted({gate.scope(namespace) for namespace, _ in queue.known}):
            try:
                await asyncio.to_thread(gate.may_work, scope)
                unreadable.discard(scope)
            except Exception as error:  # checked again next time; the jobs' own passes retry
                if not is_transient(error) and scope not in unreadable:
                    log.warning("peering %r unreadable: %r", scope, error)
                unreadable.add(scope)
        for scope in gate.took_over():
            keys = [key for key in list(queue.known) if gate.scope(key[0]) == scope]
            log.info("peering: this replica acts%s; passing its %d jobs", _in(scope), len(keys))
            for key in keys:
                queue.touch(key)
        await asyncio.sleep(TAKEOVER_CHECK_SECONDS)


def _in(scope: str) -> str:
    return f" in namespace {scope}" if scope else ""


async def _keep_role(role: HealthRole) -> None:
    while True:
        await asyncio.to_thread(role.check_logged)
        await asyncio.sleep(ROLE_PERIOD_SECONDS)


async def _stand_down(operator: Operator) -> None:
    """The health channel's part of a shutdown, before its port closes: stop acting, label the
    pod standby, and keep answering (503, retry) while the Service's endpoints drop it."""
    role, task = operator.role, operator.role_task
    if role is None:
        return
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    try:
        await asyncio.wait_for(
            asyncio.to_thread(role.check_logged, stopping=True), STAND_DOWN_SECONDS
        )
    except TimeoutError:
        log.warning("health channel: the pod's label was not set to standby in time")
    await asyncio.sleep(role.drain_seconds())


async def stop(operator: Operator) -> list[Key]:
    """Stops the watches and tasks; returns the passes still running after the grace."""
    await _stand_down(operator)
    for reflector in operator.reflectors:
        reflector.stop()
    for task in operator.tasks:
        task.cancel()
    await asyncio.gather(*operator.tasks, return_exceptions=True)
    return await operator.passes.wait(SHUTDOWN_GRACE_SECONDS)


async def _process(operator: Operator, key: Key) -> float | None:
    gate, passes, counts = operator.gate, operator.passes, operator.counts
    if gate is not None:
        try:
            may_work = await asyncio.to_thread(passes.run, key, lambda: gate.may_work(key[0]))
        except Exception as error:
            if is_transient(error):
                raise RetryableError(f"peering unreadable ({error!r})") from error
            raise
        if not may_work:
            if operator.cache.job(key) is None:
                # A deleted job's last pass (its pods' deletes) is the acting replica's.
                operator.jobs.job_gone(key)
                return None
            return PEERING_RECHECK_SECONDS  # another replica works; keep the key warm
    counts.reconciles += 1
    started = time.monotonic()
    try:
        requeue_after = await asyncio.to_thread(
            passes.run, key, lambda: operator.reconciler.reconcile(*key)
        )
        # With --verbose: where a slow start or restart spends its time.
        log.debug("%s/%s: pass took %.3f s", *key, time.monotonic() - started)
    except JobGoneError:
        operator.jobs.job_gone(key)
        return None
    except PermissionDeniedError as error:
        counts.errors += 1
        log.error("%s/%s: permission denied: %s", *key, error)
        return PERMISSION_RETRY_SECONDS
    except Exception as error:
        if is_conflict(error):
            # Our view was stale; the next pass reads the fresh object.
            log.info("%s/%s changed during reconcile; re-reading", *key)
            return CONFLICT_RETRY_SECONDS
        counts.errors += 1
        if is_transient(error):
            raise RetryableError(f"the API server is unavailable ({error!r})") from error
        raise
    return requeue_after


def _start_watches(operator: Operator, loop: asyncio.AbstractEventLoop) -> None:
    """One reflector per kind (and watched namespace); each updates the cache in its own
    thread and hands the job keys to wake to the event loop."""
    cluster, cache, jobs = operator.cluster, operator.cache, operator.jobs

    def on_job(event: WatchEvent) -> None:
        change = cache.on_job(event)
        meta = event.obj["metadata"]
        revision = (meta.get("uid"), meta.get("generation"), meta.get("deletionTimestamp"))
        loop.call_soon_threadsafe(jobs.job_changed, change.key, event.type, revision)
        if change.settles_wait:
            # A pass waits for this status write to come back (Reconciler: CACHE_WAIT_SECONDS).
            loop.call_soon_threadsafe(jobs.wake, [change.key])

    def child(update: Callable[[WatchEvent], Key | None]) -> Callable[[WatchEvent], None]:
        def on_event(event: WatchEvent) -> None:
            key = update(event)
            if key is not None:
                loop.call_soon_threadsafe(jobs.wake, [key])

        return on_event

    def on_pod(event: WatchEvent) -> None:
        change = cache.on_pod(event)
        if change is not None:
            if change.urgent:
                wake = jobs.wake_held
            elif change.settles_wait:
                wake = jobs.wake  # a held job stays held: its own writes coming back
            else:
                wake = jobs.wake_spaced
            loop.call_soon_threadsafe(wake, [change.key])

    def several(
        update: Callable[[WatchEvent], list[Key]], *, release: bool = False
    ) -> Callable[[WatchEvent], None]:
        def on_event(event: WatchEvent) -> None:
            keys = update(event)
            if keys:
                loop.call_soon_threadsafe(jobs.wake_held if release else jobs.wake, keys)

        return on_event

    handlers: dict[str, Callable[[WatchEvent], None]] = {
        spec_model.PLURAL: on_job,
        # A PodGroup's admission and the other children wake their job at once.
        "pods": on_pod,
        "services": child(cache.on_service),
        NETWORK_POLICIES: child(cache.on_network_policy),
        PODGROUPS: child(cache.on_podgroup),
        WORKLOADS: child(cache.on_workload),
        LOCAL_QUEUES: several(cache.on_local_queue),
    }
    # Only the operator's children, selected by the API server: nothing else is held. Kueue
    # labels neither its Workloads nor the LocalQueues: the cache keeps only our groups'.
    selectors = {spec_model.PLURAL: None, WORKLOADS: None, LOCAL_QUEUES: None}
    # A job's Service and NetworkPolicy are only checked for being there and being the job's,
    # a PodGroup for its state (ClusterCache.service, lifecycle.observed.podgroup_view): the
    # cache keeps no more of them.
    transforms = {
        "services": ownership_only,
        NETWORK_POLICIES: ownership_only,
        PODGROUPS: ownership_and_status,
    }
    scope = watch_scope(operator.settings.namespaces)
    reflectors = operator.reflectors
    for namespace in scope.sources:
        sources = cluster.watch_sources(namespace, kueue_objects=operator.settings.kueue)
        for resource, call in sources.items():
            reflectors.append(
                Reflector(
                    resource,
                    call,
                    handlers[resource],
                    label_selector=selectors.get(resource, LABEL_JOB_NAME),
                    counter=cluster.counter,
                    accepts_namespace=scope.accepts,
                    transform=transforms.get(resource, without_managed_fields),
                )
            )
    counter = cluster.counter
    on_node = several(cache.on_node, release=True)
    topology, changed = operator.topology, operator.topology_changed
    if topology is not None:
        wake_jobs = on_node

        def on_node(event: WatchEvent) -> None:
            wake_jobs(event)
            if topology.node_changed(event):
                loop.call_soon_threadsafe(changed.set)

    reflectors += [
        # A node's readiness changed: the jobs with pods on it (a lost node restarts them);
        # its topology changed: the topology reconciler's next pass.
        Reflector("nodes", cluster.node_source(), on_node, counter=counter),
        Reflector(QUEUES, cluster.queue_source(), several(cache.on_queue), counter=counter),
    ]
    for reflector in reflectors:
        reflector.start()


def _acts(gate: PeeringGate | None, namespaces: tuple[str, ...]) -> bool:
    """Whether this is the working replica: the one kopf's peering lets work (cluster-wide, or
    in the first watched namespace)."""
    if gate is None:
        return True
    return gate.may_work(namespaces[0] if namespaces else "")


def _may_write_topology(operator: Operator) -> bool:
    """The cluster-scoped topology objects are written by the working replica only."""
    return _acts(operator.gate, operator.settings.namespaces)


async def _wake_on_progress(store: ProgressStore, queue: WorkQueue, interval: float) -> None:
    # Progress reaches the status through the job's own pass (one writer of the status), once
    # per interval for the jobs whose ranks reported: however many ranks, one pass each. A
    # rank's answer to a request (a stalled gang's stacks) wakes its job within a tick.
    tick = min(interval, URGENT_TICK_SECONDS)
    waited = 0.0
    while True:
        await asyncio.sleep(tick)
        waited += tick
        for key in store.take_urgent():
            queue.touch(key)
        if waited + 1e-9 >= interval:
            waited = 0.0
            for key in store.take_changed():
                queue.touch(key)


def _all_synced(reflectors: list[Reflector]) -> bool:
    return all(r.synced.is_set() for r in reflectors)


async def _release_freed_memory(synced: Callable[[], bool]) -> None:
    # The first lists of the cluster are the start's largest allocations, and glibc keeps
    # what they freed (about 5 MiB of an idle operator's RSS): give it back once the caches
    # are synced, then after whatever bursts come later.
    while not synced():
        await asyncio.sleep(0.5)
    while True:
        await asyncio.to_thread(release_freed_memory)
        await asyncio.sleep(RELEASE_MEMORY_SECONDS)


async def _resync(queue: WorkQueue) -> None:
    # A safety net for anything a watch missed; reconciles are idempotent.
    while True:
        await asyncio.sleep(RESYNC_SECONDS)
        for key in list(queue.known):
            queue.add(key)


def run_operator(settings: OperatorSettings) -> None:
    """Builds the operator and runs it under kopf until the process is told to stop."""
    import kopf

    # Importing the handlers registers them with kopf.
    importlib.import_module("trainium_operator.controller.handlers")
    kopf.configure(
        verbose=settings.verbose,
        log_format=kopf.LogFormat[settings.log_format.upper()],  # LOG_FORMATS are its names
    )
    peering = settings.peering
    kopf.run(
        standalone=peering is None,
        peering_name=peering.name if peering is not None else None,
        priority=peering.priority if peering is not None else 0,
        namespaces=list(settings.namespaces),
        clusterwide=not settings.namespaces,
        liveness_endpoint=settings.liveness_endpoint,
        memo=kopf.Memo(operator=build_operator(settings)),
    )
