"""The chart grants each ServiceAccount exactly what its component's code calls, both ways.

What the code calls is read from the code (tests/chart/code_api_calls.py): the operator is
`controller/` and the k8s methods it reaches, plus kopf's own requests (kopf is a library this
does not scan: its needs are the documented constants below); the profile UI is `ui/`. A verb
the chart grants that no code sends fails as unused; a request the code sends that the chart
does not grant fails as missing. TorchX and CLI paths are not here: they run as the user.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from chart import code_api_calls
from chart.chart_harness import (
    CHART_DIR,
    FULLNAME,
    RELEASE_NAMESPACE,
    SCENARIOS,
    Manifest,
    render,
)
from chart.code_api_calls import ApiCall
from trainium_operator.api import kueue, topology
from trainium_operator.k8s.client import LOCAL_QUEUES, WORKLOADS, Cluster

UI_ACCOUNT = f"{FULLNAME}-profile-ui"
OPERATOR_FILES = code_api_calls.component_files("controller")
UI_FILES = code_api_calls.component_files("ui")

# kopf's own requests besides the watches of our @kopf.on.event handlers, which
# code_api_calls reads from the code. Source: kopf's RBAC documentation,
# https://kopf.readthedocs.io/en/stable/deployment/#rbac ("Framework: ..." rules), checked
# against the installed kopf: kopf/_core/reactor/observation.py (resource_observer lists and
# watches CRDs, namespace_observer namespaces), kopf/_core/engines/posting.py (POSTs core/v1
# Events, kopf/_cogs/structs/references.py EVENTS = v1 events), kopf/_core/engines/peering.py
# (reads, watches and PATCHes its peering object's status).
KOPF_RBAC_DOCS = "https://kopf.readthedocs.io/en/stable/deployment/#rbac"
KOPF_FRAMEWORK = {
    ApiCall("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ApiCall("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ApiCall("", "namespaces", "list"),
    ApiCall("", "namespaces", "watch"),
    ApiCall("", "events", "create"),
}
KOPF_PEERING_VERBS = ("get", "list", "watch", "patch")
# Which peering object a replica keeps alive: `kopf.run(clusterwide=not namespaces)` in
# controller/commands.py uses the ClusterKopfPeering, a namespace-bound one a KopfPeering per
# namespace. Our own Cluster.get_peering_status reads the same one.
PEERING_RESOURCE = {True: "clusterkopfpeerings", False: "kopfpeerings"}
PEERING_GROUP = "kopf.dev"
NODE_PATCH = ApiCall("", "nodes", "patch")
REPLACEMENT_ON = {"health": {"stragglerReplacement": {"enabled": True}}}
KUEUE_ON = {"kueue": {"enabled": True}}
KUEUE_CALLS = {
    ApiCall(kueue.KUEUE_GROUP, resource, verb)
    for resource in (WORKLOADS, LOCAL_QUEUES)
    for verb in ("list", "watch")
} | {ApiCall("", "pods", "patch")}
TOPOLOGY_ON = {"topology": {"enabled": True}}
TOPOLOGY_VOLCANO_CALLS = {
    ApiCall(topology.HYPERNODE_GROUP, topology.HYPERNODES, verb)
    for verb in ("list", "create", "update", "delete")
}
TOPOLOGY_KUEUE_CALLS = {
    ApiCall(kueue.KUEUE_GROUP, resource, verb)
    for resource in (topology.KUEUE_TOPOLOGIES, topology.RESOURCE_FLAVORS)
    for verb in ("list", "create", "delete")
}


# The operator's own pod: with peering and the health channel, each replica reads and labels
# the pod it runs in (controller/health_role.py), granted in a Role of the release namespace
# only (the pod's namespace, from --pod-namespace), never with the job pods' grants.
OWN_POD_METHODS = frozenset({("Cluster", "own_pod_label"), ("Cluster", "label_own_pod")})
OWN_POD_VALUES = (("peering", "enabled"), ("health", "enabled"))


@dataclass(frozen=True)
class OptIn:
    """Requests the operator sends only under an opt-in the chart passes it with its values:
    granted only with every one of them on (the chart's defaults count). What they are is read
    from the code: the requests only `methods` send (no other method the operator reaches sends
    them too) and every request to one of `groups`."""

    values: tuple[tuple[str, ...], ...]  # the chart values, e.g. (("kueue", "enabled"),)
    methods: frozenset[tuple[str, str]] = frozenset()  # (k8s class, method)
    groups: frozenset[str] = frozenset()  # API groups addressed only under the opt-in


OPT_INS = {
    # `--straggler-cordon-budget`: spec.health.onStraggler: Replace cordons a straggler's node.
    "straggler-replacement": OptIn(
        (("health", "stragglerReplacement", "enabled"),),
        methods=frozenset({("Cluster", "cordon_node")}),
    ),
    # `--kueue`: Cluster.watch_sources hands out Kueue's list functions only with
    # kueue_objects (test_kueue_objects_are_watched_only_when_the_operator_says_so), and the
    # pod patch lifts Kueue's finalizer from a force-deleted pod.
    "kueue": OptIn(
        (("kueue", "enabled"),),
        methods=frozenset({("Cluster", "release_pod_finalizer")}),
        groups=frozenset({kueue.KUEUE_GROUP}),
    ),
    # `--dra`: only a job with spec.deviceAllocation dra gets a ResourceClaimTemplate, and the
    # operator creates one only with the flag (lifecycle/policies/gang.py, DRANotEnabled).
    "dra": OptIn((("dra", "enabled"),), groups=frozenset({"resource.k8s.io"})),
    # `--topology volcano`: the topology reconciler's HyperNode writes (controller/topology.py
    # calls each scheduler's methods only when it writes for that scheduler).
    "topology-volcano": OptIn(
        (("topology", "enabled"), ("topology", "volcano")),
        methods=frozenset(
            ("Cluster", m)
            for m in (
                "list_hypernodes",
                "create_hypernode",
                "replace_hypernode",
                "delete_hypernode",
            )
        ),
    ),
    # `--topology kueue`: its Topology and ResourceFlavor writes, only beside --kueue.
    "topology-kueue": OptIn(
        (("topology", "enabled"), ("topology", "kueue"), ("kueue", "enabled")),
        methods=frozenset(
            ("Cluster", m)
            for m in ("list_kueue_topology", "create_kueue_topology", "delete_kueue_topology")
        ),
    ),
}


def opt_in_calls(opt_in: OptIn) -> set[ApiCall]:
    calls = code_api_calls.component_calls(OPERATOR_FILES, without=OWN_POD_METHODS)
    without = code_api_calls.component_calls(
        OPERATOR_FILES, without=opt_in.methods | OWN_POD_METHODS
    )
    return (calls - without) | {c for c in calls if c.group in opt_in.groups}


def own_pod_calls(values: dict[str, Any]) -> set[ApiCall]:
    """What the operator sends about its own pod with these chart values (all of it in the
    release namespace)."""
    if not all(_value(values, path) for path in OWN_POD_VALUES):
        return set()
    assert code_api_calls.used_k8s_methods(OPERATOR_FILES) >= OWN_POD_METHODS
    methods = code_api_calls.k8s_methods()["Cluster"]
    return {call for _, name in OWN_POD_METHODS for call in methods[name].calls}


def _merged(defaults: Any, override: Any) -> Any:
    if isinstance(defaults, dict) and isinstance(override, dict):
        return {k: _merged(defaults.get(k), override.get(k, defaults.get(k))) for k in defaults}
    return override


@cache
def _chart_defaults() -> Any:
    return yaml.safe_load((CHART_DIR / "values.yaml").read_text(encoding="utf-8"))


def _value(values: dict[str, Any], path: tuple[str, ...]) -> Any:
    """A chart value as helm sees it: `values` over the chart's defaults (values.yaml)."""
    node: Any = _merged(_chart_defaults(), values)
    for key in path:
        node = (node or {}).get(key)
    return node


def _opted_in(values: dict[str, Any], opt_in: OptIn) -> bool:
    return all(_value(values, path) for path in opt_in.values)


def operator_calls(values: dict[str, Any]) -> set[ApiCall]:
    """What the operator sends with these chart values."""
    clusterwide = not values.get("watchNamespaces")
    calls = code_api_calls.component_calls(OPERATOR_FILES, without=OWN_POD_METHODS)
    calls |= KOPF_FRAMEWORK
    peering = {c for c in calls if c.group == PEERING_GROUP}
    assert {c.resource for c in peering} <= set(PEERING_RESOURCE.values()), peering
    calls -= peering
    if (values.get("peering") or {}).get("enabled"):
        resource = PEERING_RESOURCE[clusterwide]
        calls |= {c for c in peering if c.resource == resource}
        calls |= {ApiCall(PEERING_GROUP, resource, verb) for verb in KOPF_PEERING_VERBS}
    # The straggler cordon and Kueue are the operator admin's opt-ins: the code that sends
    # their requests runs only with the flag the chart passes with the value.
    for opt_in in OPT_INS.values():
        if not _opted_in(values, opt_in):
            calls -= opt_in_calls(opt_in)
    return calls


def ui_calls() -> set[ApiCall]:
    return code_api_calls.component_calls(UI_FILES)


def is_namespaced(call: ApiCall) -> bool:
    return (call.group, call.resource.split("/")[0]) in code_api_calls.namespaced_resources()


Grants = dict[tuple[str, str], set[ApiCall]]  # (kind, namespace or "") -> permissions


def grants_of(manifests: list[Manifest], account: str) -> Grants:
    """What the chart's bindings give the ServiceAccount `account`, per bound role."""
    (account_namespace,) = [
        m["metadata"]["namespace"]
        for m in manifests
        if m["kind"] == "ServiceAccount" and m["metadata"]["name"] == account
    ]
    roles = {
        (m["kind"], m["metadata"].get("namespace", ""), m["metadata"]["name"]): m
        for m in manifests
        if m["kind"] in {"Role", "ClusterRole"}
    }
    grants: Grants = {}
    for binding in manifests:
        if binding["kind"] not in {"RoleBinding", "ClusterRoleBinding"}:
            continue
        subject = {"kind": "ServiceAccount", "name": account, "namespace": account_namespace}
        if subject not in binding["subjects"]:
            continue
        namespace = binding["metadata"].get("namespace", "")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else "", ref["name"])]
        granted = grants.setdefault((ref["kind"], namespace), set())
        for rule in role["rules"]:
            assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames
            granted |= {
                ApiCall(group, resource, verb)
                for group in rule["apiGroups"]
                for resource in rule["resources"]
                for verb in rule["verbs"]
            }
    return grants


