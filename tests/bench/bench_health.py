"""Health-channel benchmark, in one process: run `python tests/bench/bench_health.py`.

Prints, with each target's verdict:
1. the profiler's added step time with the channel on vs off, measured in the same run as
   interleaved blocks of a ~5 ms CPU step (target <= 0.5 %), plus the reporter's own cost
   per `on_step` in nanoseconds;
2. the operator's endpoint CPU per message (parse, cached token review, authorization against
   the watch cache, store) through the real aiohttp app over loopback HTTP, projected to 4096
   ranks reporting every 5 s (target <= 1 core-second per second), and the memory the store
   holds for 64 jobs x 64 ranks (target <= 50 MiB);
3. status writes per job per minute from `lifecycle.progress.with_progress` at the default
   interval while 64 ranks report every 5 s (target <= 12);
4. stall-to-condition latency: a real reporter thread (its training loop freezes) posting to the
   real endpoint over loopback, and the stall policy run as the operator's work queue runs a
   job's pass (at the operator's progress tick and at the pass's own requeue), from the rank's
   last step to the pass that sets Stalled, against the target max(3 x p50, 60 s): with a 3 s
   stallTimeoutSeconds (5 runs), and (not with --quick) once with the default 60 s floor.

The endpoint figure excludes TokenReview round trips (one per token per 60 s; 4096 ranks: ~70 a
minute) and the pass that writes the status; the stall latency excludes that status write
(milliseconds; the dev-cluster test checks the written condition within the bound + 1 s of
timestamp resolution). Options: --quick for a shorter run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "tests")]

from aiohttp import ClientSession  # noqa: E402
from aiohttp.test_utils import TestServer  # noqa: E402

from trainium_operator.controller.cache import ClusterCache  # noqa: E402
from trainium_operator.controller.health_server import (  # noqa: E402
    HealthChannel,
    ProgressStore,
    TokenCache,
    application,
)
from trainium_operator.k8s.informer import WatchEvent  # noqa: E402
from trainium_operator.lifecycle.channel_auth import TokenIdentity  # noqa: E402
from trainium_operator.lifecycle.decision import Decision  # noqa: E402
from trainium_operator.lifecycle.observed import Observed  # noqa: E402
from trainium_operator.lifecycle.progress import RankSample, with_progress  # noqa: E402
from trainium_operator.lifecycle.stalls import apply_stall_policy, stall_bound  # noqa: E402
from trainium_operator.profiler import channel_contract as contract  # noqa: E402
from trainium_operator.profiler.channel import ChannelConfig, Reporter  # noqa: E402
from trainium_operator.profiler.channel_contract import ProgressMessage  # noqa: E402
from unit.jobs import job_document, job_ref  # noqa: E402

JOBS, RANKS, RANKS_PER_POD = 64, 64, 32


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# -- 1. step overhead --------------------------------------------------------------------------
def _work(iterations: int) -> float:
    total = 0.0
    for i in range(iterations):
        total += (i % 7) * 0.5
    return total


def step_overhead(blocks: int, steps: int) -> None:
    config = ChannelConfig(
        url="http://127.0.0.1:9/v1/progress",  # nothing listens: the worst case, every send fails
        token_file="/nonexistent",
        interval_s=5.0,
        job="bench",
        namespace="bench",
        uid="u",
        attempt=0,
        rank=0,
        node_rank=0,
        world_size=1,
    )
    reporter = Reporter(config)
    reporter.start()
    iterations = 60_000  # ~5 ms of CPU per step on the 2-core VM
    off: list[float] = []
    on: list[float] = []
    for block in range(blocks):
        for enabled in (block % 2 == 0, block % 2 == 1):
            started = time.perf_counter()
            for number in range(steps):
                if enabled:
                    reporter.on_step(number)
                _work(iterations)
            (on if enabled else off).append((time.perf_counter() - started) / steps)
    reporter.stop(final=False)
    started = time.perf_counter_ns()
    for number in range(100_000):
        reporter.on_step(number)
    per_call_ns = (time.perf_counter_ns() - started) / 100_000
    step_ms = statistics.median(off) * 1000
    added = per_call_ns / 1e6 / step_ms * 100
    measured = (statistics.median(on) / statistics.median(off) - 1) * 100
    print("1. profiler step overhead, channel on vs off (same run)")
    print(f"   step time off {step_ms:.3f} ms, on {statistics.median(on) * 1000:.3f} ms")
    half = len(off) // 2
    noise = (statistics.median(off[:half]) / statistics.median(off[half:]) - 1) * 100
    print(f"   measured difference of medians: {measured:+.2f} %")
    print(f"   noise floor (off vs off, first half vs second half): {noise:+.2f} %")
    print(f"   reporter cost per step: {per_call_ns:.0f} ns = {added:.4f} % of the step")
    print(f"   target <= 0.5 % added: {verdict(added <= 0.5)} (accounted figure)")


# -- 2. the endpoint -------------------------------------------------------------------------
def _cluster() -> ClusterCache:
    cache = ClusterCache()
    for j in range(JOBS):
        document = job_document()
        document["metadata"] = {**document["metadata"], "name": f"job-{j}", "uid": f"uid-{j}"}
        cache.on_job(WatchEvent("ADDED", document))
        for p in range(RANKS // RANKS_PER_POD):
            cache.on_pod(
                WatchEvent(
                    "ADDED",
                    {
                        "metadata": {
                            "name": f"job-{j}-train-0-{p}",
                            "namespace": "team-a",
                            "uid": f"pod-{j}-{p}",
                            "labels": {
                                "trainium.dev/job-name": f"job-{j}",
                                "trainium.dev/stage": "train",
                                "trainium.dev/attempt": "0",
                                "trainium.dev/node-rank": str(p),
                            },
                            "ownerReferences": [{"uid": f"uid-{j}"}],
                        },
                        "spec": {"nodeName": f"node-{p}"},
                    },
                )
            )
    return cache


def _identity(token: str) -> TokenIdentity:
    _, j, p = token.split("-")
    return TokenIdentity(
        True,
        username="system:serviceaccount:team-a:default",
        audiences=(contract.AUDIENCE,),
        extra=(
            (contract.CLAIM_POD_NAME, (f"job-{j}-train-0-{p}",)),
            (contract.CLAIM_POD_UID, (f"pod-{j}-{p}",)),
        ),
    )


def _messages() -> list[tuple[str, bytes]]:
    return [
        (
            f"t-{j}-{r // RANKS_PER_POD}",
            ProgressMessage(
                job=f"job-{j}",
                namespace="team-a",
                uid=f"uid-{j}",
                attempt=0,
                rank=r,
                node_rank=r // RANKS_PER_POD,
                world_size=RANKS,
                step=100,
                step_times_ms=(500.0,) * 16,
                samples=800,
            ).to_json(),
        )
        for j in range(JOBS)
        for r in range(RANKS)
    ]


async def _post_all(channel: HealthChannel, rounds: int) -> tuple[float, int]:
    server = TestServer(application(channel))
    await server.start_server()
    url = str(server.make_url(contract.PATH))
    messages = _messages()
    sent = 0
    cpu = 0.0
    async with ClientSession() as session:
        for _ in range(rounds):
            started = time.process_time()
            for index in range(0, len(messages), 64):
                batch = messages[index : index + 64]
                replies = await asyncio.gather(
                    *(
                        session.post(url, data=body, headers={"Authorization": f"Bearer {t}"})
                        for t, body in batch
                    )
                )
                for reply in replies:
                    assert reply.status == 200, await reply.text()
                    reply.release()
                sent += len(batch)
            cpu += time.process_time() - started
    await server.close()
    return cpu, sent


def endpoint_cost(rounds: int) -> None:
    channel = HealthChannel(_cluster(), TokenCache(_identity), store=ProgressStore())
    cpu, sent = asyncio.run(_post_all(channel, rounds))
    # The operator's own share, without HTTP: what receive() costs per message.
    bodies = _messages()
    started = time.process_time()
    for token, body in bodies:
        channel.receive(token, body)
    direct_us = (time.process_time() - started) / len(bodies) * 1e6
    tracemalloc.start()
    fresh = HealthChannel(_cluster(), TokenCache(_identity), store=ProgressStore())
    before = tracemalloc.get_traced_memory()[0]
    for token, body in bodies:
        fresh.receive(token, body)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    per_message_us = cpu / sent * 1e6
    # The client's share is in the HTTP figure; an upper bound for the operator's.
    per_second = 4096 / 5.0 * per_message_us / 1e6
    print("2. operator endpoint, 64 jobs x 64 ranks")
    print(f"   receive() alone: {direct_us:.0f} us CPU per message")
    print(
        f"   over loopback HTTP (aiohttp server and client in this process): "
        f"{per_message_us:.0f} us per message, client included"
    )
    print(
        f"   4096 ranks every 5 s: <= {per_second:.3f} core-s/s; target <= 1: "
        f"{verdict(per_second <= 1)}"
    )
    print(
        f"   store + token cache held: {held / 2**20:.1f} MiB; target <= 50 MiB: "
        f"{verdict(held <= 50 * 2**20)}"
    )


# -- 3. status writes -------------------------------------------------------------------------
def status_writes() -> None:
    job = job_ref(health={"totalSteps": 100_000})
    now = datetime(2026, 1, 1, tzinfo=UTC)
    status: dict[str, object] = {"phase": "Training", "attempt": 0}
    writes = 0
    # The operator's timer wakes the job every 10 s; other events (pods, nodes) add passes:
    # here one pass every second, the worst case.
    for second in range(600):
        ranks = [
            RankSample(r, 0, RANKS, second * 2, (500.0,) * 16, now + timedelta(seconds=second))
            for r in range(RANKS)
        ]
        new = with_progress(job, status, ranks, now + timedelta(seconds=second), 10.0)
        writes += new != status
        status = new
    per_minute = writes / 10
    print("3. status writes, one job of 64 ranks, a pass every second for 10 minutes")
    print(f"   {per_minute:.1f} writes/min; target <= 12: {verdict(per_minute <= 12)}")


# -- 4. stall-to-condition latency -------------------------------------------------------------
PROGRESS_TICK_S = 10.0  # the operator's --progress-interval default


def _train_then_freeze(reporter: Reporter, steps: int, step_s: float, last: list[float]) -> None:
    for number in range(steps):
        reporter.on_step(number)
        last[0] = time.time()
        time.sleep(step_s)
    # frozen from here: the last step started at last[0]; the reporter thread keeps sending


async def _one_stall(
    stall_timeout: float | None, interval: float, step_s: float, tick: float
) -> float:
    """Seconds from the rank's last step to the pass that set Stalled."""
    import tempfile
    import threading

    health: dict[str, object] = {"reportIntervalSeconds": interval}
    if stall_timeout is not None:
        health["stallTimeoutSeconds"] = stall_timeout
    job = job_ref(health=health)
    channel = HealthChannel(_cluster(), TokenCache(_identity), store=ProgressStore())
    server = TestServer(application(channel))
    await server.start_server()
    with tempfile.TemporaryDirectory() as scratch:
        token = Path(scratch) / "token"
        token.write_text("t-0-0")
        config = ChannelConfig(
            url=str(server.make_url(contract.PATH)),
            token_file=str(token),
            interval_s=interval,
            job="job-0",
            namespace="team-a",
            uid="uid-0",
            attempt=0,
            rank=0,
            node_rank=0,
            world_size=1,
            stacks_dir=str(Path(scratch) / "stacks"),
        )
        reporter = Reporter(config)
        reporter.start()
        last = [0.0]
        loop = threading.Thread(target=_train_then_freeze, args=(reporter, 40, step_s, last))
        loop.start()
        status: dict[str, object] = {"phase": "Training", "attempt": 0}
        try:
            while True:
                # The job's pass, as the work queue runs it: its requeue or the progress tick.
                now = datetime.now(UTC)
                decision = Decision(status=status)
                observed = Observed((), {}, True, {}, now)
                apply_stall_policy(
                    job, decision, observed, channel.store.samples(("team-a", "job-0"))
                )
                status = decision.status
                stalled = [c for c in status.get("conditions", []) if c["type"] == "Stalled"]  # type: ignore[attr-defined]
                if stalled and not loop.is_alive():
                    return time.time() - last[0]
                wait = decision.requeue_after if decision.requeue_after is not None else tick
                await asyncio.sleep(min(wait, tick))
        finally:
            reporter.stop(final=False)
            loop.join()
            await server.close()


