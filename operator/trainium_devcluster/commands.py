"""`trainium-operator dev ...`: build, start, inspect and stop the local simulated cluster."""

from __future__ import annotations

import os
import shlex
import sys
import time

import click

from trainium_devcluster import build, cluster, paths, volcano
from trainium_operator.api import instance_types


def _echo(message: str) -> None:
    click.echo(message, err=True)


name_option = click.option(
    "--name",
    default=lambda: os.environ.get("TRAINIUM_DEV_CLUSTER", paths.DEFAULT_CLUSTER_NAME),
    show_default=f"$TRAINIUM_DEV_CLUSTER or {paths.DEFAULT_CLUSTER_NAME}",
    help="Cluster name (several can run side by side).",
)


@click.group()
def dev() -> None:
    """The local cluster: real kube-apiserver, controller-manager, etcd; KWOK Trainium nodes."""


@dev.command("build")
@click.option(
    "--jobs", "-j", type=int, default=build.default_jobs, show_default=True, help="go build -p"
)
@click.option(
    "--only",
    multiple=True,
    type=click.Choice(
        ["kubernetes", "etcd", "kwok", "volcano", "kueue", "crds", "helm", "kubeflow"]
    ),
    help="Build just these components (repeatable); `kubeflow` (the benchmark's peer) is "
    "built only when named.",
)
@click.option(
    "--print-path", is_flag=True, help="Print the binary directories (PATH order) and exit."
)
def build_command(jobs: int, only: tuple[str, ...], print_path: bool) -> None:
    """Build (or find cached) every binary; a warm cache makes this a no-op."""
    if print_path:
        click.echo(os.pathsep.join(str(d) for d in build.expected_toolchain().bin_dirs))
        return
    started = time.monotonic()
    try:
        results = build.build_all(jobs=jobs, echo=_echo, only=only)
    except build.BuildError as error:
        raise click.ClickException(str(error)) from error
    for result in results:
        state = f"built in {result.seconds:6.1f}s" if result.built else "cached"
        click.echo(f"{result.component:<40} {result.version:<9} {state:<18} {result.location}")
    click.echo(f"total {time.monotonic() - started:.1f}s (cache {paths.cache_root()})")


@dev.command()
@name_option
@click.option("--nodes", type=click.IntRange(min=0), default=2, show_default=True)
@click.option(
    "--instance-type",
    type=click.Choice(sorted(instance_types.INSTANCE_TYPES)),
    default=instance_types.DEFAULT_INSTANCE_TYPE,
    show_default=True,
)
@click.option(
    "--taint", is_flag=True, help="Taint the nodes aws.amazon.com/neuron=present:NoSchedule."
)
@click.option(
    "--schedule-period",
    default=None,
    help="Volcano's scheduling period (a Go duration such as 200ms); default: the one this "
    f"cluster was started with, else Volcano's {volcano.DEFAULT_SCHEDULE_PERIOD}. The test "
    f"session's cluster runs {volcano.TEST_SCHEDULE_PERIOD}; the demo and the benchmark keep "
    "the default, so their timings compare with a real cluster's.",
)
@click.option(
    "--dra-nodes",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Also this many nodes of the instance type in a node group of their own whose devices "
    "are published through DRA (ResourceSlices of the Neuron DRA driver and DRANET, no "
    "aws.amazon.com/neuron or vpc.amazonaws.com/efa), for jobs with spec.deviceAllocation dra.",
)
def up(
    *,
    name: str,
    nodes: int,
    instance_type: str,
    taint: bool,
    schedule_period: str | None,
    dra_nodes: int,
) -> None:
    """Start (or complete) a dev cluster; safe to re-run on a running cluster."""
    try:
        report = cluster.up(
            name,
            nodes=nodes,
            instance_type=instance_type,
            neuron_taint=taint,
            echo=_echo,
            schedule_period=schedule_period,
            dra_nodes=dra_nodes,
        )
    except (build.ToolchainMissingError, cluster.ClusterError) as error:
        raise click.ClickException(str(error)) from error
    for step, seconds in report.timer.steps:
        _echo(f"  {step:<20} {seconds:5.1f}s")
    _echo(
        f"cluster {name!r} ready in {report.timer.total:.1f}s "
        f"(control plane {report.control_plane}; {len(report.nodes_created)} node(s) created; "
        + ", ".join(f"{process} pid {pid}" for process, pid in report.pids.items())
        + ")"
    )
    _echo(f"kubeconfig: {report.kubeconfig}")
    _echo(f'use it:     eval "$(trainium-operator dev env --name {name})"')


