from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from trainium_operator.api.spec import TrainingJobSpec
from trainium_operator.builders import pods
from trainium_operator.builders.job import Stage
from trainium_operator.builders.upload import UploadPodSettings, upload_pod
from trainium_operator.contract import workload_env
from trainium_operator.contract.workload_env import WorkloadEnv, read_workload_env
from trainium_operator.lifecycle.parse import parse_job
from unit.jobs import UID, job_document, job_ref


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]
    }


def test_training_pod_requests_all_neuron_devices_and_efa_of_the_instance_type() -> None:
    job = job_ref(instanceType="trn1n.32xlarge")
    resources = pods.pod(job, Stage.TRAIN, 0, 1)["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"aws.amazon.com/neuron": "16", "vpc.amazonaws.com/efa": "16"}


def test_trn1_2xlarge_has_no_efa_request_and_two_processes() -> None:
    job = job_ref(instanceType="trn1.2xlarge")
    pod = pods.pod(job, Stage.TRAIN, 0, 0)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"aws.amazon.com/neuron": "1"}
    assert "--nproc_per_node=2" in pod["spec"]["containers"][0]["command"]


def test_neurondevice_resource_name_is_configurable() -> None:
    job = job_ref(neuronResourceName="aws.amazon.com/neurondevice")
    limits = pods.container_resources(job)["limits"]
    assert limits["aws.amazon.com/neurondevice"] == "16"
    assert "aws.amazon.com/neuron" not in limits


def test_pod_is_gang_scheduled_by_volcano_on_trainium_nodes() -> None:
    job = job_ref()
    pod = pods.pod(job, Stage.TRAIN, 2, 1)
    assert pod["metadata"]["name"] == "bert-train-2-1"
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "bert-train"
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["spec"]["nodeSelector"] == {"node.kubernetes.io/instance-type": "trn1.32xlarge"}
    assert {t["key"] for t in pod["spec"]["tolerations"]} == {
        "aws.amazon.com/neuron",
        "vpc.amazonaws.com/efa",
    }
    assert pod["spec"]["restartPolicy"] == "Never"
    labels = pod["metadata"]["labels"]
    assert labels["trainium.dev/stage"] == "train"
    assert labels["trainium.dev/node-rank"] == "1"
    assert labels["trainium.dev/attempt"] == "2"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == UID


def test_pod_mounts_shared_claim_and_memory_backed_shm() -> None:
    job = job_ref(storage={"claimName": "fsx", "mountPath": "/fsx"})
    spec = pods.pod(job, Stage.TRAIN, 0, 0)["spec"]
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}
    assert volumes[mounts["/fsx"]]["persistentVolumeClaim"] == {"claimName": "fsx"}


def test_compile_stage_wraps_the_same_torchrun_command_in_neuron_parallel_compile() -> None:
    job = job_ref(compile={"steps": 7, "stepsArg": "--steps_this_run", "extraArgs": ["--x"]})
    compile_cmd = pods.torchrun_command(job, Stage.COMPILE, 0)
    train_cmd = pods.torchrun_command(job, Stage.TRAIN, 0)
    assert compile_cmd[0] == "neuron_parallel_compile"
    assert compile_cmd[-3:] == ["--steps_this_run", "7", "--x"]

    def without_gang_identity(command: list[str]) -> list[str]:
        return [a for a in command if not a.startswith(("--rdzv_endpoint", "--rdzv_id"))]

    assert without_gang_identity(compile_cmd[1 : 1 + len(train_cmd)]) == without_gang_identity(
        train_cmd
    )


def _script_args(command: list[str], script: str) -> list[str]:
    return command[command.index(script) + 1 :]


def test_the_operator_appends_no_argument_the_spec_did_not_ask_for() -> None:
    job = job_ref(command={"script": "/app/train.py", "args": ["--epochs", "3"]})
    for stage, attempt in [(Stage.COMPILE, 0), (Stage.TRAIN, 0), (Stage.TRAIN, 2)]:
        command = pods.torchrun_command(job, stage, attempt)
        assert _script_args(command, "/app/train.py") == ["--epochs", "3"], (stage, attempt)


