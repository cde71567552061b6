"""`trainium-operator profile ...`: summarise, export, browse and list profiles."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click


class _ProfileSource(click.ParamType):  # type: ignore[type-arg]
    """A profile directory, or an `s3://bucket/prefix` URI (kept as a string)."""

    name = "DIR|s3://bucket/prefix"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.startswith("s3://"):
            from trainium_operator.profiler.s3 import parse_s3_uri

            try:
                parse_s3_uri(value)
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
            return value
        directory = click.Path(exists=True, file_okay=False, path_type=Path)
        return directory.convert(value, param, ctx)


PROFILE_DIR = _ProfileSource()


def _local_profile(source: str | Path) -> Path:
    """The directory to load: `source` itself, or the S3 profile downloaded into the cache."""
    if isinstance(source, Path):
        return source
    from trainium_operator.analysis.s3store import fetch_uri
    from trainium_operator.profiler.s3 import S3ProfileError, parse_s3_uri

    try:
        return fetch_uri(parse_s3_uri(source))
    except S3ProfileError as exc:
        raise click.ClickException(str(exc)) from exc


def _parse_ranks(text: str | None) -> frozenset[int] | None:
    if not text:
        return None
    ranks: set[int] = set()
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        try:
            ranks.update(range(int(low), int(high) + 1) if sep else {int(low)})
        except ValueError as exc:
            raise click.BadParameter(f"{part!r} is not a rank or a range like 0-7") from exc
    return frozenset(ranks)


@click.group()
def profile() -> None:
    """Analyse profiles written by the trainium profiler."""


@profile.command()
@click.argument("directory", type=PROFILE_DIR)
@click.option("--top", default=15, show_default=True, help="Kernels and host ops listed.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the whole analysis (the dashboard's data) as JSON instead of text.",
)
@click.option(
    "--workers", type=int, default=None, help="Decoding processes (default: CPUs, max 4)."
)
def report(directory: str | Path, top: int, as_json: bool, workers: int | None) -> None:
    """Print the analysis of the profile in DIRECTORY (or at s3://bucket/prefix): steps and
    stragglers, device and CPU utilisation, activity, memory operations, kernels, precision,
    launch latency and annotations."""
    from trainium_operator.analysis.loading import ProfileLoadError, load_profile
    from trainium_operator.analysis.report import dashboard, text_report

    try:
        loaded = load_profile(_local_profile(directory), workers=workers)
    except ProfileLoadError as exc:
        raise click.ClickException(str(exc)) from exc
    data = dashboard(loaded, buckets=100, top=top)
    if not isinstance(directory, Path):
        data["overview"]["path"] = directory  # the S3 location, not the local cache
    if as_json:
        click.echo(json.dumps(data, indent=1))
    else:
        click.echo(text_report(data, top=top), nl=False)


@profile.command()
@click.argument("directory", type=PROFILE_DIR)
@click.option(
    "--perfetto",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Perfetto trace file to write (e.g. trace.perfetto-trace).",
)
@click.option("--from-step", type=int, default=None, help="First step to include.")
@click.option("--to-step", type=int, default=None, help="Last step to include.")
@click.option("--ranks", default=None, help="Ranks to include, e.g. 0-7,32.")
@click.option("--workers", type=int, default=None, help="Decoding processes.")
def export(
    directory: str | Path,
    output: Path,
    *,
    from_step: int | None,
    to_step: int | None,
    ranks: str | None,
    workers: int | None,
) -> None:
    """Export DIRECTORY (or s3://bucket/prefix) as a Perfetto trace (open it at ui.perfetto.dev)."""
    from trainium_operator.analysis.loading import ProfileLoadError, load_profile
    from trainium_operator.analysis.perfetto import ExportOptions, export_perfetto
    from trainium_operator.analysis.timeline import TimelineIndex

    began = time.perf_counter()
    try:
        loaded = load_profile(_local_profile(directory), workers=workers)
    except ProfileLoadError as exc:
        raise click.ClickException(str(exc)) from exc
    options = ExportOptions(from_step, to_step, _parse_ranks(ranks))
    try:
        result = export_perfetto(TimelineIndex(loaded), output, options)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"wrote {result.path}: {result.bytes_written:,} bytes, {result.slices:,} slices, "
        f"{result.counters:,} counter samples, {result.flows:,} flows, {result.tracks} tracks "
        f"in {time.perf_counter() - began:.1f} s"
    )


@profile.command()
@click.argument("directory", type=PROFILE_DIR)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind (0.0.0.0: every interface, e.g. in a pod).",
)
@click.option("--port", default=8265, show_default=True, type=int)
@click.option("--workers", type=int, default=None, help="Decoding processes per load.")
@click.option(
    "--list-jobs",
    is_flag=True,
    help="Also list the cluster's TrainingJobs with profiling on (in-cluster config, or "
    "--kubeconfig); needs get/list on trainingjobs.",
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
) -> None:
    """Serve the profile web UI for every profile under DIRECTORY or s3://bucket/prefix."""
    from aiohttp import web

    from trainium_operator.ui.app import create_app
    from trainium_operator.ui.guards import default_allowed_hosts

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
    app = create_app(
        directory,
        job_lister=lister,
        workers=workers,
        allowed_hosts=allowed_hosts or default_allowed_hosts(host),
        access=access,
    )
    shown = directory.resolve() if isinstance(directory, Path) else directory
    mode = "Kubernetes authentication" if access is not None else "no authentication"
    click.echo(f"profile UI for {shown} on http://{host}:{port}/ ({mode})", err=True)
    web.run_app(app, host=host, port=port, print=None)


@profile.command(name="ls")
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


@profile.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("destination")
def upload(directory: Path, destination: str) -> None:
    """Upload the profile in DIRECTORY to DESTINATION (s3://bucket/prefix/...) as the operator
    does: rank files (multipart above 8 MiB), sizes checked, the manifest written last.
    Credentials and endpoint come from boto3's standard configuration."""
    from trainium_operator.profiler.s3 import S3ProfileError, parse_s3_uri, upload_profile

    try:
        result = upload_profile(directory, parse_s3_uri(destination))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="DESTINATION") from exc
    except S3ProfileError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"uploaded {len(result.files)} rank files ({result.bytes:,} bytes) and the manifest "
        f"to {result.uri}"
    )