@dev.command()
@name_option
def down(name: str) -> None:
    """Stop Kueue and Volcano and delete the cluster (kwokctl delete cluster)."""
    started = time.monotonic()
    try:
        cluster.down(name, echo=_echo)
    except cluster.ClusterError as error:
        raise click.ClickException(str(error)) from error
    _echo(f"down in {time.monotonic() - started:.1f}s")


@dev.command()
@name_option
def status(name: str) -> None:
    """Control plane, Volcano, Kueue, queues, nodes and the FSx claim at a glance."""
    state = cluster.status(name)
    click.echo(f"{'cluster':<22} {state.name}")
    click.echo(f"{'kube-apiserver':<22} {'running' if state.apiserver_running else 'not running'}")
    for process, pid, healthy in state.volcano:
        running = f"running (pid {pid}, {'healthy' if healthy else 'NOT healthy'})"
        click.echo(f"{process:<22} {running if pid else 'not running'}")
    click.echo(f"{'kubeconfig':<22} {state.kubeconfig}")
    click.echo(f"{'fsx-claim':<22} {state.fsx_claim_phase or '-'}")
    for node, instance_type, ready in state.nodes:
        click.echo(
            f"{'node':<22} {node:<24} {instance_type:<16} {'Ready' if ready else 'NotReady'}"
        )
    for queue, queue_state, counts in state.queues:
        phases = " ".join(f"{phase.lower()}={count}" for phase, count in counts.items())
        click.echo(f"{'queue':<22} {queue:<24} {queue_state:<16} {phases}")
    for cluster_queue, pending, admitted in state.cluster_queues:
        click.echo(
            f"{'clusterqueue (kueue)':<22} {cluster_queue:<24} "
            f"pending={pending} admitted={admitted}"
        )
    if not state.apiserver_running:
        sys.exit(1)


@dev.command()
@name_option
def kubeconfig(name: str) -> None:
    """Print the kubeconfig path of the cluster."""
    click.echo(str(paths.ClusterPaths(name).kubeconfig))


@dev.command()
@name_option
def env(name: str) -> None:
    """Print shell lines for kubectl/helm on this cluster: eval "$(trainium-operator dev env)"."""
    bin_path = os.pathsep.join(str(d) for d in build.expected_toolchain().bin_dirs)
    click.echo(f"export KUBECONFIG={shlex.quote(str(paths.ClusterPaths(name).kubeconfig))}")
    click.echo(f"export TRAINIUM_DEV_CLUSTER={shlex.quote(name)}")
    click.echo(f'export PATH={shlex.quote(bin_path)}"{os.pathsep}$PATH"')


@dev.command("lose-node")
@name_option
@click.argument("node")
def lose_node(name: str, node: str) -> None:
    """Stop NODE's heartbeat, as if its kubelet died (NotReady after ~16 s)."""
    from trainium_devcluster import clients, sim

    sim.simulate_node_loss(clients.clients_for(paths.ClusterPaths(name).kubeconfig).core, node)


@dev.command("restore-node")
@name_option
@click.argument("node")
def restore_node(name: str, node: str) -> None:
    """Give NODE its heartbeat back."""
    from trainium_devcluster import clients, sim

    sim.restore_node(clients.clients_for(paths.ClusterPaths(name).kubeconfig).core, node)


@dev.command()
@name_option
@click.option(
    "--down/--keep",
    "tear_down",
    default=False,
    show_default=True,
    help="Delete the cluster at the end (default: keep it, to look around).",
)
def demo(name: str, tear_down: bool) -> None:
    """The tutorial's job end to end on a local simulated Trainium cluster."""
    from trainium_devcluster.demo import DemoError, run_demo

    try:
        code = run_demo(name, _echo, tear_down=tear_down)
    except DemoError as error:
        raise click.ClickException(str(error)) from error
    sys.exit(code)