def test_opted_in_flags_get_the_operator_computed_values_in_each_stage() -> None:
    job = job_ref(
        command={
            "script": "/app/train.py",
            "args": ["--a"],
            "trainArgs": ["--train-only"],
            "resumeArgs": ["--resume", "latest"],
            "dataDirArg": "--data",
            "outputDirArg": "-o",
        },
        dataDir="/data/set",
        compile={"steps": 4, "stepsArg": "--max-steps", "extraArgs": ["--dry"]},
    )
    root = "/data/output/team-a/bert"
    assert _script_args(pods.torchrun_command(job, Stage.COMPILE, 0), "/app/train.py") == [
        *["--a", "--data", "/data/set", "-o", f"{root}/compile-0", "--max-steps", "4", "--dry"]
    ]
    assert _script_args(pods.torchrun_command(job, Stage.TRAIN, 0), "/app/train.py") == [
        *["--a", "--data", "/data/set", "-o", f"{root}/attempt-0", "--train-only"]
    ]
    assert _script_args(pods.torchrun_command(job, Stage.TRAIN, 1), "/app/train.py") == [
        *["--a", "--data", "/data/set", "-o", f"{root}/attempt-1", "--train-only"],
        *["--resume", "latest"],
    ]


def test_attempt_n_writes_under_its_own_directory_in_its_env_and_its_output_flag() -> None:
    job = job_ref(command={"script": "/app/train.py", "outputDirArg": "--out"})
    for stage, attempt, own in [
        (Stage.COMPILE, 0, "/data/output/team-a/bert/compile-0"),
        (Stage.TRAIN, 0, "/data/output/team-a/bert/attempt-0"),
        (Stage.TRAIN, 3, "/data/output/team-a/bert/attempt-3"),
    ]:
        pod = pods.pod(job, stage, attempt, 1)
        env = env_of(pod)
        assert env[workload_env.OUTPUT_DIR] == own, (stage, attempt)
        assert env[workload_env.OUTPUT_ROOT] == "/data/output/team-a/bert", (stage, attempt)
        assert _script_args(pod["spec"]["containers"][0]["command"], "/app/train.py") == [
            "--out",
            own,
        ]


def test_no_two_gangs_of_a_job_get_the_same_write_path() -> None:
    job = job_ref(outputDir="/fsx/out/", command={"script": "/s.py", "outputDirArg": "--out"})
    gangs = [(stage, attempt) for stage in Stage for attempt in range(12)]
    written = {env_of(pods.pod(job, s, a, 0))[workload_env.OUTPUT_DIR] for s, a in gangs}
    assert len(written) == len(gangs)
    assert all(path.startswith("/fsx/out/") and "//" not in path for path in written)
    # A resume finds the training gangs' directories, and only theirs, by name.
    attempts = {workload_env.training_attempt_of(path.rpartition("/")[2]) for path in written}
    assert attempts == {*range(12), None}


def test_only_training_attempt_directory_names_parse_as_attempts() -> None:
    assert workload_env.training_attempt_of("attempt-0") == 0
    assert workload_env.training_attempt_of("attempt-17") == 17
    for other in ("compile-3", "attempt-", "attempt-01", "attempt--1", "attempt-3.tmp", "x"):
        assert workload_env.training_attempt_of(other) is None, other


def test_resume_args_are_added_on_every_attempt_after_the_first() -> None:
    job = job_ref(command={"script": "/s.py", "resumeArgs": ["--resume"]})
    assert "--resume" not in pods.torchrun_command(job, Stage.TRAIN, 0)
    assert pods.torchrun_command(job, Stage.TRAIN, 1)[-1] == "--resume"
    assert "--resume" not in pods.torchrun_command(job, Stage.COMPILE, 1)
    assert "--resume" not in pods.torchrun_command(job, Stage.TRAIN, 3, resume=False)


