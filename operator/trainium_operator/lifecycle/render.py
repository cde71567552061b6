"""The dry run: the objects the operator will create for a TrainingJob, stage by stage.

`trainium-operator render` prints them and the TorchX backend's `--dryrun` shows them; both run
the operator's own pipeline (`machine.decide`, every policy) over simulated snapshots, so what
is printed is what a real pass creates.
"""

from __future__ import annotations

from datetime import datetime

import yaml

from trainium_operator.api import spec as spec_model
from trainium_operator.api import topology
from trainium_operator.api.objects import Obj
from trainium_operator.api.spec import NeuronStack
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.lifecycle import machine
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.observed import observe
from trainium_operator.lifecycle.parse import parse_job
from trainium_operator.lifecycle.snapshot import PassSettings, Snapshot

RENDER_UID = "00000000-0000-0000-0000-000000000000"


def parse_manifest(document: Obj, health_url: str | None = None) -> JobRef:
    """A manifest as `kubectl apply` would send it, parsed as the operator parses a stored job
    (defaults for what only the API server sets), or ValueError naming every problem."""
    if document.get("apiVersion") != spec_model.API_VERSION or document.get("kind") != (
        spec_model.KIND
    ):
        raise ValueError(
            f"expected apiVersion {spec_model.API_VERSION} kind {spec_model.KIND}, got "
            f"{document.get('apiVersion')} {document.get('kind')}"
        )
    meta = dict(document.get("metadata") or {})
    meta.setdefault("namespace", "default")
    meta.setdefault("uid", RENDER_UID)
    meta.setdefault("generation", 1)
    if "name" not in meta:
        raise ValueError("metadata.name is required")
    parsed = parse_job({**document, "metadata": meta}, health_url)
    if isinstance(parsed, list):
        raise ValueError(f"{meta['name']}: invalid spec:\n  " + "\n  ".join(parsed))
    return parsed


def render_job(document: Obj, now: datetime) -> list[Obj]:
    """The objects the operator creates for a new TrainingJob, or ValueError naming the fields."""
    return render_stages(document, now)[0][1]


def _finished(pod: Obj) -> Obj:
    return {**pod, "status": {"phase": "Succeeded"}}


def _admitted(podgroup: Obj) -> Obj:
    return {**podgroup, "status": {"phase": "Inqueue"}}


def render_stages(
    document: Obj, now: datetime, health_url: str | None = None
) -> list[tuple[Stage, list[Obj]]]:
    """Every stage's objects in the order the operator creates them, each with its stage.

    The same pure path the operator takes: its pass on a new job (NetworkPolicy, Service,
    PodGroup; the operator's default isolates every job), its pass
    once Volcano admitted that PodGroup (the pods), and with a compile stage the same two once
    that gang succeeded, which start training.
    """
    job = parse_manifest(document, health_url)
    # What an operator with Kueue, DRA and topology on creates: a job labelled for Kueue shows
    # its pod groups, one with spec.deviceAllocation dra its ResourceClaimTemplate, and a job
    # that asks no placement its instance type's default.
    settings = PassSettings(
        kueue=True, dra=True, topology=frozenset(topology.SCHEDULERS), preflight_multi_node=False
    )

    def decide(status: Obj, pods: list[Obj], groups: list[Obj], service: bool) -> Decision:
        seen = observe(
            pods=pods,
            podgroups=groups,
            service_exists=service,
            network_policy_missing=not service,
            nodes=[],
            now=now,
        )
        return machine.decide(Snapshot(job, job.generation, status, seen, settings=settings))

    def pods(plan: Decision) -> list[Obj]:
        return [o for o in plan.create if o["kind"] == "Pod"]

    stages = [Stage.COMPILE, Stage.TRAIN] if job.spec.compile.enabled else [Stage.TRAIN]
    # A gang Volcano queues gets its pods once its PodGroup is admitted (the second pass); one
    # Kueue queues gets them at once, held by Kueue's gate (the second pass then adds nothing).
    first = decide({}, [], [], False)
    groups = [_admitted(o) for o in first.create if o["kind"] == "PodGroup"]
    first_pods = decide(first.status, pods(first), groups, True)
    rendered = [(stages[0], first.create + first_pods.create)]
    if len(stages) == 1:
        return rendered
    compiled = [_finished(o) for o in pods(first) + pods(first_pods)]
    second = decide(first_pods.status, compiled, groups, True)
    groups += [_admitted(o) for o in second.create if o["kind"] == "PodGroup"]
    second_pods = decide(second.status, compiled + pods(second), groups, True)
    rendered.append((Stage.TRAIN, second.create + second_pods.create))
    return rendered


def _stage_note(stage: Stage, has_compile: bool, stack: NeuronStack) -> str:
    if stage is Stage.COMPILE and stack is NeuronStack.NATIVE:
        return (
            "native stack: the same command for spec.compile.steps steps fills the persistent "
            "NEFF cache; created first"
        )
    if stage is Stage.COMPILE:
        return "neuron_parallel_compile fills the Neuron compile cache; created first"
    if has_compile:
        return "torchrun; created once every compile pod succeeded"
    return "torchrun; created first (spec.compile.enabled is false)"


def rendered_text(
    stages: list[tuple[Stage, list[Obj]]], selected: Stage | None, stack: NeuronStack
) -> str:
    """YAML documents, each headed by a comment naming its stage (n/total) and when it runs."""
    has_compile = any(stage is Stage.COMPILE for stage, _ in stages)
    parts: list[str] = []
    for index, (stage, objects) in enumerate(stages, start=1):
        if selected is not None and stage is not selected:
            continue
        note = _stage_note(stage, has_compile, stack)
        header = f"# stage {index}/{len(stages)}: {stage.value} ({note})"
        parts += [f"{header}\n{yaml.safe_dump(obj, sort_keys=False, width=100)}" for obj in objects]
    return "---\n".join(parts)
