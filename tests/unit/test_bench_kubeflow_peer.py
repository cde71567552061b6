"""Keeps the operator benchmark's Kubeflow peer honest without building or running it: the
wrapper module pins what versions.py says, it is opt-in, and the PyTorchJob the benchmark
creates holds the same pods as the TrainingJob it is compared with."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from trainium_devcluster import build, versions
from trainium_operator.lifecycle.render import render_job

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))
import kubeflow_peer  # noqa: E402

from integration.operator_harness import job_manifest  # noqa: E402

KUBEFLOW = versions.OPT_IN_GO_COMPONENTS["kubeflow"]


def _children(nodes: int) -> list[dict[str, Any]]:
    manifest = job_manifest(
        "peer", nodes=nodes, compile={"enabled": False}, runPolicy={"nodeLostGracePeriodSeconds": 0}
    )
    manifest["metadata"].update(namespace="bench", uid="0")
    return render_job(manifest, datetime.now(UTC))


def test_the_wrapper_pins_the_training_operator_versions_py_names() -> None:
    go_mod = (build.wrapper_dir(KUBEFLOW) / "go.mod").read_text()
    requires = re.findall(r"^\s+(\S+) (v\S+)", go_mod, re.MULTILINE)
    assert (versions.KUBEFLOW_TRAINING_OPERATOR_MODULE, "v1.9.2") in requires
    assert KUBEFLOW.version == versions.KUBEFLOW_TRAINING_OPERATOR_VERSION == "v1.9.2"
    # v1.9.2's own go.mod has no replace directives, so the wrapper repeats none; it pins the
    # graph upstream resolved (its k8s.io modules at v0.31.3, controller-runtime v0.19.1).
    assert not re.search(r"^replace", go_mod, re.MULTILINE)
    assert ("k8s.io/client-go", "v0.31.3") in requires
    assert ("sigs.k8s.io/controller-runtime", "v0.19.1") in requires
    go_sum = (build.wrapper_dir(KUBEFLOW) / "go.sum").read_text()
    assert f"{versions.KUBEFLOW_TRAINING_OPERATOR_MODULE} v1.9.2 h1:" in go_sum
    (binary,) = KUBEFLOW.binaries
    assert binary.package.endswith("/cmd/training-operator.v1")


def test_kubeflow_is_opt_in_and_keyed_by_its_version() -> None:
    assert "kubeflow" not in versions.GO_COMPONENTS
    assert "training-operator" not in build.expected_toolchain().binaries
    assert build.component_dir(KUBEFLOW).name.startswith("kubeflow-v1.9.2-")
    assert build.kubeflow_manifest_dir().name == build.component_dir(KUBEFLOW).name
    assert versions.KUBEFLOW_CRD_FILES_IN_MODULE == (
        "manifests/base/crds/kubeflow.org_pytorchjobs.yaml",
    )


@pytest.mark.parametrize("nodes", [1, 2, 16])
def test_the_pytorchjob_holds_the_same_pods_as_the_trainingjob(nodes: int) -> None:
    children = _children(nodes)
    ours = sorted((o for o in children if o["kind"] == "Pod"), key=lambda p: p["metadata"]["name"])
    (podgroup,) = (o for o in children if o["kind"] == "PodGroup")
    job = kubeflow_peer.pytorchjob_for("peer", children)

    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert sum(r["replicas"] for r in replicas.values()) == len(ours) == nodes
    assert replicas["Master"]["replicas"] == 1
    assert len(kubeflow_peer.pod_names(job)) == nodes
    policy = job["spec"]["runPolicy"]["schedulingPolicy"]
    assert policy == {"minAvailable": podgroup["spec"]["minMember"], "queue": "test"}
    assert podgroup["spec"]["minMember"] == nodes

    for replica in replicas.values():
        spec = replica["template"]["spec"]
        pod = ours[0]["spec"]
        assert replica["restartPolicy"] == pod["restartPolicy"]
        for key in ("nodeSelector", "tolerations", "affinity", "volumes", "schedulerName"):
            assert spec.get(key) == pod.get(key), key
        assert spec["schedulerName"] == "volcano"
        (container,) = spec["containers"]
        (our_container,) = pod["containers"]
        assert container["name"] == kubeflow_peer.CONTAINER_NAME
        assert container["resources"] == our_container["resources"]
        assert container["image"] == our_container["image"]
        assert container.get("volumeMounts") == our_container.get("volumeMounts")
        assert "env" not in container  # per-rank env is Kubeflow's to set

    # Kubeflow sums the replicas' requests into the PodGroup's minResources, as we do.
    ours_min = {
        key: int(value)
        for key, value in podgroup["spec"]["minResources"].items()
        if str(value).isdigit()
    }
    assert ours_min
    assert {k: v for k, v in kubeflow_peer.requests_of(job).items() if k in ours_min} == ours_min


def test_kubeflow_runs_only_pytorchjobs_gang_scheduled_by_volcano() -> None:
    argv = kubeflow_peer.argv(
        Path("/bin/training-operator"),
        namespace="bench",
        threads=4,
        ports={"metrics": 1, "probe": 2, "webhook": 3},
    )
    assert "--enable-scheme=pytorchjob" in argv
    assert "--gang-scheduler-name=volcano" in argv
    assert "--namespace=bench" in argv
    assert "--controller-threads=4" in argv
    assert "--leader-elect=false" in argv
