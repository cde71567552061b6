"""`trainium-operator profile now JOB --steps N`: asks every rank of a running job to capture
its next N steps in full, by setting the job's `trainium.dev/profile-steps` annotation (the
operator consumes it: lifecycle/policies/on_demand_profile.py)."""

from __future__ import annotations

import click

from trainium_operator.k8s.client import Cluster, load_api_client
from trainium_operator.lifecycle.policies.on_demand_profile import (
    ANNOTATION,
    MAX_STEPS,
    annotation_value,
)


@click.command("now")
@click.argument("job")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option(
    "--steps",
    type=click.IntRange(1, MAX_STEPS),
    default=20,
    show_default=True,
    help="Steps each rank captures in full, from its next step on.",
)
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None)
def profile_now(job: str, namespace: str, steps: int, kubeconfig: str | None) -> None:
    """Profile the next STEPS steps of running training job JOB on every rank.

    The job's status (onDemandProfile) then names the profile's directory and its state;
    `kubectl describe trainingjob JOB` shows the ProfileRequested and ProfileCaptured events.
    """
    cluster = Cluster(load_api_client(kubeconfig))
    if cluster.get_training_job(namespace, job) is None:
        raise click.ClickException(f"no TrainingJob {namespace}/{job}")
    value = annotation_value(steps)
    cluster.set_training_job_annotation(namespace, job, ANNOTATION, value)
    click.echo(
        f"trainingjob {namespace}/{job} annotated {ANNOTATION}={value}: every rank captures "
        f"its next {steps} steps; see status.onDemandProfile"
    )
