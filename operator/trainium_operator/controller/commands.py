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
from trainium_operator.controller.reconciler import parse_job
from trainium_operator.lifecycle import machine
from trainium_operator.lifecycle.observed import observe

Obj = dict[str, Any]
RENDER_UID = "00000000-0000-0000-0000-000000000000"


@click.command()
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Watch only this namespace (repeatable); default: all namespaces.",
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
        peering=peering,
        priority=priority or 0,
        peering_lifetime=peering_lifetime,
        namespaces=namespaces,
        clusterwide=not namespaces,
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


def render_job(document: Obj, now: datetime) -> list[Obj]:
    """The objects the operator creates for a new TrainingJob, or ValueError naming the fields."""
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
    parsed = parse_job({**document, "metadata": meta})
    if isinstance(parsed, list):
        raise ValueError(f"{meta['name']}: invalid spec:\n  " + "\n  ".join(parsed))
    # Two passes, as on a cluster: the Service and PodGroup first, the pods once Volcano has
    # admitted the PodGroup.
    empty = observe(pods=[], podgroups=[], service_exists=False, nodes=[], now=now)
    first = machine.decide(parsed, {}, empty)
    admitted = [
        {**obj, "status": {"phase": "Inqueue"}} for obj in first.create if obj["kind"] == "PodGroup"
    ]
    in_queue = observe(pods=[], podgroups=admitted, service_exists=True, nodes=[], now=now)
    return first.create + machine.decide(parsed, first.status, in_queue).create


@click.command()
@click.option(
    "-f",
    "--filename",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
    help="TrainingJob manifest(s) to render ('-' for stdin).",
)
@click.option("--crd", is_flag=True, help="Print the TrainingJob CustomResourceDefinition.")
def render(filename: str | None, crd: bool) -> None:
    """Print exactly the objects the operator would create, without a cluster."""
    if crd:
        click.echo(yaml.safe_dump(training_job_crd(), sort_keys=False, width=100), nl=False)
        return
    if not filename:
        raise click.UsageError("give -f FILE (or --crd)")
    text = sys.stdin.read() if filename == "-" else Path(filename).read_text()
    now = datetime.now(UTC)
    objects: list[Obj] = []
    errors: list[str] = []
    for document in yaml.safe_load_all(text):
        if not document:
            continue
        try:
            objects.extend(render_job(document, now))
        except ValueError as error:
            errors.append(str(error))
    if errors:
        raise click.ClickException("\n".join(errors))
    click.echo(yaml.safe_dump_all(objects, sort_keys=False, width=100), nl=False)


logging.getLogger("kubernetes").setLevel(logging.WARNING)