def assert_same(granted: set[ApiCall], used: set[ApiCall], where: str) -> None:
    unused = sorted(map(str, granted - used))
    missing = sorted(map(str, used - granted))
    problem = f"{where}: granted, no code sends it: {unused}; sent, not granted: {missing}"
    assert not unused, problem
    assert not missing, problem


def assert_grants_match(
    grants: Grants,
    used: set[ApiCall],
    values: dict[str, Any],
    own_pod: set[ApiCall] | None = None,
) -> None:
    release = ("Role", RELEASE_NAMESPACE)
    if own_pod:
        assert release in grants, sorted(grants)
        assert_same(grants.pop(release), own_pod, f"the Role in {RELEASE_NAMESPACE}")
    watched = values.get("watchNamespaces") or []
    if not watched:
        assert set(grants) == {("ClusterRole", "")}, sorted(grants)
        assert_same(grants[("ClusterRole", "")], used, "the ClusterRole")
        return
    # Bound to namespaces: namespaced kinds in a Role of each watched namespace, only
    # cluster-scoped ones in the ClusterRole.
    assert set(grants) == {("ClusterRole", "")} | {("Role", n) for n in watched}, sorted(grants)
    assert_same(
        grants[("ClusterRole", "")], {c for c in used if not is_namespaced(c)}, "ClusterRole"
    )
    for namespace in watched:
        namespaced = {c for c in used if is_namespaced(c)}
        assert_same(grants[("Role", namespace)], namespaced, f"the Role in {namespace}")


