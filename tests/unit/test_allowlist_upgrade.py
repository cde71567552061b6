"""Upgrading to the pod-field allowlist (api/pod_fields.py): a job an older operator admitted
with a field now refused keeps running. The operator leaves its pods alone, names the fields in
one Warning, and builds later pods without them (docs/jobs.md, "Upgrading")."""

from __future__ import annotations

from unit.test_reconciler_writes import NAME, running_gang

OLD_FIELDS = {
    "podTemplate": {
        "spec": {
            "serviceAccount": "ci-admin",
            "volumes": [{"name": "nas", "nfs": {"server": "10.0.0.9", "path": "/"}}],
        }
    }
}


def test_a_running_job_with_a_refused_field_keeps_its_pods_and_gets_one_warning_naming_it() -> None:
    cluster, reconciler = running_gang()
    # What an older operator and CRD admitted (the CRD of this version drops such fields).
    cluster.update("TrainingJob", NAME, {"spec": OLD_FIELDS})

    for _ in range(3):
        reconciler.reconcile("team-a", NAME)

    assert cluster.job(NAME)["status"]["phase"] == "Training"
    assert not cluster.of("delete"), "the running gang is left alone"
    warnings = [e for e in cluster.events if e["reason"] == "PodFieldsDropped"]
    assert len(warnings) == 1
    assert warnings[0]["type"] == "Warning"
    assert warnings[0]["message"].startswith(
        "spec.podTemplate.spec.serviceAccount, spec.podTemplate.spec.volumes[0].nfs: no longer "
        "allowed in spec.podTemplate"
    )
