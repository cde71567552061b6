"""The images' entry points run as they ship: each image's file layout is assembled from its
Dockerfile (the training image's COPY and ENV lines; the operator image's wheel, installed as
its runtime stage installs it) and its commands run there, so a module the image lacks fails
here instead of on a Trainium node. No Docker engine: the base images' packages (torch,
transformers, boto3, the operator's pinned dependencies) come from this environment, and only
our code comes from the assembled layout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from images.dockerfile_model import (
    TRAINING_DOCKERFILES,
    Dockerfile,
    assemble_copies,
)
from s3_server import S3Bucket, aws_env
from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.builders.upload import PROFILE_MOUNT_PATH, UploadPodSettings, upload_pod
from trainium_operator.contract import preflight
from trainium_operator.profiler.s3 import MANIFEST_NAME
from unit.jobs import job_ref

RUN_TIMEOUT_S = 240


def under(root: Path, value: str) -> str:
    """An image path (or a PATH-like list of them) as it lies in the assembled layout."""
    return os.pathsep.join(
        str(root / part.lstrip("/")) if part.startswith("/opt/") else part
        for part in value.split(os.pathsep)
    )


def image_env(dockerfile: Dockerfile, root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINIUM_", "PYTHON"))}
    for name, value in dockerfile.final_env().items():
        if name in ("PYTHONPATH", "WORKDIR"):
            env[name] = under(root, value)
        elif name not in ("PATH", "LD_LIBRARY_PATH"):
            env[name] = value
    env["OMP_NUM_THREADS"] = "1"
    return env


def image_command(argv: list[str], root: Path) -> list[str]:
    """`python3 /opt/...` as this environment's interpreter on the layout's file."""
    program, *rest = argv
    if program in ("python", "python3"):
        program = sys.executable
    return [program, *(under(root, a) for a in rest)]


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )


# The Neuron stack each training image's layout runs (its ENV's TRAINIUM_NEURON_STACK).
STACK_OF_TRAINING_IMAGE = {"training": "xla", "training-native": "native"}


@pytest.fixture(scope="module", params=sorted(TRAINING_DOCKERFILES))
def training_image(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, str], str]:
    """(layout root, image env, image name) of each training image: the XLA stack's and the
    native stack's."""
    name: str = request.param
    dockerfile = Dockerfile(TRAINING_DOCKERFILES[name])
    root = assemble_copies(dockerfile, tmp_path_factory.mktemp(f"{name}-image"))
    return root, image_env(dockerfile, root), name


def test_the_training_images_cmd_runs_in_its_layout(
    training_image: tuple[Path, dict[str, str], str],
) -> None:
    """The image's own CMD (`pretrain.py --help`) answers from the image's layout (it failed
    with ModuleNotFoundError while the Dockerfile copied only the profiler of our package);
    `--help` answers before torch is imported, so every module the script needs is imported by
    the training run from the same layout below (e2e)."""
    root, env, name = training_image
    (cmd,) = Dockerfile(TRAINING_DOCKERFILES[name]).final("CMD")
    result = run(image_command(cmd.exec_form(), root), env, root)
    assert result.returncode == 0, result.stderr
    assert "--output_dir" in result.stdout
    assert "trainium_operator" not in result.stderr


def test_the_training_images_gang_preflight_answers_from_its_layout(
    training_image: tuple[Path, dict[str, str], str],
) -> None:
    """The command the operator puts before a gang's stage command (`contract.preflight.argv`:
    `python3 -m trainium_training.preflight ...`) starts from the image's layout: the module
    is the layout's, and its --help (answered before torch is imported) names every flag the
    contract writes."""
    root, env, _ = training_image
    where = run(
        image_command(
            ["python3", "-c", f"import {preflight.MODULE} as m; print(m.__file__)"], root
        ),
        env,
        root,
    )
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(root / "opt" / "trainium")), where.stdout
    command = preflight.argv(
        nodes=2,
        rdzv_backend="c10d",
        rdzv_endpoint="job-0:29400",
        rdzv_id="preflight",
        timeout_seconds=300,
        threshold=0.25,
        devices=preflight.DEVICES_NEURON,
        expected_devices=16,
    )
    result = run(image_command([*command[:3], "--help"], root), env, root)
    assert result.returncode == 0, result.stderr
    for flag in command[3:]:
        assert flag.split("=")[0] in result.stdout


