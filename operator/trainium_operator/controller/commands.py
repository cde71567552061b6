"""`trainium-operator run` (the operator) and `trainium-operator render` (dry run)."""

from __future__ import annotations

import logging
import secrets
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import yaml

from trainium_operator.api import spec as spec_model
from trainium_operator.api.crd import training_job_crd
from trainium_operator.api.spec import NeuronStack
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.controller.reconciler import parse_job
from trainium_operator.lifecycle import machine
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.observed import observe
from trainium_operator.profiler.channel_contract import PATH

Obj = dict[str, Any]
RENDER_UID = "00000000-0000-0000-0000-000000000000"


@click.command()
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Watch only this namespace, or the namespaces matching a glob pattern such as "
    "'team-*' (repeatable); default: all namespaces. A pattern needs cluster-wide list and "
    "watch rights.",
)
@click.option("--peering", default=None, help="kopf peering name, for several replicas.")
@click.option(
    "--priority",
    type=int,
    default=None,
    help="Peering priority; the highest-priority replica works, the others wait. Default: "
    "random, so two replicas never tie (kopf lets tied replicas both work).",
)
@click.option(
    "--peering-lifetime",
    type=click.IntRange(min=2),
    default=60,
    show_default=True,
    help="Seconds a replica's peering entry lives without a keep-alive: how long a crashed "
    "active replica blocks its standby.",
)
@click.option(
    "--liveness-endpoint",
    default=None,
    help="kopf health endpoint, e.g. http://0.0.0.0:8080/healthz.",
)
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus /metrics here.")
@click.option(
    "--health-port",
    type=int,
    default=None,
    help="Serve the health channel (training ranks' progress) on this port; off by default.",
)
@click.option(
    "--health-url",
    default=None,
    help="How training pods reach the health channel, e.g. "
    "http://trainium-operator.trainium-system.svc:8090/v1/progress (the chart sets it). "
    "Default with --health-port: http://127.0.0.1:<port>/v1/progress.",
)
@click.option(
    "--progress-interval",
    type=click.FloatRange(min=0.5),
    default=10.0,
    show_default=True,
    help="Seconds between writes of a job's status.progress (the ranks' reports batched).",
)
@click.option("--workers", type=int, default=4, show_default=True, help="Concurrent reconciles.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None)
@click.option("--log-format", type=click.Choice(["plain", "json"]), default="plain")
@click.option("--verbose", is_flag=True)
def run(
    *,
    namespaces: tuple[str, ...],
    peering: str | None,
    priority: int | None,
    peering_lifetime: int,
    liveness_endpoint: str | None,
    metrics_port: int | None,
    health_port: int | None,
    health_url: str | None,
    progress_interval: float,
    workers: int,
    kubeconfig: str | None,
    log_format: str,
    verbose: bool,
) -> None:
    """Run the operator (watches TrainingJobs, their pods and nodes)."""
    import kopf

    from trainium_operator.controller import handlers

    kopf.configure(
        verbose=verbose,
        log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.PLAIN,
    )
    if peering is not None and priority is None:
        priority = secrets.randbelow(1_000_000) + 1
    runtime = handlers.Runtime(
        kubeconfig=kubeconfig,
        workers=workers,
        metrics_port=metrics_port,
        health_port=health_port,
        progress_interval=progress_interval,
        health_url=health_url or (f"http://127.0.0.1:{health_port}{PATH}" if health_port else None),
        peering=peering,
        priority=priority or 0,
        peering_lifetime=peering_lifetime,
        namespaces=namespaces,
    )
    kopf.run(
        standalone=peering is None,
        peering_name=peering,
        priority=priority or 0,
        namespaces=list(namespaces),
        clusterwide=not namespaces,
        liveness_endpoint=liveness_endpoint,
        memo=kopf.Memo(runtime=runtime),
    )


def _parse_for_render(document: Obj, health_url: str | None = None) -> JobRef:
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
    job = _parse_for_render(document, health_url)

    def decide(status: Obj, pods: list[Obj], groups: list[Obj], service: bool) -> Decision:
        seen = observe(
            pods=pods,
            podgroups=groups,
            service_exists=service,
            network_policy_missing=not service,
            nodes=[],
            now=now,
        )
        return machine.decide(job, status, seen)

    stages = [Stage.COMPILE, Stage.TRAIN] if job.spec.compile.enabled else [Stage.TRAIN]
    first = decide({}, [], [], False)
    groups = [_admitted(o) for o in first.create if o["kind"] == "PodGroup"]
    first_pods = decide(first.status, [], groups, True)
    rendered = [(stages[0], first.create + first_pods.create)]
    if len(stages) == 1:
        return rendered
    compiled = [_finished(o) for o in first_pods.create if o["kind"] == "Pod"]
    second = decide(first_pods.status, compiled, groups, True)
    groups += [_admitted(o) for o in second.create if o["kind"] == "PodGroup"]
    second_pods = decide(second.status, compiled, groups, True)
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


def _rendered_text(
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


@click.command()
@click.option(
    "-f",
    "--filename",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
    help="TrainingJob manifest(s) to render ('-' for stdin).",
)
@click.option(
    "--stage",
    type=click.Choice([s.value for s in Stage]),
    default=None,
    help="Print only this stage's objects (default: every stage, in apply order).",
)
@click.option(
    "--health-url",
    default=None,
    help="Render as an operator serving the health channel there (the chart's default: "
    "http://<release>-health.<namespace>.svc:8090/v1/progress): training pods then get its env "
    "and their pod-bound token. Default: as an operator without one.",
)
@click.option("--crd", is_flag=True, help="Print the TrainingJob CustomResourceDefinition.")
def render(filename: str | None, stage: str | None, health_url: str | None, crd: bool) -> None:
    """Print exactly the objects the operator will create, every stage labelled, in the
    order it creates them, without a cluster."""
    if crd:
        click.echo(yaml.safe_dump(training_job_crd(), sort_keys=False, width=100), nl=False)
        return
    if not filename:
        raise click.UsageError("give -f FILE (or --crd)")
    text = sys.stdin.read() if filename == "-" else Path(filename).read_text()
    now = datetime.now(UTC)
    selected = Stage(stage) if stage else None
    outputs: list[str] = []
    errors: list[str] = []
    for document in yaml.safe_load_all(text):
        if not document:
            continue
        try:
            stages = render_stages(document, now, health_url)
        except ValueError as error:
            errors.append(str(error))
            continue
        if selected is not None and selected not in dict(stages):
            errors.append(
                f"{document['metadata']['name']}: has no {selected.value} stage "
                "(spec.compile.enabled is false)"
            )
            continue
        stack = _parse_for_render(document, health_url).spec.effective_neuron_stack
        outputs.append(_rendered_text(stages, selected, stack))
    if errors:
        raise click.ClickException("\n".join(errors))
    click.echo("---\n".join(outputs), nl=False)


logging.getLogger("kubernetes").setLevel(logging.WARNING)
