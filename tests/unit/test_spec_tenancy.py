"""The operator's own tenancy check: a job never runs as one of the chart's accounts, which the
chart passes in TRAINIUM_RESERVED_SERVICE_ACCOUNTS (the admission policy refuses them too; this
holds when the policy is not installed)."""

from __future__ import annotations

import pytest

from trainium_operator.api.spec import RESERVED_SERVICE_ACCOUNTS_ENV, reserved_service_accounts
from trainium_operator.builders.job import JobRef
from trainium_operator.lifecycle.parse import parse_job
from unit.jobs import job_document

CHART_ACCOUNTS = "trn-trainium-operator,trn-trainium-operator-profile-ui,s3-upload"


@pytest.mark.parametrize(
    "account", ["trn-trainium-operator", "trn-trainium-operator-profile-ui", "s3-upload"]
)
def test_a_job_running_as_one_of_the_charts_accounts_is_an_invalid_spec_naming_the_field(
    monkeypatch: pytest.MonkeyPatch, account: str
) -> None:
    monkeypatch.setenv(RESERVED_SERVICE_ACCOUNTS_ENV, CHART_ACCOUNTS)

    problems = parse_job(job_document(serviceAccountName=account))

    assert problems == [
        f"spec.serviceAccountName: {account} is an account of the trainium-operator "
        "itself (operator, profile UI or profile upload); no job may run as it"
    ]


def test_other_accounts_and_the_default_run_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RESERVED_SERVICE_ACCOUNTS_ENV, CHART_ACCOUNTS)

    for spec in ({"serviceAccountName": "team-runner"}, {}):
        assert isinstance(parse_job(job_document(**spec)), JobRef)


def test_without_the_charts_setting_no_account_is_reserved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RESERVED_SERVICE_ACCOUNTS_ENV, raising=False)

    assert isinstance(parse_job(job_document(serviceAccountName="trn-trainium-operator")), JobRef)


def test_the_setting_is_a_comma_separated_list_of_names() -> None:
    environ = {RESERVED_SERVICE_ACCOUNTS_ENV: " a, b ,,c "}

    assert reserved_service_accounts(environ) == {"a", "b", "c"}
    assert reserved_service_accounts({}) == frozenset()
