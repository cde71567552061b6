"""The chaos suite's checks see the defects they are for, on hand-made observations (no cluster):
a check that cannot fail would pass a broken operator."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from chaos import checks

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def pod(
    uid: str, *, attempt: int = 0, rank: int = 0, node: str | None = "n-1", phase: str = "Running"
) -> checks.PodSeen:
    return checks.PodSeen(
        name=f"j-train-{attempt}-{rank}", uid=uid, job="j", stage="train", attempt=attempt,
        rank=rank, node=node, phase=phase, deleting=False,
    )  # fmt: skip


def event(reason: str, seconds: float, kind: str = "Normal", message: str = "") -> checks.EventSeen:
    return checks.EventSeen(kind, reason, message or reason, T0 + timedelta(seconds=seconds))


def test_a_scheduled_rank_recreated_as_another_pod_is_two_gangs_on_one_attempt() -> None:
    ledger = checks.Ledger()
    checks.check_pods([pod("uid-a")], {"j": 1}, ledger)
    checks.check_pods([pod("uid-a")], {"j": 1}, ledger)
    assert ledger.violations == []
    # Force-deleted, then re-created with the same attempt (before it is even scheduled).
    checks.check_pods([pod("uid-b", node=None, phase="Pending")], {"j": 1}, ledger)
    checks.check_pods([pod("uid-b", node="n-2")], {"j": 1}, ledger)
    assert len(ledger.violations) == 1, "reported once per pod"
    assert "rank 0 was scheduled as j-train-0-0@n-1 (uid uid-a)" in ledger.violations[0]
    assert "two gangs write to attempt 0" in ledger.violations[0]


def test_a_rank_recreated_before_it_was_ever_scheduled_is_no_second_gang() -> None:
    ledger = checks.Ledger()
    checks.check_pods([pod("uid-a", node=None, phase="Pending")], {"j": 1}, ledger)
    checks.check_pods([pod("uid-b")], {"j": 1}, ledger)
    checks.check_pods([pod("uid-c", attempt=1)], {"j": 1}, ledger)
    assert ledger.violations == []


def test_two_attempts_alive_at_once_is_a_violation_and_full_gangs_are_counted() -> None:
    ledger = checks.Ledger()
    gang = [pod("a0", rank=0), pod("a1", rank=1)]
    checks.check_pods(gang, {"j": 2}, ledger)
    assert ledger.full_gangs == {("j", "train", 0): 2}
    checks.check_pods([*gang, pod("b0", attempt=1, node=None, phase="Pending")], {"j": 2}, ledger)
    assert ledger.violations == ["[start] j: pods of attempts [0, 1] alive at once"]


def test_restart_counts_must_match_the_attempt_and_a_trained_attempt_never_pends() -> None:
    ledger = checks.Ledger()
    restarts = {"total": 1, "application": 1, "infrastructure": 0}
    checks.check_status(
        "j", {"attempt": 1, "phase": "Training", "restarts": restarts}, set(), ledger
    )
    assert ledger.violations == []
    checks.check_status(
        "j", {"attempt": 2, "phase": "Training", "restarts": restarts}, set(), ledger
    )
    assert ledger.violations == ["[start] j: attempt 2 but 1 restarts counted"]
    ledger = checks.Ledger()
    training = {"attempt": 0, "phase": "Training", "restarts": {"total": 0}}
    checks.check_status("j", training, {0}, ledger)
    waiting = {**training, "phase": "Pending", "reason": "WaitingForGang", "message": "1/2 ready"}
    checks.check_status("j", waiting, {0}, ledger)
    assert ledger.violations == [
        "[start] j: went back from Training to Pending in attempt 0 (WaitingForGang: 1/2 ready)"
    ]
    # A restart's next gang waiting in the queue is a new attempt: no regression.
    ledger = checks.Ledger()
    checks.check_status("j", training, {0}, ledger)
    split = {"total": 1, "application": 0, "infrastructure": 1}
    checks.check_status("j", {"attempt": 1, "phase": "Pending", "restarts": split}, {1}, ledger)
    assert ledger.violations == []


SUCCEEDED = {"phase": "Succeeded", "reason": "TrainingSucceeded"}


def test_an_event_newer_than_the_final_state_describing_an_older_one_is_a_violation() -> None:
    clean = [event("GangRunning", 0), event("WaitingForGang", 1), event("TrainingSucceeded", 2)]
    assert checks.final_event_violations("j", SUCCEEDED, clean) == []
    stale = [event("GangRunning", 0), event("TrainingSucceeded", 1), event("WaitingForGang", 2)]
    [found] = checks.final_event_violations("j", SUCCEEDED, stale)
    assert "ended Succeeded/TrainingSucceeded but its newest event" in found
    assert "WaitingForGang" in found


def test_a_tie_to_the_second_with_an_older_state_is_a_violation() -> None:
    tied = [event("WaitingForGang", 1), event("TrainingSucceeded", 1)]
    [found] = checks.final_event_violations("j", SUCCEEDED, tied)
    assert "tied to the second" in found
    assert checks.final_event_violations("j", SUCCEEDED, []) == [
        "j: ended Succeeded/TrainingSucceeded without any event about it"
    ]


def test_upload_events_are_judged_against_the_upload_state_not_the_phase() -> None:
    status = {**SUCCEEDED, "profile": {"upload": {"state": "Failed"}}}
    events = [event("TrainingSucceeded", 1), event("ProfileUploadFailed", 1, "Warning")]
    assert checks.final_event_violations("j", status, events) == []
    events = [event("TrainingSucceeded", 1), event("ProfileUploaded", 2)]
    [found] = checks.final_event_violations("j", status, events)
    assert "status.profile.upload is Failed but the newest upload event is" in found


def test_any_warning_on_a_control_job_is_a_violation() -> None:
    assert checks.warning_violations("ctl", [event("GangRunning", 0)]) == []
    [found] = checks.warning_violations("ctl", [event("Unschedulable", 0, "Warning", "2/0 tasks")])
    assert "ctl (a control job no fault targeted) has Warning events" in found


def test_a_control_jobs_true_report_of_a_node_that_went_notready_on_its_own_is_no_violation() -> (
    None
):
    lost = event("NodeLost", 0, "Warning", "node n-3 is NotReady; pod ctl-train-0-0 (rank 0) lost")
    assert checks.warning_violations("ctl", [lost], frozenset({"n-3"})) == []
    # Any other node's, or any other Warning, still is one.
    assert checks.warning_violations("ctl", [lost], frozenset({"n-4"}))
    other = event("Unschedulable", 0, "Warning", "2/0 tasks")
    assert checks.warning_violations("ctl", [lost, other], frozenset({"n-3"}))


def refused_status(**changes: Any) -> dict[str, Any]:
    message = "the upload pod p-profile-upload-0 was refused by the API server: exceeded quota"
    record = {
        "attempt": 0,
        "state": "Failed",
        "reason": "PodRefused",
        "pod": "p-profile-upload-0",
        "message": message,
    }
    status = {
        **SUCCEEDED,
        "profile": {"upload": record},
        "profileUploads": [record],
    }
    return {**status, **changes}


def test_a_refused_side_pod_must_leave_the_job_succeeded_and_say_so_in_the_upload() -> None:
    warning = event("ProfileUploadFailed", 1, "Warning")
    assert checks.side_pod_refusal_violations("p", refused_status(), [warning]) == []
    pending = refused_status(phase="Pending", reason="AdmissionRejected", message="refused")
    found = checks.side_pod_refusal_violations("p", pending, [warning])
    assert found == ["p: upload pods refused and the job ended Pending/AdmissionRejected: refused"]
    found = checks.side_pod_refusal_violations("p", refused_status(), [])
    assert found == ["p: no ProfileUploadFailed Warning event"]
    leaked = event("AdmissionRejected", 1, "Warning", "Pod p-profile-upload-0 was refused")
    found = checks.side_pod_refusal_violations("p", refused_status(), [warning, leaked])
    [found_leak] = found
    assert "reached the job's own events" in found_leak


def test_events_are_sorted_as_kubectl_sorts_them() -> None:
    later = T0 + timedelta(seconds=5)
    series = SimpleNamespace(last_observed_time=later)

    def core_event(**fields: Any) -> Any:
        values = {"type": "Normal", "reason": "R", "message": "", "series": None}
        values |= {"last_timestamp": None, "event_time": None, **fields}
        return SimpleNamespace(**values)

    assert checks.EventSeen.of(core_event(series=series, last_timestamp=T0)).time == later
    assert checks.EventSeen.of(core_event(last_timestamp=T0, event_time=later)).time == T0
    assert checks.EventSeen.of(core_event(event_time=later)).time == later
