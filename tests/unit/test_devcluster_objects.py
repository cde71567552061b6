"""What `dev up` creates, KWOK stages, build cache keys and sim helpers, all without a cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainium_devcluster import build, objects, paths, sim, stages, versions, volcano
from trainium_operator.api import instance_types


@pytest.mark.parametrize(
    ("instance_type", "efa"), [("trn1.32xlarge", "8"), ("trn1n.32xlarge", "16")]
)
def test_fake_nodes_advertise_the_instance_shape(instance_type: str, efa: str) -> None:
    node = objects.fake_nodes(1, instance_type)[0]

    capacity = node["status"]["capacity"]
    assert capacity == node["status"]["allocatable"]
    expected = {
        "cpu": "128",
        "memory": "512Gi",
        "pods": "250",
        "aws.amazon.com/neuron": "16",
        "aws.amazon.com/neuroncore": "32",
        "vpc.amazonaws.com/efa": efa,
    }
    assert {name: capacity.get(name) for name in expected} == expected
    assert "aws.amazon.com/neurondevice" not in capacity, "not advertised since Neuron 2.20"
    labels = node["metadata"]["labels"]
    assert labels["node.kubernetes.io/instance-type"] == instance_type
    assert labels[objects.ZONE_LABEL]
    assert labels[objects.NODEGROUP_LABEL]
    assert node["metadata"]["annotations"][objects.KWOK_NODE_ANNOTATION] == "fake"


def test_small_instance_has_no_efa_resource() -> None:
    node = objects.fake_nodes(1, "trn1.2xlarge")[0]
    assert "vpc.amazonaws.com/efa" not in node["status"]["capacity"]
    assert node["status"]["capacity"]["aws.amazon.com/neuroncore"] == "2"


def test_node_names_are_distinct_and_deterministic() -> None:
    names = [n["metadata"]["name"] for n in objects.fake_nodes(3, "trn1.32xlarge")]
    assert names == ["trn1-32xlarge-0", "trn1-32xlarge-1", "trn1-32xlarge-2"]


def test_added_nodes_continue_the_numbering_of_the_nodes_there() -> None:
    existing = ["trn1-32xlarge-0", "trn1-32xlarge-1", "trn1-32xlarge-7x", "trn1n-32xlarge-9"]
    first = objects.next_node_index(existing, "trn1.32xlarge")
    names = [
        n["metadata"]["name"] for n in objects.fake_nodes(2, "trn1.32xlarge", first_index=first)
    ]
    assert names == ["trn1-32xlarge-2", "trn1-32xlarge-3"]
    assert objects.next_node_index([], "trn1.32xlarge") == 0
    # Another instance type's nodes (and names that only look alike) take no index.
    assert objects.next_node_index(["trn1n-32xlarge-4"], "trn1.32xlarge") == 0


def test_taint_option_adds_the_neuron_taint() -> None:
    tainted = objects.fake_nodes(1, "trn1.32xlarge", neuron_taint=True)[0]
    plain = objects.fake_nodes(1, "trn1.32xlarge")[0]
    assert tainted["spec"]["taints"] == [
        {"key": "aws.amazon.com/neuron", "value": "present", "effect": "NoSchedule"}
    ]
    assert "taints" not in plain["spec"]


def test_unknown_instance_type_names_the_option_and_the_choices() -> None:
    with pytest.raises(ValueError, match=r"--instance-type 'p4d.24xlarge'.*trn1.32xlarge"):
        objects.fake_nodes(1, "p4d.24xlarge")


def test_every_known_instance_type_can_be_simulated() -> None:
    for name in instance_types.INSTANCE_TYPES:
        assert (
            objects.fake_nodes(1, name)[0]["metadata"]["labels"][instance_types.INSTANCE_TYPE_LABEL]
            == name
        )


def test_fsx_volume_and_claim_pair_up_as_static_provisioning() -> None:
    volume = objects.fsx_persistent_volume()
    claim = objects.fsx_persistent_volume_claim()
    assert volume["spec"]["csi"]["driver"] == "fsx.csi.aws.com"
    assert volume["spec"]["csi"]["volumeHandle"].startswith("fs-")
    assert set(volume["spec"]["csi"]["volumeAttributes"]) == {"dnsname", "mountname"}
    assert volume["spec"]["accessModes"] == claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert volume["spec"]["storageClassName"] == claim["spec"]["storageClassName"] == ""
    assert (
        claim["spec"]["resources"]["requests"]["storage"] == volume["spec"]["capacity"]["storage"]
    )
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
    assert claim["metadata"] == {"name": "fsx-claim", "namespace": "default"}


def test_queues_match_volcano_defaults_plus_the_tutorial_queue() -> None:
    queues = {q["metadata"]["name"]: q for q in objects.volcano_queues()}
    assert set(queues) == {"default", "test"}
    # The tutorial's create_volcano_test_queue.sh: weight 1, not reclaimable, no capability.
    assert queues["test"]["spec"] == {"weight": 1, "reclaimable": False}
    assert queues["default"]["spec"]["reclaimable"] is True


def test_queue_capability_is_declared_only_when_asked() -> None:
    queue = objects.volcano_queue("small", reclaimable=False, capability={"cpu": "4"})
    assert queue["spec"]["capability"] == {"cpu": "4"}


def test_each_node_gets_a_csinode_listing_the_fsx_driver_owned_by_the_node() -> None:
    node = objects.fake_node("trn1-32xlarge-0", instance_types.INSTANCE_TYPES["trn1.32xlarge"])
    node["metadata"]["uid"] = "1234"
    csi = objects.csi_node(node)
    assert csi["metadata"]["name"] == "trn1-32xlarge-0"
    assert csi["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "trn1-32xlarge-0", "uid": "1234"}
    ]
    (driver,) = csi["spec"]["drivers"]
    assert (driver["name"], driver["nodeID"]) == ("fsx.csi.aws.com", "trn1-32xlarge-0")
    assert driver["name"] == objects.fsx_persistent_volume()["spec"]["csi"]["driver"]


def test_volcano_is_one_pinned_component_building_both_processes() -> None:
    component = versions.GO_COMPONENTS["volcano"]
    assert component.version == versions.VOLCANO_VERSION == "v1.14.1"
    assert [b.name for b in component.binaries] == ["vc-scheduler", "vc-controller-manager"]
    go_mod = (build.wrapper_dir(component) / "go.mod").read_text()
    assert f"volcano.sh/volcano {versions.VOLCANO_VERSION}" in go_mod
    # volcano's own replace directives, repeated: its k8s.io staging modules are v0.34.1; its
    # API module (a staging directory upstream) is the published v1.14.0.
    assert "k8s.io/api => k8s.io/api v0.34.1" in go_mod
    assert "volcano.sh/apis => volcano.sh/apis v1.14.0" in go_mod
    assert "controller-gen" not in versions.GO_COMPONENTS


def test_volcano_crds_and_binaries_share_the_module_cache_key() -> None:
    component = versions.GO_COMPONENTS["volcano"]
    assert build.volcano_crd_dir().name.endswith(build.component_digest(component))
    assert "volcano-v1.14.1" in build.volcano_crd_dir().name


def test_scheduler_conf_uses_proportion_gang_and_priority_not_capacity() -> None:
    conf = yaml.safe_load(volcano.SCHEDULER_CONF.read_text())
    plugins = [p["name"] for tier in conf["tiers"] for p in tier["plugins"]]
    assert {"gang", "priority", "predicates", "proportion"} <= set(plugins)
    assert "capacity" not in plugins
    assert [a.strip() for a in conf["actions"].split(",")] == ["enqueue", "allocate", "backfill"]


def test_volcano_processes_run_without_leader_election_and_with_health_endpoints(
    tmp_path: Path,
) -> None:
    scheduler = volcano.scheduler_argv(
        Path("/b/vc-scheduler"), tmp_path / "kc", healthz_port=1, metrics_port=2
    )
    assert f"--scheduler-conf={volcano.SCHEDULER_CONF}" in scheduler
    assert {"--leader-elect=false", "--enable-healthz=true"} <= set(scheduler)
    assert "--healthz-address=127.0.0.1:1" in scheduler
    assert "--schedule-period=1s" in scheduler, "Volcano's default, as on a real cluster"
    manager = volcano.controller_manager_argv(
        Path("/b/vc-controller-manager"), tmp_path / "kc", healthz_port=3
    )
    assert "--controllers=+pg-controller,+queue-controller,+gc-controller" in manager
    assert "--healthz-address=127.0.0.1:3" in manager


def test_a_daemon_with_no_pid_file_or_a_foreign_pid_is_not_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(tmp_path))
    scheduler, manager = volcano.daemons(paths.ClusterPaths("unit"))
    assert volcano.running_pid(scheduler) is None
    scheduler.cluster.state_dir.mkdir(parents=True)
    scheduler.pid_file.write_text(f"{os.getpid()}\n")  # alive, but pytest, not vc-scheduler
    scheduler.port_file.write_text("1\n")
    assert volcano.running_pid(scheduler) is None
    assert not volcano.healthy(scheduler)
    assert volcano.stop(scheduler.cluster) == []
    assert not scheduler.pid_file.exists()
    assert manager.log.parent == scheduler.log.parent


def _stage(name: str) -> dict[str, object]:
    (stage,) = [s for s in stages.all_stages() if s["metadata"]["name"] == name]
    return stage


def test_stages_include_the_node_stages_kwok_would_otherwise_drop() -> None:
    names = {s["metadata"]["name"] for s in stages.all_stages()}
    assert {"node-initialize", "node-heartbeat-with-lease"} <= names
    assert {
        "pod-ready",
        "pod-succeeded",
        "pod-failed",
        "pod-delete",
        "pod-kill-held-by-kueue",
    } <= names


def test_pod_outcome_stages_are_selected_by_annotation_and_delayed_by_it() -> None:
    failed = _stage("pod-failed")["spec"]
    assert isinstance(failed, dict)
    expressions = failed["selector"]["matchExpressions"]
    assert {
        "key": '.metadata.annotations["sim.trainium.dev/outcome"]',
        "operator": "In",
        "values": ["failed"],
    } in expressions
    assert failed["delay"]["durationFrom"] == {
        "expressionFrom": '.metadata.annotations["sim.trainium.dev/after"]'
    }
    template = failed["next"]["statusTemplate"]
    assert "phase: Failed" in template
    assert '"sim.trainium.dev/exit-code" ) 1 }}' in template


def _contradict(first: dict[str, object], second: dict[str, object]) -> bool:
    """True when no object can satisfy both expressions (same key)."""
    if first["key"] != second["key"]:
        return False
    operators = {first["operator"], second["operator"]}
    if operators in ({"Exists", "DoesNotExist"}, {"In", "DoesNotExist"}):
        return True
    values = [set(e.get("values") or ()) for e in (first, second)]  # type: ignore[call-overload]
    if operators == {"In", "NotIn"}:
        inside = values[0] if first["operator"] == "In" else values[1]
        outside = values[1] if first["operator"] == "In" else values[0]
        return inside <= outside
    return operators == {"In"} and not values[0] & values[1]


def test_pod_stage_selectors_never_overlap() -> None:
    """KWOK picks randomly among matching stages, so each pod state must match one stage: every
    two pod stages have a pair of expressions no pod satisfies together."""
    selectors = {s["metadata"]["name"]: s["spec"]["selector"] for s in stages.pod_stages()}
    names = sorted(selectors)
    for index, name in enumerate(names):
        for other in names[index + 1 :]:
            assert any(
                _contradict(mine, theirs)
                for mine in selectors[name]["matchExpressions"]
                for theirs in selectors[other]["matchExpressions"]
            ), f"{name} and {other} can match the same pod"


def test_a_deleted_pod_kueue_does_not_hold_is_removed_at_once_as_before() -> None:
    """Other finalizers (the tests' own) keep a deleted pod Running, as a kubelet that never
    confirms the delete would."""
    delete = _stage("pod-delete")["spec"]
    assert isinstance(delete, dict)
    assert delete["next"] == {"delete": True}
    assert delete["selector"]["matchExpressions"] == [
        {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
        {"key": ".metadata.finalizers.[]", "operator": "NotIn", "values": [stages.KUEUE_FINALIZER]},
    ]


def test_a_deleted_pod_kueue_holds_is_killed_first_then_deleted() -> None:
    """Kueue removes its finalizer only from an ended pod: KWOK ends it as a kubelet would."""
    kill = _stage("pod-kill-held-by-kueue")["spec"]
    assert isinstance(kill, dict)
    expressions = kill["selector"]["matchExpressions"]
    assert {
        "key": ".metadata.finalizers.[]",
        "operator": "In",
        "values": ["kueue.x-k8s.io/managed"],
    } in expressions
    assert {
        "key": ".status.phase",
        "operator": "NotIn",
        "values": ["Succeeded", "Failed"],
    } in expressions
    template = kill["next"]["statusTemplate"]
    assert "phase: Failed" in template
    assert "{{ $exitCode := 137 }}" in template
    assert "sim.trainium.dev" not in template, "a kill ignores the simulated outcome"
    held = _stage("pod-delete-held-by-kueue")["spec"]
    assert isinstance(held, dict)
    assert held["next"] == {"delete": True}


def test_kwokctl_config_serialises_once_to_parseable_documents(tmp_path: Path) -> None:
    binaries = {
        name: tmp_path / name
        for name in (
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubectl",
            "etcd",
            "kwok",
        )
    }
    text = stages.dump_documents(
        stages.kwokctl_config_documents(
            binaries=binaries, kube_version="v1.36.5", etcd_version="v3.6.6", kwok_version="v0.8.0"
        )
    )
    documents = list(yaml.safe_load_all(text))
    options = documents[0]["options"]
    assert options["runtime"] == "binary"
    assert options["heartbeatFactor"] == 1
    assert options["etcdVersion"] == "3.6.6"
    assert options["kubeApiserverBinary"] == str(tmp_path / "kube-apiserver")
    kwok = documents[1]
    assert kwok["kind"] == "KwokConfiguration"
    # Written without KWOK's defaults: a parallelism left out is 0 and KWOK refuses to start.
    parallelisms = {k: v for k, v in kwok["options"].items() if k.endswith("Parallelism")}
    assert set(parallelisms) == {
        "podPlayStageParallelism",
        "nodePlayStageParallelism",
        "nodeLeaseParallelism",
        "podsOnNodeSyncParallelism",
    }
    assert all(v >= 1 for v in parallelisms.values())
    assert parallelisms["podPlayStageParallelism"] == stages.POD_STAGE_PARALLELISM
    assert kwok["options"]["enableDebuggingHandlers"] is True
    assert [d["kind"] for d in documents[2:]] == ["Stage"] * len(stages.all_stages())


def test_go_build_names_a_single_binary_explicitly() -> None:
    etcd = versions.GO_COMPONENTS["etcd"]
    args = build.go_build_args(etcd, Path("/out"), jobs=1)
    assert args[-2:] == ["/out/etcd", "go.etcd.io/etcd/server/v3"]


def test_kubernetes_build_stamps_a_semver_version() -> None:
    args = build.go_build_args(versions.GO_COMPONENTS["kubernetes"], Path("/out"), jobs=2)
    ldflags = next(a for a in args if a.startswith("-ldflags="))
    assert "-X k8s.io/component-base/version.gitVersion=v1.36.5" in ldflags
    assert "-X k8s.io/client-go/pkg/version.gitMinor=36" in ldflags
    assert "-tags=selinux,notest" in args


def test_kubernetes_kueue_and_kwok_share_one_module_graph_with_one_version_of_each_library() -> (
    None
):
    family = [versions.GO_COMPONENTS[name] for name in ("kubernetes", "kueue", "kwok")]
    assert {component.wrapper for component in family} == {"kubernetes"}
    go_mod = (build.wrapper_dir(family[0]) / "go.mod").read_text()
    for pinned in (
        f"k8s.io/kubernetes {versions.KUBERNETES_VERSION}",
        f"sigs.k8s.io/kueue {versions.KUEUE_VERSION}",
        f"sigs.k8s.io/kwok {versions.KWOK_VERSION}",
        "k8s.io/client-go => k8s.io/client-go v0.36.5",  # staging at Kubernetes' own release
    ):
        assert pinned in go_mod


def test_a_wrappers_components_build_one_after_another_and_the_longest_chain_first() -> None:
    chains = build.build_chains(list(versions.GO_COMPONENTS.values()))
    assert [[c.name for c in chain] for chain in chains] == [
        ["kubernetes", "kueue", "kwok"],  # the first compiles what the other two share
        ["etcd"],
        ["volcano"],
    ]
    only_kwok_and_etcd = [versions.GO_COMPONENTS["kwok"], versions.GO_COMPONENTS["etcd"]]
    assert [[c.name for c in chain] for chain in build.build_chains(only_kwok_and_etcd)] == [
        ["kwok"],
        ["etcd"],
    ]


def test_the_build_module_imports_with_the_standard_library_alone() -> None:
    # .ci/bootstrap starts the Go build with the system python3 before the virtualenv exists.
    operator_dir = Path(build.__file__).parents[1]
    script = (
        f"import sys; sys.path.insert(0, {str(operator_dir)!r}); import trainium_devcluster.build"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_go_builds_emit_no_dwarf_from_the_compiler_as_none_is_linked() -> None:
    args = build.go_build_args(versions.GO_COMPONENTS["kueue"], Path("/out"), jobs=2)
    assert "-gcflags=all=-dwarf=false" in args
    ldflags = next(a for a in args if a.startswith("-ldflags="))
    assert ldflags.startswith("-ldflags=-s -w")


def test_cache_key_changes_with_the_module_graph_but_not_comments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    component = versions.GO_COMPONENTS["kwok"]
    wrapper = tmp_path / component.wrapper
    shutil.copytree(build.wrapper_dir(component), wrapper)
    monkeypatch.setattr(build, "GOMOD_DIR", tmp_path)
    original = build.component_digest(component)

    go_mod = wrapper / "go.mod"
    go_mod.write_text("// a new comment\n" + go_mod.read_text())
    assert build.component_digest(component) == original

    go_mod.write_text(go_mod.read_text().replace("go 1.26.0", "go 1.26.1"))
    assert build.component_digest(component) != original


def test_kueues_build_replaces_its_list_of_integrations_and_its_cache_key_follows_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    component = versions.GO_COMPONENTS["kueue"]
    ((module, path, replacement),) = component.overlays
    assert (module, path) == (versions.KUEUE_MODULE, "pkg/controller/jobs/jobs.go")
    assert build.module_version(component, module) == versions.KUEUE_VERSION
    text = (build.wrapper_dir(component) / replacement).read_text()
    assert '_ "sigs.k8s.io/kueue/pkg/controller/jobs/pod"' in text
    assert text.count("sigs.k8s.io/kueue/pkg/controller/jobs/") == 1  # the pod integration only
    wrapper = tmp_path / component.wrapper
    shutil.copytree(build.wrapper_dir(component), wrapper)
    monkeypatch.setattr(build, "GOMOD_DIR", tmp_path)
    original = build.component_digest(component)
    (wrapper / replacement).write_text(text + "\n// changed\n")
    assert build.component_digest(component) != original


def test_cache_lives_where_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(tmp_path))
    assert paths.bin_root() == tmp_path / "bin"
    assert build.component_dir(versions.GO_COMPONENTS["etcd"]).parent == tmp_path / "bin"
    cluster = paths.ClusterPaths("c1")
    assert cluster.kubeconfig == tmp_path / "kwok" / "clusters" / "c1" / "kubeconfig.yaml"


def test_missing_toolchain_names_the_parts_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(tmp_path))
    with pytest.raises(build.ToolchainMissingError, match=r"kube-apiserver.*dev build"):
        build.require_toolchain()


def test_outcome_annotations_for_an_oom_kill() -> None:
    annotations = sim.outcome_annotations(
        succeeded=False, exit_code=137, reason="OOMKilled", message="out of memory", after="5s"
    )
    assert annotations == {
        stages.OUTCOME_ANNOTATION: "failed",
        stages.EXIT_CODE_ANNOTATION: "137",
        stages.REASON_ANNOTATION: "OOMKilled",
        stages.MESSAGE_ANNOTATION: "out of memory",
        stages.AFTER_ANNOTATION: "5s",
    }


def test_outcome_annotations_default_to_a_clean_exit() -> None:
    annotations = sim.outcome_annotations(succeeded=True)
    assert annotations[stages.EXIT_CODE_ANNOTATION] == "0"
    assert annotations[stages.REASON_ANNOTATION] == "Completed"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"succeeded": True, "exit_code": 1}, "succeeded pod exits 0"),
        ({"succeeded": False, "exit_code": 0}, "non-zero"),
        ({"succeeded": False, "exit_code": 300}, "0..255"),
        ({"succeeded": True, "after": "soon"}, "Go duration"),
        ({"succeeded": True, "after": -1}, ">= 0"),
    ],
)
def test_outcome_annotations_reject_contradictions(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sim.outcome_annotations(**kwargs)  # type: ignore[arg-type]


def test_delays_become_go_durations() -> None:
    assert sim.go_duration(1.5) == "1500ms"
    assert sim.go_duration("1m30s") == "1m30s"


def test_wait_for_returns_the_first_satisfying_value() -> None:
    values = iter([1, 2, 3])
    assert (
        sim.wait_for(lambda: next(values), until=lambda v: v >= 2, timeout=5, description="two")
        == 2
    )


def test_wait_for_reports_the_last_observed_state() -> None:
    with pytest.raises(
        sim.WaitTimeoutError, match=r"waiting for phase Running; last observed: 'Pending'"
    ):
        sim.wait_for(
            lambda: "Pending",
            until=lambda v: v == "Running",
            timeout=0.3,
            description="phase Running",
            interval=0.05,
        )


def test_wait_for_treats_errors_as_not_yet_and_reports_them() -> None:
    def fetch() -> str:
        raise LookupError("pod not found")

    with pytest.raises(AssertionError, match="pod not found"):
        sim.wait_for(fetch, timeout=0.2, description="the pod", interval=0.05)


@pytest.mark.parametrize("instance_type", ["trn2.48xlarge", "trn2u.48xlarge"])
def test_trn2_fake_nodes_advertise_16_chips_64_logical_cores_and_16_efa(
    instance_type: str,
) -> None:
    capacity = objects.fake_nodes(1, instance_type)[0]["status"]["capacity"]
    assert (capacity["cpu"], capacity["memory"]) == ("192", "2048Gi")
    assert capacity["aws.amazon.com/neuron"] == "16"
    assert capacity["aws.amazon.com/neuroncore"] == "64"
    assert capacity["vpc.amazonaws.com/efa"] == "16"
    # Trn2 support came in Neuron 2.21, after the plugin stopped advertising neurondevice.
    assert "aws.amazon.com/neurondevice" not in capacity


def test_the_schedule_period_chosen_at_up_is_kept_for_a_restarted_scheduler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(tmp_path))
    scheduler, _ = volcano.daemons(paths.ClusterPaths("unit"))
    assert scheduler.schedule_period() == volcano.DEFAULT_SCHEDULE_PERIOD
    scheduler.schedule_period_file.parent.mkdir(parents=True)
    scheduler.schedule_period_file.write_text("200ms\n")
    assert scheduler.schedule_period() == "200ms"
    argv = volcano.scheduler_argv(
        Path("/b/vc-scheduler"),
        tmp_path / "kc",
        healthz_port=1,
        metrics_port=2,
        schedule_period=scheduler.schedule_period(),
    )
    assert "--schedule-period=200ms" in argv


def test_cluster_and_volcano_files_lie_in_kwokctls_directory_or_in_ours_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(tmp_path))
    cluster = paths.ClusterPaths("dev")
    kwok, ours = tmp_path / "kwok" / "clusters" / "dev", tmp_path / "clusters" / "dev"
    assert (cluster.kwok_dir, cluster.state_dir) == (kwok, ours)
    assert cluster.kubeconfig == kwok / "kubeconfig.yaml"
    assert (cluster.kwokctl_config, cluster.kwokctl_log) == (
        ours / "kwokctl-config.yaml",
        ours / "kwokctl.log",
    )
    scheduler = volcano.Daemon("vc-scheduler", cluster)
    assert [
        scheduler.pid_file,
        scheduler.port_file,
        scheduler.log,
        scheduler.schedule_period_file,
    ] == [
        ours / "vc-scheduler.pid",
        ours / "vc-scheduler.healthz-port",
        ours / "vc-scheduler.log",
        ours / "vc-scheduler.schedule-period",
    ]
