"""The chart's tenancy objects as rendered: the admission policy checking TrainingJob authors,
its binding, the accounts it reserves (the same list the operator gets), and the workload
namespace with its Pod Security labels. The policy's behaviour on a real API server is
tests/integration/test_tenancy.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chart.chart_harness import FULLNAME, RELEASE_NAMESPACE, Manifest, find, helm, one, render
from chart.chart_harness import template_args as chart_template_args
from trainium_operator.api import kueue, pod_fields

POLICY = f"{FULLNAME}-tenancy"
RIGHTS = ("privileged", "hostnamespaces", "hostpath", "capabilities")


def policy(manifests: list[Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = one(manifests, "ValidatingAdmissionPolicy", POLICY)["spec"]
    return spec


def expressions(manifests: list[Manifest]) -> list[str]:
    return [v["expression"] for v in policy(manifests)["validations"]]


def operator_env(manifests: list[Manifest]) -> dict[str, str]:
    deployment = one(manifests, "Deployment", FULLNAME)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_defaults_keep_jobs_out_of_the_release_namespace_and_check_every_right(
    tmp_path: Path,
) -> None:
    manifests = render({}, tmp_path)
    spec = policy(manifests)
    binding = one(manifests, "ValidatingAdmissionPolicyBinding", POLICY)["spec"]

    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["trainium.dev"],
            "apiVersions": ["*"],
            "resources": ["trainingjobs"],
            "operations": ["CREATE", "UPDATE"],
        }
    ]
    assert f"request.namespace != '{RELEASE_NAMESPACE}'" in expressions(manifests)
    for right in RIGHTS:
        assert any(f"subresource('{right}')" in e for e in expressions(manifests)), right
    assert any("resource('serviceaccounts')" in e for e in expressions(manifests))
    assert binding == {"policyName": POLICY, "validationActions": ["Deny"]}
    assert one(manifests, "Deployment", FULLNAME)["metadata"]["namespace"] == RELEASE_NAMESPACE
    # Add-ons go where the jobs run, which by default is not beside the operator.
    rendered = render({"etcd": {"enabled": True}}, tmp_path)
    assert one(rendered, "Service", "etcd-server")["metadata"]["namespace"] == "trainium-jobs"


def test_every_refusal_names_a_field_and_the_permission_that_would_allow_it(
    tmp_path: Path,
) -> None:
    spec = policy(render({}, tmp_path))
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    messages = [v.get("message") or v["messageExpression"] for v in spec["validations"]]

    assert all(v["reason"] == "Forbidden" for v in spec["validations"])
    for right in RIGHTS:
        (message,) = [m for m in messages if f"trainingjobs/{right}" in m]
        assert 'needs verb "use"' in message
        # The message starts with the offending fields, which its variable spells out.
        fields = message.split(".join(")[0].removeprefix("variables.")
        assert "'spec.podTemplate.spec." in variables[fields], right
    (account,) = [m for m in messages if "resourceName" in m and "serviceaccounts" in m]
    assert account.startswith("'spec.serviceAccountName: '")
    assert 'needs verb "use" on serviceaccounts' in " ".join(account.split())


@pytest.mark.parametrize(
    ("values", "reserved"),
    [
        pytest.param({}, [FULLNAME], id="defaults"),
        pytest.param(
            {
                "profileUI": {"enabled": True},
                "profileUpload": {"serviceAccount": {"create": True}},
            },
            [FULLNAME, f"{FULLNAME}-profile-ui", f"{FULLNAME}-profile-upload"],
            id="ui-and-created-upload-account",
        ),
        pytest.param(
            {"profileUpload": {"serviceAccount": {"name": "s3-writer"}}},
            [FULLNAME, "s3-writer"],
            id="named-upload-account",
        ),
        # An operator running as its namespace's `default` is kept from jobs by the namespace
        # rule; refusing `default` everywhere would refuse every job that names no account.
        pytest.param({"serviceAccount": {"create": False}}, [], id="operator-as-default"),
    ],
)
def test_the_charts_own_accounts_are_reserved_in_the_policy_and_for_the_operator(
    values: dict[str, Any], reserved: list[str], tmp_path: Path
) -> None:
    manifests = render(values, tmp_path)
    quoted = "[" + ",".join(f"'{name}'" for name in reserved) + "]"

    assert f"!(variables.serviceAccount in {quoted})" in expressions(manifests)
    assert operator_env(manifests)["TRAINIUM_RESERVED_SERVICE_ACCOUNTS"] == ",".join(reserved)


def test_a_namespaced_operator_binds_the_policy_to_its_namespaces_only(tmp_path: Path) -> None:
    manifests = render({"watchNamespaces": ["team-a", "team-b"]}, tmp_path)
    binding = one(manifests, "ValidatingAdmissionPolicyBinding", POLICY)["spec"]

    assert binding["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "In",
            "values": ["team-a", "team-b", RELEASE_NAMESPACE],
        }
    ]


def test_jobs_may_be_allowed_in_the_release_namespace_and_the_policy_turned_off(
    tmp_path: Path,
) -> None:
    allowed = render({"tenancy": {"allowJobsInReleaseNamespace": True}}, tmp_path)
    assert not any("request.namespace !=" in e for e in expressions(allowed))
    assert any("subresource('privileged')" in e for e in expressions(allowed))

    off = render({"tenancy": {"admissionPolicy": {"enabled": False}}}, tmp_path)
    assert find(off, "ValidatingAdmissionPolicy") == []
    assert find(off, "ValidatingAdmissionPolicyBinding") == []

    warn = render(
        {"tenancy": {"admissionPolicy": {"validationActions": ["Warn", "Audit"]}}}, tmp_path
    )
    binding = one(warn, "ValidatingAdmissionPolicyBinding", POLICY)["spec"]
    assert binding["validationActions"] == ["Warn", "Audit"]


def test_only_a_created_workload_namespace_gets_pod_security_labels(tmp_path: Path) -> None:
    assert find(render({}, tmp_path), "Namespace") == []

    namespace = one(
        render({"createWorkloadNamespace": True}, tmp_path), "Namespace", "trainium-jobs"
    )
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"
    assert namespace["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

    unlabelled = render(
        {
            "createWorkloadNamespace": True,
            "tenancy": {"podSecurity": {"enforce": "", "warn": "", "audit": ""}},
        },
        tmp_path,
    )
    assert not any(
        key.startswith("pod-security.kubernetes.io/")
        for key in one(unlabelled, "Namespace", "trainium-jobs")["metadata"]["labels"]
    )


def test_creating_the_release_namespace_as_the_workload_namespace_is_refused(
    tmp_path: Path,
) -> None:
    values = {"createWorkloadNamespace": True, "workloadNamespace": RELEASE_NAMESPACE}
    result = helm(*chart_template_args(values, tmp_path), check=False)

    assert result.returncode != 0
    assert (
        "createWorkloadNamespace needs a workloadNamespace other than the release" in result.stderr
    )


def test_an_unknown_pod_security_level_is_refused_by_the_schema(tmp_path: Path) -> None:
    values = {"tenancy": {"podSecurity": {"enforce": "strict"}}}
    result = helm(*chart_template_args(values, tmp_path), check=False)

    assert result.returncode != 0
    assert "enforce" in result.stderr


def test_straggler_replacement_is_refused_unless_the_chart_turns_it_on_and_rbac_grants_it(
    tmp_path: Path,
) -> None:
    def replace_rule(values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        manifests = render(values, tmp_path)
        (rule,) = [v for v in policy(manifests)["validations"] if "onStraggler" in v["expression"]]
        deployment = one(manifests, "Deployment", FULLNAME)
        return rule, deployment["spec"]["template"]["spec"]["containers"][0]["args"]

    off, off_args = replace_rule({})
    assert off["expression"] == "object.spec.?health.?onStraggler.orValue('Report') != 'Replace'"
    assert "spec.health.onStraggler: Replace is off in this cluster" in off["message"]
    assert "health.stragglerReplacement.enabled" in off["message"]
    assert not [a for a in off_args if a.startswith("--straggler-cordon-budget")]

    on, on_args = replace_rule(
        {"health": {"stragglerReplacement": {"enabled": True, "maxCordonedNodes": 3}}}
    )
    assert "subresource('stragglerreplacement')" in on["expression"]
    assert "check('use').allowed()" in on["expression"]
    assert 'needs verb "use" on trainingjobs/stragglerreplacement' in on["messageExpression"]
    assert "--straggler-cordon-budget=3" in on_args


def test_the_policys_volume_types_are_the_operators_allowlist(tmp_path: Path) -> None:
    """One list (api/pod_fields.py): the policy refuses a volume type the CRD and the operator
    refuse, for a cluster whose CRD is older than the allowlist."""
    variables = {v["name"]: v["expression"] for v in policy(render({}, tmp_path))["variables"]}

    listed = variables["volumeTypeFields"].split("!(k in [")[1].split("])")[0]

    assert {name.strip("'") for name in listed.split(",")} == {"name", *pod_fields.VOLUME_TYPES}


def test_every_secret_and_claim_check_names_the_fields_the_object_and_the_right(
    tmp_path: Path,
) -> None:
    spec = policy(render({}, tmp_path))
    checks = [v for v in spec["validations"] if "check('get')" in v["expression"]]
    secrets = [v for v in checks if "resource('secrets')" in v["expression"]]
    claims = [v for v in checks if "resource('persistentvolumeclaims')" in v["expression"]]

    # One authorizer check per validation: each costs a third of an expression's budget.
    assert all(v["expression"].count("authorizer.") == 1 for v in checks)
    assert len(secrets) == 8
    assert len(claims) == 4
    for check in secrets + claims:
        message = " ".join(check["messageExpression"].split())
        assert message.startswith("variables.secretFields.filter(") or message.startswith(
            "variables.claimFields.filter("
        )
        assert 'needs verb "get" on' in message
        assert "resourceName ' + variables.distinct" in message


def test_a_priority_class_needs_a_grant_and_queues_only_where_the_chart_lists_open_ones(
    tmp_path: Path,
) -> None:
    def rules(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
        found = {}
        for rule in policy(render(values, tmp_path))["validations"]:
            for field in ("variables.priorityClass", "variables.queue"):
                if rule["expression"].startswith(field) or f"\n{field}" in rule["expression"]:
                    found[field] = rule
        return found

    defaults = rules({})
    assert set(defaults) == {"variables.priorityClass"}, "queues are open by default"
    priority = defaults["variables.priorityClass"]["expression"]
    assert "resource('priorityclasses')" in priority
    assert "check('use').allowed()" in priority
    message = defaults["variables.priorityClass"]["messageExpression"]
    assert "spec.scheduling.priorityClassName" in message
    assert 'needs verb "use" on priorityclasses' in message

    listed = rules(
        {"tenancy": {"scheduling": {"openQueues": ["default"], "openPriorityClasses": ["*"]}}}
    )
    assert set(listed) == {"variables.queue"}
    assert "variables.queue in ['default']" in listed["variables.queue"]["expression"]
    assert "resource('queues')" in listed["variables.queue"]["expression"]
    assert "spec.scheduling.queue" in listed["variables.queue"]["messageExpression"]


def workload_priority_rule(manifests: list[Manifest]) -> dict[str, Any] | None:
    rules = [
        rule
        for rule in policy(manifests)["validations"]
        if "resource('workloadpriorityclasses')" in rule["expression"]
    ]
    assert len(rules) <= 1
    return rules[0] if rules else None


def test_a_workload_priority_class_needs_a_grant_unless_the_chart_lists_it_open(
    tmp_path: Path,
) -> None:
    """Mirrors the PriorityClass rule: Kueue's class (a TrainingJob label) lets a gang preempt
    other teams' Workloads."""
    spec = policy(render({}, tmp_path))
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    # The label the operator reads the class from.
    assert variables["workloadPriorityClass"] == (
        f"object.metadata.?labels[?'{kueue.PRIORITY_CLASS_LABEL}'].orValue('')"
    )

    rule = workload_priority_rule(render({}, tmp_path))
    assert rule is not None
    expression = " ".join(rule["expression"].split())
    assert expression.startswith("variables.workloadPriorityClass == '' ||")
    assert "variables.workloadPriorityClass in [] ||" in expression
    assert (
        "authorizer.group('kueue.x-k8s.io').resource('workloadpriorityclasses')"
        ".namespace(request.namespace).name(variables.workloadPriorityClass)"
        ".check('use').allowed()"
    ) in expression
    message = " ".join(rule["messageExpression"].split())
    assert message.startswith("'metadata.labels[kueue.x-k8s.io/priority-class]: ' + variables.user")
    assert 'needs verb "use" on workloadpriorityclasses (API group kueue.x-k8s.io)' in message
    assert message.endswith("variables.workloadPriorityClass + variables.grantHint")

    listed = workload_priority_rule(
        render({"tenancy": {"scheduling": {"openWorkloadPriorityClasses": ["low"]}}}, tmp_path)
    )
    assert listed is not None
    assert "variables.workloadPriorityClass in ['low']" in listed["expression"]
    open_to_all = render(
        {"tenancy": {"scheduling": {"openWorkloadPriorityClasses": ["*"]}}}, tmp_path
    )
    assert workload_priority_rule(open_to_all) is None


