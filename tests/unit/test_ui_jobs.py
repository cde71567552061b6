from __future__ import annotations

from trainium_operator.ui.jobs import profiled_jobs


def test_only_jobs_with_profiling_on_are_listed_newest_first() -> None:
    def item(name: str, created: str, enabled: bool, path: str | None = None) -> dict[str, object]:
        status = {"phase": "Training", "profile": {"path": path}} if path else {}
        return {
            "metadata": {"name": name, "namespace": "ml", "creationTimestamp": created},
            "spec": {"profile": {"enabled": enabled}},
            "status": status,
        }

    jobs = profiled_jobs(
        [
            item("old", "2026-11-01T00:00:00Z", True),
            item("off", "2026-11-03T00:00:00Z", False),
            item("new", "2026-11-02T00:00:00Z", True, "/data/profiles/ml/new/0"),
        ]
    )
    assert [j.name for j in jobs] == ["new", "old"]
    assert jobs[0].profile_path == "/data/profiles/ml/new/0"
    assert jobs[0].status == "Training"
    assert jobs[1].status == "Pending"
