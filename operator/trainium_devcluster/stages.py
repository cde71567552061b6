"""KWOK Stages and the kwokctl configuration of the dev cluster, built as dicts and serialised once.

KWOK plays a Stage on an object when the stage's selector matches; the statusTemplate (a Go
template, KWOK's own language) renders the status patch. Any custom stage disables all of KWOK's
default stages, so the node stages are included here too. Pods only reach KWOK once bound to a
fake node (its pod watch selects `spec.nodeName != ""`), which is what keeps them Pending until a
scheduler places them.

Pod outcomes are driven by annotations, so a test (or a person with kubectl) decides when and how a
"container" ends:

- `sim.trainium.dev/outcome`: `succeeded` or `failed`
- `sim.trainium.dev/exit-code`, `sim.trainium.dev/reason`, `sim.trainium.dev/message`
- `sim.trainium.dev/after`: a Go duration (`5s`, `1m30s`) to wait before the pod ends
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trainium_operator.api import kueue

OUTCOME_ANNOTATION = "sim.trainium.dev/outcome"
# On a node cut off from the control plane (`sim.simulate_node_loss`): its kubelet posts no
# status. KWOK also stops for a node whose Lease another holder took, but it reads the Lease
# from its own cache, which can lag after an API server restart and let it set the node Ready
# again; the node's own annotation stops its stages whatever that cache says.
NODE_LOST_ANNOTATION = "sim.trainium.dev/node-lost"
EXIT_CODE_ANNOTATION = "sim.trainium.dev/exit-code"
REASON_ANNOTATION = "sim.trainium.dev/reason"
MESSAGE_ANNOTATION = "sim.trainium.dev/message"
AFTER_ANNOTATION = "sim.trainium.dev/after"
OUTCOME_SUCCEEDED = "succeeded"
OUTCOME_FAILED = "failed"

KWOK_API_VERSION = "kwok.x-k8s.io/v1alpha1"
KWOKCTL_API_VERSION = "config.kwok.x-k8s.io/v1alpha1"

# Node liveness timing. kwok renews each node's Lease every duration/4 (2 s); the node lifecycle
# controller marks a node Unknown after the grace period without a renewal. 16 s tolerates
# several missed renewals on a busy 2-core machine yet makes a simulated node loss visible fast.
NODE_LEASE_DURATION_SECONDS = 8
NODE_MONITOR_PERIOD_MS = 1000
NODE_MONITOR_GRACE_PERIOD_MS = 16000


def _annotation(key: str) -> str:
    return f'.metadata.annotations["{key}"]'


def _expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    expression: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        expression["values"] = list(values)
    return expression


_NOT_DELETING = _expression(".metadata.deletionTimestamp", "DoesNotExist")
_DELETING = _expression(".metadata.deletionTimestamp", "Exists")
_TERMINAL_PHASES = ("Succeeded", "Failed")
# Kueue's pod finalizer: Kueue lets go of a pod only once it has ended.
KUEUE_FINALIZER = kueue.MANAGED_FINALIZER
_HELD_BY_KUEUE = _expression(".metadata.finalizers.[]", "In", KUEUE_FINALIZER)
_NOT_HELD_BY_KUEUE = _expression(".metadata.finalizers.[]", "NotIn", KUEUE_FINALIZER)
_READY_STATUS = '.status.conditions.[] | select( .type == "Ready" ) | .status'
_REACHABLE = _expression(_annotation(NODE_LOST_ANNOTATION), "DoesNotExist")


def _stage(name: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": KWOK_API_VERSION,
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {"resourceRef": {"apiGroup": "v1", "kind": kind}, **spec},
    }


# --- node stages (KWOK's own node-initialize and node-heartbeat-with-lease) ----------------------
# One change to KWOK's node-initialize: when a node lacks one address type, the addresses it
# has are kept. KWOK's own template writes only the missing ones, so a node that turns Ready
# again after a node loss (the binary runtime gives no NodeIP; the Hostname is kept) lost
# every address, and the API server could no longer reach it for `kubectl logs`.

# The parts both node templates share: the node's conditions, its NodeIP and NodeName addresses
# and the kubelet's port.
_NODE_CONDITIONS = """\
{{ $now := Now }}
{{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $lastTransitionTime | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
"""
_NODE_IP_ADDRESS = """\
{{ with NodeIP }}
- address: {{ . | Quote }}
  type: InternalIP
{{ end }}
"""
_NODE_NAME_ADDRESS = """\
{{ with NodeName }}
- address: {{ . | Quote }}
  type: Hostname
{{ end }}
"""
_DAEMON_ENDPOINTS = """\
{{ with NodePort }}
daemonEndpoints:
  kubeletEndpoint:
    Port: {{ . }}
{{ end }}
"""
# After `{{ with .status.<field> }}`: the node's own resources, else KWOK's defaults.
_RESOURCES_OR_DEFAULT = """\
{{ YAML . 1 }}
{{ else }}
  cpu: 1k
  memory: 1Ti
  pods: 1M
{{ end }}
"""

NODE_INITIALIZE_TEMPLATE = (
    _NODE_CONDITIONS
    + """\
{{ $hasInternalIP := false }}
{{ $hasHostname := false }}
{{ range .status.addresses }}
  {{ if eq .type "InternalIP" }}
    {{ $hasInternalIP = true }}
  {{ end }}
  {{ if eq .type "Hostname" }}
    {{ $hasHostname = true }}
  {{ end }}
{{ end }}
{{ if or (not $hasInternalIP) (not $hasHostname) }}
addresses:
{{ range .status.addresses }}
- address: {{ .address | Quote }}
  type: {{ .type | Quote }}
{{ end }}
{{ end }}
{{ if not $hasInternalIP }}
"""
    + _NODE_IP_ADDRESS
    + """\
{{ end }}
{{ if not $hasHostname }}
"""
    + _NODE_NAME_ADDRESS
    + """\
{{ end }}
"""
    + _DAEMON_ENDPOINTS
    + """\
allocatable:
{{ with .status.allocatable }}
"""
    + _RESOURCES_OR_DEFAULT
    + """\
capacity:
{{ with .status.capacity }}
"""
    + _RESOURCES_OR_DEFAULT
    + """\
{{ $nodeInfo := .status.nodeInfo }}
{{ $kwokVersion := printf "kwok-%s" Version }}
nodeInfo:
  architecture: {{ or $nodeInfo.architecture "amd64" }}
  bootID: {{ or $nodeInfo.bootID `""` }}
  containerRuntimeVersion: {{ or $nodeInfo.containerRuntimeVersion $kwokVersion }}
  kernelVersion: {{ or $nodeInfo.kernelVersion $kwokVersion }}
  kubeProxyVersion: {{ or $nodeInfo.kubeProxyVersion $kwokVersion }}
  kubeletVersion: {{ or $nodeInfo.kubeletVersion $kwokVersion }}
  machineID: {{ or $nodeInfo.machineID `""` }}
  operatingSystem: {{ or $nodeInfo.operatingSystem "linux" }}
  osImage: {{ or $nodeInfo.osImage `""` }}
  systemUUID: {{ or $nodeInfo.systemUUID `""` }}
phase: Running
"""
)

NODE_HEARTBEAT_TEMPLATE = (
    _NODE_CONDITIONS
    + """\
addresses:
{{ with .status.addresses }}
{{ YAML . 1 }}
{{ else }}
"""
    + _NODE_IP_ADDRESS
    + _NODE_NAME_ADDRESS
    + """\
{{ end }}
"""
    + _DAEMON_ENDPOINTS
)


def node_stages() -> list[dict[str, Any]]:
    return [
        _stage(
            "node-initialize",
            "Node",
            {
                "selector": {
                    "matchExpressions": [_expression(_READY_STATUS, "NotIn", "True"), _REACHABLE]
                },
                "next": {"statusTemplate": NODE_INITIALIZE_TEMPLATE},
            },
        ),
        _stage(
            "node-heartbeat-with-lease",
            "Node",
            {
                "selector": {
                    "matchExpressions": [
                        _expression(".status.phase", "In", "Running"),
                        _expression(_READY_STATUS, "In", "True"),
                        _REACHABLE,
                    ]
                },
                # Liveness comes from the Lease; the status heartbeat may be rare, as a kubelet's.
                "delay": {"durationMilliseconds": 600000, "jitterDurationMilliseconds": 610000},
                "next": {"statusTemplate": NODE_HEARTBEAT_TEMPLATE},
            },
        ),
    ]


# --- pod stages -------------------------------------------------------------------------------


def _ip_fields(addresses: str, field: str) -> str:
    """`<field>` (the first address) and `<field>s` (all of them) from the template variable
    $<addresses>, when it has any."""
    return (
        "{{ with $" + addresses + " }}\n"
        f"{field}: {{{{ index . 0 | Quote }}}}\n"
        f"{field}s:\n"
        "{{ range . }}\n"
        "- ip: {{ . | Quote }}\n"
        "{{ end }}\n"
        "{{ end }}\n"
    )


# A ready pod's Ready and ContainersReady conditions, after `conditions:`.
_POD_READY_CONDITIONS = """\
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
"""

# A container's status once it started (in a list ranged over): ready, never restarted.
_CONTAINER_READY = """\
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
"""

# A running container's (an app container's, or a sidecar init container's) state.
_CONTAINER_RUNNING = """\
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
"""

POD_READY_TEMPLATE = (
    """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
"""
    + _POD_READY_CONDITIONS
    + """\
{{ range .spec.readinessGates }}
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: {{ .conditionType | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
"""
    + _CONTAINER_READY
    + _CONTAINER_RUNNING
    + """{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
"""
    + _CONTAINER_READY
    + """  {{ if eq .restartPolicy "Always" }}
"""
    + _CONTAINER_RUNNING
    + """  {{ else }}
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
      startedAt: {{ $now | Quote }}
  {{ end }}
{{ end }}
{{ $hostIPs := NodeIPsWith .spec.nodeName }}
"""
    + _ip_fields("hostIPs", "hostIP")
    + """\
{{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" )\
 ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
"""
    + _ip_fields("podIPs", "podIP")
    + """\
phase: Running
startTime: {{ $now | Quote }}
"""
)

# A running pod whose Ready condition was cleared (the node lifecycle controller does this when a
# node stops heartbeating) becomes ready again once its node is back, as a kubelet would report.
POD_READY_AGAIN_TEMPLATE = (
    """\
{{ $now := Now }}
conditions:
"""
    + _POD_READY_CONDITIONS
)


def _terminated_pod_template(*, phase: str, variables: str) -> str:
    """Every container terminated with $exitCode, $reason and $message, which `variables` (Go
    template assignments) define; the pod in `phase`, not Ready."""
    return (
        "{{ $now := Now }}\n"
        "{{ $root := . }}\n" + variables + "{{ $startedAt := or .status.startTime $now }}\n"
        "conditions:\n"
        "- lastTransitionTime: {{ $now | Quote }}\n"
        '  status: "False"\n'
        "  reason: PodCompleted\n"
        "  type: Ready\n"
        "- lastTransitionTime: {{ $now | Quote }}\n"
        '  status: "False"\n'
        "  reason: PodCompleted\n"
        "  type: ContainersReady\n"
        "containerStatuses:\n"
        "{{ range .spec.containers }}\n"
        "- image: {{ .image | Quote }}\n"
        "  name: {{ .name | Quote }}\n"
        "  ready: false\n"
        "  started: false\n"
        "  restartCount: 0\n"
        "  state:\n"
        "    terminated:\n"
        "      exitCode: {{ $exitCode }}\n"
        "      reason: {{ $reason | Quote }}\n"
        "      message: {{ $message | Quote }}\n"
        "      startedAt: {{ $startedAt | Quote }}\n"
        "      finishedAt: {{ $now | Quote }}\n"
        "{{ end }}\n"
        f"phase: {phase}\n"
    )


def _pod_outcome_template(*, phase: str, default_exit_code: int, default_reason: str) -> str:
    """Terminates every container with the annotated exit code, reason and message."""
    return _terminated_pod_template(
        phase=phase,
        variables=(
            "{{ $annotations := or .metadata.annotations dict }}\n"
            "{{ $exitCode := or ( index $annotations "
            f'"{EXIT_CODE_ANNOTATION}" ) {default_exit_code} }}}}\n'
            f'{{{{ $reason := or ( index $annotations "{REASON_ANNOTATION}" )'
            f' "{default_reason}" }}}}\n'
            f'{{{{ $message := or ( index $annotations "{MESSAGE_ANNOTATION}" ) "" }}}}\n'
        ),
    )


# What a kubelet reports for a pod deleted while it ran: every container killed (SIGKILL's exit
# code once the grace period is over: KWOK has no process to end on SIGTERM), the pod Failed.
KILLED_EXIT_CODE = 137
POD_KILLED_TEMPLATE = _terminated_pod_template(
    phase="Failed",
    variables=(
        f"{{{{ $exitCode := {KILLED_EXIT_CODE} }}}}\n"
        '{{ $reason := "Error" }}\n'
        '{{ $message := "" }}\n'
    ),
)


def _outcome_stage(name: str, outcome: str, template: str) -> dict[str, Any]:
    return _stage(
        name,
        "Pod",
        {
            "selector": {
                "matchExpressions": [
                    _NOT_DELETING,
                    _expression(".status.phase", "In", "Running"),
                    _expression(_annotation(OUTCOME_ANNOTATION), "In", outcome),
                ]
            },
            "delay": {
                "durationMilliseconds": 0,
                "durationFrom": {"expressionFrom": _annotation(AFTER_ANNOTATION)},
            },
            "next": {
                "event": {
                    "type": "Normal" if outcome == OUTCOME_SUCCEEDED else "Warning",
                    "reason": "Completed" if outcome == OUTCOME_SUCCEEDED else "Failed",
                    "message": f"simulated container outcome: {outcome}",
                },
                "statusTemplate": template,
            },
        },
    )


def pod_stages() -> list[dict[str, Any]]:
    no_outcome = _expression(_annotation(OUTCOME_ANNOTATION), "DoesNotExist")
    return [
        _stage(
            "pod-ready",
            "Pod",
            {
                "selector": {
                    "matchExpressions": [
                        _NOT_DELETING,
                        _expression(".status.phase", "In", "Pending"),
                        _expression(_READY_STATUS, "NotIn", "True"),
                    ]
                },
                "next": {
                    "event": {
                        "type": "Normal",
                        "reason": "Started",
                        "message": "Started container",
                    },
                    "statusTemplate": POD_READY_TEMPLATE,
                },
            },
        ),
        _stage(
            "pod-ready-again",
            "Pod",
            {
                "selector": {
                    "matchExpressions": [
                        _NOT_DELETING,
                        no_outcome,
                        _expression(".status.phase", "In", "Running"),
                        _expression(_READY_STATUS, "NotIn", "True"),
                    ]
                },
                "next": {"statusTemplate": POD_READY_AGAIN_TEMPLATE},
            },
        ),
        _outcome_stage(
            "pod-succeeded",
            OUTCOME_SUCCEEDED,
            _pod_outcome_template(
                phase="Succeeded", default_exit_code=0, default_reason="Completed"
            ),
        ),
        _outcome_stage(
            "pod-failed",
            OUTCOME_FAILED,
            _pod_outcome_template(phase="Failed", default_exit_code=1, default_reason="Error"),
        ),
        # A kubelet kills the containers of a pod being deleted and then removes it; finalizers
        # other controllers hold still keep it, exactly as on a real node. The tests' own
        # finalizers keep such a pod Running, as a kubelet that never confirms the delete does.
        # A pod Kueue holds is first ended as a kubelet would end it: Kueue removes its
        # finalizer only from an ended pod, so it would stay Running and Terminating forever.
        _stage(
            "pod-delete",
            "Pod",
            {
                "selector": {"matchExpressions": [_DELETING, _NOT_HELD_BY_KUEUE]},
                "next": {"delete": True},
            },
        ),
        _stage(
            "pod-kill-held-by-kueue",
            "Pod",
            {
                "selector": {
                    "matchExpressions": [
                        _DELETING,
                        _HELD_BY_KUEUE,
                        _expression(".status.phase", "NotIn", *_TERMINAL_PHASES),
                    ]
                },
                "next": {
                    "event": {
                        "type": "Normal",
                        "reason": "Killing",
                        "message": "Stopping container (pod deleted)",
                    },
                    "statusTemplate": POD_KILLED_TEMPLATE,
                },
            },
        ),
        _stage(
            "pod-delete-held-by-kueue",
            "Pod",
            {
                "selector": {
                    "matchExpressions": [
                        _DELETING,
                        _HELD_BY_KUEUE,
                        _expression(".status.phase", "In", *_TERMINAL_PHASES),
                    ]
                },
                "next": {"delete": True},
            },
        ),
    ]


def all_stages() -> list[dict[str, Any]]:
    return node_stages() + pod_stages()


def kwokctl_configuration(
    *,
    binaries: dict[str, Path],
    kube_version: str,
    etcd_version: str,
    kwok_version: str,
) -> dict[str, Any]:
    """kwokctl options: binary runtime, our local binaries (symlinked, not downloaded), timings."""
    return {
        "apiVersion": KWOKCTL_API_VERSION,
        "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary",
            "kubeVersion": kube_version,
            "etcdVersion": etcd_version.lstrip("v"),
            "kwokVersion": kwok_version,
            "kubeApiserverBinary": str(binaries["kube-apiserver"]),
            "kubeControllerManagerBinary": str(binaries["kube-controller-manager"]),
            "kubeSchedulerBinary": str(binaries["kube-scheduler"]),
            "kubectlBinary": str(binaries["kubectl"]),
            "etcdBinary": str(binaries["etcd"]),
            "kwokControllerBinary": str(binaries["kwok"]),
            # kwokctl multiplies every heartbeat timing by this factor (default 5); ours are final.
            "heartbeatFactor": 1,
            "nodeLeaseDurationSeconds": NODE_LEASE_DURATION_SECONDS,
            "kubeControllerManagerNodeMonitorPeriodMilliseconds": NODE_MONITOR_PERIOD_MS,
            "kubeControllerManagerNodeMonitorGracePeriodMilliseconds": NODE_MONITOR_GRACE_PERIOD_MS,
            "bindAddress": "127.0.0.1",
            # Logs objects (kwok.x-k8s.io/v1alpha1, one per pod) give a KWOK pod's container a
            # log file, served through the API server like a kubelet's (`kubectl logs`,
            # `torchx log`); sim.simulate_pod_logs creates them.
            "enableCRDs": ["Logs"],
        },
        "componentsPatches": [
            {
                "name": "kube-controller-manager",
                # The PV binder otherwise retries an unbound claim only every 15 s; a claim
                # created with its volume still Pending would wait that long to bind.
                "extraArgs": [{"key": "pvclaimbinder-sync-period", "value": "2s"}],
            }
        ],
    }


# How many pods KWOK moves through their stages at once (KWOK's default: 4). On EKS each node's
# kubelet starts and stops its own pods, all at once across a gang; 4 workers for 128-512 nodes
# made a gang's pods turn Running, and a deleted gang's pods go, one after another over a second
# or more, a delay no real cluster has (the gang benchmark's restart waited on it).
POD_STAGE_PARALLELISM = 16


def kwok_configuration() -> dict[str, Any]:
    """KWOK's own options. kwokctl hands this document to KWOK as written, without KWOK's
    defaults (a missing parallelism is 0, and KWOK refuses to start), so every option KWOK
    defaults is spelled out here, at its default except POD_STAGE_PARALLELISM."""
    return {
        "apiVersion": KWOKCTL_API_VERSION,
        "kind": "KwokConfiguration",
        "options": {
            "cidr": "10.0.0.0/24",
            "manageAllNodes": False,
            "enableDebuggingHandlers": True,  # `kubectl logs` through KWOK's kubelet server
            "enableContentionProfiling": False,
            "enableProfilingHandler": True,
            "podPlayStageParallelism": POD_STAGE_PARALLELISM,
            "nodePlayStageParallelism": 4,
            "nodeLeaseParallelism": 4,
            "podsOnNodeSyncParallelism": 1,
            "enablePodsOnNodeSyncListPager": True,
            "enablePodsOnNodeSyncStreamWatch": False,
        },
    }


def kwokctl_config_documents(
    *, binaries: dict[str, Path], kube_version: str, etcd_version: str, kwok_version: str
) -> list[dict[str, Any]]:
    return [
        kwokctl_configuration(
            binaries=binaries,
            kube_version=kube_version,
            etcd_version=etcd_version,
            kwok_version=kwok_version,
        ),
        kwok_configuration(),
        *all_stages(),
    ]


def dump_documents(documents: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False, width=1000)
