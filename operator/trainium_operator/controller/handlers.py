"""kopf's handlers: kopf runs the process (login, peering, probes) and watches what can lift an
admission refusal; the operator itself is built and started by `controller.wiring`.

Only `on.event` handlers are used, so kopf adds no finalizers and no progress annotations:
deleting a TrainingJob never waits for the operator, and garbage collection removes its
children through owner references (the operator deletes the gang's pods at once when it sees the
job gone: `Reconciler._delete_orphans`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from trainium_operator.controller import wiring
from trainium_operator.controller.wiring import Operator
from trainium_operator.controller.workqueue import Key
from trainium_operator.k8s.client import PRIORITY_CLASS_NOT_FOUND, credentials

log = logging.getLogger(__name__)


def _operator(memo: Any) -> Operator:
    operator = memo.operator
    assert isinstance(operator, Operator)
    return operator


@kopf.on.login()
def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
    # kopf's default login reads $KUBECONFIG; ours honours --kubeconfig and in-cluster config.
    creds = credentials(_operator(memo).settings.kubeconfig)
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
    operator = _operator(memo)
    settings.posting.level = logging.WARNING  # our own Events describe the job
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.error_backoffs = [1, 2, 5, 10]
    if operator.settings.peering is not None:
        settings.peering.lifetime = operator.settings.peering.lifetime
    wiring.start(operator)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    running = await wiring.stop(_operator(memo))
    if running:
        # asyncio.run would wait for these threads without a bound (an API server that stopped
        # answering holds them for minutes): exit now, as a crash would, which is safe.
        log.warning(
            "exiting with %d reconcile pass(es) unfinished after %.0f s (%s); the next replica "
            "repeats them",
            len(running),
            wiring.SHUTDOWN_GRACE_SECONDS,
            ", ".join(f"{namespace}/{name}" for namespace, name in running),
        )
        logging.shutdown()
        os._exit(0)


def _retry_held(memo: Any, keys: list[Key]) -> None:
    _operator(memo).jobs.wake(keys)


# What can lift an admission refusal (see controller/admission_holds.py): each change wakes the
# jobs held in its namespace; a PriorityClass wakes the jobs that named a missing one.
@kopf.on.event("", "v1", "resourcequotas")
@kopf.on.event("", "v1", "limitranges")
@kopf.on.event("", "v1", "serviceaccounts")
def namespace_policy_event(namespace: str | None, memo: Any, **_: Any) -> None:
    if namespace is not None:
        _retry_held(memo, _operator(memo).reconciler.holds.release_namespace(namespace))


@kopf.on.event("", "v1", "namespaces")
def namespace_event(name: str, memo: Any, **_: Any) -> None:
    # Pod Security admission reads the namespace's labels.
    _retry_held(memo, _operator(memo).reconciler.holds.release_namespace(name))


@kopf.on.event("scheduling.k8s.io", "v1", "priorityclasses")
def priority_class_event(memo: Any, **_: Any) -> None:
    holds = _operator(memo).reconciler.holds
    _retry_held(memo, holds.release_reason(PRIORITY_CLASS_NOT_FOUND))


@kopf.on.probe(id="queue")
def queue_probe(memo: kopf.Memo, **_: Any) -> dict[str, int]:
    operator = _operator(memo)
    return {
        "known_jobs": len(operator.queue.known),
        "reconciles": operator.counts.reconciles,
        "reconcile_errors": operator.counts.errors,
        **{f"cached_{kind}": count for kind, count in operator.cache.sizes().items()},
    }