def test_an_update_that_only_changes_the_workload_priority_class_is_checked(
    tmp_path: Path,
) -> None:
    """The class is a label, not spec: without this a job created without it could be given a
    higher class by a metadata patch; other metadata changes stay unchecked."""
    (condition,) = policy(render({}, tmp_path))["matchConditions"]
    expression = " ".join(condition["expression"].split())

    assert expression.startswith(
        "request.operation == 'CREATE' || object.spec != oldObject.spec ||"
    )
    label = kueue.PRIORITY_CLASS_LABEL
    assert (
        f"object.metadata.?labels[?'{label}'].orValue('') != "
        f"oldObject.metadata.?labels[?'{label}'].orValue('')"
    ) in expression


def test_preflight_cordon_is_refused_unless_the_chart_turns_cordons_on_and_rbac_grants_it(
    tmp_path: Path,
) -> None:
    def cordon_rule(values: dict[str, Any]) -> dict[str, Any]:
        manifests = render(values, tmp_path)
        (rule,) = [v for v in policy(manifests)["validations"] if "onUnfit" in v["expression"]]
        return rule

    off = cordon_rule({})
    assert off["expression"] == "object.spec.?preflight.?onUnfit.orValue('Exclude') != 'Cordon'"
    assert "spec.preflight.onUnfit: Cordon is off in this cluster" in off["message"]
    on = cordon_rule({"health": {"stragglerReplacement": {"enabled": True}}})
    assert "subresource('stragglerreplacement')" in on["expression"]
    assert 'needs verb "use" on trainingjobs/stragglerreplacement' in on["messageExpression"]
