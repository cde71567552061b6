"""The TorchX `trainium` scheduler without a cluster: AppDef mapping, golden dry runs,
registration next to torchx's built-ins, state mapping.

Golden files: regenerate with `UPDATE_GOLDEN=1 pytest tests/unit/test_torchx_scheduler.py`
and review the diff (they hold every object the operator creates for the app).
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("torchx")

from torchx import specs
from torchx.components.dist import ddp
from torchx.schedulers import get_scheduler_factories

from trainium_operator.torchx_backend.appdef import AppDefError, RunConfig, app_to_training_job
from trainium_operator.torchx_backend.scheduler import TrainiumScheduler, job_state

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
SCRIPT = "/opt/trainium/trainium_training/pretrain.py"
TUTORIAL_ARGS = (
    "--batch_size 16 --grad_accum_usteps 32 "
    "--data_dir /data/bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128 --output_dir /data/output"
)


def _tutorial_component() -> Any:
    path = ROOT / "examples" / "torchx" / "trn1_dist_ddp.py"
    spec = importlib.util.spec_from_file_location("trn1_dist_ddp", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generateAppDef


def _ddp(**kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dist.ddp is deprecated in favour of dist.torchrun
        return ddp(*kwargs.pop("script_args", ("--epochs", "2")), **kwargs)


def _dryrun(app: Any, cfg: dict[str, Any]) -> str:
    scheduler = TrainiumScheduler("test", name_suffix=lambda: "0a1b2c")
    return str(scheduler.submit_dryrun(app, cfg))


def _assert_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing golden file; run UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == path.read_text(), f"dry run differs from {path}; UPDATE_GOLDEN=1 to accept"


def _documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_dist_ddp_2x32_dry_run_matches_the_golden_file() -> None:
    app = _ddp(script="/app/train.py", j="2x32", h="aws_trn1.32xlarge", image="example.com/t:1")
    text = _dryrun(app, {"namespace": "ml", "queue": "test"})
    _assert_golden("torchx-dist-ddp-2x32.yaml", text)
    job, *objects = _documents(text)
    assert job["spec"]["nodes"] == 2
    assert job["spec"]["processesPerNode"] == 32
    assert job["spec"]["instanceType"] == "trn1.32xlarge"
    assert "resources" not in job["spec"], "the named resource is the whole node, not requests"
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == [
        "train-0a1b2c-train-0-0",
        "train-0a1b2c-train-0-1",
    ]
    command = pods[0]["spec"]["containers"][0]["command"]
    assert command.count("torchrun") == 1, "the operator's torchrun, never the user's as well"
    assert command[command.index("/app/train.py") + 1 :] == ["--epochs", "2"]
    limits = pods[0]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"aws.amazon.com/neuron": "16", "vpc.amazonaws.com/efa": "8"}, (
        "neurondevice normalised to the device plugin's aws.amazon.com/neuron"
    )


def test_trn2_native_dry_run_matches_the_golden_file_and_compiles_without_npc() -> None:
    app = _ddp(script="/app/train.py", j="2x64", image="example.com/t:1")
    app.roles[0].entrypoint = "neuron_parallel_compile"  # "warm the cache first"
    app.roles[0].args = ["torchrun", "--nnodes=2", "--nproc_per_node=64", "/app/train.py"]
    cfg = {"namespace": "ml", "queue": "test", "instance_type": "trn2.48xlarge"}
    text = _dryrun(app, {**cfg, "neuron_stack": "native"})
    _assert_golden("torchx-trn2-native.yaml", text)
    job, *objects = _documents(text)
    assert job["spec"]["neuron"] == {"stack": "native"}
    assert job["spec"]["compile"]["enabled"] is True
    pods = [o for o in objects if o["kind"] == "Pod"]
    compile_command = pods[0]["spec"]["containers"][0]["command"]
    assert compile_command[:2] == ["/bin/sh", "-c"]
    assert "neuron_parallel_compile" not in compile_command
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["TRAINIUM_NEURON_STACK"] == "native"
    assert "--nproc_per_node=64" in compile_command
    lnc1 = _documents(_dryrun(app, {**cfg, "lnc": 1}))[0]
    assert lnc1["spec"]["lnc"] == 1
    assert "neuron" not in lnc1["spec"], "the instance type's default stack"
    with pytest.raises(AppDefError, match="neuron_stack 'jax' is not a Neuron stack"):
        _dryrun(app, {**cfg, "neuron_stack": "jax"})
    trn1 = {**cfg, "instance_type": "trn1.32xlarge", "neuron_stack": "native"}
    app.roles[0].args = ["torchrun", "--nnodes=2", "--nproc_per_node=32", "/app/train.py"]
    with pytest.raises(AppDefError, match=r"spec\.neuron\.stack is not supported"):
        _dryrun(app, trn1)


def test_tutorial_generate_app_def_precompile_dry_run_matches_the_golden_file() -> None:
    app = _tutorial_component()(
        f"{TUTORIAL_ARGS} --steps_this_run 10",
        2,
        32,
        SCRIPT,
        "example.com/bert:1",
        "bertcompile",
        precompile=True,
        bf16=True,
        cacheset="bert-large",
        instance_type="trn1.32xlarge",
    )
    text = _dryrun(app, {"namespace": "default", "queue": "test"})
    _assert_golden("torchx-tutorial-precompile.yaml", text)
    job, *objects = _documents(text)
    spec = job["spec"]
    assert spec["compile"] == {
        "enabled": True,
        "steps": 10,
        "stepsArg": "--steps_this_run",
        "cacheDir": "/data/neuron_cache",
        "cacheSet": "bert-large",
    }
    assert spec["rendezvous"] == {"backend": "etcd", "endpoint": "etcd-server:2379"}
    assert spec["runPolicy"]["backoffLimit"] == 3
    assert spec["storage"] == {"claimName": "fsx-claim", "mountPath": "/data"}
    env = {e["name"]: e["value"] for e in spec["env"]}
    assert env["TRANSFORMERS_CACHE"] == "/data/transformers_cache/bert-large_$(TRAINIUM_NODE_RANK)"
    pods = [o for o in objects if o["kind"] == "Pod"]
    compile_pod, train_pod = pods[0], pods[2]
    compile_command = compile_pod["spec"]["containers"][0]["command"]
    assert compile_command[:2] == ["neuron_parallel_compile", "torchrun"]
    assert compile_command.count("neuron_parallel_compile") == 1
    assert compile_command[-2:] == ["--steps_this_run", "10"]
    assert "--steps_this_run" not in train_pod["spec"]["containers"][0]["command"]
    pod_env = [e["name"] for e in train_pod["spec"]["containers"][0]["env"]]
    assert pod_env.index("TRAINIUM_NODE_RANK") < pod_env.index("TRANSFORMERS_CACHE"), (
        "$(TRAINIUM_NODE_RANK) expands only when defined earlier"
    )
    compile_env = {e["name"]: e.get("value") for e in compile_pod["spec"]["containers"][0]["env"]}
    assert compile_env["NEURON_CC_FLAGS"] == "--cache_dir=/data/neuron_cache/bert-large_0"


def test_tutorial_training_launch_maps_to_a_job_without_a_compile_stage() -> None:
    app = _tutorial_component()(TUTORIAL_ARGS, 2, 32, SCRIPT, "img:1", "berttrain")
    job = app_to_training_job(app, RunConfig(queue="test"), name="berttrain-1")
    assert job["spec"]["compile"]["enabled"] is False
    assert job["spec"]["command"]["args"][:2] == ["--batch_size", "16"]


def test_python_m_torch_distributed_run_is_unwrapped() -> None:
    role = specs.Role(
        name="r",
        image="i",
        entrypoint="python3",
        args=["-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=8", "t.py", "--x"],
        num_replicas=2,
    )
    job = app_to_training_job(specs.AppDef(name="a", roles=[role]), RunConfig(), name="a-1")
    assert job["spec"]["command"] == {"script": "t.py", "args": ["--x"]}
    assert job["spec"]["processesPerNode"] == 8


def test_macros_in_script_args_and_env_become_the_job_name_and_node_rank() -> None:
    role = specs.Role(
        name="r",
        image="i",
        entrypoint="/app/train.py",
        args=["--run", specs.macros.app_id],
        env={"SHARD": f"part-{specs.macros.replica_id}"},
        num_replicas=1,
    )
    job = app_to_training_job(specs.AppDef(name="a", roles=[role]), RunConfig(), name="a-1")
    assert job["spec"]["command"] == {"script": "/app/train.py", "args": ["--run", "a-1"]}
    assert job["spec"]["env"] == [{"name": "SHARD", "value": "part-$(TRAINIUM_NODE_RANK)"}]


def one_role_app(**role: Any) -> specs.AppDef:
    """An app of one role running x.py, but for `role`'s fields."""
    return specs.AppDef(
        name="app", roles=[specs.Role(**{"name": "a", "image": "i", "entrypoint": "x.py", **role})]
    )


