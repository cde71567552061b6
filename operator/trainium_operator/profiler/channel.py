"""The rank side of the health channel: a daemon thread that tells the operator, every few
seconds, which step this rank is in and how long its recent steps took.

One message per pod: when torchrun runs several ranks in the pod (LOCAL_WORLD_SIZE > 1) and the
operator gave the pod directory (TRAINIUM_HEALTH_POD_DIR), every rank's thread writes its newest
sample there each interval; local rank 0's reads them and sends them as one batch, then writes
the operator's answer there, which the other ranks read (`pod_samples.py`). A pod of one rank,
or one without the directory, sends its own one-rank messages.

A replica of the operator that stands by (peering: another one writes status) answers 503 with
Retry-After: the reporter then retries that soon, within an interval, rather than backing off,
and by then the Service routes it to the acting replica.

The training loop's cost is `on_step`: a clock read, a subtraction and a deque append under
no lock the sender holds for long. Sending happens on the reporter's own thread, with a short
timeout: when the operator is away (restarting, partitioned, not installed) the thread tries
again at the next interval with the then-newest state, so nothing queues and training never
waits. The token is
read again before every send, since the kubelet rotates it.

Started by `profiler.start_profiling()` when `TRAINIUM_HEALTH_URL` is set (the operator sets it
on jobs whose `spec.health.enabled` is true), whether or not detailed profiling is on.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainium_operator.contract import channel as contract
from trainium_operator.contract import profiler_env
from trainium_operator.profiler import pod_samples


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    url: str
    token_file: str
    interval_s: float
    job: str
    namespace: str
    uid: str
    attempt: int
    rank: int
    node_rank: int
    world_size: int
    stacks_dir: str = ""  # where stack dumps go (empty: the operator gave none; none written)
    local_rank: int = 0  # torchrun's LOCAL_RANK: the rank's place in its pod
    local_world_size: int = 1  # torchrun's LOCAL_WORLD_SIZE: the pod's ranks
    pod_dir: str = ""  # where the pod's ranks meet (empty: each rank sends its own messages)

    @property
    def batched(self) -> bool:
        """Whether this rank's pod reports as one message (local rank 0 sends it)."""
        return (
            bool(self.pod_dir)
            and 1 < self.local_world_size <= contract.MAX_RANKS_PER_MESSAGE
            and 0 <= self.local_rank < self.local_world_size
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ChannelConfig | None:
        """The channel's settings, or None when the operator did not turn it on (or the pod's
        identity is incomplete: a channel that cannot say who it is stays off)."""
        env = os.environ if environ is None else environ
        url = env.get(contract.URL)
        if not url:
            return None
        try:
            interval = float(env.get(contract.INTERVAL_S) or contract.DEFAULT_INTERVAL_S)
            return cls(
                url=url,
                token_file=env.get(contract.TOKEN_FILE) or contract.TOKEN_PATH,
                interval_s=min(max(interval, 0.05), 300.0),
                job=env[profiler_env.JOB_NAME],
                namespace=env[profiler_env.JOB_NAMESPACE],
                uid=env[profiler_env.JOB_UID],
                attempt=int(env.get(profiler_env.ATTEMPT) or 0),
                rank=int(env.get("RANK") or 0),
                node_rank=int(env.get("GROUP_RANK") or 0),
                world_size=int(env.get("WORLD_SIZE") or 1),
                stacks_dir=env.get(contract.STACKS_DIR) or "",
                local_rank=int(env.get(contract.LOCAL_RANK) or 0),
                local_world_size=int(env.get(contract.LOCAL_WORLD_SIZE) or 1),
                pod_dir=env.get(contract.POD_DIR) or "",
            )
        except (KeyError, ValueError):
            return None


Sender = Callable[[str, bytes, str], dict[str, Any]]


def format_stacks(rank: int, request_id: str) -> str:
    """The Python stacks of every thread of this process, innermost call last, as
    `faulthandler` would print them but with thread names (the training loop is MainThread)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    lines = [f"# rank {rank}, pid {os.getpid()}, stack request {request_id}, {time.ctime()}"]
    for ident, frame in sorted(sys._current_frames().items()):
        lines.append(f"\nThread {names.get(ident, '?')} ({ident}), most recent call last:")
        lines.extend(line.rstrip("\n") for line in traceback.format_stack(frame))
    return "\n".join(lines) + "\n"


def write_stacks(directory: str, request_id: str, rank: int) -> str:
    """Writes this process's stacks for the request (atomically: a reader never sees half a
    file); the path written."""
    path = Path(contract.stacks_file(directory, request_id, rank))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(format_stacks(rank, request_id))
    partial.replace(path)
    return str(path)


SEND_TIMEOUT_S = 2.0
# A rank's sends back off to at most this (Reporter.max_backoff_s).
MAX_BACKOFF_S = 60.0
MIN_RETRY_S = 0.2  # the soonest a refused send is retried, whatever Retry-After says


def next_wait(
    previous: float,
    *,
    sent: bool,
    retry_after_s: float | None,
    interval_s: float,
    max_backoff_s: float,
) -> float:
    """Seconds until the reporter's next send: an interval after a success; after a refusal
    that asked to retry (a standby replica's Retry-After) that soon, never more than an
    interval; after any other failure twice the last wait (at least an interval: after an
    immediate answer it was 0), up to `max_backoff_s`."""
    if sent:
        return interval_s
    if retry_after_s is not None:
        return min(max(retry_after_s, MIN_RETRY_S), interval_s)
    return min(max(previous, interval_s) * 2, max_backoff_s)


def retry_after_s(header: str | None) -> float | None:
    """A Retry-After header's seconds (the HTTP-date form is not used by the operator)."""
    try:
        seconds = float(header) if header else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 3600 else None


def http_send(url: str, body: bytes, token: str) -> dict[str, Any]:
    """POST one message; the operator's reply. Raises OSError/ValueError on any failure."""
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=SEND_TIMEOUT_S) as response:
            reply = json.loads(response.read(contract.MAX_BODY_BYTES))
    except urllib.error.HTTPError as error:  # a refusal still carries the operator's reason
        with error:
            text = error.read(contract.MAX_BODY_BYTES)
        try:
            reply = json.loads(text)
        except ValueError:
            raise ValueError(f"HTTP {error.code} from the operator") from error
        if not isinstance(reply, dict):
            raise ValueError(f"HTTP {error.code} from the operator") from error
        reply = {**reply, "accepted": False, "status": error.code}
        retry_after = retry_after_s(error.headers.get("Retry-After"))
        if retry_after is not None:
            reply["retryAfterS"] = retry_after
    if not isinstance(reply, dict):
        raise ValueError("the operator's reply is not a JSON object")
    return reply


