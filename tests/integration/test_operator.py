"""The operator, running as a process, against the real local control plane (KWOK nodes,
the real Volcano scheduler): the tutorial job end to end and every failure path."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from integration.operator_harness import (
    ROOT,
    OperatorProcess,
    OperatorView,
    create_job,
    create_peering,
    ensure_shared_claim,
    finish_pods,
    get_job,
    job_events,
    job_manifest,
    job_pods,
    kubectl,
    patch_job,
    start_compiling,
    start_training,
    training_job,
    wait_attempt,
    wait_gang_running,
    wait_phase,
    wait_running_gone,
)
from trainium_devcluster import testing
from trainium_devcluster.sim import restore_node, simulate_node_loss, wait_for
from trainium_operator.contract import neff_cache
from trainium_operator.lifecycle.observed import parse_time
from trainium_operator.lifecycle.policies.goodput import PARTS as GOODPUT_PARTS

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]


def _env(container: Any) -> dict[str, Any]:
    return {e.name: e.value for e in container.env}


def described_events(describe_output: str) -> list[tuple[str, str]]:
    """(type, reason) of each event `kubectl describe` lists, in its order."""
    lines = describe_output.split("\nEvents:", 1)[1].splitlines()
    rows = [line.split() for line in lines if line.startswith("  ") and line.split()]
    return [(row[0], row[1]) for row in rows if row[0] in ("Normal", "Warning")]


def test_tutorial_job_compiles_then_trains_to_success_on_two_trainium_nodes(
    dev_cluster: Any, clients: Any, namespace: str, operator: OperatorView
) -> None:
    manifest = yaml.safe_load((ROOT / "examples/bert-large-pretrain.yaml").read_text())
    create_job(clients, namespace, manifest)
    name = manifest["metadata"]["name"]

    compile_pods = wait_gang_running(clients, namespace, name, "compile", 0)
    job = wait_phase(clients, namespace, name, "Compiling")
    assert job["status"]["workers"]["summary"] == "2/2"
    assert len({p.spec.node_name for p in compile_pods}) == 2, "gang spread over two nodes"
    command = compile_pods[0].spec.containers[0].command
    assert command[:2] == ["neuron_parallel_compile", "torchrun"]
    assert command[-2:] == ["--steps_this_run", "10"]

    # status.goodput counts whole seconds (the status's resolution): each stage lasts over a
    # second, so its part cannot round to 0 (a sub-second training stage once did).
    time.sleep(1.5)
    finish_pods(clients, namespace, compile_pods)
    train_pods = wait_gang_running(clients, namespace, name, "train", 0)
    job = wait_phase(clients, namespace, name, "Training")
    time.sleep(1.5)
    assert len({p.spec.node_name for p in train_pods}) == 2, "one training pod per node"

    for rank, pod in enumerate(train_pods):
        container = pod.spec.containers[0]
        assert pod.metadata.annotations["scheduling.k8s.io/group-name"] == f"{name}-train"
        assert pod.metadata.labels["trainium.dev/node-rank"] == str(rank)
        assert pod.metadata.owner_references[0].kind == "TrainingJob"
        assert pod.spec.scheduler_name == "volcano"
        assert pod.spec.restart_policy == "Never"
        assert pod.spec.node_selector == {"node.kubernetes.io/instance-type": "trn1.32xlarge"}
        assert container.resources.limits == {
            "aws.amazon.com/neuron": "16",
            "vpc.amazonaws.com/efa": "8",
        }
        assert container.command[0] == "torchrun"
        assert "--nnodes=2" in container.command
        assert "--nproc_per_node=32" in container.command
        assert "--rdzv_backend=etcd" in container.command
        assert "--rdzv_endpoint=etcd-server:2379" in container.command
        assert "--steps_this_run" not in container.command
        env = _env(container)
        assert env["FI_PROVIDER"] == "efa"
        assert env["NEURON_CC_FLAGS"] == f"--cache_dir=/data/neuron_cache/bert-large_{rank}"
        assert env["TRAINIUM_PROFILE_DIR"] == f"/data/profiles/{namespace}/{name}/0"
        volumes = {v.name: v for v in pod.spec.volumes}
        mounts = {m.mount_path: m.name for m in container.volume_mounts}
        assert volumes[mounts["/data"]].persistent_volume_claim.claim_name == "fsx-claim"
        assert volumes[mounts["/dev/shm"]].empty_dir.medium == "Memory"

    podgroup = clients.custom.get_namespaced_custom_object(
        "scheduling.volcano.sh", "v1beta1", namespace, "podgroups", f"{name}-train"
    )
    assert podgroup["spec"]["minMember"] == 2
    assert podgroup["spec"]["queue"] == "test"

    # One rank ends first: the job is still training (it used to flip to Pending/WaitingForGang
    # with an event saying "2/2 scheduled, 1/2 ready").
    finish_pods(clients, namespace, train_pods[:1])
    wait_for(
        lambda: get_job(clients, namespace, name)["status"].get("message", ""),
        until=lambda message: "1 finished" in message,
        timeout=30,
        description="the job to see its first rank finish",
    )
    assert get_job(clients, namespace, name)["status"]["phase"] == "Training"
    finish_pods(clients, namespace, train_pods[1:])
    job = wait_phase(clients, namespace, name, "Succeeded")
    assert job["status"]["restarts"]["total"] == 0
    assert job["status"]["compile"]["completionTime"]
    assert job["status"]["training"]["completionTime"]
    assert job["status"]["profile"]["path"] == f"/data/profiles/{namespace}/{name}/0"
    # status.goodput: every second from creation to completion in exactly one part.
    goodput = job["status"]["goodput"]
    parts = [goodput[k] for k in GOODPUT_PARTS]
    assert abs(sum(parts) - goodput["wallSeconds"]) <= 0.5, goodput
    completed = parse_time(job["status"]["completionTime"])
    created = parse_time(job["metadata"]["creationTimestamp"])
    assert completed is not None
    assert created is not None
    assert abs(goodput["wallSeconds"] - (completed - created).total_seconds()) <= 2, goodput
    assert goodput["compilingSeconds"] > 0, goodput
    assert goodput["trainingSeconds"] > 0, goodput
    assert (goodput["lostSeconds"], goodput["lostUnknown"]) == (0, 0), goodput
    assert goodput["summary"] == f"{goodput['percent']:.1f}%", goodput
    # Events are written after the status they report: the last one may follow the phase.
    reasons = wait_for(
        lambda: [reason for _, reason, _ in job_events(clients, namespace, name)],
        until=lambda found: "TrainingSucceeded" in found,
        timeout=10,
        description="the TrainingSucceeded event",
    )
    assert "CompileSucceeded" in reasons

    # `kubectl describe` is what a user reads as the truth: a healthy job shows no Warning, and
    # its events in kubectl's order end with the state the job is in.
    described = kubectl(dev_cluster, namespace, "describe", "tj", name)
    assert described.returncode == 0, described.stderr
    shown = described_events(described.stdout)
    assert [kind for kind, _ in shown if kind != "Normal"] == [], shown
    reasons_shown = [reason for _, reason in shown]
    assert reasons_shown[-1] == "TrainingSucceeded", shown
    assert reasons_shown.index("CompileSucceeded") < reasons_shown.index("TrainingSucceeded")

    listing = kubectl(dev_cluster, namespace, "get", "tj", "-o", "wide")
    assert listing.returncode == 0, listing.stderr
    table = listing.stdout
    header, row = table.splitlines()[:2]
    assert header.split()[:9] == [
        "NAME",
        "PHASE",
        "NODES",
        "WORKERS",
        "QUEUE",
        "RESTARTS",
        "STEP",
        "RATE",
        "ETA",
    ]
    assert row.split()[:6] == [name, "Succeeded", "2", "0/2", "volcano/test:Admitted", "0"]
    assert "TrainingSucceeded" in row
    assert row.split()[-1] == goodput["summary"], "the GOODPUT column (wide) ends the row"


def test_compile_failure_fails_the_job_with_the_exit_code(
    clients: Any, namespace: str, operator: OperatorView
) -> None:
    pods = start_compiling(clients, namespace, "cf")
    finish_pods(clients, namespace, pods[1:], succeeded=False, exit_code=2, message="neuronx-cc")
    job = wait_phase(clients, namespace, "cf", "Failed")
    assert job["status"]["reason"] == "CompileFailed"
    assert job["status"]["lastFailure"]["exitCode"] == 2
    assert job["status"]["lastFailure"]["pod"] == "cf-compile-0-1"
    assert "exit code 2" in job["status"]["message"]
    assert not job_pods(clients, namespace, "cf", "train")
    wait_for(
        lambda: [p for p in job_pods(clients, namespace, "cf") if p.status.phase == "Running"],
        until=lambda running: not running,
        timeout=30,
        description="the still-running compile pod deleted (cleanPodPolicy Running)",
    )


def test_worker_failure_restarts_the_whole_gang_with_resume_then_succeeds(
    clients: Any, namespace: str, operator: OperatorView
) -> None:
    first = start_training(clients, namespace, "wf", command={"resumeArgs": ["--resume"]})
    for pod in first:
        assert "--resume" not in pod.spec.containers[0].command
        assert _env(pod.spec.containers[0])["TRAINIUM_RESUME"] == "0"
    finish_pods(clients, namespace, first[:1], succeeded=False, exit_code=137, reason="Error")
    second = wait_gang_running(clients, namespace, "wf", "train", 1)
    for pod in second:
        assert pod.spec.containers[0].command[-1] == "--resume"
        env = _env(pod.spec.containers[0])
        assert (env["TRAINIUM_RESUME"], env["TRAINIUM_RESTART_COUNT"]) == ("1", "1")
    job = wait_phase(clients, namespace, "wf", "Training")
    assert job["status"]["restarts"] == {"total": 1, "application": 1, "infrastructure": 0}
    assert job["status"]["lastFailure"]["exitCode"] == 137
    # The failed pod stays for its logs; its running peer was stopped.
    old = {p.metadata.name: p for p in job_pods(clients, namespace, "wf", "train", 0)}
    assert list(old) == ["wf-train-0-0"]
    finish_pods(clients, namespace, second)
    wait_phase(clients, namespace, "wf", "Succeeded")
    # kubectl lists events by time; microseconds keep GangRunning before TrainingSucceeded
    # even when both fall in one second. The operator posts events after the status they
    # follow: the last one may arrive just after the phase.
    events = wait_for(
        lambda: (
            clients.core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=wf,involvedObject.kind=TrainingJob"
            ).items
        ),
        until=lambda found: "TrainingSucceeded" in {e.reason for e in found},
        timeout=10,
        description="the TrainingSucceeded event",
    )
    in_time_order = sorted(events, key=lambda e: e.event_time)
    assert all(e.event_time.microsecond or e.last_timestamp is None for e in events)
    assert [e.reason for e in in_time_order][-1] == "TrainingSucceeded"
    assert [e.metadata.name for e in in_time_order] == sorted(e.metadata.name for e in events)


def test_node_loss_force_deletes_its_pods_and_restarts_the_gang_elsewhere(
    clients: Any, namespace: str, operator: OperatorView
) -> None:
    pods = start_training(clients, namespace, "nl")
    lost_node = pods[1].spec.node_name
    simulate_node_loss(clients.core, lost_node)
    try:
        job = wait_attempt(clients, namespace, "nl", 1)  # a gang restart after the node loss
        assert job["status"]["restarts"]["infrastructure"] == 1
        assert job["status"]["restarts"]["application"] == 0
        assert job["status"]["lastFailure"]["reason"] == "NodeLost"
        assert job["status"]["lastFailure"]["node"] == lost_node
        # Force-deleted: never stuck in Terminating on the dead node.
        wait_for(
            lambda: job_pods(clients, namespace, "nl", "train", 0),
            until=lambda old: not old,
            timeout=30,
            description="attempt-0 pods gone",
        )
    finally:
        restore_node(clients.core, lost_node)
    wait_gang_running(clients, namespace, "nl", "train", 1)
    wait_phase(clients, namespace, "nl", "Training")


def test_backoff_limit_exhaustion_fails_the_job(
    clients: Any, namespace: str, operator: OperatorView
) -> None:
    manifest = job_manifest("bo", compile={"enabled": False}, runPolicy={"backoffLimit": 1})
    create_job(clients, namespace, manifest)
    for attempt in (0, 1):
        pods = wait_gang_running(clients, namespace, "bo", "train", attempt)
        finish_pods(clients, namespace, pods[:1], succeeded=False, exit_code=1)
    job = wait_phase(clients, namespace, "bo", "Failed")
    assert job["status"]["reason"] == "BackoffLimitExceeded"
    assert job["status"]["restarts"]["application"] == 1
    assert "backoffLimit (1) exhausted" in job["status"]["message"]
    # The event is posted after the status write that failed the job: wait for it, bounded.
    wait_for(
        lambda: [r for t, r, _ in job_events(clients, namespace, "bo") if t == "Warning"],
        until=lambda warnings: "BackoffLimitExceeded" in warnings,
        timeout=30,
        description="a BackoffLimitExceeded Warning event",
    )


def test_active_deadline_fails_the_job_and_stops_its_pods(
    clients: Any, namespace: str, operator: OperatorView
) -> None:
    start_compiling(clients, namespace, "dl", runPolicy={"activeDeadlineSeconds": 8})
    job = wait_phase(clients, namespace, "dl", "Failed", timeout=60)
    assert job["status"]["reason"] == "DeadlineExceeded"
    wait_running_gone(clients, namespace, "dl", "running pods deleted after the deadline")


def test_suspend_deletes_pods_and_resume_continues_with_a_new_attempt(
    clients: Any, namespace: str, operator: OperatorView
) -> None:
    start_training(clients, namespace, "sr")
    patch_job(clients, namespace, "sr", {"spec": {"runPolicy": {"suspend": True}}})
    wait_phase(clients, namespace, "sr", "Suspended")
    wait_running_gone(clients, namespace, "sr", "pods deleted on suspend", terminating_too=True)
    groups = clients.custom.list_namespaced_custom_object(
        "scheduling.volcano.sh", "v1beta1", namespace, "podgroups"
    )["items"]
    assert groups == []
    patch_job(clients, namespace, "sr", {"spec": {"runPolicy": {"suspend": False}}})
    pods = wait_gang_running(clients, namespace, "sr", "train", 1)
    assert pods[0].spec.containers[0].command[-1] == "--resume"
    job = wait_phase(clients, namespace, "sr", "Training")
    assert job["status"]["restarts"]["total"] == 0, "a resume is not a failure"


def test_deleting_a_job_removes_everything_it_created(
    clients: Any, namespace: str, operator: OperatorView
) -> None:
    running = start_compiling(clients, namespace, "del")
    # The job's NetworkPolicy, as the API server stored it: owned by the job, selecting its pods
    # and admitting only them.
    networking = client.NetworkingV1Api(clients.api_client)
    policy = networking.read_namespaced_network_policy("del", namespace)
    assert policy.metadata.owner_references[0].kind == "TrainingJob"
    selector = policy.spec.pod_selector.match_labels
    assert all(selector.items() <= (p.metadata.labels or {}).items() for p in running)
    assert [peer.pod_selector.match_labels for peer in policy.spec.ingress[0]._from] == [selector]
    clients.custom.delete_namespaced_custom_object(
        "trainium.dev", "v1alpha1", namespace, "trainingjobs", "del"
    )

    def leftovers() -> list[str]:
        pods = [p.metadata.name for p in job_pods(clients, namespace, "del")]
        services = [s.metadata.name for s in clients.core.list_namespaced_service(namespace).items]
        policies = [
            n.metadata.name for n in networking.list_namespaced_network_policy(namespace).items
        ]
        groups = clients.custom.list_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", namespace, "podgroups"
        )["items"]
        return pods + services + policies + [g["metadata"]["name"] for g in groups]

    wait_for(leftovers, until=lambda left: not left, timeout=60, description="children deleted")


def test_operator_killed_mid_training_resumes_without_duplicating_pods(
    clients: Any, namespace: str, own_operator: OperatorProcess
) -> None:
    pods = training_job(clients, namespace, "rs")
    uids = {p.metadata.uid for p in pods}
    own_operator.kill()
    own_operator.start()
    finish_pods(clients, namespace, pods[:1], succeeded=False, exit_code=1)
    new = wait_gang_running(clients, namespace, "rs", "train", 1)
    everything = job_pods(clients, namespace, "rs")
    assert len([p for p in everything if p.metadata.labels["trainium.dev/attempt"] == "1"]) == 2
    assert uids.isdisjoint({p.metadata.uid for p in new})
    job = wait_phase(clients, namespace, "rs", "Training")
    assert job["status"]["restarts"]["total"] == 1
    finish_pods(clients, namespace, new)
    wait_phase(clients, namespace, "rs", "Succeeded")
    own_operator.assert_alive()


INVALID_SPECS = [
    pytest.param({"nodes": 0}, "spec.nodes", id="zero-nodes"),
    pytest.param({"instanceType": "p4d.24xlarge"}, "spec.instanceType", id="unknown-instance"),
    pytest.param({"processesPerNode": 64}, "spec.processesPerNode cannot exceed", id="procs"),
    pytest.param(
        {"rendezvous": {"backend": "etcd"}}, "spec.rendezvous.endpoint is required", id="etcd"
    ),
    pytest.param(
        {"env": [{"name": "MASTER_ADDR", "value": "x"}]}, "reserved names", id="reserved-env"
    ),
    pytest.param({"profile": {"startStep": 9, "endStep": 2}}, "endStep must be", id="window"),
    pytest.param({"compile": {"cacheSet": "a b"}}, "spec.compile.cacheSet", id="cache-set"),
    pytest.param({"runPolicy": {"backoffLimit": -1}}, "spec.runPolicy.backoffLimit", id="backoff"),
    pytest.param({"precision": "fp8"}, "spec.precision", id="precision"),
    pytest.param({"scheduling": {"queue": "Team_A"}}, "spec.scheduling.queue", id="queue-name"),
    pytest.param({"storage": {"claimName": "../fsx"}}, "spec.storage.claimName", id="claim-name"),
    pytest.param(
        {
            "podTemplate": {
                "spec": {"volumes": [{"name": "c", "secret": {"secretName": "Bad_Name"}}]}
            }
        },
        "spec.podTemplate.spec.volumes[0].secret.secretName",
        id="volume-secret-name",
    ),
    pytest.param(
        {
            "podTemplate": {
                "spec": {
                    "containers": [
                        {"name": "trainer", "envFrom": [{"configMapRef": {"name": "Settings"}}]}
                    ]
                }
            }
        },
        "spec.podTemplate.spec.containers[0].envFrom[0].configMapRef.name",
        id="env-from-config-map-name",
    ),
    pytest.param(
        {"podTemplate": {"spec": {"imagePullSecrets": [{"name": "ecr_pull"}]}}},
        "spec.podTemplate.spec.imagePullSecrets[0].name",
        id="image-pull-secret-name",
    ),
    pytest.param(
        {"podTemplate": {"spec": {"volumes": [{"name": "a.b", "emptyDir": {}}]}}},
        "spec.podTemplate.spec.volumes[0].name",
        id="volume-name-is-a-label",
    ),
    pytest.param(
        {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "t", "key": "a/b"}}}]},
        "spec.env[0].valueFrom.secretKeyRef.key",
        id="env-secret-key",
    ),
    pytest.param(
        {"instanceType": "trn1.32xlarge", "neuron": {"stack": "native"}},
        "spec.neuron.stack is not supported on spec.instanceType",
        id="native-stack-on-trn1",
    ),
    pytest.param(
        {"instanceType": "trn1.32xlarge", "neuron": {"compileOnly": True}},
        "spec.neuron.compileOnly and spec.neuron.hloCache are native-stack controls",
        id="native-compile-only-on-trn1",
    ),
    pytest.param(
        {"instanceType": "trn2.48xlarge", "neuronResourceName": "aws.amazon.com/neurondevice"},
        "spec.neuronResourceName: aws.amazon.com/neurondevice has not been advertised since",
        id="neurondevice-on-trn2",
    ),
    pytest.param(
        {
            "instanceType": "trn2u.48xlarge",
            "resources": {"limits": {"aws.amazon.com/neurondevice": "16"}},
        },
        "spec.resources: aws.amazon.com/neurondevice has not been advertised since",
        id="neurondevice-limit-on-trn2u",
    ),
]


@pytest.mark.parametrize(("spec", "message"), INVALID_SPECS)
def test_invalid_specs_are_refused_by_the_api_server_naming_the_field(
    dev_cluster: Any, namespace: str, spec: dict[str, Any], message: str
) -> None:
    manifest = job_manifest("bad", **spec)
    with pytest.raises(Exception) as refused:  # noqa: PT011 - ApiException; checked below
        create_job(dev_cluster.clients, namespace, manifest)
    assert getattr(refused.value, "status", None) == 422
    assert message in str(getattr(refused.value, "body", "")), refused.value


def test_valid_names_inside_the_pod_template_are_accepted_and_every_pod_field_kept(
    dev_cluster: Any, namespace: str, operator: Any
) -> None:
    env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "hf.token", "key": ".t_1-A"}}}]
    sidecar = {
        "name": "log-shipper",
        "image": "example.com/shipper:1",
        "env": env,
        "envFrom": [{"prefix": "S_", "secretRef": {"name": "s", "optional": True}}],
        "volumeMounts": [{"name": "conf", "mountPath": "/etc/conf", "readOnly": True}],
    }
    template = {
        "spec": {
            "imagePullSecrets": [{"name": "ecr.pull-1"}],
            "volumes": [
                {"name": "conf", "configMap": {"name": "c.v1", "defaultMode": 256}},
                {
                    "name": "creds",
                    "secret": {"secretName": "s", "items": [{"key": "k", "path": "k"}]},
                },
                {
                    "name": "more",
                    "persistentVolumeClaim": {"claimName": "x" * 253, "readOnly": True},
                },
                {
                    "name": "p",
                    "projected": {
                        "sources": [
                            {"secret": {"name": "s"}},
                            {"serviceAccountToken": {"path": "t"}},
                        ]
                    },
                },
            ],
            "initContainers": [{**sidecar, "name": "fetch"}],
            "containers": [sidecar],
        }
    }
    manifest = job_manifest("names", podTemplate=template, env=env, runPolicy={"suspend": True})
    create_job(dev_cluster.clients, namespace, manifest)
    # The operator's own checks agree: the job is suspended, not Failed with InvalidSpec.
    stored = wait_phase(dev_cluster.clients, namespace, "names", "Suspended")["spec"]
    assert stored["podTemplate"]["spec"] == template["spec"]
    assert stored["env"] == env


def test_immutable_fields_cannot_change_under_a_running_job(clients: Any, namespace: str) -> None:
    create_job(clients, namespace, job_manifest("imm"))
    with pytest.raises(Exception) as refused:  # noqa: PT011
        patch_job(clients, namespace, "imm", {"spec": {"nodes": 4}})
    assert "spec.nodes is immutable" in str(getattr(refused.value, "body", ""))
    # Set on a running job (or removed) would make the next restart resume from another place.
    for added in ({"outputDir": "/data/elsewhere"}, {"dataDir": "/data/other"}):
        with pytest.raises(Exception) as refused:  # noqa: PT011
            patch_job(clients, namespace, "imm", {"spec": added})
        field = next(iter(added))
        assert f"spec.{field} is immutable" in str(getattr(refused.value, "body", "")), field
    assert "outputDir" not in get_job(clients, namespace, "imm")["spec"]


def test_kubectl_apply_of_a_typo_is_refused_with_the_field_name(
    dev_cluster: Any, namespace: str, tmp_path: Path
) -> None:
    manifest = job_manifest("typo")
    manifest["spec"]["nodez"] = 2
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(manifest))
    result = kubectl(dev_cluster, namespace, "apply", "-f", str(path))
    assert result.returncode != 0
    assert 'unknown field "spec.nodez"' in result.stderr


def test_two_peered_replicas_never_both_act_and_the_standby_takes_over(
    dev_cluster: Any, clients: Any, namespace: str, tmp_path: Path
) -> None:
    create_peering(clients, namespace, "tj")
    ensure_shared_claim(clients, namespace)
    replicas = [
        OperatorProcess(
            Path(dev_cluster.kubeconfig),
            namespace,
            tmp_path / f"operator-{priority}.log",
            extra_args=("--peering", "tj", "--priority", str(priority)),
        )
        for priority in (200, 100)
    ]
    active, standby = replicas
    active.start()
    wait_for(
        lambda: "trainingjobs listed" in active.log(),
        timeout=30,
        description="the high-priority replica watching",
    )
    standby.start()
    try:
        wait_for(
            lambda: clients.custom.get_namespaced_custom_object(
                "kopf.dev", "v1", namespace, "kopfpeerings", "tj"
            ).get("status", {}),
            until=lambda peers: len(peers) == 2,
            timeout=60,
            description="both replicas registered as peers",
        )
        create_job(clients, namespace, job_manifest("peer", compile={"enabled": False}))
        pods = wait_gang_running(clients, namespace, "peer", "train", 0)
        finish_pods(clients, namespace, pods[:1], succeeded=False, exit_code=1)
        second = wait_gang_running(clients, namespace, "peer", "train", 1)
        job = wait_phase(clients, namespace, "peer", "Training")
        assert job["status"]["restarts"]["total"] == 1, "one restart, made once"
        assert len(job_pods(clients, namespace, "peer", "train", 2)) == 0
        assert "Resuming operations" not in standby.log(), "the standby stayed paused"
        assert "peer" not in "".join(
            line for line in standby.log().splitlines() if "GangRestart" in line
        )
        active.stop()  # graceful: kopf withdraws the peer, the standby resumes
        finish_pods(clients, namespace, second)
        wait_phase(clients, namespace, "peer", "Succeeded", timeout=120)
        standby.assert_alive()
    finally:
        for replica in replicas:
            replica.stop()
    assert "Traceback" not in standby.log() + active.log()


def test_sigterm_stops_the_operator_within_3_s_and_the_next_one_continues_the_jobs(
    clients: Any, namespace: str, own_operator: OperatorProcess
) -> None:
    """A rolling update or a drained node: the replica exits quickly, with nothing lost."""
    steady = training_job(clients, namespace, "steady")
    # The signal lands while the operator works on a new job (its first passes and creates).
    create_job(clients, namespace, job_manifest("fresh", nodes=1, compile={"enabled": False}))
    stopped_in = own_operator.stop()
    assert stopped_in is not None, "the operator ignored SIGTERM and was killed"
    assert stopped_in <= 3.0, f"the operator took {stopped_in:.1f} s to exit after SIGTERM"
    assert own_operator.process is not None
    assert own_operator.process.returncode == 0, own_operator.log()[-3000:]

    own_operator.start()
    wait_for(
        lambda: get_job(clients, namespace, "fresh"),
        until=lambda j: (j.get("status") or {}).get("reason") == "Queued",
        timeout=30,
        description="the new job queued behind the running one (both nodes are taken)",
    )
    job = get_job(clients, namespace, "steady")
    assert job["status"]["phase"] == "Training"
    assert job["status"]["restarts"]["total"] == 0
    assert {p.metadata.uid for p in job_pods(clients, namespace, "steady")} == {
        p.metadata.uid for p in steady
    }
    finish_pods(clients, namespace, steady)
    wait_phase(clients, namespace, "steady", "Succeeded")
    fresh = wait_gang_running(clients, namespace, "fresh", "train", 0, nodes=1)
    assert len(job_pods(clients, namespace, "fresh")) == 1, "no pod created twice"
    finish_pods(clients, namespace, fresh)
    wait_phase(clients, namespace, "fresh", "Succeeded")


# -- the native Neuron stack (trn2.48xlarge) -------------------------------------------------

TRN2 = "trn2.48xlarge"


def _summary(programs: int, size: int, directory: str) -> str:
    """What the compile pod's SUMMARY_SCRIPT writes to its termination message (KWOK has no
    kubelet to read /dev/termination-log, so the simulated outcome carries it)."""
    return json.dumps(
        {
            "kind": neff_cache.SUMMARY_KIND,
            "readable": True,
            "programs": programs,
            "bytes": size,
            "dir": directory,
        }
    )


def test_a_trn2_native_job_compiles_into_the_neff_cache_then_trains_from_it(
    dev_cluster: Any, clients: Any, namespace: str, operator: OperatorView
) -> None:
    with testing.extra_nodes(dev_cluster, 2, instance_type=TRN2) as trn2_nodes:
        manifest = job_manifest(
            "native",
            instanceType=TRN2,
            compile={"steps": 5, "stepsArg": "--steps_this_run", "cacheSet": "llama"},
            neuron={"compilerVersion": "2.28.7631.0"},
        )
        create_job(clients, namespace, manifest)
        compile_pods = wait_gang_running(clients, namespace, "native", "compile", 0)
        assert {p.spec.node_name for p in compile_pods} == set(trn2_nodes)
        caches = []
        for rank, pod in enumerate(compile_pods):
            container = pod.spec.containers[0]
            assert container.command[:3] == ["/bin/sh", "-c", neff_cache.SUMMARY_SCRIPT]
            assert "neuron_parallel_compile" not in container.command
            assert "--nproc_per_node=64" in container.command
            assert container.command[-2:] == ["--steps_this_run", "5"]
            assert container.resources.limits == {
                "aws.amazon.com/neuron": "16",
                "vpc.amazonaws.com/efa": "16",
            }
            env = _env(container)
            assert env["TRAINIUM_NEURON_STACK"] == "native"
            assert (env["NEURON_LOGICAL_NC_CONFIG"], env["NEURON_CC_FLAGS"]) == (
                "2",
                "--logical-nc-config=2",
            )
            cache = env[neff_cache.NEFF_CACHE_DIR_ENV]
            assert cache == f"/data/neuron_cache/native/llama_{rank}/2.28.7631.0/lnc-2/neff"
            caches.append(cache)

        for rank, pod in enumerate(compile_pods):
            message = _summary(30 + rank, 2**30, caches[rank])
            finish_pods(clients, namespace, [pod], message=message)
        train_pods = wait_gang_running(clients, namespace, "native", "train", 0)
        job = wait_phase(clients, namespace, "native", "Training")
        assert job["status"]["compile"]["cache"] == {
            "path": "/data/neuron_cache/native/llama_<rank>/2.28.7631.0/lnc-2/neff",
            "programs": 61,
            "bytes": 2 * 2**30,
            "nodesReported": 2,
            "nodes": 2,
            "summary": "61 programs, 2.0 GiB",
        }
        for rank, pod in enumerate(train_pods):
            container = pod.spec.containers[0]
            assert container.command[0] == "torchrun"
            assert "--nproc_per_node=64" in container.command
            assert _env(container)[neff_cache.NEFF_CACHE_DIR_ENV] == caches[rank]
        finish_pods(clients, namespace, train_pods)
        wait_phase(clients, namespace, "native", "Succeeded")

        # LNC 1: 128 ranks per node, and a cache of its own.
        create_job(
            clients,
            namespace,
            job_manifest("native-lnc1", instanceType=TRN2, lnc=1, compile={"enabled": False}),
        )
        (first, *_) = wait_gang_running(clients, namespace, "native-lnc1", "train", 0)
        container = first.spec.containers[0]
        assert "--nproc_per_node=128" in container.command
        env = _env(container)
        assert env["NEURON_LOGICAL_NC_CONFIG"] == "1"
        assert env[neff_cache.NEFF_CACHE_DIR_ENV].endswith("/lnc-1/neff")
