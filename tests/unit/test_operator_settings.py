"""`trainium-operator run` gathers every setting from its flags, with the chart's env names as
fallbacks, into one frozen OperatorSettings; nothing below the CLI reads the environment."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from trainium_operator.builders.upload import UploadPodSettings
from trainium_operator.controller import commands, settings, wiring
from trainium_operator.controller.settings import HealthSettings, OperatorSettings

PACKAGE = Path(commands.__file__).resolve().parents[1]
ENV_NAMES = [value for name, value in vars(settings).items() if name.startswith("ENV_")]
# The training pods' own contract: it reads the pod's environment, not the operator's.
READS_ENV_BY_DESIGN = {"api/workload_env.py"}


def settings_of(args: list[str], env: dict[str, str] | None = None) -> OperatorSettings:
    """The settings `run` would start the operator with (the operator itself is not run)."""
    started: list[OperatorSettings] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wiring, "run_operator", started.append)
        # Every env name the CLI knows unset, then `env`: the test's shell does not leak in.
        result = CliRunner().invoke(
            commands.run, args, env={**dict.fromkeys(ENV_NAMES), **(env or {})}
        )
    assert result.exit_code == 0, result.output
    (chosen,) = started
    return chosen


def test_the_charts_env_names_set_what_the_flags_would() -> None:
    chosen = settings_of(
        [],
        {
            "TRAINIUM_RESERVED_SERVICE_ACCOUNTS": " a, b ,,c ",
            "TRAINIUM_JOB_NETWORK_POLICY": "false",
            "TRAINIUM_PROFILE_S3_URI": "s3://chart-default/p",
            "TRAINIUM_OPERATOR_IMAGE": "reg/op@sha256:abc",
            "TRAINIUM_OPERATOR_IMAGE_PULL_POLICY": "Always",
            "TRAINIUM_OPERATOR_IMAGE_PULL_SECRETS": "a, b,",
            "TRAINIUM_PROFILE_UPLOAD_SERVICE_ACCOUNT": "trn-profile-upload",
        },
    )

    assert chosen.reserved_service_accounts == {"a", "b", "c"}
    assert chosen.isolate_jobs is False
    assert chosen.upload.s3_uri == "s3://chart-default/p"
    assert chosen.upload.pod_settings() == UploadPodSettings(
        image="reg/op@sha256:abc",
        image_pull_policy="Always",
        image_pull_secrets=("a", "b"),
        service_account="trn-profile-upload",
    )


def test_without_flags_or_env_the_operator_runs_with_the_defaults() -> None:
    chosen = settings_of([])

    assert chosen == OperatorSettings()
    assert chosen.isolate_jobs is True, "every job isolated unless the chart turns it off"
    assert chosen.reserved_service_accounts == frozenset()
    # Outside the chart: the chart's default image of this version, never the job's.
    assert chosen.upload.pod_settings().image == "trainium-operator:0.1.0"


def test_a_flag_wins_over_its_env_fallback() -> None:
    chosen = settings_of(
        ["--no-job-network-policy", "--reserved-service-accounts=x"],
        {"TRAINIUM_JOB_NETWORK_POLICY": "true", "TRAINIUM_RESERVED_SERVICE_ACCOUNTS": "y"},
    )

    assert (chosen.isolate_jobs, chosen.reserved_service_accounts) == (False, {"x"})


def test_the_health_channel_defaults_to_a_local_url_and_peering_to_a_random_priority() -> None:
    chosen = settings_of(["--health-port=8090", "--peering=p", "--peering-lifetime=5"])

    assert chosen.health == HealthSettings(8090, "http://127.0.0.1:8090/v1/progress")
    assert chosen.peering is not None
    assert (chosen.peering.name, chosen.peering.lifetime) == ("p", 5)
    assert chosen.peering.priority >= 1, "0 would tie with another replica's default"


def test_the_operator_learns_its_own_pod_from_its_flags_both_or_neither() -> None:
    chosen = settings_of(["--pod-name=op-7d9-abcde", "--pod-namespace=trainium-system"])
    assert chosen.own_pod == settings.OwnPod("trainium-system", "op-7d9-abcde")
    assert settings_of([]).own_pod is None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wiring, "run_operator", lambda _settings: None)
        result = CliRunner().invoke(commands.run, ["--pod-name=op"], env=dict.fromkeys(ENV_NAMES))
    assert result.exit_code != 0
    assert "--pod-name and --pod-namespace go together" in result.output


def test_topology_is_written_for_the_schedulers_the_chart_names() -> None:
    assert settings_of([], {"TRAINIUM_TOPOLOGY": "volcano,kueue"}).topology == {"volcano", "kueue"}
    assert settings_of(["--topology", "kueue"]).topology == {"kueue"}
    assert settings_of([], {"TRAINIUM_TOPOLOGY": ""}).topology == frozenset()


def test_an_unknown_topology_scheduler_is_refused_naming_the_choices() -> None:
    result = CliRunner().invoke(
        commands.run, ["--topology", "volcano,slurm"], env=dict.fromkeys(ENV_NAMES)
    )

    assert result.exit_code != 0
    assert "slurm" in result.output
    assert "volcano, kueue" in result.output


def test_the_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        OperatorSettings().workers = 8  # type: ignore[misc]


def test_nothing_below_the_cli_reads_the_environment() -> None:
    reads = re.compile(r"\bos\.environ\b|\bgetenv\b|\benviron\b\s*(\[|\.get)")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for layer in ("controller", "lifecycle", "api", "builders")
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        if str(path.relative_to(PACKAGE)) not in READS_ENV_BY_DESIGN
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if reads.search(line)
    ]
    assert found == [], "settings come from the CLI (controller/settings.py), not the env"


def test_every_log_format_the_cli_offers_is_one_kopf_configures() -> None:
    import kopf

    assert settings_of(["--log-format", "full"]).log_format == "full"
    assert {kopf.LogFormat[name.upper()] for name in settings.LOG_FORMATS} == set(kopf.LogFormat)