class Reporter:
    """The newest progress of this rank, and the thread that sends it."""

    def __init__(self, config: ChannelConfig, send: Sender = http_send) -> None:
        self.config = config
        self._send = send
        self._lock = threading.Lock()
        self._step = -1
        self._step_start_ns = 0
        self._times_ms: deque[float] = deque(maxlen=contract.MAX_STEP_TIMES)
        self._samples: int | None = None
        self._tokens: int | None = None
        self._checkpoint_step: int | None = None
        self._changed = False
        self._stop = threading.Event()
        self._final = True
        self.sequence = 0
        self.sent = 0  # messages the operator accepted (local rank 0 of a batched pod, or own)
        self.written = 0  # samples written to the pod directory (a batched pod's other ranks)
        self.failures = 0
        # The operator's Retry-After on the last refusal (a standby replica's 503); None: none.
        self.retry_after_s: float | None = None
        self.last_reply: dict[str, Any] = {}
        self.last_error = ""
        self.stacks_dumped = ""  # the newest stack request answered (sent in every message)
        self.stacks_written: list[str] = []
        self._stacks_tried = ""
        # On-demand capture (`captureSteps`): the request the training thread has not taken
        # yet (the profiler opens its window at the next step), and what the rank reports.
        self.capture_pending: contract.CaptureRequest | None = None
        self.profile_capturing = ""
        self.profile_captured = ""
        self._capture_tried = ""
        self._answer_now = False  # a request was answered: say so without waiting an interval
        self.thread = threading.Thread(target=self._loop, name="trainium-health", daemon=True)

    # -- the training loop's side ----------------------------------------------------------
    def on_step(self, number: int) -> None:
        now = time.monotonic_ns()
        with self._lock:
            if self._step >= 0:
                self._times_ms.append((now - self._step_start_ns) / 1e6)
            self._step = number
            self._step_start_ns = now
            self._changed = True

    def report(self, *, samples: int | None = None, tokens: int | None = None) -> None:
        """Add to the cumulative samples/tokens this rank has processed."""
        with self._lock:
            if samples is not None:
                self._samples = (self._samples or 0) + max(samples, 0)
            if tokens is not None:
                self._tokens = (self._tokens or 0) + max(tokens, 0)
            self._changed = True

    def checkpoint_saved(self, step: int) -> None:
        """The checkpoint of `step` is complete: a restart resumes from it."""
        with self._lock:
            self._checkpoint_step = max(step, 0)
            self._changed = True

    # -- the reporter thread ---------------------------------------------------------------
    def message(self, *, final: bool = False) -> contract.ProgressMessage:
        cfg = self.config
        with self._lock:
            times = tuple(self._times_ms)
            step, samples, tokens = self._step, self._samples, self._tokens
            checkpoint_step = self._checkpoint_step
            started = self._step_start_ns
            self._changed = False
        age_ms = (time.monotonic_ns() - started) / 1e6 if step >= 0 else None
        self.sequence += 1
        return contract.ProgressMessage(
            job=cfg.job,
            namespace=cfg.namespace,
            uid=cfg.uid,
            attempt=cfg.attempt,
            rank=cfg.rank,
            node_rank=cfg.node_rank,
            world_size=cfg.world_size,
            step=step,
            step_times_ms=times,
            samples=samples,
            tokens=tokens,
            sequence=self.sequence,
            step_age_ms=age_ms,
            stacks_dumped=self.stacks_dumped,
            profile_capturing=self.profile_capturing,
            profile_captured=self.profile_captured,
            final=final,
            last_checkpoint_step=checkpoint_step,
        )

    @property
    def leader(self) -> bool:
        """Whether this rank's thread talks to the operator (for its pod or for itself)."""
        return not self.config.batched or self.config.local_rank == 0

    def _body(self, final: bool) -> bytes:
        own = self.message(final=final)
        cfg = self.config
        if not cfg.batched:
            return own.to_json()
        others = pod_samples.read_samples(
            cfg.pod_dir, cfg.local_world_size, own, contract.stale_after_s(cfg.interval_s)
        )
        return contract.batch_json([own, *others])

    def send_once(self, *, final: bool = False) -> bool:
        """One message now (this rank's, or its pod's); whether the operator accepted it.
        Never raises."""
        try:
            token = Path(self.config.token_file).read_text().strip()
            reply = self._send(self.config.url, self._body(final), token)
        except (OSError, ValueError, urllib.error.URLError) as error:
            self.failures += 1
            self.last_error = repr(error)
            self.retry_after_s = None
            return False
        self.last_reply = reply
        retry_after = reply.get("retryAfterS")
        self.retry_after_s = float(retry_after) if isinstance(retry_after, int | float) else None
        accepted = bool(reply.get("accepted"))
        if accepted:
            self.sent += 1
            self._pass_on(reply.get("requests"))
            self._answer(reply.get("requests"))
        else:
            self.failures += 1
            self.last_error = str(reply.get("reason") or "refused")
        return accepted

    def _pass_on(self, requests: object) -> None:
        """Local rank 0 of a batched pod writes the operator's requests for its other ranks."""
        if not self.config.batched:
            return
        try:
            pod_samples.write_answer(self.config.pod_dir, requests)
        except OSError as error:  # a full /dev/shm: the others miss this answer, not training
            self.last_error = f"answer not passed on: {error!r}"

    def write_once(self, *, final: bool = False) -> bool:
        """A batched pod's other rank: reads the operator's answer local rank 0 passed on, does
        what it asks, and writes this rank's newest sample; whether the sample was written.
        Never raises."""
        cfg = self.config
        requests = pod_samples.read_answer(cfg.pod_dir, contract.stale_after_s(cfg.interval_s))
        self.last_reply = {"requests": requests}
        self._answer(requests)
        try:
            sample = contract.sample_json(self.message(final=final))
            pod_samples.write_atomically(contract.sample_file(cfg.pod_dir, cfg.local_rank), sample)
        except OSError as error:
            self.failures += 1
            self.last_error = f"sample not written: {error!r}"
            return False
        self.written += 1
        return True

    def tick(self, *, final: bool = False) -> bool:
        """This rank's part of one interval: send (local rank 0, or an unbatched rank) or write
        its sample for local rank 0 to send."""
        return self.send_once(final=final) if self.leader else self.write_once(final=final)

    def _answer(self, requests: object) -> None:
        """Does what the operator asked (an unknown or malformed request is ignored)."""
        if not isinstance(requests, dict):
            return
        self._take_capture_request(requests.get(contract.REQUEST_CAPTURE_STEPS))
        request_id = requests.get(contract.REQUEST_DUMP_STACKS)
        if not contract.valid_request_id(request_id) or request_id == self._stacks_tried:
            return
        assert isinstance(request_id, str)
        self._stacks_tried = request_id  # once per request, whatever happens
        if not self.config.stacks_dir:
            return
        try:
            path = write_stacks(self.config.stacks_dir, request_id, self.config.rank)
        except OSError as error:  # a full or read-only volume: no answer, the operator says so
            self.last_error = f"stacks not written: {error!r}"
            return
        self.stacks_written.append(path)
        self.stacks_dumped = request_id
        self._answer_now = True

    def _take_capture_request(self, value: object) -> None:
        """Holds a new capture request for the training thread (once per request id)."""
        request = contract.CaptureRequest.from_json(value)
        if request is None or request.request_id == self._capture_tried:
            return
        self._capture_tried = request.request_id
        if self.config.stacks_dir:  # no profile directory given: nowhere to write, no answer
            self.capture_pending = request

    def take_capture(self) -> contract.CaptureRequest | None:
        """The pending capture request, once (the training thread, at a step)."""
        request, self.capture_pending = self.capture_pending, None
        return request

    def capture_started(self, request_id: str) -> None:
        self.profile_capturing = request_id
        self._answer_now = True

    def capture_finished(self, request_id: str, *, complete: bool) -> None:
        """The capture's files are closed (the profiler's flusher thread); `complete`: without
        an error, so the rank reports it captured."""
        if self.profile_capturing == request_id:
            self.profile_capturing = ""
        if complete:
            self.profile_captured = request_id
        else:
            self.last_error = f"on-demand profile {request_id} not written"
        self._answer_now = True

    def _loop(self) -> None:
        backoff = self.config.interval_s
        while not self._stop.wait(backoff):
            # Only a send backs off: a local write failing is no reason to write less often.
            sent = self.tick() or not self.leader
            backoff = next_wait(
                backoff,
                sent=sent,
                retry_after_s=self.retry_after_s,
                interval_s=self.config.interval_s,
                max_backoff_s=self.max_backoff_s,
            )
            if self._answer_now:
                self._answer_now = False
                backoff = 0.0
        if self._final:
            self.tick(final=True)

    @property
    def max_backoff_s(self) -> float:
        """Failed sends are retried at the report interval (at least a second apart): a
        returning operator, or the replica taking over from a crashed one, hears from every
        rank within one interval. Retrying costs no one: a pod sends one message per interval
        either way, and a failed send fails fast or within SEND_TIMEOUT_S on this thread."""
        return min(MAX_BACKOFF_S, max(self.config.interval_s, 1.0))

    def start(self) -> None:
        self.thread.start()

    def stop(self, *, final: bool = True) -> None:
        """Ends the thread without waiting for it; `final`: it sends the last state once."""
        self._final = final
        self._stop.set()