def resource(**fields: Any) -> specs.Resource:
    """A minimal resource (1 CPU, 1 MB), but for `fields`."""
    return specs.Resource(**{"cpu": 1, "gpu": 0, "memMB": 1, **fields})


@pytest.mark.parametrize(
    ("app", "message"),
    [
        pytest.param(
            specs.AppDef(
                name="two",
                roles=[
                    specs.Role(name="a", image="i", entrypoint="x.py"),
                    specs.Role(name="b", image="i", entrypoint="y.py"),
                ],
            ),
            "has 2 roles (a, b); a TrainingJob runs one gang",
            id="several-roles",
        ),
        pytest.param(
            one_role_app(num_replicas=4, min_replicas=2),
            "elastic jobs are not supported",
            id="elastic",
        ),
        pytest.param(
            one_role_app(entrypoint="python", args=["-m", "pkg"]),
            "python -m pkg: a TrainingJob runs a script file",
            id="python-module",
        ),
        pytest.param(
            one_role_app(resource=resource(devices={"aws.amazon.com/neuron": 4})),
            "requests 4 Neuron devices; a TrainingJob pod takes a whole trn1.32xlarge node",
            id="partial-node",
        ),
        pytest.param(
            one_role_app(entrypoint="torchrun", args=["--nnodes", "3", "x.py"], num_replicas=2),
            "torchrun --nnodes 3 differs from the role's num_replicas 2",
            id="nnodes",
        ),
        pytest.param(
            one_role_app(
                resource=resource(capabilities={"node.kubernetes.io/instance-type": "p5.48xlarge"})
            ),
            "instance type 'p5.48xlarge'",
            id="not-trainium",
        ),
    ],
)
def test_an_app_def_a_training_job_cannot_express_is_refused_clearly(
    app: Any, message: str
) -> None:
    with pytest.raises(AppDefError) as refused:
        app_to_training_job(app, RunConfig(), name="x-1")
    assert message in str(refused.value)


def test_installing_us_keeps_torchx_builtin_schedulers_visible() -> None:
    factories = get_scheduler_factories()
    assert {"trainium", "kubernetes", "local_cwd"} <= set(factories)
    assert isinstance(factories["trainium"]("session"), TrainiumScheduler)


@pytest.mark.parametrize(
    ("job", "state"),
    [
        ({"metadata": {}, "status": {"phase": "Training"}}, specs.AppState.RUNNING),
        ({"metadata": {}, "status": {"phase": "Restarting"}}, specs.AppState.RUNNING),
        ({"metadata": {}, "status": {"phase": "Succeeded"}}, specs.AppState.SUCCEEDED),
        ({"metadata": {}, "status": {"phase": "Failed"}}, specs.AppState.FAILED),
        ({"metadata": {}}, specs.AppState.SUBMITTED),
        (
            {
                "metadata": {"annotations": {"trainium.dev/torchx-cancelled": "true"}},
                "status": {"phase": "Suspended"},
            },
            specs.AppState.CANCELLED,
        ),
    ],
)
def test_job_phases_map_to_torchx_app_states(job: dict[str, Any], state: Any) -> None:
    assert job_state(job) == state
