from __future__ import annotations

from trainium_operator.ui.jobs import listed_jobs


def test_every_job_is_listed_newest_first_with_whether_profiling_is_on() -> None:
    def item(name: str, created: str, enabled: bool, path: str | None = None) -> dict[str, object]:
        status = {"phase": "Training", "profile": {"path": path}} if path else {}
        return {
            "metadata": {"name": name, "namespace": "ml", "creationTimestamp": created},
            "spec": {"profile": {"enabled": enabled}},
            "status": status,
        }

    jobs = listed_jobs(
        [
            item("old", "2026-11-01T00:00:00Z", True),
            item("off", "2026-11-03T00:00:00Z", False),
            item("new", "2026-11-02T00:00:00Z", True, "/data/profiles/ml/new/0"),
        ]
    )
    assert [(j.name, j.profiling) for j in jobs] == [("off", False), ("new", True), ("old", True)]
    assert jobs[1].profile_path == "/data/profiles/ml/new/0"
    assert jobs[1].status == "Training"
    assert jobs[1].live.health == "healthy"
    assert jobs[2].status == "Pending"
    assert jobs[2].live.health == "inactive"


def test_a_job_without_spec_or_status_is_listed_pending_and_unprofiled() -> None:
    (job,) = listed_jobs([{"metadata": {"name": "bare", "namespace": "ml"}}])
    assert (job.status, job.profiling, job.live.step) == ("Pending", False, None)