_reporter: Reporter | None = None
_lock = threading.Lock()


def start_from_env(environ: Mapping[str, str] | None = None) -> Reporter | None:
    """Starts this process's reporter when the operator turned the channel on."""
    global _reporter  # noqa: PLW0603 - one reporter per process, read on the hot path
    config = ChannelConfig.from_env(environ)
    if config is None:
        return None
    with _lock:
        if _reporter is None:
            _reporter = Reporter(config)
            _reporter.start()
        return _reporter


def stop() -> None:
    global _reporter
    with _lock:
        reporter, _reporter = _reporter, None
    if reporter is not None:
        reporter.stop()


def on_step(number: int) -> None:
    reporter = _reporter
    if reporter is not None:
        reporter.on_step(number)


def report(*, samples: int | None = None, tokens: int | None = None) -> None:
    """Public API (`profiler.report`): the samples and tokens of the step just done."""
    reporter = _reporter
    if reporter is not None:
        reporter.report(samples=samples, tokens=tokens)


def checkpoint_saved(step: int) -> None:
    """Public API (`profiler.checkpoint_saved`): the checkpoint of `step` is complete (written
    and durable), so the operator can tell how much work a restart loses (status.goodput)."""
    reporter = _reporter
    if reporter is not None:
        reporter.checkpoint_saved(step)


def current() -> Reporter | None:
    return _reporter


def capture_pending() -> bool:
    """Whether the operator asked for an on-demand capture the profiler has not opened yet
    (read at every step: one global and one attribute read)."""
    reporter = _reporter
    return reporter is not None and reporter.capture_pending is not None
