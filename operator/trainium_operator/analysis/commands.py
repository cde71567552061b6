"""`trainium-operator profile ...`: summarise, export and upload profiles.

The commands that read a profile through this package (report, export) and the upload live
here; `profile serve` and `profile ls`, which read through the web UI's profile store, are the
`ui` package's (`ui/commands.py`), and the console script adds them to this group.
"""

from __future__ import annotations

import json
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


def local_profile(source: str | Path) -> Path:
    """The directory to load: `source` itself, or the S3 profile downloaded into the cache."""
    if isinstance(source, Path):
        return source
    from trainium_operator.analysis.s3store import fetch_uri
    from trainium_operator.profiler.s3 import S3ProfileError, parse_s3_uri

    try:
        return fetch_uri(parse_s3_uri(source))
    except S3ProfileError as exc:
        raise click.ClickException(str(exc)) from exc


def parse_ranks(text: str | None) -> frozenset[int] | None:
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
        loaded = load_profile(local_profile(directory), workers=workers)
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
        loaded = load_profile(local_profile(directory), workers=workers)
    except ProfileLoadError as exc:
        raise click.ClickException(str(exc)) from exc
    options = ExportOptions(from_step, to_step, parse_ranks(ranks))
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
