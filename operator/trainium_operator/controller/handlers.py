"""Wiring: watches feed the cache and the work queue; workers run the reconciler in threads.

TrainingJobs and their pods, PodGroups and Services are watched by our own reflectors
(`k8s.informer`) with server-side label selectors, into one cache (`controller.cache`) the
reconciler reads; nodes too, and a node's change wakes only the jobs with pods on it. kopf
runs the process (login, peering, probes) and watches what can lift an admission refusal.
Only `on.event` handlers are used, so kopf adds no finalizers and no progress annotations:
deleting a TrainingJob never waits for the operator, and garbage collection removes its
children through owner references.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kopf
from aiohttp import web

from trainium_operator.api import spec as spec_model
from trainium_operator.builders.job import LABEL_JOB_NAME
from trainium_operator.controller import health_server
from trainium_operator.controller.cache import ClusterCache
from trainium_operator.controller.health_server import (
    HealthChannel,
    ProgressStore,
    TokenCache,
    reviewer,
)
from trainium_operator.controller.peering import PeeringGate
from trainium_operator.controller.reconciler import (
    JobGoneError,
    PermissionDeniedError,
    Reconciler,
)
from trainium_operator.controller.watch_scope import watch_scope
from trainium_operator.controller.workqueue import Key, RetryableError, WorkQueue
from trainium_operator.k8s.client import (
    NETWORK_POLICIES,
    PODGROUPS,
    PRIORITY_CLASS_NOT_FOUND,
    QUEUES,
    Cluster,
    credentials,
    is_conflict,
    is_transient,
    load_api_client,
)
from trainium_operator.k8s.informer import Reflector, WatchEvent
from trainium_operator.k8s.reviews import Reviews
from trainium_operator.lifecycle.ranks import DEFAULT_INTERVAL_SECONDS as DEFAULT_PROGRESS_INTERVAL

log = logging.getLogger(__name__)
T = TypeVar("T")
RESYNC_SECONDS = 120.0
URGENT_TICK_SECONDS = 0.25  # how soon a rank's answer to a request wakes its job
# On SIGTERM, passes already running get this long to finish their writes; then they are
# abandoned (every pass is idempotent and records a restart before its side effects, so the
# next replica repeats what one left half done, as after a crash). Kubernetes waits 30 s
# between SIGTERM and SIGKILL; a standby replica takes over sooner the earlier we exit.
SHUTDOWN_GRACE_SECONDS = 2.0
CONFLICT_RETRY_SECONDS = 0.2
PEERING_RECHECK_SECONDS = 5.0
PERMISSION_RETRY_SECONDS = 30.0  # until someone fixes the RBAC


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
class Runtime:
    """Operator-wide state shared by the handlers (passed to kopf as `memo`)."""

    kubeconfig: str | None = None
    workers: int = 4
    peering: str | None = None
    priority: int = 0
    peering_lifetime: int = 60
    namespaces: tuple[str, ...] = ()  # names or glob patterns; empty: all
    gate: PeeringGate | None = None
    metrics_port: int | None = None
    health_port: int | None = None  # the health channel's endpoint (controller.health_server)
    health_url: str | None = None  # how training pods reach it
    health: HealthChannel | None = None
    progress_interval: float = DEFAULT_PROGRESS_INTERVAL  # seconds between progress writes
    straggler_cordon_budget: int = 0  # nodes onStraggler: Replace may keep cordoned; 0: off
    queue: WorkQueue | None = None
    cluster: Cluster | None = None
    reconciler: Reconciler | None = None
    cache: ClusterCache = field(default_factory=ClusterCache)
    reflectors: list[Reflector] = field(default_factory=list)
    seen_generations: dict[Key, tuple[Any, ...]] = field(default_factory=dict)
    reconciles: int = 0
    reconcile_errors: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    passes: RunningPasses = field(default_factory=RunningPasses)


def _runtime(memo: Any) -> Runtime:
    runtime = memo.runtime
    assert isinstance(runtime, Runtime)
    return runtime


def _queue(memo: Any) -> WorkQueue:
    queue = _runtime(memo).queue
    if queue is None:
        raise RuntimeError("the work queue starts in the startup handler")
    return queue


@kopf.on.login()
def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
    # kopf's default login reads $KUBECONFIG; ours honours --kubeconfig and in-cluster config.
    creds = credentials(_runtime(memo).kubeconfig)
    return kopf.ConnectionInfo(
        server=creds.server,
        ca_path=creds.ca_path,
        insecure=creds.insecure,
        certificate_path=creds.certificate_path,
        private_key_path=creds.private_key_path,
        token=creds.token,
        scheme="Bearer" if creds.token else None,
    )


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    runtime = _runtime(memo)
    settings.posting.level = logging.WARNING  # our own Events describe the job
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.error_backoffs = [1, 2, 5, 10]
    settings.peering.lifetime = runtime.peering_lifetime
    runtime.queue = WorkQueue()
    runtime.cluster = Cluster(load_api_client(runtime.kubeconfig))
    store = ProgressStore() if runtime.health_port else None
    runtime.reconciler = Reconciler(
        runtime.cluster,
        runtime.cache,
        synced=lambda: all(r.synced.is_set() for r in runtime.reflectors),
        health_url=runtime.health_url if runtime.health_port else None,
        progress=store.samples if store is not None else None,
        progress_interval=runtime.progress_interval,
        straggler_cordon_budget=runtime.straggler_cordon_budget,
    )
    queue, reconciler = runtime.queue, runtime.reconciler
    if runtime.peering:
        runtime.gate = PeeringGate(
            runtime.cluster, runtime.peering, runtime.priority, not runtime.namespaces
        )
    gate = runtime.gate

    async def process(key: Key) -> float | None:
        if gate is not None:
            try:
                may_work = await asyncio.to_thread(
                    runtime.passes.run, key, lambda: gate.may_work(key[0])
                )
            except Exception as error:
                if is_transient(error):
                    raise RetryableError(f"peering unreadable ({error!r})") from error
                raise
            if not may_work:
                return PEERING_RECHECK_SECONDS  # another replica works; keep the key warm
        runtime.reconciles += 1
        try:
            requeue_after = await asyncio.to_thread(
                runtime.passes.run, key, lambda: reconciler.reconcile(*key)
            )
        except JobGoneError:
            job_gone(runtime, key)
            return None
        except PermissionDeniedError as error:
            runtime.reconcile_errors += 1
            log.error("%s/%s: permission denied: %s", *key, error)
            return PERMISSION_RETRY_SECONDS
        except Exception as error:
            if is_conflict(error):
                # Our view was stale; the next pass reads the fresh object.
                log.info("%s/%s changed during reconcile; re-reading", *key)
                return CONFLICT_RETRY_SECONDS
            runtime.reconcile_errors += 1
            if is_transient(error):
                raise RetryableError(f"the API server is unavailable ({error!r})") from error
            raise
        return requeue_after

    for _index in range(runtime.workers):
        runtime.tasks.append(asyncio.create_task(queue.run_worker(process)))
    runtime.tasks.append(asyncio.create_task(_resync(queue)))
    _start_watches(runtime, asyncio.get_running_loop())
    if runtime.metrics_port:
        runtime.tasks.append(asyncio.create_task(_serve_metrics(runtime, runtime.metrics_port)))
    if runtime.health_port and store is not None:
        reviews = Reviews(runtime.cluster.api_client, runtime.cluster.counter)
        runtime.health = HealthChannel(
            runtime.cache,
            TokenCache(reviewer(reviews)),
            store=store,
            synced=lambda: all(r.synced.is_set() for r in runtime.reflectors),
        )
        runtime.tasks.append(
            asyncio.create_task(health_server.serve(runtime.health, "0.0.0.0", runtime.health_port))
        )
        runtime.tasks.append(
            asyncio.create_task(_wake_on_progress(store, queue, runtime.progress_interval))
        )


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    runtime = _runtime(memo)
    for reflector in runtime.reflectors:
        reflector.stop()
    for task in runtime.tasks:
        task.cancel()
    await asyncio.gather(*runtime.tasks, return_exceptions=True)
    running = await runtime.passes.wait(SHUTDOWN_GRACE_SECONDS)
    if running:
        # asyncio.run would wait for these threads without a bound (an API server that stopped
        # answering holds them for minutes): exit now, as a crash would, which is safe.
        log.warning(
            "exiting with %d reconcile pass(es) unfinished after %.0f s (%s); the next replica "
            "repeats them",
            len(running),
            SHUTDOWN_GRACE_SECONDS,
            ", ".join(f"{namespace}/{name}" for namespace, name in running),
        )
        logging.shutdown()
        os._exit(0)


def job_gone(runtime: Runtime, key: Key) -> None:
    """A pass found its job gone. The key is forgotten only if no job of that name exists now:
    a job deleted and created again under the same name during the pass is a new job, and its
    own event (queued while the pass ran) must still wake it."""
    if runtime.cache.job(key) is not None:
        return
    if runtime.queue is not None:
        runtime.queue.forget(key)
    runtime.seen_generations.pop(key, None)


def _start_watches(runtime: Runtime, loop: asyncio.AbstractEventLoop) -> None:
    """One reflector per kind (and watched namespace); each updates the cache in its own
    thread and hands the job keys to wake to the event loop."""
    assert runtime.cluster is not None
    assert runtime.queue is not None
    cluster, cache, queue = runtime.cluster, runtime.cache, runtime.queue

    def wake(keys: list[Key]) -> None:
        for key in keys:
            queue.touch(key)

    def wake_held(keys: list[Key]) -> None:
        # A job held after an admission refusal still owes a pass to its own pods and to a
        # node going (a rank failed, a node lost): the refusal must never stand between a
        # running gang and its restart. Its refused create is retried once in that pass.
        reconciler = runtime.reconciler
        for key in keys:
            if reconciler is not None:
                reconciler.holds.release(key)
            queue.touch(key)

    def on_job(event: WatchEvent) -> None:
        key = cache.on_job(event)
        meta = event.obj["metadata"]
        revision = (meta.get("uid"), meta.get("generation"), meta.get("deletionTimestamp"))
        loop.call_soon_threadsafe(_job_changed, runtime, key, event.type, revision)

    def child(
        update: Callable[[WatchEvent], Key | None],
        *,
        release: Callable[[WatchEvent], bool] = lambda _: False,
    ) -> Callable[[WatchEvent], None]:
        def on_event(event: WatchEvent) -> None:
            key = update(event)
            if key is not None:
                loop.call_soon_threadsafe(wake_held if release(event) else wake, [key])

        return on_event

    def several(
        update: Callable[[WatchEvent], list[Key]], *, release: bool = False
    ) -> Callable[[WatchEvent], None]:
        def on_event(event: WatchEvent) -> None:
            keys = update(event)
            if keys:
                loop.call_soon_threadsafe(wake_held if release else wake, keys)

        return on_event

    handlers: dict[str, Callable[[WatchEvent], None]] = {
        spec_model.PLURAL: on_job,
        "pods": child(cache.on_pod, release=_pod_ended),
        "services": child(cache.on_service),
        NETWORK_POLICIES: child(cache.on_network_policy),
        PODGROUPS: child(cache.on_podgroup),
    }
    # Only the operator's children, selected by the API server: nothing else is held.
    selectors = {spec_model.PLURAL: None}
    scope = watch_scope(runtime.namespaces)
    for namespace in scope.sources:
        for resource, call in cluster.watch_sources(namespace).items():
            runtime.reflectors.append(
                Reflector(
                    resource,
                    call,
                    handlers[resource],
                    label_selector=selectors.get(resource, LABEL_JOB_NAME),
                    counter=cluster.counter,
                    accepts_namespace=scope.accepts,
                )
            )
    counter = cluster.counter
    runtime.reflectors += [
        # A node's readiness changed: the jobs with pods on it (a lost node restarts them).
        Reflector(
            "nodes", cluster.node_source(), several(cache.on_node, release=True), counter=counter
        ),
        Reflector(QUEUES, cluster.queue_source(), several(cache.on_queue), counter=counter),
    ]
    for reflector in runtime.reflectors:
        reflector.start()


def _pod_ended(event: WatchEvent) -> bool:
    """A pod gone, going or finished: its job may owe a restart even while it is held."""
    if event.type == "DELETED" or event.obj["metadata"].get("deletionTimestamp"):
        return True
    return (event.obj.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _job_changed(runtime: Runtime, key: Key, event_type: str, revision: tuple[Any, ...]) -> None:
    queue = runtime.queue
    assert queue is not None
    if event_type == "DELETED":
        queue.forget(key)
        if runtime.health is not None:
            runtime.health.forget(key)
        runtime.seen_generations.pop(key, None)
        if runtime.reconciler is not None:
            runtime.reconciler.holds.release(key)
        return
    # Our own status writes come back as events; only spec changes (a new generation),
    # deletion and first sight need a pass. Pod and node events cover the rest.
    if runtime.seen_generations.get(key) != revision:
        runtime.seen_generations[key] = revision
        if runtime.reconciler is not None:
            runtime.reconciler.holds.release(key)  # a new spec may fix an admission refusal
        queue.add(key)


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


async def _resync(queue: WorkQueue) -> None:
    # A safety net for anything a watch missed; reconciles are idempotent.
    while True:
        await asyncio.sleep(RESYNC_SECONDS)
        for key in list(queue.known):
            queue.add(key)


def _retry_held(memo: Any, keys: list[Key]) -> None:
    queue = _runtime(memo).queue
    for key in keys:
        if queue is not None:
            queue.touch(key)


# What can lift an admission refusal (see controller/admission_holds.py): each change wakes the
# jobs held in its namespace; a PriorityClass wakes the jobs that named a missing one.
@kopf.on.event("", "v1", "resourcequotas")
@kopf.on.event("", "v1", "limitranges")
@kopf.on.event("", "v1", "serviceaccounts")
def namespace_policy_event(namespace: str | None, memo: Any, **_: Any) -> None:
    reconciler = _runtime(memo).reconciler
    if namespace is not None and reconciler is not None:
        _retry_held(memo, reconciler.holds.release_namespace(namespace))


@kopf.on.event("", "v1", "namespaces")
def namespace_event(name: str, memo: Any, **_: Any) -> None:
    # Pod Security admission reads the namespace's labels.
    reconciler = _runtime(memo).reconciler
    if reconciler is not None:
        _retry_held(memo, reconciler.holds.release_namespace(name))


@kopf.on.event("scheduling.k8s.io", "v1", "priorityclasses")
def priority_class_event(memo: Any, **_: Any) -> None:
    reconciler = _runtime(memo).reconciler
    if reconciler is not None:
        _retry_held(memo, reconciler.holds.release_reason(PRIORITY_CLASS_NOT_FOUND))


@kopf.on.probe(id="queue")
def queue_probe(memo: kopf.Memo, **_: Any) -> dict[str, int]:
    runtime = _runtime(memo)
    return {
        "known_jobs": len(runtime.queue.known) if runtime.queue else 0,
        "reconciles": runtime.reconciles,
        "reconcile_errors": runtime.reconcile_errors,
        **{f"cached_{kind}": count for kind, count in runtime.cache.sizes().items()},
    }


def metrics_text(runtime: Runtime) -> str:
    """Prometheus text exposition of the operator's counters."""
    lines = [
        "# HELP trainium_operator_reconciles_total Reconcile passes run.",
        "# TYPE trainium_operator_reconciles_total counter",
        f"trainium_operator_reconciles_total {runtime.reconciles}",
        "# HELP trainium_operator_reconcile_errors_total Reconcile passes that raised.",
        "# TYPE trainium_operator_reconcile_errors_total counter",
        f"trainium_operator_reconcile_errors_total {runtime.reconcile_errors}",
        "# HELP trainium_operator_known_jobs TrainingJobs the operator watches.",
        "# TYPE trainium_operator_known_jobs gauge",
        f"trainium_operator_known_jobs {len(runtime.queue.known) if runtime.queue else 0}",
        "# HELP trainium_operator_api_requests_total Kubernetes API requests by verb and resource.",
        "# TYPE trainium_operator_api_requests_total counter",
    ]
    counts = dict(runtime.cluster.counter.counts) if runtime.cluster else {}
    for key, value in sorted(counts.items()):
        verb, resource = key.split(" ", 1)
        lines.append(
            f'trainium_operator_api_requests_total{{verb="{verb}",resource="{resource}"}} {value}'
        )
    if runtime.health is not None:
        lines += [
            "# HELP trainium_operator_health_messages_total Health-channel messages by outcome.",
            "# TYPE trainium_operator_health_messages_total counter",
        ]
        for outcome, value in sorted(runtime.health.counted().items()):
            lines.append(f'trainium_operator_health_messages_total{{outcome="{outcome}"}} {value}')
        tokens = runtime.health.tokens
        accepted, refused = tokens.sizes()
        lines += [
            "# HELP trainium_operator_health_token_reviews_total Health-channel tokens by "
            "what decided them: a TokenReview, the pre-filter (none needed), or the per-pod "
            "review limit (none allowed).",
            "# TYPE trainium_operator_health_token_reviews_total counter",
            f'trainium_operator_health_token_reviews_total{{decided_by="review"}} {tokens.reviews}',
            f'trainium_operator_health_token_reviews_total{{decided_by="prefilter"}} '
            f"{tokens.prefiltered}",
            f'trainium_operator_health_token_reviews_total{{decided_by="review_limit"}} '
            f"{tokens.review_limited}",
            "# HELP trainium_operator_health_cached_tokens Health-channel token reviews "
            "remembered, by verdict.",
            "# TYPE trainium_operator_health_cached_tokens gauge",
            f'trainium_operator_health_cached_tokens{{verdict="accepted"}} {accepted}',
            f'trainium_operator_health_cached_tokens{{verdict="refused"}} {refused}',
            "# HELP trainium_operator_health_stored_ranks Ranks whose newest message is kept.",
            "# TYPE trainium_operator_health_stored_ranks gauge",
            f"trainium_operator_health_stored_ranks {runtime.health.store.size()}",
        ]
    return "\n".join(lines) + "\n"


async def _serve_metrics(runtime: Runtime, port: int) -> None:
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=metrics_text(runtime), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "0.0.0.0", port)
    await site.start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
