"""`trainium-operator run` (the operator) and `trainium-operator render` (dry run)."""

from __future__ import annotations

import logging
import secrets
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import click
import yaml

from trainium_operator.api import topology
from trainium_operator.api.crd import training_job_crd
from trainium_operator.api.reference import api_reference
from trainium_operator.builders.job import Stage
from trainium_operator.controller.settings import (
    ENV_DRA,
    ENV_JOB_NETWORK_POLICY,
    ENV_KUEUE,
    ENV_OPERATOR_IMAGE,
    ENV_OPERATOR_IMAGE_PULL_POLICY,
    ENV_OPERATOR_IMAGE_PULL_SECRETS,
    ENV_PREFLIGHT_MULTI_NODE,
    ENV_PROFILE_S3_URI,
    ENV_PROFILE_UPLOAD_SERVICE_ACCOUNT,
    ENV_RESERVED_SERVICE_ACCOUNTS,
    ENV_TOPOLOGY,
    LOG_FORMATS,
    HealthSettings,
    OperatorSettings,
    OwnPod,
    PeeringSettings,
    name_list,
)
from trainium_operator.lifecycle.policies.profile_upload import UploadDefaults
from trainium_operator.lifecycle.render import parse_manifest, render_stages, rendered_text

# run's text settings that the chart passes as env: (flag, env name, help without the env).
_ENV_TEXT_OPTIONS: tuple[tuple[str, str, str], ...] = (
    (
        "--reserved-service-accounts",
        ENV_RESERVED_SERVICE_ACCOUNTS,
        "Comma-separated ServiceAccounts no job may run as (the chart's own accounts).",
    ),
    (
        "--profile-s3-uri",
        ENV_PROFILE_S3_URI,
        "Default spec.profile.s3Uri of profiled jobs (the chart's profileUpload.s3Uri).",
    ),
    (
        "--profile-upload-service-account",
        ENV_PROFILE_UPLOAD_SERVICE_ACCOUNT,
        "ServiceAccount of every upload pod; default: the namespace's `default`, never the "
        "job's own.",
    ),
    (
        "--operator-image",
        ENV_OPERATOR_IMAGE,
        "The image upload pods run; default: the chart's image of this version.",
    ),
    (
        "--operator-image-pull-policy",
        ENV_OPERATOR_IMAGE_PULL_POLICY,
        "Upload pods' imagePullPolicy; default: IfNotPresent.",
    ),
    (
        "--operator-image-pull-secrets",
        ENV_OPERATOR_IMAGE_PULL_SECRETS,
        "Comma-separated imagePullSecrets of upload pods (they must exist in the jobs' "
        "namespaces).",
    ),
)