OPERATOR_VALUES = {
    "defaults": {},
    "peering": {"peering": {"enabled": True}},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "namespaced-peering": {"watchNamespaces": ["team-a", "team-b"], "peering": {"enabled": True}},
    "straggler-replacement": REPLACEMENT_ON,
    "namespaced-straggler-replacement": {"watchNamespaces": ["team-a"], **REPLACEMENT_ON},
    "kueue": KUEUE_ON,
    "namespaced-kueue": {"watchNamespaces": ["team-a", "team-b"], **KUEUE_ON},
    "dra": {"dra": {"enabled": True}},
    "namespaced-dra": {"watchNamespaces": ["team-a"], "dra": {"enabled": True}},
    "topology": TOPOLOGY_ON,
    "topology-kueue": {**TOPOLOGY_ON, **KUEUE_ON},
    "topology-kueue-only": {"topology": {"enabled": True, "volcano": False}, **KUEUE_ON},
    "namespaced-topology": {"watchNamespaces": ["team-a"], **TOPOLOGY_ON, **KUEUE_ON},
}


@pytest.mark.parametrize("scenario", sorted(OPERATOR_VALUES))
def test_operator_account_is_granted_exactly_what_the_operator_calls(
    scenario: str, tmp_path: Path
) -> None:
    values = OPERATOR_VALUES[scenario]
    grants = grants_of(render(values, tmp_path), FULLNAME)
    assert_grants_match(grants, operator_calls(values), values, own_pod_calls(values))