def stall_latency(quick: bool) -> None:
    step_s, interval = 0.05, 0.5
    print("4. stall-to-condition latency (a frozen rank; target max(3 x p50, 60 s))")
    scaled = {"stallTimeoutSeconds": 3, "reportIntervalSeconds": interval}
    bound = stall_bound(job_ref(health=scaled).spec.health, step_s * 1000)
    # As the dev-cluster tests run the operator (--progress-interval 1).
    runs = [asyncio.run(_one_stall(3.0, interval, step_s, 1.0)) for _ in range(2 if quick else 5)]
    worst = max(runs)
    print(
        f"   stallTimeoutSeconds 3, progress tick 1 s (p50 {step_s * 1000:.0f} ms, "
        f"reports every {interval:g} s): "
        f"{', '.join(f'{r:.2f}' for r in runs)} s; worst {worst:.2f} s within the {bound:g} s "
        f"bound: {verdict(worst <= bound)}"
    )
    if quick:
        print("   default bound (60 s floor): skipped with --quick")
        return
    default = asyncio.run(_one_stall(None, interval, step_s, PROGRESS_TICK_S))
    target = max(3 * step_s, 60.0)
    print(
        f"   default bound, progress tick {PROGRESS_TICK_S:g} s: {default:.2f} s; "
        f"target <= {target:.0f} s: {verdict(default <= target)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    step_overhead(blocks=4 if args.quick else 20, steps=50 if args.quick else 200)
    endpoint_cost(rounds=1 if args.quick else 3)
    status_writes()
    stall_latency(args.quick)


if __name__ == "__main__":
    main()
