"""One health message per pod: the ranks of a pod write their samples to the pod directory,
local rank 0 sends them as one batch and passes the operator's answer on. Reporters here are
objects of one process pointing at a tmp directory; a local HTTP stub or the real endpoint's
`HealthChannel` receives."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainium_operator.builders import pods
from trainium_operator.builders.job import Stage
from trainium_operator.contract import channel as contract
from trainium_operator.controller.health_server import HealthChannel, TokenCache
from trainium_operator.profiler import pod_samples
from trainium_operator.profiler.channel import ChannelConfig, Reporter
from unit.conftest import Posts
from unit.jobs import UID, job_document, job_ref
from unit.test_health_channel import _cache_with, message, pod_identity, pod_jwt, training_pod

Received = list[dict[str, Any]]
Send = Callable[[str, bytes, str], dict[str, Any]]
FIRST_RANK = 32  # node 1 of the unit job (2 nodes x 32 processes)


def config(tmp_path: Path, local_rank: int, local_world: int, **changes: Any) -> ChannelConfig:
    token = tmp_path / "token"
    token.write_text("t")
    base = ChannelConfig(
        url="http://unused/",
        token_file=str(token),
        interval_s=0.05,
        job="bert",
        namespace="team-a",
        uid=UID,
        attempt=0,
        rank=FIRST_RANK + local_rank,
        node_rank=1,
        world_size=64,
        stacks_dir=str(tmp_path / "stacks"),
        local_rank=local_rank,
        local_world_size=local_world,
        pod_dir=str(tmp_path / "pod"),
    )
    return dataclasses.replace(base, **changes)


def pod_of(tmp_path: Path, ranks: int, send: Send, **changes: Any) -> list[Reporter]:
    return [Reporter(config(tmp_path, i, ranks, **changes), send=send) for i in range(ranks)]


def recorder(
    received: Received, requests: dict[str, Any] | None = None
) -> Callable[[str, bytes, str], dict[str, Any]]:
    def send(_url: str, body: bytes, _token: str) -> dict[str, Any]:
        received.append(json.loads(body))
        return {"accepted": True, "requests": requests or {}}

    return send


def ranks_of(body: dict[str, Any]) -> list[int]:
    return [entry["rank"] for entry in body["ranks"]]


def test_a_pod_of_four_ranks_sends_one_message_per_interval_carrying_all_four(
    tmp_path: Path,
) -> None:
    received: Received = []
    reporters = pod_of(tmp_path, 4, recorder(received))
    for interval in range(3):
        for reporter in reporters:
            reporter.on_step(interval)
        for reporter in reversed(reporters):  # the others write, then local rank 0 sends
            assert reporter.tick()
        assert len(received) == interval + 1
        assert ranks_of(received[-1]) == [32, 33, 34, 35]
        assert [entry["step"] for entry in received[-1]["ranks"]] == [interval] * 4
    assert [r.sent for r in reporters] == [3, 0, 0, 0]
    assert [r.written for r in reporters] == [0, 3, 3, 3]


def test_the_pods_batch_is_what_the_operators_endpoint_accepts_for_every_rank(
    tmp_path: Path,
) -> None:
    cache = _cache_with(("job", job_document()), ("pod", training_pod()))
    channel = HealthChannel(cache, TokenCache(lambda _token: pod_identity()))
    token = pod_jwt()
    statuses: list[int] = []

    def send(_url: str, body: bytes, _token: str) -> dict[str, Any]:
        status, _verdict = channel.receive(token, body)
        statuses.append(status)
        return {"accepted": status == 200}

    reporters = pod_of(tmp_path, 3, send)
    for reporter in reversed(reporters):
        reporter.on_step(5)
        assert reporter.tick()
    assert statuses == [200]
    assert sorted(channel.store.ranks(("team-a", "bert"))) == [32, 33, 34]


def test_ranks_on_their_own_threads_post_only_through_local_rank_0(
    endpoint: tuple[str, Posts], tmp_path: Path
) -> None:
    url, posts = endpoint
    reporters = pod_of(tmp_path, 4, recorder([]), url=url, interval_s=0.1)
    reporters = [Reporter(r.config) for r in reporters]  # the real HTTP sender
    for reporter in reporters:
        reporter.on_step(1)
        reporter.start()
    started = time.monotonic()
    # Three intervals' POSTs, however loaded the machine (bounded: a stuck reporter fails).
    while len(posts) < 3 and time.monotonic() - started < 10:
        time.sleep(0.05)
    for reporter in reporters:
        reporter.stop(final=False)
    elapsed = time.monotonic() - started
    for reporter in reporters:
        reporter.thread.join(2)
    received = [body for _, body in posts]
    assert 3 <= len(received) <= elapsed / 0.1 + 1  # one POST per interval, not one per rank
    assert all("ranks" in body for body in received)
    assert ranks_of(received[-1]) == [32, 33, 34, 35]  # once every rank has written a sample
    assert [r.sent > 0 for r in reporters] == [True, False, False, False]


def test_a_rank_whose_sample_is_stale_is_left_out(tmp_path: Path) -> None:
    received: Received = []
    reporters = pod_of(tmp_path, 3, recorder(received))
    for reporter in reversed(reporters):
        reporter.tick()
    stale = Path(contract.sample_file(str(tmp_path / "pod"), 2))
    old = time.time() - contract.stale_after_s(0.05) - 1
    os.utime(stale, (old, old))  # rank 34's process died: it stopped writing
    reporters[0].tick()
    assert ranks_of(received[0]) == [32, 33, 34]
    assert ranks_of(received[1]) == [32, 33]


def test_an_on_demand_capture_and_a_stack_request_in_the_answer_reach_every_local_rank(
    tmp_path: Path,
) -> None:
    received: Received = []
    requests = {
        contract.REQUEST_CAPTURE_STEPS: {"id": "cap-1", "steps": 3},
        contract.REQUEST_DUMP_STACKS: "stall-1",
    }
    reporters = pod_of(tmp_path, 3, recorder(received, requests))
    assert reporters[0].tick()
    for reporter in reporters[1:]:
        assert reporter.tick()
    for reporter in reporters:
        assert reporter.take_capture() == contract.CaptureRequest("cap-1", 3)
        assert reporter.stacks_dumped == "stall-1"
    stacks = sorted(p.name for p in (tmp_path / "stacks" / "stall-1").iterdir())
    assert stacks == ["rank-32.txt", "rank-33.txt", "rank-34.txt"]
    reporters[0].tick()
    assert [e.get("stacksDumped") for e in received[-1]["ranks"]] == ["stall-1"] * 3


def test_a_stale_or_malformed_answer_asks_nothing_of_the_other_ranks(tmp_path: Path) -> None:
    pod = tmp_path / "pod"
    pod_samples.write_answer(str(pod), {contract.REQUEST_CAPTURE_STEPS: {"id": "c", "steps": 2}})
    answer = Path(contract.answer_file(str(pod)))
    old = time.time() - 10
    os.utime(answer, (old, old))  # written for an earlier container of this pod
    (other,) = pod_of(tmp_path, 2, recorder([]))[1:]
    other.tick()
    assert other.take_capture() is None
    for garbage in (b"[" * 100_000, b'{"requests": [1]}', b"\xff\xfe", b"x" * 20_000):
        answer.write_bytes(garbage)
        other.tick()
        assert other.take_capture() is None


def test_malformed_huge_foreign_linked_and_fifo_samples_are_skipped_without_blocking(
    tmp_path: Path,
) -> None:
    received: Received = []
    reporters = pod_of(tmp_path, 9, recorder(received))
    reporters[8].tick()  # the one honest other rank (local rank 8, rank 40)
    pod = tmp_path / "pod"

    def sample(local_rank: int) -> Path:
        return Path(contract.sample_file(str(pod), local_rank))

    honest = reporters[3].message()
    sample(1).write_bytes(b"{" + b" " * (10 * 2**20) + b"}")  # 10 MiB
    sample(2).write_bytes(b"not json")
    os.mkfifo(sample(3))  # would block a plain open() forever
    sample(4).symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_bytes(contract.sample_json(honest))
    foreign = dataclasses.replace(honest, uid="another-job")
    sample(5).write_bytes(contract.sample_json(foreign))
    twin = dataclasses.replace(honest, rank=FIRST_RANK)  # names local rank 0's rank again
    sample(6).write_bytes(contract.sample_json(twin))
    sample(7).mkdir()
    Path(contract.sample_file(str(pod), 500)).write_bytes(contract.sample_json(honest))
    started = time.monotonic()
    assert reporters[0].tick()
    # A plain open() of the FIFO would block forever; a generous bound tells the two apart.
    assert time.monotonic() - started < 10
    assert ranks_of(received[0]) == [32, 40]


def test_a_batch_of_absurd_samples_stays_within_the_message_bound_and_parses() -> None:
    huge = message(
        job="j" * 253,
        world_size=128,
        step=2**61,
        step_times_ms=(1.7976931348623157e308,) * 64,
        samples=2**61,
        tokens=2**61,
        step_age_ms=9.99e11,
        stacks_dumped="a" * 64,
        profile_capturing="b" * 64,
        profile_captured="c" * 64,
        final=True,
        last_checkpoint_step=2**61,
    )
    batch = contract.batch_json([dataclasses.replace(huge, rank=r) for r in range(200)])
    assert len(batch) <= contract.MAX_BATCH_BODY_BYTES
    ranks = contract.parse_messages(batch)
    assert 1 < len(ranks) < contract.MAX_RANKS_PER_MESSAGE  # the ones that fit, in order
    assert [m.rank for m in ranks] == list(range(len(ranks)))


@pytest.mark.parametrize(
    ("local_rank", "local_world", "pod_dir"),
    [("0", "1", "/p"), ("3", "200000", "/p"), ("5", "4", "/p"), ("-1", "4", "/p"), ("0", "4", "")],
)
def test_a_rank_sends_its_own_messages_unless_its_pod_shape_is_one_batch_can_carry(
    local_rank: str, local_world: str, pod_dir: str
) -> None:
    environ = {
        contract.URL: "http://unused/",
        contract.POD_DIR: pod_dir,
        contract.LOCAL_RANK: local_rank,
        contract.LOCAL_WORLD_SIZE: local_world,
        "TRAINIUM_JOB_NAME": "bert",
        "TRAINIUM_JOB_NAMESPACE": "team-a",
        "TRAINIUM_JOB_UID": UID,
    }
    cfg = ChannelConfig.from_env(environ)
    assert cfg is not None
    assert not cfg.batched
    assert Reporter(cfg).leader
    batched = ChannelConfig.from_env(
        {**environ, contract.LOCAL_RANK: "1", contract.LOCAL_WORLD_SIZE: "4"}
    )
    assert batched is not None
    assert batched.batched == bool(pod_dir)


def test_a_training_pod_gets_its_pod_directory_on_its_memory_backed_shm() -> None:
    job = dataclasses.replace(
        job_ref(), health_url="http://op.trainium-system.svc:8090" + contract.PATH
    )
    pod = pods.pod(job, Stage.TRAIN, 0, 1)
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert env[contract.POD_DIR] == contract.POD_DIR_PATH
    shm = next(p for p in mounts if env[contract.POD_DIR].startswith(p + "/"))
    assert volumes[mounts[shm]]["emptyDir"] == {"medium": "Memory"}


def test_a_refused_send_right_after_answering_a_request_backs_off_instead_of_spinning(
    tmp_path: Path,
) -> None:
    calls: list[float] = []

    def send(_url: str, _body: bytes, _token: str) -> dict[str, Any]:
        calls.append(time.monotonic())
        if len(calls) == 1:  # a stack request: the rank answers at once, off its interval
            return {"accepted": True, "requests": {contract.REQUEST_DUMP_STACKS: "s-1"}}
        return {"accepted": False, "reason": "pod over its budget", "status": 429}

    (reporter,) = pod_of(tmp_path, 1, send)  # interval 0.05 s
    reporter.start()
    time.sleep(0.4)
    reporter.stop(final=False)
    reporter.thread.join(2)
    assert reporter.stacks_dumped == "s-1"
    assert len(calls) <= 0.4 / 0.05 + 2, len(calls)  # never faster than one per interval
