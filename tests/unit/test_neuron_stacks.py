"""The two Neuron stacks: per-instance defaults, refusals, the instance table, the renders."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

from trainium_operator.api.crd import training_job_crd
from trainium_operator.api.instance_types import (
    INSTANCE_TYPES,
    UNCONFIRMED_SHAPES,
)
from trainium_operator.api.spec import NeuronStack, TrainingJobSpec
from trainium_operator.api.status import TrainingJobStatus
from trainium_operator.builders import pods
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.cli import main
from trainium_operator.contract import neff_cache
from trainium_operator.lifecycle.observed import pod_view
from unit.jobs import decide, job_ref
from unit.test_lifecycle import observed, pod

GOLDEN = Path(__file__).parent / "golden"
HEALTH_URL = "https://trainium-operator.trainium-system.svc:8443"


def _spec(**fields: Any) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate(
        {"image": "example.com/train:1", "command": {"script": "/train.py"}, **fields}
    )


@pytest.mark.parametrize(
    ("instance_type", "stack"),
    [
        ("trn1.2xlarge", NeuronStack.XLA),
        ("trn1.32xlarge", NeuronStack.XLA),
        ("trn1n.32xlarge", NeuronStack.XLA),
        ("trn2.48xlarge", NeuronStack.NATIVE),
        ("trn2u.48xlarge", NeuronStack.NATIVE),
    ],
)
def test_the_stack_defaults_by_instance_type(instance_type: str, stack: NeuronStack) -> None:
    assert _spec(instanceType=instance_type).effective_neuron_stack is stack


def test_a_trn2_job_may_ask_for_the_xla_stack() -> None:
    spec = _spec(instanceType="trn2.48xlarge", neuron={"stack": "xla"})
    assert spec.effective_neuron_stack is NeuronStack.XLA


@pytest.mark.parametrize("instance_type", ["trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge"])
def test_the_native_stack_on_trn1_is_refused_naming_the_field_and_the_fix(
    instance_type: str,
) -> None:
    with pytest.raises(ValidationError) as refused:
        _spec(instanceType=instance_type, neuron={"stack": "native"})
    message = str(refused.value)
    assert "spec.neuron.stack is not supported on spec.instanceType" in message
    assert "remove spec.neuron.stack" in message
    assert "(got native)" in message


@pytest.mark.parametrize("control", ["compileOnly", "hloCache"])
def test_native_compile_controls_on_the_xla_stack_are_refused(control: str) -> None:
    with pytest.raises(ValidationError, match="are native-stack controls"):
        _spec(instanceType="trn1.32xlarge", neuron={control: True})
    with pytest.raises(ValidationError, match="are native-stack controls"):
        _spec(instanceType="trn2.48xlarge", neuron={"stack": "xla", control: True})
    assert _spec(instanceType="trn2.48xlarge", neuron={control: True})


def test_the_crd_refuses_unsupported_stacks_with_the_models_messages() -> None:
    spec_schema = training_job_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"
    ]["spec"]
    rules = {r.get("fieldPath"): r for r in spec_schema["x-kubernetes-validations"]}
    stack_rule = rules[".neuron.stack"]
    assert (
        "self.neuron.stack == 'native' && self.instanceType in ['trn2.48xlarge'"
        in (stack_rule["rule"])
    )
    assert "trn1" not in stack_rule["rule"].split("'native'")[1]
    assert "native-stack controls" in rules[".neuron"]["message"]
    neuron = spec_schema["properties"]["neuron"]
    assert neuron["default"] == {}
    stack = neuron["properties"]["stack"]
    assert stack["enum"] == ["xla", "native"]
    assert "default" not in stack, "defaulted per instance type by the operator, not the schema"
    for implied in ("neuron_parallel_compile", "TorchNeuron", "NEFF cache", "trn1"):
        assert implied in stack["description"]


LEGACY_DEVICE = "aws.amazon.com/neurondevice"


@pytest.mark.parametrize("instance_type", ["trn2.48xlarge", "trn2u.48xlarge"])
@pytest.mark.parametrize(
    ("request_", "field", "fix"),
    [
        ({"neuronResourceName": LEGACY_DEVICE}, "spec.neuronResourceName", "remove spec.neuron"),
        (
            {"resources": {"limits": {LEGACY_DEVICE: "16"}}},
            "spec.resources",
            f"remove {LEGACY_DEVICE} from spec.resources.limits",
        ),
        ({"resources": {"requests": {LEGACY_DEVICE: "1"}}}, "spec.resources", "remove"),
    ],
)
def test_neurondevice_on_trainium2_is_refused_naming_the_field_the_reason_and_the_fix(
    instance_type: str, request_: dict[str, Any], field: str, fix: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        _spec(instanceType=instance_type, **request_)
    message = str(refused.value)
    assert f"{field}: {LEGACY_DEVICE} has not been advertised since Neuron 2.20" in message
    assert fix in message
    assert re.search(r"aws\.amazon\.com/neuron(?!device)", message), "names the resource to use"


def test_neurondevice_stays_allowed_on_trn1_where_plugins_before_neuron_2_20_advertised_it() -> (
    None
):
    spec = _spec(instanceType="trn1.32xlarge", neuronResourceName=LEGACY_DEVICE)
    assert spec.neuron_resource_name.value == LEGACY_DEVICE
    assert _spec(instanceType="trn1.32xlarge", resources={"limits": {LEGACY_DEVICE: "16"}})


def test_the_crd_refuses_neurondevice_on_trainium2_with_the_models_messages() -> None:
    spec_schema = training_job_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"
    ]["spec"]
    rules = {r.get("fieldPath"): r for r in spec_schema["x-kubernetes-validations"]}
    for path in (".neuronResourceName", ".resources"):
        rule = rules[path]
        assert LEGACY_DEVICE in rule["rule"]
        assert "'trn2.48xlarge', 'trn2u.48xlarge'" in rule["rule"]
        assert "trn1" not in rule["rule"]
    with pytest.raises(ValidationError) as refused:
        _spec(instanceType="trn2.48xlarge", neuronResourceName=LEGACY_DEVICE)
    assert rules[".neuronResourceName"]["message"] in str(refused.value)


def test_trn2_48xlarge_runs_64_ranks_per_node_at_lnc_2_and_128_at_lnc_1() -> None:
    trn2 = INSTANCE_TYPES["trn2.48xlarge"]
    assert (trn2.logical_cores(2), trn2.logical_cores(1)) == (64, 128)
    assert (trn2.neuron_devices, trn2.efa_interfaces) == (16, 16)
    assert _spec(instanceType="trn2.48xlarge").effective_processes_per_node == 64
    assert _spec(instanceType="trn2.48xlarge", lnc=1).effective_processes_per_node == 128
    trn1 = INSTANCE_TYPES["trn1.32xlarge"]
    assert (trn1.neuron_cores, trn1.neuron_devices, trn1.efa_interfaces) == (32, 16, 8)
    assert INSTANCE_TYPES["trn1n.32xlarge"].efa_interfaces == 16


def test_trn3_shapes_are_marked_unconfirmed_and_not_admitted() -> None:
    for shape in UNCONFIRMED_SHAPES.values():
        assert {"name", "efa_interfaces"} <= set(shape.unconfirmed)
        assert shape.neuron_stacks == ("native",)
        assert shape.name not in INSTANCE_TYPES
        with pytest.raises(ValidationError):
            _spec(instanceType=shape.name)
    gen1, gen2 = UNCONFIRMED_SHAPES["trn3-gen1-server"], UNCONFIRMED_SHAPES["trn3-gen2-server"]
    assert (gen1.logical_cores(2), gen1.logical_cores(1)) == (64, 128)
    assert (gen2.logical_cores(2), gen2.logical_cores(1)) == (16, 32)
    assert all(not t.unconfirmed for t in INSTANCE_TYPES.values())


def test_a_trn1_job_renders_byte_identically_to_main_before_the_native_stack() -> None:
    # render-trn1-xla-main.yaml is main's render (8593f8c) of these jobs, before spec.neuron,
    # plus the later intended changes: the health channel's TRAINIUM_HEALTH_STACKS_DIR and
    # TRAINIUM_HEALTH_POD_DIR, and every pod naming its serviceAccountName (default here).
    result = CliRunner().invoke(
        main,
        ["render", "-f", str(GOLDEN / "render-trn1-xla-input.yaml"), "--health-url", HEALTH_URL],
    )
    assert result.exit_code == 0, result.output
    assert result.output == (GOLDEN / "render-trn1-xla-main.yaml").read_text()
    pods = [o for o in yaml.safe_load_all(result.output) if o["kind"] == "Pod"]
    assert pods[0]["spec"]["containers"][0]["command"][0] == "neuron_parallel_compile"


# -- pods per stack -------------------------------------------------------------------------


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def _trn2(**spec: Any) -> JobRef:
    return job_ref(instanceType="trn2.48xlarge", compile={"cacheSet": "llama"}, **spec)


def test_a_native_compile_pod_runs_the_training_command_itself_and_reports_its_cache() -> None:
    job = _trn2()
    compile_pod = pods.pod(job, Stage.COMPILE, 0, 1)
    command = compile_pod["spec"]["containers"][0]["command"]
    assert command[:4] == ["/bin/sh", "-c", neff_cache.SUMMARY_SCRIPT, "sh"]
    assert command[4] == "torchrun"
    assert "--nproc_per_node=64" in command
    assert pods.NEURON_PARALLEL_COMPILE not in command
    train_command = pods.pod(job, Stage.TRAIN, 0, 1)["spec"]["containers"][0]["command"]
    assert train_command[0] == "torchrun"
    script = job.spec.command.script
    # The same script and arguments (no train-only ones here); only the rendezvous differs.
    assert command[command.index(script) :] == train_command[train_command.index(script) :]


def test_native_pods_get_the_stack_the_neff_cache_and_lnc_as_runtime_and_compiler_setting() -> None:
    job = _trn2()
    compile_env = _env(pods.pod(job, Stage.COMPILE, 0, 1))
    train_env = _env(pods.pod(job, Stage.TRAIN, 0, 1))
    key = neff_cache.image_cache_key(job.spec.image)
    cache = f"/data/neuron_cache/native/llama_1/{key}/lnc-2/neff"
    for env in (compile_env, train_env):
        assert env["TRAINIUM_NEURON_STACK"] == "native"
        assert env["TORCH_NEURONX_NEFF_CACHE_DIR"] == cache
        assert env["NEURON_LOGICAL_NC_CONFIG"] == "2"
        assert env["NEURON_CC_FLAGS"] == "--logical-nc-config=2"
        assert (env["FI_PROVIDER"], env["FI_EFA_USE_DEVICE_RDMA"]) == ("efa", "1")
        assert "XLA_TRANSFER_SEED_ASYNC" not in env
        assert neff_cache.COMPILE_ONLY_ENV not in env
        assert neff_cache.HLO_CACHE_DIR_ENV not in env
    assert compile_env["TRAINIUM_COMPILE_STEPS"] == "10"
    other_rank = _env(pods.pod(job, Stage.TRAIN, 0, 0))["TORCH_NEURONX_NEFF_CACHE_DIR"]
    assert other_rank == f"/data/neuron_cache/native/llama_0/{key}/lnc-2/neff"
    resources = pods.pod(job, Stage.TRAIN, 0, 0)["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"aws.amazon.com/neuron": "16", "vpc.amazonaws.com/efa": "16"}


def test_the_native_cache_is_keyed_by_compiler_and_lnc_so_they_never_collide() -> None:
    def cache(**spec: Any) -> str:
        return _env(pods.pod(_trn2(**spec), Stage.TRAIN, 0, 0))["TORCH_NEURONX_NEFF_CACHE_DIR"]

    lnc1 = _trn2(lnc=1)
    assert _env(pods.pod(lnc1, Stage.TRAIN, 0, 0))["NEURON_CC_FLAGS"] == "--logical-nc-config=1"
    assert (
        "--nproc_per_node=128"
        in pods.pod(lnc1, Stage.TRAIN, 0, 0)["spec"]["containers"][0]["command"]
    )
    pinned = cache(neuron={"compilerVersion": "2.28.7631.0"})
    assert pinned == "/data/neuron_cache/native/llama_0/2.28.7631.0/lnc-2/neff"
    caches = {
        cache(),
        cache(lnc=1),
        pinned,
        cache(neuron={"compilerVersion": "2.29.0.0"}),
        cache(image="example.com/train:2"),
    }
    assert len(caches) == 5


def test_native_compile_only_and_hlo_cache_are_settings_that_default_off() -> None:
    job = _trn2(neuron={"compileOnly": True, "hloCache": True})
    compile_env = _env(pods.pod(job, Stage.COMPILE, 0, 0))
    train_env = _env(pods.pod(job, Stage.TRAIN, 0, 0))
    assert compile_env[neff_cache.COMPILE_ONLY_ENV] == "1"
    assert neff_cache.COMPILE_ONLY_ENV not in train_env, "training executes"
    for env in (compile_env, train_env):
        assert env[neff_cache.HLO_CACHE_DIR_ENV] == env[neff_cache.NEFF_CACHE_DIR_ENV].replace(
            "/neff", "/hlo"
        )
        assert env[neff_cache.HLO_COMPILE_CACHE_ENV] == "1"


def test_profiled_native_pods_capture_the_window_through_torch_profiler_not_the_environment() -> (
    None
):
    """Neuron's environment capture records the whole run ("enabled for the entire lifetime of
    the application"); on TorchNeuron the window is captured through torch.profiler, and the
    docs say not to combine the two, so a native pod gets no NEURON_RT_INSPECT_* variable."""
    job = _trn2(profile={"enabled": True, "neuronDeviceProfile": True})
    env = _env(pods.pod(job, Stage.TRAIN, 0, 0))
    assert env["TRAINIUM_PROFILE_NEURON_DEVICE"] == "1"
    assert env["TRAINIUM_PROFILE_STEPS"] == "10:20"
    assert not [name for name in env if name.startswith("NEURON_RT_INSPECT_")]
    xla = job_ref(
        instanceType="trn2.48xlarge",
        neuron={"stack": "xla"},
        profile={"enabled": True, "neuronDeviceProfile": True},
    )
    xla_env = _env(pods.pod(xla, Stage.TRAIN, 0, 0))
    assert xla_env["NEURON_RT_INSPECT_DEVICE_PROFILE"] == "1"
    assert "TRAINIUM_PROFILE_NEURON_DEVICE" not in xla_env


def test_an_xla_job_on_trn2_keeps_neuron_parallel_compile_and_adds_the_lnc_compiler_flag() -> None:
    job = _trn2(neuron={"stack": "xla"})
    compile_pod = pods.pod(job, Stage.COMPILE, 0, 0)
    assert compile_pod["spec"]["containers"][0]["command"][0] == pods.NEURON_PARALLEL_COMPILE
    env = _env(compile_pod)
    assert env["NEURON_CC_FLAGS"] == "--cache_dir=/data/neuron_cache/llama_0 --logical-nc-config=2"
    assert "TRAINIUM_NEURON_STACK" not in env, "absent reads as xla"
    assert neff_cache.NEFF_CACHE_DIR_ENV not in env


# -- the compile pod's cache summary ------------------------------------------------------------


def _run_summary(tmp_path: Path, cache: Path, *command: str) -> tuple[int, str | None]:
    message = tmp_path / "termination-log"
    script = neff_cache.SUMMARY_SCRIPT.replace(neff_cache.TERMINATION_MESSAGE_PATH, str(message))
    done = subprocess.run(
        ["/bin/sh", "-c", script, "sh", *command],
        env={**os.environ, neff_cache.NEFF_CACHE_DIR_ENV: str(cache)},
        check=False,
    )
    return done.returncode, message.read_text() if message.exists() else None


def test_the_summary_script_counts_the_neff_files_and_their_bytes_after_a_success(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "neff"
    (cache / "ab" / "cd").mkdir(parents=True)
    (cache / "ab" / "cd" / "k1.neff").write_bytes(b"x" * 1000)
    (cache / "ab" / "k2.neff").write_bytes(b"y" * 24)
    (cache / "ab" / "k2.lock").write_text("not a program")
    rc, message = _run_summary(tmp_path, cache, "true")
    assert rc == 0
    assert neff_cache.parse_summary(message) == neff_cache.CacheSummary(True, 2, 1024, str(cache))


def test_the_summary_says_unreadable_for_a_missing_cache_and_nothing_after_a_failure(
    tmp_path: Path,
) -> None:
    rc, message = _run_summary(tmp_path, tmp_path / "missing", "true")
    assert rc == 0
    summary = neff_cache.parse_summary(message)
    assert summary == neff_cache.CacheSummary(False, None, None, str(tmp_path / "missing"))
    failed = tmp_path / "failed"
    failed.mkdir()
    rc, message = _run_summary(failed, tmp_path / "missing", "sh", "-c", "exit 3")
    assert (rc, message) == (3, None)


def test_parse_summary_ignores_other_termination_messages() -> None:
    assert neff_cache.parse_summary(None) is None
    assert neff_cache.parse_summary("Traceback ... RuntimeError: boom") is None
    assert neff_cache.parse_summary('{"kind": "other", "programs": 3}') is None
    bad = neff_cache.parse_summary(
        '{"kind": "trainium.dev/neff-cache-summary", "readable": true, "programs": -1}'
    )
    assert bad == neff_cache.CacheSummary(False, None, None, None)


# -- status.compile.cache -------------------------------------------------------------------


def _summary(programs: int, size: int) -> str:
    return json.dumps(
        {"kind": neff_cache.SUMMARY_KIND, "readable": True, "programs": programs, "bytes": size}
    )


def _compiled(job: JobRef, *messages: str | None) -> dict[str, Any]:
    """The status of the pass that sees the compile gang succeed with these messages."""
    gang = [
        pod(job, Stage.COMPILE, 0, rank, "Succeeded", termination_message=message)
        for rank, message in enumerate(messages)
    ]
    running = decide(job, {}, observed(*gang[:0]))
    done = decide(job, running.status, observed(*gang))
    assert done.status["compile"]["completionTime"]
    return done.status


def test_the_native_compile_stage_reports_its_cached_programs_and_size_in_the_status() -> None:
    job = _trn2()
    status = _compiled(job, _summary(40, 3 * 2**30), _summary(41, 2**30))
    cache = status["compile"]["cache"]
    key = neff_cache.image_cache_key(job.spec.image)
    assert cache == {
        "path": f"/data/neuron_cache/native/llama_<rank>/{key}/lnc-2/neff",
        "nodesReported": 2,
        "nodes": 2,
        "programs": 81,
        "bytes": 4 * 2**30,
        "summary": "81 programs, 4.0 GiB",
    }
    (compiled,) = [c for c in status["conditions"] if c["type"] == "Compiled"]
    assert compiled["message"].endswith("NEFF cache: 81 programs, 4.0 GiB")
    TrainingJobStatus.model_validate(status)


def test_a_compile_pod_without_a_summary_leaves_the_figures_partial_and_says_why() -> None:
    job = _trn2()
    unreadable = json.dumps({"kind": neff_cache.SUMMARY_KIND, "readable": False})
    status = _compiled(job, _summary(7, 512 * 2**20), None)
    cache = status["compile"]["cache"]
    assert (cache["programs"], cache["nodesReported"]) == (7, 1)
    assert cache["summary"] == "7 programs, 512.0 MiB (1 of 2 nodes)"
    assert cache["message"] == (
        "1 of 2 compile pods did not report their NEFF cache: 1 left no cache summary in "
        "their termination message"
    )
    nothing = _compiled(job, unreadable, "OOMKilled")["compile"]["cache"]
    assert not {"programs", "bytes", "summary"} & set(nothing), "unknown, never zero"
    assert nothing["nodesReported"] == 0
    assert "1 could not list their cache directory" in nothing["message"]


def test_an_xla_compile_stage_writes_no_cache_figures() -> None:
    status = _compiled(job_ref(), None, None)
    assert "cache" not in status["compile"]


def test_the_trainer_containers_termination_message_is_observed() -> None:
    raw = {
        "metadata": {
            "name": "bert-compile-0-0",
            "labels": {
                "trainium.dev/stage": "compile",
                "trainium.dev/attempt": "0",
                "trainium.dev/node-rank": "0",
            },
        },
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [
                {"name": "sidecar", "state": {"terminated": {"message": "other"}}},
                {"name": "trainer", "state": {"terminated": {"exitCode": 0, "message": "m"}}},
            ],
        },
    }
    view = pod_view(raw)
    assert view is not None
    assert view.termination_message == "m"


# -- render shows both stacks -----------------------------------------------------------------

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_render_shows_a_trn2_native_job_and_a_trn1_xla_job_side_by_side(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text(
        (EXAMPLES / "trn2-native-pretrain.yaml").read_text()
        + "---\n"
        + (EXAMPLES / "bert-large-pretrain.yaml").read_text()
    )
    result = CliRunner().invoke(main, ["render", "-f", str(both)])
    assert result.exit_code == 0, result.output
    chunks = result.output.split("---\n")
    headers = {c.splitlines()[0] for c in chunks}
    assert any(
        h.startswith("# stage 1/2: compile (native stack: the same command") for h in headers
    )
    assert any(h.startswith("# stage 1/2: compile (neuron_parallel_compile") for h in headers)
    found = {
        (o["metadata"]["name"], o["metadata"]["labels"]["trainium.dev/stage"]): o
        for o in (yaml.safe_load(c) for c in chunks)
        if o["kind"] == "Pod"
    }
    native = found["bert-large-trn2-compile-0-1", "compile"]["spec"]["containers"][0]
    xla = found["bert-large-pretrain-compile-0-1", "compile"]["spec"]["containers"][0]
    assert native["command"][:3] == ["/bin/sh", "-c", neff_cache.SUMMARY_SCRIPT]
    assert "--nproc_per_node=64" in native["command"]
    assert xla["command"][0] == pods.NEURON_PARALLEL_COMPILE
    assert "--nproc_per_node=32" in xla["command"]
    native_env = {e["name"]: e.get("value") for e in native["env"]}
    assert native_env["TORCH_NEURONX_NEFF_CACHE_DIR"] == (
        "/data/neuron_cache/native/bert-large-trn2_1/2.28.7631.0/lnc-2/neff"
    )
    train = found["bert-large-trn2-train-0-1", "train"]["spec"]["containers"][0]
    train_env = {e["name"]: e.get("value") for e in train["env"]}
    assert train_env["TORCH_NEURONX_NEFF_CACHE_DIR"] == native_env["TORCH_NEURONX_NEFF_CACHE_DIR"]
    # The example's device profile covers its steps 10 to 20, not the 28,125-step run.
    assert train_env["TRAINIUM_PROFILE_NEURON_DEVICE"] == "1"
    assert train_env["TRAINIUM_PROFILE_STEPS"] == "10:20"
    assert "NEURON_RT_INSPECT_ENABLE" not in train_env
    assert native["resources"]["limits"] == {
        "aws.amazon.com/neuron": "16",
        "vpc.amazonaws.com/efa": "16",
    }
    assert xla["resources"]["limits"] == {
        "aws.amazon.com/neuron": "16",
        "vpc.amazonaws.com/efa": "8",
    }


def test_the_lnc_field_says_the_node_sets_lnc_and_the_pods_only_state_it() -> None:
    """AWS documents LNC on EKS per node (a file written at boot) or per DRA claim, never
    through pod env alone: `kubectl explain` must not promise more."""
    spec_schema = training_job_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"
    ]["spec"]
    description = " ".join(spec_schema["properties"]["lnc"]["description"].split())
    assert "does not change the nodes' setting" in description
    assert "/opt/aws/neuron/logical_nc_config" in description
    assert "spec.nodeSelector" in description
    pod_env = {e["name"]: e["value"] for e in _trn2_env(lnc=1) if "value" in e}
    assert pod_env["NEURON_LOGICAL_NC_CONFIG"] == "1"
    assert "--logical-nc-config=1" in pod_env["NEURON_CC_FLAGS"]


def _trn2_env(**fields: Any) -> list[dict[str, Any]]:
    job = job_ref(instanceType="trn2.48xlarge", **fields)
    return pods.pod(job, Stage.TRAIN, 0, 0)["spec"]["containers"][0]["env"]
