"""Problems in pass-through pod content the API server would report without naming the field
(found by the spec fuzzer): the spec checks name it instead."""

from __future__ import annotations

import pytest

from trainium_operator.builders.job import JobRef
from trainium_operator.lifecycle.parse import parse_job
from unit.jobs import job_document


def problems_of(template: dict[str, object]) -> list[str]:
    parsed = parse_job(job_document(podTemplate=template))
    assert not isinstance(parsed, JobRef), "expected the spec to be refused"
    return parsed


@pytest.mark.parametrize(
    ("template", "field"),
    [
        (
            {"spec": {"containers": [{"name": "trainer"}, {"name": "trainer"}]}},
            "spec.podTemplate.spec.containers",
        ),
        (
            {
                "spec": {
                    "initContainers": [{"name": "init", "image": "busybox"}],
                    "containers": [{"name": "init", "image": "busybox"}],
                }
            },
            "initContainers",
        ),
    ],
)
def test_repeated_container_names_name_the_field(template: dict[str, object], field: str) -> None:
    assert any(field in problem for problem in problems_of(template))


@pytest.mark.parametrize(
    ("template", "field"),
    [
        (
            {"spec": {"initContainers": [{"name": "fetch", "image": "busybox",
                                          "resources": {"limits": {"cpu": "lots"}}}]}},
            "spec.podTemplate.spec.initContainers[0].resources.limits[cpu]",
        ),
        (
            {"spec": {"containers": [{"name": "side", "image": "busybox",
                                      "resources": {"requests": {"memory": "1 Gi"}}}]}},
            "spec.podTemplate.spec.containers[0].resources.requests[memory]",
        ),
        (
            {"spec": {"containers": [{"name": "side", "image": "busybox",
                                      "resources": {"limits": {"cpu": ["1"]}}}]}},
            "spec.podTemplate.spec.containers[0].resources.limits[cpu]",
        ),
        (
            {"spec": {"volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "big"}}]}},
            "spec.podTemplate.spec.volumes[0].emptyDir.sizeLimit",
        ),
    ],
)  # fmt: skip
def test_a_malformed_quantity_in_pass_through_content_is_a_problem_naming_it(
    template: dict[str, object], field: str
) -> None:
    # The API server cannot decode such a pod: its 400 says only "quantities must match the
    # regular expression", so the job would fail without saying where.
    assert any(field in problem for problem in problems_of(template)), problems_of(template)


def test_well_formed_quantities_in_pass_through_content_are_no_problem() -> None:
    template = {
        "spec": {
            "containers": [
                {
                    "name": "side",
                    "image": "busybox",
                    "resources": {
                        "limits": {"cpu": "500m", "memory": 2**30, "example.com/widget": "1"},
                        "requests": {"cpu": -1, "memory": "1.5Gi", "ephemeral-storage": "1e3"},
                    },
                }
            ],
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
        }
    }
    assert isinstance(parse_job(job_document(podTemplate=template)), JobRef)
