"""Which replica the health channel's Service routes to: the one that acts.

With peering only the replica kopf's rule lets work writes status (controller/peering.py), so
the chart's health Service selects, besides the operator's labels, `LABEL: active`. Each
replica keeps that label on its own pod (named by `run --pod-name/--pod-namespace`) in step
with its role: re-checked every `ROLE_PERIOD_SECONDS`, written only when it changes. A replica
that does not act keeps no messages: the endpoint answers 503 with Retry-After (the rank tries
again within a second, by then routed to the acting replica), and its store starts empty each
time its role changes, so it never writes figures it heard while another replica acted.

On SIGTERM the acting replica labels itself standby first, then answers 503 for
`DRAIN_SECONDS` while the Service's endpoints drop it, and only then closes the port.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainium_operator.controller.health_server import HealthChannel
from trainium_operator.controller.settings import OwnPod
from trainium_operator.k8s.client import Cluster

log = logging.getLogger(__name__)

LABEL = "trainium.dev/health-channel"
ACTIVE = "active"
STANDBY = "standby"
ROLE_PERIOD_SECONDS = 1.0
# Kubernetes drops a relabelled pod from the Service's endpoints within about a second; until
# then a rank routed here is asked to retry, never refused outright.
DRAIN_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class RoleStep:
    """What one check does, in this order: the channel's role, then the pod's label."""

    accept: bool  # the channel stores the ranks' messages (else: 503, retry)
    restart_store: bool  # the role changed: forget every stored message
    label: str | None  # the value to write on the pod now; None: leave it


def role_step(acting: bool, accepting: bool, label: str | None, *, labelled: bool) -> RoleStep:
    """The step from what the replica is (`acting`: the peering lets it work), what its channel
    does now and the label its pod has (as last read or written; `labelled`: it has a pod to
    label). The label is written only when it differs, so a steady replica writes nothing."""
    wanted = ACTIVE if acting else STANDBY
    return RoleStep(
        accept=acting,
        restart_store=acting != accepting,
        label=wanted if labelled and label != wanted else None,
    )


class HealthRole:
    """Keeps the channel's role and the pod's label in step with `acting` (blocking calls:
    run it off the event loop)."""

    def __init__(
        self,
        channel: HealthChannel,
        acting: Callable[[], bool],
        cluster: Cluster | None = None,
        pod: OwnPod | None = None,
    ) -> None:
        self.channel = channel
        self.acting = acting
        self.cluster = cluster
        self.pod = pod
        self.label: str | None = None  # the pod's, as last read or written
        # When (monotonic) the pod's label last moved from active to standby.
        self.stood_down_at: float | None = None
        self._label_read = False
        self._last_error = ""
        self._lock = threading.Lock()  # the periodic check and the shutdown's never interleave

    def check(self, *, stopping: bool = False) -> RoleStep:
        """One check: the role applied, then the label written if it changed. `stopping`: the
        process is shutting down, so it acts no more whatever the peering says."""
        with self._lock:
            return self._check(stopping)

    def _check(self, stopping: bool) -> RoleStep:
        acting = not stopping and self.acting()
        cluster, pod = self.cluster, self.pod
        if cluster is not None and pod is not None and not self._label_read:
            self.label = cluster.own_pod_label(pod.namespace, pod.name, LABEL)
            self._label_read = True
        step = role_step(
            acting, self.channel.accepting, self.label, labelled=cluster is not None and bool(pod)
        )
        if step.restart_store:
            # Refuse before the label moves away, accept before it arrives: a message routed
            # here in between is retried, never stored where no status is written from.
            self.channel.set_accepting(step.accept)
            log.info("health channel: this replica %s", "acts" if acting else "stands by")
        if step.label is not None and cluster is not None and pod is not None:
            cluster.label_own_pod(pod.namespace, pod.name, LABEL, step.label)
            if self.label == ACTIVE:
                self.stood_down_at = time.monotonic()
            self.label = step.label
            log.info("health channel: labelled pod %s/%s %s", pod.namespace, pod.name, step.label)
        return step

    def check_logged(self, *, stopping: bool = False) -> RoleStep | None:
        """`check`, its failure logged once per distinct error (the next period retries)."""
        try:
            step = self.check(stopping=stopping)
        except Exception as error:
            text = repr(error)
            if text != self._last_error:
                log.warning("health channel: could not apply this replica's role: %s", text)
            self._last_error = text
            return None
        self._last_error = ""
        return step

    def drain_seconds(self) -> float:
        """How much longer to keep answering before the port closes: DRAIN_SECONDS after the
        pod stopped being labelled active (0 when it was not)."""
        if self.stood_down_at is None:
            return 0.0
        return max(DRAIN_SECONDS - (time.monotonic() - self.stood_down_at), 0.0)