def test_every_attempt_gets_the_workload_environment_and_it_reads_back() -> None:
    job = job_ref(dataDir="/data/in", compile={"steps": 5})
    container = pods.pod(job, Stage.TRAIN, 2, 1, resume=True, restarts=2)["spec"]["containers"][0]
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    run = read_workload_env(env)
    assert run == WorkloadEnv(
        job_name="bert",
        namespace="team-a",
        uid=UID,
        stage="train",
        node_rank=1,
        attempt=2,
        restart_count=2,
        resume=True,
        output_dir="/data/output/team-a/bert/attempt-2",
        output_root="/data/output/team-a/bert",
        data_dir="/data/in",
        compile_steps=None,
        node_name="",
        precision="bf16",
    )
    first = pods.pod(job, Stage.COMPILE, 0, 0)["spec"]["containers"][0]
    compile_run = read_workload_env({e["name"]: e.get("value", "") for e in first["env"]})
    assert (compile_run.resume, compile_run.restart_count, compile_run.compile_steps) == (
        False,
        0,
        5,
    )
    assert set(workload_env.WORKLOAD_ENV_NAMES) <= set(env) | {workload_env.COMPILE_STEPS}


def test_a_flag_option_that_is_not_an_option_name_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"command\.dataDirArg"):
        TrainingJobSpec.model_validate(
            {"image": "i", "command": {"script": "/s.py", "dataDirArg": "data dir"}}
        )


def test_c10d_rendezvous_points_at_rank0_through_the_headless_service() -> None:
    job = job_ref()
    command = pods.torchrun_command(job, Stage.TRAIN, 3)
    assert "--rdzv_backend=c10d" in command
    assert "--rdzv_endpoint=train-0.bert.team-a.svc:29400" in command
    assert f"--rdzv_id={UID[:8]}-train-3" in command
    assert "--max_restarts=0" in command
    service = pods.headless_service(job)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    pod = pods.pod(job, Stage.TRAIN, 3, 0)
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("train-0", "bert")


def test_etcd_rendezvous_uses_the_given_endpoint() -> None:
    job = job_ref(rendezvous={"backend": "etcd", "endpoint": "etcd-server:2379"})
    command = pods.torchrun_command(job, Stage.TRAIN, 0)
    assert "--rdzv_backend=etcd" in command
    assert "--rdzv_endpoint=etcd-server:2379" in command


