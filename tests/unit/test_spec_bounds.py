"""Tenant paths and numbers in the spec are bounded (issue 29, items 4 and 11): the claim is
never mounted over a system or Python package directory, the profile directory is on the
claim, and every number has a maximum, in the operator's parse and in the CRD schema."""

from __future__ import annotations

import re
from typing import Any

import pytest

from trainium_operator.api.crd import training_job_crd
from trainium_operator.builders.job import JobRef
from trainium_operator.lifecycle.parse import parse_job
from unit.jobs import job_document


def _problems(**spec: Any) -> list[str]:
    parsed = parse_job(job_document(**spec))
    assert not isinstance(parsed, JobRef), f"{spec} was accepted"
    return parsed


def _spec_schema() -> dict[str, Any]:
    crd = training_job_crd()
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


SYSTEM_DIRECTORIES = [
    "/",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/usr",
    "/usr/lib/python3.11/site-packages",
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/var/run",
    "/run",
    "/opt/conda",
    "/tmp",
    "/data/../usr/lib",
    "/data/./x",
    "/data//x",
    "/data/",
    "/home/me/.local/lib/python3.11/site-packages",
    "/mnt/venv/lib/python3.11/site-packages",
    "/data/lib/python3/dist-packages/x",
    "/database",
]


@pytest.mark.parametrize("mount_path", SYSTEM_DIRECTORIES)
def test_a_mount_path_outside_the_allowed_roots_is_refused_naming_the_field_and_the_fix(
    mount_path: str,
) -> None:
    problems = " ".join(_problems(storage={"mountPath": mount_path}))
    assert "spec.storage.mountPath" in problems, problems
    assert "/data (the default)" in problems, problems


@pytest.mark.parametrize("mount_path", SYSTEM_DIRECTORIES)
def test_the_crd_schema_refuses_the_same_mount_paths(mount_path: str) -> None:
    field = _spec_schema()["properties"]["storage"]["properties"]["mountPath"]
    pattern_ok = re.fullmatch(field["pattern"].strip("^$"), mount_path) is not None
    (rule,) = field["x-kubernetes-validations"]
    cel = re.fullmatch(r"!self\.matches\('(.*)'\)", rule["rule"])
    assert cel is not None, rule
    cel_ok = re.search(cel.group(1), mount_path) is None
    assert not (pattern_ok and cel_ok and len(mount_path) <= field["maxLength"]), mount_path


@pytest.mark.parametrize("mount_path", ["/data", "/fsx", "/fsx/team-a", "/mnt/shared_1", "/home/u"])
def test_a_mount_path_below_an_allowed_root_is_accepted(mount_path: str) -> None:
    assert isinstance(parse_job(job_document(storage={"mountPath": mount_path})), JobRef)


@pytest.mark.parametrize(
    "output_dir", ["/etc/profiles", "/data", "/data/../etc", "/dataprofiles", "/fsx/p"]
)
def test_a_profile_directory_off_the_claim_is_refused(output_dir: str) -> None:
    problems = " ".join(_problems(profile={"enabled": True, "outputDir": output_dir}))
    assert "spec.profile.outputDir" in problems, problems


def test_the_crd_refuses_a_profile_directory_off_the_claim() -> None:
    rules = {r.get("fieldPath"): r for r in _spec_schema()["x-kubernetes-validations"]}
    rule = rules[".profile.outputDir"]["rule"]
    assert "self.profile.outputDir.startsWith(self.storage.mountPath + '/')" in rule


# field path in the spec -> (a value above its maximum, the CRD schema's path to it)
ABOVE_MAXIMUM = {
    "runPolicy.backoffLimit": 1001,
    "runPolicy.infrastructureBackoffLimit": 1001,
    "runPolicy.activeDeadlineSeconds": 365 * 86400 + 1,
    "runPolicy.ttlSecondsAfterFinished": 365 * 86400 + 1,
    "runPolicy.nodeLostGracePeriodSeconds": 86401,
    "runPolicy.startupTimeoutSeconds": 86401,
    "rendezvous.timeoutSeconds": 86401,
    "profile.startStep": 10**12 + 1,
    "profile.endStep": 10**12 + 1,
    "health.totalSteps": 10**12 + 1,
    "processesPerNode": 129,
}


def _nested(path: str, value: Any) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    return {head: _nested(rest, value) if rest else value}


@pytest.mark.parametrize("path", sorted(ABOVE_MAXIMUM))
def test_every_number_of_the_spec_has_a_maximum(path: str) -> None:
    problems = " ".join(_problems(**_nested(path, ABOVE_MAXIMUM[path])))
    assert f"spec.{path}: Input should be less than or equal to" in problems, problems
    node = _spec_schema()
    for part in path.split("."):
        node = node["properties"][part]
    assert node["maximum"] < ABOVE_MAXIMUM[path]


def test_no_integer_of_the_spec_schema_is_unbounded() -> None:
    unbounded: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("type") in ("integer", "number") and "maximum" not in node:
            unbounded.append(path)
        for name, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(_spec_schema(), "spec")
    assert unbounded == []


def test_a_spec_too_large_to_copy_into_every_pod_is_refused_naming_its_size_and_field() -> None:
    # 1 MiB of env is under the API server's object limit; copied into a 512-node gang's pods
    # it would be half a GiB of the operator's memory.
    huge = parse_job(job_document(env=[{"name": f"V{i}", "value": "x" * 4000} for i in range(250)]))
    assert isinstance(huge, list)
    assert any(
        p.startswith("spec.env: the spec is") and "at most 131072 are allowed" in p for p in huge
    ), huge
    # A map of annotations (a pass-through the schema cannot bound in bytes) is named too.
    big = {"example.com/owner": "x" * 200_000}
    named = parse_job(job_document(podMetadata={"annotations": big}))
    assert isinstance(named, list)
    assert any(p.startswith("spec.podMetadata.annotations") for p in named), named


def test_argument_lists_are_bounded_in_count_and_length() -> None:
    many = parse_job(job_document(command={"script": "/t.py", "args": ["-x"] * 513}))
    long = parse_job(job_document(command={"script": "/t.py", "args": ["x" * 16385]}))
    assert isinstance(many, list)
    assert any("spec.command.args" in p for p in many), many
    assert isinstance(long, list)
    assert any("spec.command.args" in p for p in long), long