def _env_text_options(command: Callable[..., None]) -> Callable[..., None]:
    """Adds `_ENV_TEXT_OPTIONS` to a command, in the table's order (default: empty)."""
    for flag, env, help_text in reversed(_ENV_TEXT_OPTIONS):
        command = click.option(flag, default="", envvar=env, help=f"{help_text} Env: {env}.")(
            command
        )
    return command


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
    "--pod-name",
    default=None,
    help="The operator's own pod (the chart passes it from the downward API): with --peering "
    "and --health-port, the acting replica labels it trainium.dev/health-channel=active, the "
    "others standby, and the health channel's Service selects the active one.",
)
@click.option(
    "--pod-namespace",
    default=None,
    help="The namespace of --pod-name (the chart's release namespace).",
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
@click.option(
    "--straggler-cordon-budget",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Nodes the operator may keep cordoned for stragglers at once, cluster-wide "
    "(spec.health.onStraggler: Replace). 0: Replace only reports; a job author controls what "
    "its ranks report, so taking nodes out of the cluster is the operator admin's opt-in.",
)
@click.option("--workers", type=int, default=4, show_default=True, help="Concurrent reconciles.")
@click.option(
    "--job-network-policy/--no-job-network-policy",
    "isolate_jobs",
    default=True,
    show_default=True,
    envvar=ENV_JOB_NETWORK_POLICY,
    help="Give each job a NetworkPolicy admitting only its own pods (the chart's "
    f"networkPolicy.jobs). Env: {ENV_JOB_NETWORK_POLICY}.",
)
@click.option(
    "--kueue/--no-kueue",
    default=False,
    show_default=True,
    envvar=ENV_KUEUE,
    help="Queue jobs labelled kueue.x-k8s.io/queue-name with Kueue (watches its Workloads and "
    f"LocalQueues; Kueue's CRDs must be installed; the chart's kueue.enabled). Env: {ENV_KUEUE}.",
)
@click.option(
    "--dra/--no-dra",
    default=False,
    show_default=True,
    envvar=ENV_DRA,
    help="Give jobs with spec.deviceAllocation dra their devices through a ResourceClaimTemplate "
    "(resource.k8s.io/v1, Kubernetes 1.34+; the chart's dra.enabled). Env: "
    f"{ENV_DRA}.",
)
@click.option(
    "--preflight-multi-node/--no-preflight-multi-node",
    default=False,
    show_default=True,
    envvar=ENV_PREFLIGHT_MULTI_NODE,
    help="Preflight every new gang of multi-node jobs that leave spec.preflight.enabled unset "
    f"(the chart's preflight.multiNodeDefault). Env: {ENV_PREFLIGHT_MULTI_NODE}.",
)
@click.option(
    "--topology",
    "topology_schedulers",
    default="",
    envvar=ENV_TOPOLOGY,
    help="Comma-separated schedulers to keep network topology for, from the nodes' AWS labels "
    "(docs/topology.md): volcano (HyperNodes), kueue (a Topology and a ResourceFlavor per "
    f"instance type); default: none (the chart's topology.*). Env: {ENV_TOPOLOGY}.",
)
@_env_text_options
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None)
@click.option(
    "--log-format",
    type=click.Choice(list(LOG_FORMATS)),
    default="plain",
    help="plain: the message only; full: with its time, logger and level (a file or a "
    "terminal; in a pod the runtime stamps each line already); json: one object per line.",
)
@click.option("--verbose", is_flag=True)
def run(
    *,
    namespaces: tuple[str, ...],
    peering: str | None,
    priority: int | None,
    peering_lifetime: int,
    pod_name: str | None,
    pod_namespace: str | None,
    liveness_endpoint: str | None,
    metrics_port: int | None,
    health_port: int | None,
    health_url: str | None,
    progress_interval: float,
    straggler_cordon_budget: int,
    workers: int,
    isolate_jobs: bool,
    kueue: bool,
    dra: bool,
    preflight_multi_node: bool,
    topology_schedulers: str,
    reserved_service_accounts: str,
    profile_s3_uri: str,
    profile_upload_service_account: str,
    operator_image: str,
    operator_image_pull_policy: str,
    operator_image_pull_secrets: str,
    kubeconfig: str | None,
    log_format: str,
    verbose: bool,
) -> None:
    """Run the operator (watches TrainingJobs, their pods and nodes)."""
    from trainium_operator.controller import wiring

    schedulers = frozenset(name_list(topology_schedulers))
    unknown = sorted(schedulers - set(topology.SCHEDULERS))
    if unknown:
        raise click.BadParameter(
            f"{', '.join(unknown)}: not a scheduler topology is written for (choose from "
            f"{', '.join(topology.SCHEDULERS)})",
            param_hint="--topology",
        )

    if bool(pod_name) != bool(pod_namespace):
        raise click.UsageError("--pod-name and --pod-namespace go together")

    wiring.run_operator(
        OperatorSettings(
            kubeconfig=kubeconfig,
            workers=workers,
            namespaces=namespaces,
            peering=(
                PeeringSettings(
                    peering,
                    # Random by default, so two replicas never tie (kopf lets both work).
                    priority if priority is not None else secrets.randbelow(1_000_000) + 1,
                    peering_lifetime,
                )
                if peering is not None
                else None
            ),
            own_pod=OwnPod(pod_namespace, pod_name) if pod_name and pod_namespace else None,
            liveness_endpoint=liveness_endpoint,
            metrics_port=metrics_port,
            health=HealthSettings.local(health_port, health_url) if health_port else None,
            progress_interval=progress_interval,
            straggler_cordon_budget=straggler_cordon_budget,
            isolate_jobs=isolate_jobs,
            kueue=kueue,
            dra=dra,
            preflight_multi_node=preflight_multi_node,
            topology=schedulers,
            reserved_service_accounts=frozenset(name_list(reserved_service_accounts)),
            upload=UploadDefaults(
                s3_uri=profile_s3_uri.strip() or None,
                service_account=profile_upload_service_account.strip() or None,
                image=operator_image.strip() or None,
                image_pull_policy=operator_image_pull_policy.strip() or "IfNotPresent",
                image_pull_secrets=name_list(operator_image_pull_secrets),
            ),
            log_format=log_format,
            verbose=verbose,
        )
    )


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
@click.option(
    "--api-doc",
    is_flag=True,
    help="Print the TrainingJob API reference (docs/api.md), generated from the CRD's schema.",
)
def render(
    filename: str | None, stage: str | None, health_url: str | None, crd: bool, api_doc: bool
) -> None:
    """Print exactly the objects the operator will create, every stage labelled, in the
    order it creates them, without a cluster."""
    if crd:
        click.echo(yaml.safe_dump(training_job_crd(), sort_keys=False, width=100), nl=False)
        return
    if api_doc:
        click.echo(api_reference(), nl=False)
        return
    if not filename:
        raise click.UsageError("give -f FILE (or --crd, --api-doc)")
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
        stack = parse_manifest(document, health_url).spec.effective_neuron_stack
        outputs.append(rendered_text(stages, selected, stack))
    if errors:
        raise click.ClickException("\n".join(errors))
    click.echo("---\n".join(outputs), nl=False)


logging.getLogger("kubernetes").setLevel(logging.WARNING)