def test_environment_has_efa_neuron_settings_and_a_per_rank_compile_cache() -> None:
    job = job_ref(compile={"cacheSet": "bert-large"})
    env = env_of(pods.pod(job, Stage.TRAIN, 0, 1))
    expected = {
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "FI_EFA_FORK_SAFE": "1",
        "CCOM_SOCKET_IFNAME": "eth0",
        "NEURON_RT_RESET_CORES": "1",
        "XLA_TRANSFER_SEED_ASYNC": "1",
        "NEURON_CC_FLAGS": "--cache_dir=/data/neuron_cache/bert-large_1",
        "NEURON_RT_STOCHASTIC_ROUNDING_EN": "1",
        "TRAINIUM_NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }
    assert {name: env.get(name) for name in expected} == expected


def test_user_env_replaces_a_default_without_duplicating_it() -> None:
    job = job_ref(
        env=[{"name": "CCOM_SOCKET_IFNAME", "value": "ens5"}, {"name": "X", "value": "1"}]
    )
    names = [e["name"] for e in pods.pod(job, Stage.TRAIN, 0, 0)["spec"]["containers"][0]["env"]]
    assert names.count("CCOM_SOCKET_IFNAME") == 1
    assert env_of(pods.pod(job, Stage.TRAIN, 0, 0))["CCOM_SOCKET_IFNAME"] == "ens5"


def test_profiling_env_points_into_the_attempts_profile_directory() -> None:
    job = job_ref(profile={"enabled": True, "startStep": 3, "endStep": 9})
    env = env_of(pods.pod(job, Stage.TRAIN, 2, 0))
    assert env["TRAINIUM_PROFILE"] == "1"
    assert env["TRAINIUM_PROFILE_DIR"] == "/data/profiles/team-a/bert/2"
    assert env["TRAINIUM_PROFILE_STEPS"] == "3:9"
    # The profile's manifest names the job it belongs to.
    assert (env["TRAINIUM_JOB_NAME"], env["TRAINIUM_JOB_NAMESPACE"]) == ("bert", "team-a")
    assert env["TRAINIUM_JOB_UID"] == UID
    assert "TRAINIUM_PROFILE" not in env_of(pods.pod(job, Stage.COMPILE, 0, 0))


def test_podgroup_requires_the_whole_gang_in_the_queue() -> None:
    group = pods.podgroup(job_ref(nodes=16, scheduling={"queue": "test"}), Stage.TRAIN)
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {
        "minMember": 16,
        "queue": "test",
        # trn1.32xlarge: 16 Neuron devices and 8 EFA interfaces per pod, times 16 pods.
        "minResources": {"aws.amazon.com/neuron": "256", "vpc.amazonaws.com/efa": "128"},
    }


def test_podgroup_min_resources_sum_the_pod_requests_in_their_units() -> None:
    job = job_ref(nodes=2, resources={"requests": {"cpu": "500m", "memory": "64Gi"}})
    group = pods.podgroup(job, Stage.TRAIN)
    assert group["spec"]["minResources"]["cpu"] == "1000m"
    assert group["spec"]["minResources"]["memory"] == "128Gi"
    container = pods.pod(job, Stage.TRAIN, 0, 0)["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "64Gi"}


@pytest.mark.parametrize(
    ("quantity", "times_three"),
    [("64Gi", "192Gi"), ("500m", "1500m"), ("1.5", "4.5"), ("16", "48"), ("1e3", "3e3")],
)
def test_scale_quantity_keeps_the_unit(quantity: str, times_three: str) -> None:
    assert pods.scale_quantity(quantity, 3) == times_three


def test_a_malformed_quantity_is_refused_by_the_spec_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"resources\.requests\.memory"):
        TrainingJobSpec.model_validate(
            {
                "image": "i",
                "command": {"script": "s"},
                "resources": {"requests": {"memory": "lots"}},
            }
        )


def test_builders_are_deterministic() -> None:
    assert pods.stage_pods(job_ref(), Stage.TRAIN, 1) == pods.stage_pods(job_ref(), Stage.TRAIN, 1)


def test_neuron_device_profiling_sets_the_runtime_capture_and_merges_after_torchrun() -> None:
    job = job_ref(profile={"enabled": True, "neuronDeviceProfile": True})
    pod = pods.pod(job, Stage.TRAIN, 1, 0)
    env = env_of(pod)
    assert env["NEURON_RT_INSPECT_ENABLE"] == "1"
    assert env["NEURON_RT_INSPECT_DEVICE_PROFILE"] == "1"
    assert env["NEURON_RT_INSPECT_OUTPUT_DIR"] == (
        "/data/profiles/team-a/bert/1/$(TRAINIUM_NODE_NAME)/neuron"
    )
    names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    assert names.index("TRAINIUM_NODE_NAME") < names.index("NEURON_RT_INSPECT_OUTPUT_DIR")
    command = pod["spec"]["containers"][0]["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    assert command[3:] == ["sh", *pods.torchrun_command(job, Stage.TRAIN, 1)]
    assert pods.pod(job, Stage.COMPILE, 0, 0)["spec"]["containers"][0]["command"][0] == (
        "neuron_parallel_compile"
    )


def test_trn2_pod_requests_16_chips_16_efa_runs_64_workers_and_sets_lnc() -> None:
    job = job_ref(instanceType="trn2.48xlarge")
    pod = pods.pod(job, Stage.TRAIN, 0, 0)
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {
        "aws.amazon.com/neuron": "16",
        "vpc.amazonaws.com/efa": "16",
    }
    assert "--nproc_per_node=64" in container["command"]
    assert env_of(pod)["NEURON_LOGICAL_NC_CONFIG"] == "2"
    assert pod["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"] == "trn2.48xlarge"
    lnc1 = pods.pod(job_ref(instanceType="trn2u.48xlarge", lnc=1), Stage.TRAIN, 0, 0)
    assert "--nproc_per_node=128" in lnc1["spec"]["containers"][0]["command"]
    assert env_of(lnc1)["NEURON_LOGICAL_NC_CONFIG"] == "1"
    assert "NEURON_LOGICAL_NC_CONFIG" not in env_of(pods.pod(job_ref(), Stage.TRAIN, 0, 0))


# Pod Security "baseline" (kubernetes.io/docs/concepts/security/pod-security-standards): the
# capabilities a container may add, and the host and privilege fields it may not set.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    spec = pod["spec"]
    found = [f for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    found += [v["name"] for v in spec["volumes"] if "hostPath" in v]
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            found.append(f"{container['name']}: privileged")
        added = set((context.get("capabilities") or {}).get("add") or [])
        found += [f"{container['name']}: adds {c}" for c in sorted(added - BASELINE_CAPABILITIES)]
        found += [
            f"{container['name']}: hostPort" for p in container.get("ports", []) if "hostPort" in p
        ]
    return found


@pytest.mark.parametrize("stage", [Stage.COMPILE, Stage.TRAIN])
@pytest.mark.parametrize("instance_type", ["trn1.32xlarge", "trn1.2xlarge", "trn2.48xlarge"])
def test_training_pods_get_the_tightest_context_baseline_allows(
    stage: Stage, instance_type: str
) -> None:
    job = job_ref(
        instanceType=instance_type, profile={"enabled": True, "neuronDeviceProfile": True}
    )
    pod = pods.pod(job, stage, 0, 0)
    spec = pod["spec"]
    (trainer,) = spec["containers"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False, "nothing in the pod calls the API"
    context = trainer["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["privileged"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}, "NET_RAW and the rest are gone"
    assert baseline_violations(pod) == []


def test_a_pod_template_may_loosen_what_the_operator_set_only_field_by_field() -> None:
    template = {
        "spec": {
            "securityContext": {"runAsUser": 1000, "runAsNonRoot": True},
            "automountServiceAccountToken": True,
            "containers": [
                {"name": "trainer", "securityContext": {"capabilities": {"drop": ["NET_RAW"]}}}
            ],
        }
    }
    spec = pods.pod(job_ref(podTemplate=template), Stage.TRAIN, 0, 0)["spec"]
    assert spec["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsUser": 1000,
        "runAsNonRoot": True,
    }
    assert spec["automountServiceAccountToken"] is True
    context = spec["containers"][0]["securityContext"]
    assert context["capabilities"] == {"drop": ["NET_RAW"]}, "an explicit drop list wins"
    assert context["allowPrivilegeEscalation"] is False, "fields it did not name stay"


def test_merge_security_context_merges_nested_objects_and_replaces_everything_else() -> None:
    default = {"seccompProfile": {"type": "RuntimeDefault"}, "capabilities": {"drop": ["ALL"]}}
    merged = pods.merge_security_context(
        default,
        {"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}, "runAsUser": 7},
    )
    assert merged == {
        "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"},
        "capabilities": {"drop": ["ALL"]},
        "runAsUser": 7,
    }
    assert default == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "capabilities": {"drop": ["ALL"]},
    }


POD_TEMPLATE = {
    "metadata": {"labels": {"team": "nlp"}, "annotations": {"example.com/owner": "ml"}},
    "spec": {
        "volumes": [{"name": "datasets", "persistentVolumeClaim": {"claimName": "ds"}}],
        "initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]}],
        "containers": [
            {"name": "metrics", "image": "example.com/exporter:1"},
            {
                "name": "trainer",
                "volumeMounts": [{"name": "datasets", "mountPath": "/datasets"}],
                "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
            },
        ],
        "imagePullSecrets": [{"name": "ecr"}],
        "securityContext": {"fsGroup": 1000},
        "terminationGracePeriodSeconds": 60,
    },
}


def test_pod_template_is_merged_over_the_built_pod_without_replacing_the_operators_parts() -> None:
    job = job_ref(podTemplate=POD_TEMPLATE)
    plain = pods.pod(job_ref(), Stage.TRAIN, 0, 0)
    pod = pods.pod(job, Stage.TRAIN, 0, 0)
    spec = pod["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["dshm", "shared-data", "datasets"]
    assert [c["name"] for c in spec["initContainers"]] == ["fetch"]
    assert [c["name"] for c in spec["containers"]] == ["trainer", "metrics"]
    trainer = spec["containers"][0]
    assert [m["mountPath"] for m in trainer["volumeMounts"]] == ["/dev/shm", "/data", "/datasets"]
    # Security contexts merge field by field: the author's capability joins drop ALL.
    assert trainer["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
    }
    plain_trainer = plain["spec"]["containers"][0]
    for owned in ("command", "env", "resources", "image"):
        assert trainer[owned] == plain_trainer[owned], owned
    assert spec["imagePullSecrets"] == [{"name": "ecr"}]
    assert spec["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "fsGroup": 1000,
    }
    assert spec["terminationGracePeriodSeconds"] == 60
    assert spec["restartPolicy"] == "Never"
    assert pod["metadata"]["labels"]["team"] == "nlp"
    assert pod["metadata"]["labels"]["trainium.dev/job-name"] == "bert"
    assert pod["metadata"]["annotations"]["example.com/owner"] == "ml"
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "bert-train"


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        pytest.param(
            {"spec": {"restartPolicy": "Always"}},
            "spec.podTemplate.spec.restartPolicy is set by the operator (the operator sets Never",
            id="restart-policy",
        ),
        pytest.param(
            {"spec": {"nodeSelector": {"a": "b"}}},
            "spec.podTemplate.spec.nodeSelector is set by the operator (use spec.nodeSelector)",
            id="node-selector",
        ),
        pytest.param(
            {"spec": {"containers": [{"name": "trainer", "command": ["bash"]}]}},
            "spec.podTemplate.spec.containers[0].command: the trainer container's command is set "
            "by the operator (use spec.command)",
            id="trainer-command",
        ),
        pytest.param(
            {"spec": {"containers": [{"name": "trainer", "resources": {}}]}},
            "(use spec.resources)",
            id="trainer-resources",
        ),
        pytest.param(
            {"metadata": {"labels": {"trainium.dev/attempt": "9"}}},
            "spec.podTemplate.metadata.labels[trainium.dev/attempt]: the operator selects",
            id="selector-label",
        ),
        pytest.param(
            {"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}},
            "spec.podTemplate.spec.volumes[0].name 'dshm' is the operator's",
            id="volume-name",
        ),
        pytest.param(
            {"spec": {"containers": [{"name": "side"}]}},
            "spec.podTemplate.spec.containers[0].image is required for a sidecar container",
            id="sidecar-without-image",
        ),
    ],
)
def test_pod_template_overriding_what_the_operator_owns_is_refused_naming_the_fix(
    template: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        TrainingJobSpec.model_validate(
            {"image": "i", "command": {"script": "/s.py"}, "podTemplate": template}
        )
    assert expected in str(refused.value)


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return dict(selector["matchLabels"]).items() <= labels.items()


def test_the_job_network_policy_admits_only_the_jobs_own_pods_of_every_stage() -> None:
    job = job_ref()
    policy = pods.network_policy(job)
    assert policy["metadata"]["namespace"] == job.namespace
    assert policy["metadata"]["ownerReferences"][0]["uid"] == UID
    assert policy["spec"]["policyTypes"] == ["Ingress"], "egress stays open: S3, data, DNS"
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert "ports" not in rule, "rendezvous and the collectives' bootstrap use any port"
    upload = upload_pod(job, 0, "s3://b/p", UploadPodSettings(image="op@sha256:" + "0" * 64))
    own = [
        pods.pod(job, Stage.COMPILE, 0, 0, resume=False, restarts=0),
        pods.pod(job, Stage.TRAIN, 3, 1, resume=True, restarts=3),
        upload,
    ]
    for pod in own:
        labels = pod["metadata"]["labels"]
        assert _selects(policy["spec"]["podSelector"], labels), pod["metadata"]["name"]
        assert _selects(peer["podSelector"], labels), pod["metadata"]["name"]
    document = job_document()
    document["metadata"]["name"] = "other"
    other_job = parse_job(document)
    assert not isinstance(other_job, list)
    other = pods.pod(other_job, Stage.TRAIN, 0, 0, resume=False, restarts=0)
    assert not _selects(peer["podSelector"], other["metadata"]["labels"])