@pytest.mark.parametrize(
    "values",
    [pytest.param({}, id="cluster-wide"), pytest.param({"watchNamespaces": ["team-a"]}, id="ns")],
)
def test_profile_ui_account_is_granted_exactly_what_the_ui_calls(
    values: dict[str, Any], tmp_path: Path
) -> None:
    manifests = render({**values, "profileUI": {"enabled": True}}, tmp_path)
    assert_grants_match(grants_of(manifests, UI_ACCOUNT), ui_calls(), values)


@pytest.mark.parametrize("scenario", ["everything", "namespaced-everything"])
def test_the_upload_account_is_granted_nothing(scenario: str, tmp_path: Path) -> None:
    """The upload pods only write to S3 (IAM, not RBAC): no binding names their account."""
    manifests = render(SCENARIOS[scenario], tmp_path)
    upload_accounts = [
        m["metadata"]["name"]
        for m in manifests
        if m["kind"] == "ServiceAccount"
        and m["metadata"]["labels"].get("app.kubernetes.io/component") == "profile-upload"
    ]
    assert upload_accounts
    for account in upload_accounts:
        assert not grants_of(manifests, account)


def test_each_k8s_method_counts_the_requests_it_sends() -> None:
    """The request counters (the API metrics) name the verb, and the resource where it is a
    constant, of the requests each method sends."""
    assert code_api_calls.counter_mismatches() == []


@pytest.mark.parametrize("component", ["operator", "ui"])
def test_components_reach_the_api_only_through_the_k8s_classes_they_construct(
    component: str,
) -> None:
    """What keeps the derivation complete: no generated-client call outside k8s/, and each
    k8s class a component constructs is used through the holder name the analysis knows."""
    files = OPERATOR_FILES if component == "operator" else UI_FILES
    assert code_api_calls.direct_client_uses(files) == []
    used_classes = {cls for cls, _ in code_api_calls.used_k8s_methods(files)}
    constructed = {
        cls for cls in code_api_calls.HOLDERS.values() if code_api_calls.constructs(files, cls)
    }
    assert constructed
    assert used_classes == constructed


def test_the_analysis_sees_the_requests_it_is_built_for() -> None:
    """Guards the analysis itself: requests read from the client's own paths, subresources and
    the Reflector's list + watch."""
    calls = code_api_calls.component_calls(OPERATOR_FILES)
    assert ApiCall("trainium.dev", "trainingjobs/status", "update") in calls
    assert {ApiCall("", "nodes", "list"), ApiCall("", "nodes", "watch")} <= calls
    assert NODE_PATCH in calls  # Cluster.cordon_node, granted only with REPLACEMENT_ON
    assert NODE_PATCH not in operator_calls({})
    assert NODE_PATCH in operator_calls(REPLACEMENT_ON)
    assert calls >= KUEUE_CALLS  # Kueue's watches and the finalizer patch, only with KUEUE_ON
    assert calls >= TOPOLOGY_VOLCANO_CALLS | TOPOLOGY_KUEUE_CALLS  # only with TOPOLOGY_ON
    assert not (TOPOLOGY_VOLCANO_CALLS | TOPOLOGY_KUEUE_CALLS) & operator_calls(KUEUE_ON)
    assert operator_calls(TOPOLOGY_ON) >= TOPOLOGY_VOLCANO_CALLS
    assert not TOPOLOGY_KUEUE_CALLS & operator_calls(TOPOLOGY_ON)  # Kueue's need kueue.enabled
    assert not KUEUE_CALLS & operator_calls(REPLACEMENT_ON)
    assert operator_calls(KUEUE_ON) >= KUEUE_CALLS
    assert is_namespaced(ApiCall(kueue.KUEUE_GROUP, WORKLOADS, "list"))
    assert is_namespaced(ApiCall(kueue.KUEUE_GROUP, LOCAL_QUEUES, "watch"))
    assert ApiCall("", "resourcequotas", "watch") in calls  # a @kopf.on.event handler
    assert ApiCall("", "pods/log", "get") not in calls  # the CLI's, not the operator's
    assert is_namespaced(ApiCall("scheduling.volcano.sh", "podgroups", "get"))
    assert not is_namespaced(ApiCall("scheduling.volcano.sh", "queues", "list"))
    assert KOPF_RBAC_DOCS.startswith("https://kopf.readthedocs.io/")