# A whole training run (shards, pretrain.py to its final checkpoint), as tests/tiers.py puts
# full runs: e2e, not the unit tier's quick verdict.
@pytest.mark.e2e
def test_a_two_step_cpu_training_run_works_from_the_training_image_layout(
    training_image: tuple[Path, dict[str, str], str], tmp_path: Path
) -> None:
    """Without a Neuron device each image trains on the CPU, on its own stack's code path."""
    root, env, name = training_image
    package = root / "opt" / "trainium" / "trainium_training"
    shards = run(
        [sys.executable, str(package / "make_shards.py"), "--output_dir", str(tmp_path / "data"),
         "--num_shards", "1", "--samples_per_shard", "16", "--seq_len", "16", "--max_pred", "3",
         "--vocab_size", "1024"],
        env, root,
    )  # fmt: skip
    assert shards.returncode == 0, shards.stderr
    trained = run(
        [sys.executable, str(package / "pretrain.py"), "--model_config", "tiny",
         "--batch_size", "4", "--warmup_steps", "0", "--grad_accum_usteps", "1",
         "--max_steps", "2", "--data_dir", str(tmp_path / "data"),
         "--output_dir", str(tmp_path / "out")],
        env, root,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "training steps 1..2" in trained.stderr
    stack = STACK_OF_TRAINING_IMAGE[name]
    assert f"Neuron stack {stack}: torch device cpu" in trained.stderr
    assert list((tmp_path / "out").rglob("*.pt")), "the run wrote its final checkpoint"


@pytest.fixture(scope="module")
def operator_image(operator_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator wheel, built as the image's build stage builds it and installed as its
    runtime stage does (here without dependencies: they are this environment's)."""
    site = tmp_path_factory.mktemp("operator-image") / "site-packages"
    zipfile.ZipFile(operator_wheel).extractall(site)
    return site


def operator_env(site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINIUM_", "PYTHON"))}
    env.update(PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def test_the_operator_images_entry_point_runs_from_the_installed_wheel(
    operator_image: Path, tmp_path: Path
) -> None:
    code = (
        "import sys, trainium_operator\n"
        f"assert trainium_operator.__file__.startswith({str(operator_image)!r}), "
        "trainium_operator.__file__\n"
        "from trainium_operator.cli import main\n"
        "sys.argv = ['trainium-operator', '--help']\n"
        "main()\n"
    )
    result = run([sys.executable, "-c", code], operator_env(operator_image), tmp_path)
    assert result.returncode == 0, result.stderr
    for command in ("run", "profile", "render"):
        assert command in result.stdout
    assert not (operator_image / "trainium_devcluster").exists(), (
        "the dev cluster is no part of the image"
    )


def test_the_upload_pods_command_uploads_a_profile_from_the_operator_image(
    operator_image: Path, s3: S3Bucket, tmp_path: Path
) -> None:
    """The command the operator gives the profile upload pod, run in the operator image's
    layout (the image that pod runs, never the job's), against a real S3 API: the rank files
    and the manifest (last) arrive."""
    job = job_ref(profile={"enabled": True, "s3Uri": s3.uri("profiles")})
    settings = UploadPodSettings(image="registry.example/trainium-operator:test")
    pod: dict[str, Any] = upload_pod(job, 0, s3.uri("profiles"), settings)
    (container,) = pod["spec"]["containers"]
    assert container["image"] == settings.image
    profile = write_synthetic_profile(
        tmp_path / "shared" / "profile", SyntheticSpec(nodes=1, ranks_per_node=2, steps=3)
    )
    argv = [str(profile) if a == PROFILE_MOUNT_PATH else a for a in container["command"]]
    assert str(profile) in argv, f"the command names the profile's mount path: {argv}"
    env = {**operator_env(operator_image), **aws_env(s3.endpoint)}
    result = run(image_command(argv, tmp_path), env, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    keys = s3.keys("profiles/")
    ranks = [k for k in keys if k.endswith(".trnprof")]
    assert len(ranks) == 2, keys
    assert any(k.endswith(f"/{MANIFEST_NAME}") for k in keys), keys
