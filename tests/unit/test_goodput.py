"""status.goodput (lifecycle/policies/goodput.py): wall time split into queued, compiling, training,
restarting, suspended and lost; restart-safe because it is accounted from the stored status."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from trainium_operator.api.status import validated_status
from trainium_operator.contract.channel import ProgressMessage, parse_message
from trainium_operator.lifecycle.policies.goodput import PARTS, figures_at, with_goodput
from trainium_operator.lifecycle.ranks import RankSample
from trainium_operator.profiler.channel import ChannelConfig, Reporter
from unit.jobs import job_ref
from unit.test_progress import shown_progress
from unit.test_reconciler_writes import KEY, NAME, end_pod, running_gang
from unit.test_reconciler_writes import NOW as RECONCILER_NOW

Obj = dict[str, Any]
CREATED = datetime(2026, 12, 3, 9, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return CREATED + timedelta(seconds=seconds)


def step_to(stored: Obj, seconds: float, phase: str | None = None, **changes: Any) -> Obj:
    """One reconcile pass at `seconds` after creation whose new status is `stored` with
    `changes` (and `phase`); the status as it is stored after the pass's write."""
    new = {k: v for k, v in stored.items() if k != "goodput"}
    if stored.get("goodput") is not None:
        new["goodput"] = stored["goodput"]
    if phase is not None:
        new["phase"] = phase
    new.update(changes)
    return validated_status(with_goodput(stored, new, at(seconds), CREATED))


def figures(status: Obj) -> dict[str, float]:
    goodput = status["goodput"]
    return {key: goodput[key] for key in (*PARTS, "wallSeconds")}


def progress_of(attempt: int, step: int, checkpoint: int | None, p50_ms: float = 500.0) -> Obj:
    out: Obj = {"attempt": attempt, "step": step, "stepTimeP50Ms": p50_ms}
    if checkpoint is not None:
        out["lastCheckpointStep"] = checkpoint
    return out


def run_with_one_restart(checkpoint: int | None) -> list[Obj]:
    """Queued 10 s (the operator saw the job 10 s after its creation) + 20 s, compiled 100 s,
    trained 100 s to step 150 (checkpoint at `checkpoint`), restarted 20 s, queued 10 s,
    trained 100 s, succeeded: 360 s of wall time."""
    passes = [step_to({}, 10, "Pending", attempt=0)]
    passes.append(step_to(passes[-1], 30, "Compiling"))
    passes.append(step_to(passes[-1], 130, "Training"))
    passes.append(step_to(passes[-1], 200, progress=progress_of(0, 150, checkpoint)))
    passes.append(step_to(passes[-1], 230, "Restarting", attempt=1))
    passes.append(step_to(passes[-1], 250, "Pending"))
    passes.append(step_to(passes[-1], 260, "Training"))
    passes.append(step_to(passes[-1], 360, "Succeeded"))
    return passes


def test_queue_compile_train_restart_train_splits_wall_time_and_charges_the_lost_steps() -> None:
    final = run_with_one_restart(checkpoint=100)[-1]
    assert figures(final) == {
        "queuedSeconds": 40.0,
        "compilingSeconds": 100.0,
        "trainingSeconds": 175.0,  # 200 s trained, less 50 steps x 0.5 s lost
        "restartingSeconds": 20.0,
        "suspendedSeconds": 0.0,
        "preflightSeconds": 0.0,
        "lostSeconds": 25.0,
        "wallSeconds": 360.0,
    }
    goodput = final["goodput"]
    assert sum(goodput[key] for key in PARTS) == goodput["wallSeconds"]
    assert (goodput["percent"], goodput["summary"]) == (48.6, "48.6%")
    assert (goodput["startTime"], goodput["asOf"]) == (
        "2026-12-03T09:00:00Z",
        "2026-12-03T09:06:00Z",
    )
    assert goodput["lostUnknown"] == 0


def test_without_a_checkpoint_step_lost_work_is_unknown_not_guessed_and_percent_a_bound() -> None:
    final = run_with_one_restart(checkpoint=None)[-1]
    goodput = final["goodput"]
    assert (goodput["trainingSeconds"], goodput["lostSeconds"], goodput["lostUnknown"]) == (
        200.0,
        0.0,
        1,
    )
    assert sum(goodput[key] for key in PARTS) == goodput["wallSeconds"] == 360.0
    assert goodput["summary"] == "<=55.6%"


def test_a_finished_jobs_figures_stop_at_its_end() -> None:
    final = run_with_one_restart(checkpoint=100)[-1]
    later = step_to(final, 3600, reason="StillSucceeded")
    assert later["goodput"] == final["goodput"]


