"""A TrainingJob's network placement (spec.scheduling.topology): rendered to Kueue's pod-set
topology annotation on a Kueue-queued gang's pods and to the PodGroup's networkTopology under
Volcano, the trn2u default, the refusals, and `render` showing it.

What Kueue's TAS and Volcano's network-topology-aware plugin then do with them is the
integration tier's (tests/integration/test_topology.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from trainium_operator.api import topology
from trainium_operator.api.crd import training_job_crd
from trainium_operator.builders.job import JobRef
from trainium_operator.lifecycle.observed import Observed
from trainium_operator.lifecycle.parse import parse_job
from trainium_operator.lifecycle.render import render_stages
from trainium_operator.lifecycle.snapshot import PassSettings
from unit.jobs import decide, job_document, job_ref
from unit.test_kueue import kueue_document, kueue_job, seen

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
BOTH = frozenset(topology.SCHEDULERS)
REQUIRED = topology.REQUIRED_TOPOLOGY_ANNOTATION
PREFERRED = topology.PREFERRED_TOPOLOGY_ANNOTATION


def volcano_pass(job: JobRef, settings: PassSettings | None = None) -> dict[str, Any]:
    """The PodGroup a first pass of a job Volcano queues creates."""
    observed = Observed((), {}, True, {}, T0, network_policy_missing=False)
    decision = decide(job, {}, observed, settings=settings or PassSettings())
    (podgroup,) = [o for o in decision.create if o["kind"] == "PodGroup"]
    return podgroup


def kueue_pods(job: JobRef, topology_for: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    settings = PassSettings(kueue=True, topology=topology_for)
    decision = decide(job, {}, seen(), settings=settings)
    return [o for o in decision.create if o["kind"] == "Pod"]


def placement(level: str, mode: str | None = None) -> dict[str, Any]:
    asked = {"level": level, **({"mode": mode} if mode else {})}
    return {"scheduling": {"topology": asked}}


@pytest.mark.parametrize(
    ("level", "tier"), [("block", 2), ("spine", 3), ("layer-1", 4)], ids=["block", "spine", "l1"]
)
def test_a_required_level_is_a_hard_network_topology_up_to_its_tier(level: str, tier: int) -> None:
    podgroup = volcano_pass(job_ref(**placement(level)))

    assert podgroup["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": tier}


def test_a_preferred_level_is_a_soft_network_topology() -> None:
    podgroup = volcano_pass(job_ref(**placement("block", "Preferred")))

    assert podgroup["spec"]["networkTopology"] == {"mode": "soft"}


def test_a_job_that_asks_nothing_gets_no_network_topology() -> None:
    assert "networkTopology" not in volcano_pass(job_ref())["spec"]


def test_a_kueue_gang_carries_the_required_levels_node_label_on_every_pod() -> None:
    pods = kueue_pods(kueue_job(**placement("spine")))

    assert len(pods) == 2
    for pod in pods:
        annotations = pod["metadata"]["annotations"]
        assert annotations[REQUIRED] == "topology.k8s.aws/network-node-layer-2"
        assert PREFERRED not in annotations
        # Kueue hands out the domains in the order of the ranks this label holds.
        assert annotations["kueue.x-k8s.io/pod-group-pod-index-label"] == "trainium.dev/node-rank"
        assert pod["metadata"]["labels"]["trainium.dev/node-rank"] in {"0", "1"}


def test_a_kueue_gang_of_trn2u_prefers_one_ultraserver_by_its_neuron_label() -> None:
    job = kueue_job(instanceType="trn2u.48xlarge", nodes=4, **placement("ultraserver", "Preferred"))

    for pod in kueue_pods(job):
        assert pod["metadata"]["annotations"][PREFERRED] == topology.ULTRASERVER_LABEL


@pytest.mark.parametrize(
    ("nodes", "topology_for", "default"),
    [
        (4, BOTH, True),
        (1, frozenset({"volcano"}), True),
        (4, frozenset(), False),  # no topology objects: a TAS request could never be admitted
        (4, frozenset({"kueue"}), False),  # topology for Kueue only; this job is Volcano's
        (5, BOTH, False),  # more than one UltraServer holds
    ],
)
def test_a_trn2u_gang_that_fits_one_ultraserver_prefers_one_where_topology_is_kept(
    nodes: int, topology_for: frozenset[str], default: bool
) -> None:
    job = job_ref(instanceType="trn2u.48xlarge", nodes=nodes)

    podgroup = volcano_pass(job, PassSettings(topology=topology_for))

    expected = {"mode": "soft"} if default else None
    assert podgroup["spec"].get("networkTopology") == expected


def test_the_trn2u_default_under_kueue_is_the_preferred_ultraserver_annotation() -> None:
    job = kueue_job(instanceType="trn2u.48xlarge", nodes=4)

    with_topology = kueue_pods(job, frozenset({"kueue"}))
    without = kueue_pods(job)

    assert {p["metadata"]["annotations"][PREFERRED] for p in with_topology} == {
        topology.ULTRASERVER_LABEL
    }
    assert not [p for p in without if PREFERRED in p["metadata"]["annotations"]]
    assert not [p for p in without if "kueue.x-k8s.io/pod-group-pod-index-label" in str(p)]


def test_trn1_and_trn2_get_no_default() -> None:
    for instance_type in ("trn1.32xlarge", "trn2.48xlarge"):
        job = job_ref(instanceType=instance_type, nodes=2)
        assert job.placement(BOTH) is None


def test_an_ultraserver_on_a_type_without_ultraservers_is_refused_naming_the_fix() -> None:
    problems = parse_job(job_document(**placement("ultraserver", "Preferred")))

    assert isinstance(problems, list)
    assert any(
        "spec.scheduling.topology.level: ultraserver applies only to UltraServer instance "
        "types (trn2u.48xlarge)" in p
        for p in problems
    ), problems


def test_a_required_ultraserver_for_more_nodes_than_it_holds_is_refused() -> None:
    asked = placement("ultraserver")
    problems = parse_job(job_document(instanceType="trn2u.48xlarge", nodes=8, **asked))
    preferred = parse_job(
        job_document(
            instanceType="trn2u.48xlarge", nodes=8, **placement("ultraserver", "Preferred")
        )
    )

    assert isinstance(problems, list)
    assert any("an UltraServer holds 4 nodes" in p and "Preferred" in p for p in problems)
    assert isinstance(preferred, JobRef)


def test_an_unknown_level_or_mode_is_refused_by_name() -> None:
    problems = parse_job(job_document(**placement("rack", "Sometimes")))

    assert isinstance(problems, list)
    text = " ".join(problems)
    assert "spec.scheduling.topology.level" in text
    assert "spec.scheduling.topology.mode" in text


def test_the_crd_refuses_what_the_operator_refuses_with_the_same_words() -> None:
    spec = training_job_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]
    messages = [rule["message"] for rule in spec["x-kubernetes-validations"]]
    asked = spec["properties"]["scheduling"]["properties"]["topology"]
    for problem in (
        parse_job(job_document(**placement("ultraserver"))),
        parse_job(job_document(instanceType="trn2u.48xlarge", nodes=8, **placement("ultraserver"))),
    ):
        assert isinstance(problem, list)
        assert any(message in problem[0] for message in messages), problem
    assert asked["properties"]["level"]["enum"] == ["ultraserver", "block", "spine", "layer-1"]
    assert asked["properties"]["mode"]["enum"] == ["Required", "Preferred"]
    assert asked["required"] == ["level"]


@pytest.mark.parametrize("where", ["podMetadata", "podTemplate"])
@pytest.mark.parametrize(
    "annotation", [REQUIRED, PREFERRED, "volcano.sh/network-topology-mode"], ids=["r", "p", "v"]
)
def test_a_job_author_cannot_place_the_gang_through_pod_annotations(
    where: str, annotation: str
) -> None:
    metadata = {"annotations": {annotation: "topology.k8s.aws/network-node-layer-1"}}
    spec = {where: metadata} if where == "podMetadata" else {where: {"metadata": metadata}}

    problems = parse_job(job_document(**spec))

    assert isinstance(problems, list)
    assert any(annotation in p and "use spec.scheduling.topology" in p for p in problems), problems


def test_render_shows_the_placement_of_both_schedulers() -> None:
    volcano = render_stages(job_document(instanceType="trn2u.48xlarge", nodes=4), T0)
    queued = render_stages(
        kueue_document(instanceType="trn2u.48xlarge", nodes=4, **placement("block")), T0
    )

    podgroups = [o for _, objects in volcano for o in objects if o["kind"] == "PodGroup"]
    assert [g["spec"]["networkTopology"] for g in podgroups] == [{"mode": "soft"}] * 2  # default
    pods = [o for _, objects in queued for o in objects if o["kind"] == "Pod"]
    assert pods
    assert {p["metadata"]["annotations"][REQUIRED] for p in pods} == {
        "topology.k8s.aws/network-node-layer-3"
    }