def test_the_own_pod_grant_is_get_and_patch_of_pods_in_the_release_namespace_only(
    tmp_path: Path,
) -> None:
    """The health channel's role label under peering: the smallest grant, in one Role of the
    release namespace, and none without peering or without the channel."""
    own_pod = {ApiCall("", "pods", "get"), ApiCall("", "pods", "patch")}
    assert own_pod_calls({"peering": {"enabled": True}}) == own_pod
    assert own_pod_calls({}) == set()
    assert own_pod_calls({"peering": {"enabled": True}, "health": {"enabled": False}}) == set()
    values = {"watchNamespaces": ["team-a"], "peering": {"enabled": True}}
    grants = grants_of(render(values, tmp_path), FULLNAME)
    assert grants[("Role", RELEASE_NAMESPACE)] == own_pod
    assert ApiCall("", "pods", "patch") not in grants[("Role", "team-a")]
    for without in ({}, {"peering": {"enabled": True}, "health": {"enabled": False}}):
        grants = grants_of(render(without, tmp_path), FULLNAME)
        assert ("Role", RELEASE_NAMESPACE) not in grants


def test_each_opt_in_covers_exactly_the_requests_it_is_for() -> None:
    """What the opt-ins take away without their value: the straggler cordon's node patch, and
    Kueue's watches with the pod patch; nothing the operator sends otherwise (the pods' other
    verbs stay: only the patch is Kueue's)."""
    assert opt_in_calls(OPT_INS["straggler-replacement"]) == {NODE_PATCH}
    # Kueue's group is Kueue's opt-in: the topology objects for Kueue need it on too.
    assert opt_in_calls(OPT_INS["kueue"]) == KUEUE_CALLS | TOPOLOGY_KUEUE_CALLS
    assert opt_in_calls(OPT_INS["topology-volcano"]) == TOPOLOGY_VOLCANO_CALLS
    assert opt_in_calls(OPT_INS["topology-kueue"]) == TOPOLOGY_KUEUE_CALLS


@pytest.mark.parametrize("namespace", [None, "team-a"], ids=["cluster-wide", "namespaced"])
def test_kueue_objects_are_watched_only_when_the_operator_says_so(namespace: str | None) -> None:
    """The ground for granting Kueue's kinds only with kueue.enabled: the list functions the
    operator's watches run address Kueue's API group only with kueue_objects, and the operator
    passes its --kueue setting to every watch_sources call."""
    cluster = Cluster(client.ApiClient())

    def kueue_sources(kueue_objects: bool) -> set[str]:
        sources = cluster.watch_sources(namespace, kueue_objects=kueue_objects)
        return {
            resource
            for resource, source in sources.items()
            if kueue.KUEUE_GROUP in getattr(source, "args", ())
        }

    assert kueue_sources(False) == set()
    assert kueue_sources(True) == {WORKLOADS, LOCAL_QUEUES}
    calls = [
        node
        for path in OPERATOR_FILES
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "watch_sources"
    ]
    assert calls
    for call in calls:
        (flag,) = [k.value for k in call.keywords if k.arg == "kueue_objects"]
        assert ast.unparse(flag).endswith("settings.kueue"), ast.unparse(call)