def test_an_operator_restart_mid_run_gives_the_same_figures_as_an_operator_that_stayed() -> None:
    # Both operators see the same transitions; the one that stayed also reconciled every
    # minute, the restarted one was away from 150 s to 750 s and its first pass (from the
    # stored status alone) is at 750 s.
    start = step_to(step_to(step_to({}, 10, "Pending"), 30, "Compiling"), 130, "Training")
    stayed = start
    for second in range(190, 751, 60):
        stayed = step_to(stayed, second)
    stayed = step_to(stayed, 750, "Succeeded")
    away = step_to(step_to(start, 150, progress=progress_of(0, 20, 10)), 750, "Succeeded")
    assert figures(away) == figures(stayed)
    assert figures(away)["trainingSeconds"] == 620.0


def test_a_pass_repeated_or_a_write_lost_neither_double_counts_nor_loses_time() -> None:
    training = step_to(step_to({}, 10, "Pending"), 30, "Training")
    once = step_to(training, 90, progress=progress_of(0, 5, None))
    # The same pass again on the stored status (a retried reconcile after a 409): the same
    # figures, since the ledger only moves with the status it is stored in.
    assert step_to(training, 90, progress=progress_of(0, 5, None)) == once
    # A pass whose write failed leaves `training` stored; the next one accounts from there.
    assert figures(step_to(training, 150, "Succeeded")) == figures(step_to(once, 150, "Succeeded"))


def test_without_another_change_the_status_is_never_rewritten_only_to_move_as_of() -> None:
    queued = step_to({}, 0, "Pending")
    for seconds in (50, 70, 3600, 86400):
        assert step_to(queued, seconds) == queued, f"rewritten {seconds} s later"
    # The next write that changes something carries all the time since, in the stored phase.
    admitted = step_to(queued, 86400, "Training")
    assert (admitted["goodput"]["queuedSeconds"], admitted["goodput"]["asOf"]) == (
        86400.0,
        "2026-12-04T09:00:00Z",
    )


def test_a_reader_takes_the_figures_to_now_as_the_next_write_will() -> None:
    trained = step_to(step_to(step_to({}, 0, "Pending"), 10, "Training"), 110, "Pending")
    assert trained["goodput"]["percent"] == round(100 * 100 / 110, 1)
    for seconds in (110, 200, 1000):
        now = figures_at(trained, at(seconds))
        assert now is not None
        # Exactly what a status write at that moment would store.
        assert now == step_to(trained, seconds, reason="Written")["goodput"]
    read = figures_at(trained, at(1000))
    assert read is not None
    assert (read["queuedSeconds"], read["wallSeconds"], read["percent"]) == (900.0, 1000.0, 10.0)
    assert read["asOf"] == "2026-12-03T09:16:40Z"
    assert figures_at({"phase": "Pending"}, at(5)) is None  # no ledger yet
    done = step_to(trained, 200, "Succeeded")
    assert figures_at(done, at(9999)) == done["goodput"]  # a finished job's figures stay


def test_lost_work_is_at_most_the_stopped_attempts_training_and_of_that_attempt() -> None:
    training = step_to(step_to({}, 0, "Pending", attempt=0), 10, "Training")
    # A checkpoint far behind (1000 steps x 0.5 s) after 30 s of training: 30 s lost, not 500.
    stale = step_to(training, 40, "Restarting", attempt=1, progress=progress_of(0, 1010, 10))
    assert (stale["goodput"]["lostSeconds"], stale["goodput"]["trainingSeconds"]) == (30.0, 0.0)
    # Progress of an earlier attempt says nothing about this one: unknown.
    again = step_to(step_to(stale, 50, "Training"), 80, "Restarting", attempt=2)
    assert again["goodput"]["lostUnknown"] == 1
    assert again["goodput"]["lostSeconds"] == 30.0


def test_suspended_time_is_its_own_part_outside_goodput_and_suspending_loses_work() -> None:
    training = step_to(step_to({}, 0, "Pending", attempt=0), 20, "Training")
    suspended = step_to(training, 120, "Suspended", progress=progress_of(0, 200, 180, 1000.0))
    resumed = step_to(suspended, 420, "Pending", attempt=1)
    done = step_to(step_to(resumed, 430, "Training"), 530, "Succeeded")
    goodput = done["goodput"]
    assert figures(done) == {
        "queuedSeconds": 30.0,
        "compilingSeconds": 0.0,
        "trainingSeconds": 180.0,  # 200 s less 20 steps x 1 s after the checkpoint
        "restartingSeconds": 0.0,
        "preflightSeconds": 0.0,
        "suspendedSeconds": 300.0,
        "lostSeconds": 20.0,
        "wallSeconds": 530.0,
    }
    assert goodput["percent"] == round(100 * 180 / 230, 1)


def test_a_job_started_by_an_operator_without_goodput_is_accounted_from_now() -> None:
    older = {"phase": "Training", "attempt": 2, "startTime": "2026-12-03T08:00:00Z"}
    first = step_to(older, 600)
    assert first["goodput"]["startTime"] == first["goodput"]["asOf"] == "2026-12-03T09:10:00Z"
    assert step_to(first, 700, "Succeeded")["goodput"]["trainingSeconds"] == 100.0
    finished = {"phase": "Succeeded", "completionTime": "2026-12-03T08:30:00Z"}
    assert "goodput" not in step_to(finished, 600)


