"""`trainium-operator profile serve` and `profile ls`: the profile web UI and its listing.

They read profiles through the UI's own store (`ui.profiles`); the console script adds them to
the `profile` group of `analysis/commands.py`, which holds the commands that drive the analysis.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from trainium_operator.analysis.commands import PROFILE_DIR
from trainium_operator.ui.limits import (
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_SUMMARISE_AHEAD,
    DEFAULT_SUMMARISE_WRITTEN_EVERY_S,
    DEFAULT_SUMMARY_CACHE_BYTES,
)


@click.command()
@click.argument("directory", type=PROFILE_DIR)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind (0.0.0.0: every interface, e.g. in a pod).",
)
@click.option("--port", default=8265, show_default=True, type=int)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Processes that summarise a profile's rank files. Default 1: in the server's own "
    "process, one file at a time (no process start on an open's path, one rank's events in "
    "memory at once). More: a pool of that many worker processes, faster on a large profile "
    "with spare cores, each adding its own memory (about 80 MiB) to the UI's.",
)
@click.option(
    "--list-jobs",
    is_flag=True,
    help="Also list the cluster's TrainingJobs with their live progress and health "
    "(in-cluster config, or --kubeconfig); needs get/list on trainingjobs.",
)
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="With --list-jobs: list only these namespaces (repeat the option; default: all). "
    "Needed when the UI's RBAC is a Role per namespace.",
)
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None)
@click.option(
    "--auth",
    type=click.Choice(["none", "kubernetes"]),
    default="none",
    show_default=True,
    help="kubernetes: every request needs the user's bearer token (TokenReview) and shows "
    "only namespaces where the user may get trainingjobs (SubjectAccessReview); the UI's own "
    "account needs create on tokenreviews and subjectaccessreviews. none: local use.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    help="A name the UI is reached by (the Host header; repeat the option; '*' allows any). "
    "Default: the bound address, localhost, 127.0.0.1 and ::1.",
)
@click.option(
    "--token-audience",
    "audiences",
    multiple=True,
    help="With --auth kubernetes: audiences the token review requires (default: the API server's).",
)
@click.option(
    "--summary-cache",
    "summary_cache",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory where the UI keeps the rank summaries it computes, so a profile opens "
    "without decoding it again (also across restarts); only this UI may write it, and it may "
    "not lie inside the served profiles. Default: $XDG_CACHE_HOME/trainium-operator/"
    "ui-summaries (~/.cache/...). 'none': keep nothing on disk.",
)
@click.option(
    "--summary-cache-size",
    "summary_cache_mib",
    type=click.IntRange(min=16),
    default=DEFAULT_SUMMARY_CACHE_BYTES >> 20,
    show_default=True,
    help="MiB of summaries kept; the least recently used go first.",
)
@click.option(
    "--summarise-ahead",
    type=click.IntRange(min=0),
    default=DEFAULT_SUMMARISE_AHEAD,
    show_default=True,
    help="Profiles the UI discovers (its profile list, the job list) that may wait to be "
    "summarised in the background, newest first, so that they open from the cache; "
    "0: a profile is summarised only when it is opened.",
)
@click.option(
    "--summarise-written-every",
    "summarise_written_every",
    type=click.FloatRange(min=0),
    default=DEFAULT_SUMMARISE_WRITTEN_EVERY_S,
    show_default=True,
    help="With --list-jobs: seconds between two looks at the jobs' statuses for profiles "
    "written since (rank files present; under S3, uploaded), which are then summarised ahead "
    "as --summarise-ahead describes, so that a link to one opens from the cache; each look "
    "reads the shared job list once and the newest 64 jobs' profile directories. 0: only "
    "profiles the UI lists are summarised ahead.",
)
@click.option(
    "--memory-budget",
    "memory_budget_mib",
    type=click.IntRange(min=32),
    default=DEFAULT_MEMORY_BUDGET >> 20,
    show_default=True,
    help="MiB of loaded profiles and timeline ranks held in memory (least recently used out "
    "first): keep it well below the container's memory limit.",
)
@click.option(
    "--auth-cache-ttl",
    type=float,
    default=10.0,
    show_default=True,
    help="With --auth kubernetes: seconds a token or access review result is reused.",
)
def serve(
    directory: str | Path,
    *,
    host: str,
    port: int,
    workers: int | None,
    list_jobs: bool,
    namespaces: tuple[str, ...],
    kubeconfig: str | None,
    auth: str,
    allowed_hosts: tuple[str, ...],
    audiences: tuple[str, ...],
    auth_cache_ttl: float,
    summary_cache: Path | None,
    summary_cache_mib: int,
    summarise_ahead: int,
    summarise_written_every: float,
    memory_budget_mib: int,
) -> None:
    """Serve the profile web UI for every profile under DIRECTORY or s3://bucket/prefix."""
    from aiohttp import web

    from trainium_operator.ui.app import create_app
    from trainium_operator.ui.guards import default_allowed_hosts
    from trainium_operator.ui.summary_cache import (
        SummaryCache,
        UnsafeCacheDirError,
        checked_directory,
        default_directory,
    )

    if namespaces and not list_jobs:
        raise click.UsageError("--namespace only applies with --list-jobs")
    if audiences and auth != "kubernetes":
        raise click.UsageError("--token-audience only applies with --auth kubernetes")
    lister = None
    if list_jobs:
        from trainium_operator.ui.jobs import cluster_job_lister

        lister = cluster_job_lister(kubeconfig, namespaces)
    access = None
    if auth == "kubernetes":
        from trainium_operator.ui.auth import kubernetes_access

        access = kubernetes_access(kubeconfig, audiences=audiences, ttl=auth_cache_ttl)
    cache_dir: Path | None = None
    if summary_cache is None or str(summary_cache) != "none":
        served = directory if isinstance(directory, Path) else None
        try:
            cache_dir = checked_directory(summary_cache or default_directory(), served)
        except (UnsafeCacheDirError, OSError) as exc:
            raise click.UsageError(f"--summary-cache: {exc}") from exc
    app = create_app(
        directory,
        job_lister=lister,
        workers=workers,
        allowed_hosts=allowed_hosts or default_allowed_hosts(host),
        access=access,
        summary_cache=SummaryCache(cache_dir, summary_cache_mib << 20),
        memory_budget=memory_budget_mib << 20,
        summarise_ahead=summarise_ahead,
        summarise_written_every=summarise_written_every,
    )
    shown = directory.resolve() if isinstance(directory, Path) else directory
    mode = "Kubernetes authentication" if access is not None else "no authentication"
    click.echo(f"profile UI for {shown} on http://{host}:{port}/ ({mode})", err=True)
    web.run_app(app, host=host, port=port, print=None)


@click.command(name="ls")
@click.argument("directory", type=PROFILE_DIR)
def list_profiles(directory: str | Path) -> None:
    """List the profiles under DIRECTORY or s3://bucket/prefix (S3: only profiles whose
    manifest is there are complete; the others are marked incomplete)."""
    from trainium_operator.profiler.s3 import S3ProfileError
    from trainium_operator.ui.profiles import ProfileStore

    try:
        rows = ProfileStore.for_source(directory).listing()
    except S3ProfileError as exc:
        raise click.ClickException(str(exc)) from exc
    if not rows:
        click.echo(f"no profiles under {directory}", err=True)
        sys.exit(1)
    for row in rows:
        state = "" if row["loadable"] else f"\tINCOMPLETE: {row['manifest_problem']}"
        click.echo(
            f"{row['id']}\t{row['namespace']}/{row['job_name']}\tattempt {row['attempt']}\t"
            f"{row['created'] or '-'}\t{row['nodes']} nodes\t{row['ranks']} ranks\t"
            f"{row['bytes'] / 1e6:.1f} MB{state}"
        )
