"""The operator's own tenancy check: a job never runs as one of the chart's accounts, which the
operator is given (`run --reserved-service-accounts`, the chart's
TRAINIUM_RESERVED_SERVICE_ACCOUNTS) and hands to the spec model's validation context (the
admission policy refuses them too; this holds when the policy is not installed)."""

from __future__ import annotations

import pytest

from trainium_operator.builders.job import JobRef
from trainium_operator.lifecycle.parse import parse_job
from unit.jobs import job_document

CHART_ACCOUNTS = frozenset(
    {"trn-trainium-operator", "trn-trainium-operator-profile-ui", "s3-upload"}
)


@pytest.mark.parametrize("account", sorted(CHART_ACCOUNTS))
def test_a_job_running_as_one_of_the_charts_accounts_is_an_invalid_spec_naming_the_field(
    account: str,
) -> None:
    problems = parse_job(
        job_document(serviceAccountName=account), reserved_service_accounts=CHART_ACCOUNTS
    )

    assert problems == [
        f"spec.serviceAccountName: {account} is an account of the trainium-operator "
        "itself (operator, profile UI or profile upload); no job may run as it"
    ]


def test_other_accounts_and_the_default_run_as_given() -> None:
    for spec in ({"serviceAccountName": "team-runner"}, {}):
        parsed = parse_job(job_document(**spec), reserved_service_accounts=CHART_ACCOUNTS)
        assert isinstance(parsed, JobRef)


def test_without_the_charts_setting_no_account_is_reserved_whatever_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The spec model reads no environment: `render` answers the same in every shell.
    monkeypatch.setenv("TRAINIUM_RESERVED_SERVICE_ACCOUNTS", ",".join(CHART_ACCOUNTS))

    assert isinstance(parse_job(job_document(serviceAccountName="trn-trainium-operator")), JobRef)