def test_an_operator_clock_behind_the_stored_figures_adds_no_negative_time() -> None:
    training = step_to(step_to({}, 0, "Pending"), 100, "Training")
    behind = step_to(training, 40, reason="ClockBehind")
    assert figures(behind) == figures(training)


def test_the_checkpoint_step_travels_in_the_message_and_progress_takes_the_lowest() -> None:
    message = ProgressMessage(
        job="j",
        namespace="n",
        uid="u",
        attempt=0,
        rank=0,
        node_rank=0,
        world_size=2,
        step=12,
        step_times_ms=(10.0,),
        last_checkpoint_step=10,
    )
    assert parse_message(message.to_json()) == message
    older = ProgressMessage(**{**_fields(message), "last_checkpoint_step": None})
    assert b"lastCheckpointStep" not in older.to_json()
    now = datetime(2026, 12, 3, 9, 0, 0, tzinfo=UTC)

    def sample(rank: int, checkpoint: int | None) -> RankSample:
        return RankSample(
            rank=rank,
            attempt=0,
            world_size=3,
            step=12,
            step_times_ms=(10.0,),
            received=now,
            last_checkpoint_step=checkpoint,
        )

    ranks = [sample(0, 10), sample(1, 8), sample(2, None)]
    shown = shown_progress(job_ref(), ranks, now=now)
    assert shown is not None
    assert shown["lastCheckpointStep"] == 8
    quiet = shown_progress(job_ref(), [sample(0, None)], now=now)
    assert quiet is not None
    assert "lastCheckpointStep" not in quiet


def _fields(message: ProgressMessage) -> dict[str, Any]:
    return {name: getattr(message, name) for name in message.__slots__}


def test_the_reconciler_writes_nothing_for_a_quiet_job_however_long_it_runs() -> None:
    cluster, reconciler = running_gang()
    stored = cluster.job(NAME)["status"]["goodput"]
    assert stored["asOf"] == "2026-12-01T12:00:00Z"
    for seconds in (30, 61, 600, 7200):
        reconciler.clock = lambda seconds=seconds: RECONCILER_NOW + timedelta(seconds=seconds)
        reconciler.reconcile(*KEY)
    assert cluster.writes == [], "only the clock moved: no status write"
    for pod in ("bert-train-0-0", "bert-train-0-1"):
        end_pod(cluster, pod, 0)
    reconciler.reconcile(*KEY)
    status = cluster.job(NAME)["status"]
    assert status["phase"] == "Succeeded"
    goodput = status["goodput"]
    assert (goodput["trainingSeconds"], goodput["wallSeconds"], goodput["percent"]) == (
        7200.0,
        7200.0,
        100.0,
    )


def test_the_reporter_sends_the_newest_checkpoint_step_the_script_saved() -> None:
    config = ChannelConfig(
        url="http://operator/v1/progress",
        token_file="/dev/null",
        interval_s=5.0,
        job="j",
        namespace="n",
        uid="u",
        attempt=0,
        rank=0,
        node_rank=0,
        world_size=1,
    )
    reporter = Reporter(config)
    reporter.on_step(1)
    assert reporter.message().last_checkpoint_step is None
    reporter.checkpoint_saved(100)
    reporter.checkpoint_saved(200)
    assert reporter.message().last_checkpoint_step == 200


def test_a_failed_preflight_moves_its_seconds_to_preflight_and_loses_no_work() -> None:
    """Queued 30 s, a training gang 40 s whose preflight ran 12 s of it and found an unfit node
    (the restart's status records it), restarting 10 s, the new gang trains 100 s."""
    record = {"attempt": 0, "stage": "train", "outcome": "Unfit", "seconds": 12.0}
    passes = [step_to({}, 0, "Pending", attempt=0)]
    passes.append(step_to(passes[-1], 30, "Training"))
    passes.append(step_to(passes[-1], 70, "Restarting", attempt=1, preflight=record))
    passes.append(step_to(passes[-1], 80, "Training"))
    passes.append(step_to(passes[-1], 180, "Succeeded"))
    final = passes[-1]["goodput"]
    assert figures(passes[-1]) == {
        "queuedSeconds": 30.0,
        "compilingSeconds": 0.0,
        "trainingSeconds": 128.0,  # 40 - 12 s of the first gang, 100 s of the second
        "restartingSeconds": 10.0,
        "suspendedSeconds": 0.0,
        "preflightSeconds": 12.0,
        "lostSeconds": 0.0,
        "wallSeconds": 180.0,
    }
    assert final["lostUnknown"] == 0  # the preflighted gang trained nothing: no unknown loss
    # The record stays in the status: a later restart does not move its seconds again.
    again = step_to(passes[-2], 200, "Restarting", attempt=2)
    assert again["goodput"]["preflightSeconds"] == 12.0
