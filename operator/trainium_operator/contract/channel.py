"""The health channel's contract: what a rank sends the operator, where, and how it proves who
it is. One module both sides import (as `profiler_env.py` is for the profiler's environment):
the pod builder writes the env and the token volume, the profiler's reporter
(`profiler/channel.py`) reads them and sends messages, the operator's endpoint
(`controller/health_server.py`) parses them with `parse_message`.

Security model (docs/health.md): each training pod gets a projected ServiceAccount token with
the audience `AUDIENCE`, bound to the pod (the kubelet requests it with the pod as its
bound object, and the API server invalidates it when the pod is deleted) and rotated by the
kubelet. A rank sends it as a bearer token; the operator asks the API server (TokenReview, with
the audience) who it belongs to, reads the pod name and uid the API server put in the review's
`extra`, and accepts the message only if that pod exists, is a training pod of the job the
message names (label, owner uid, attempt, node rank) and lives in the token's namespace. A
message claims nothing the operator believes without that check.

Standard library only: the training image imports this module without our dependencies.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

# -- set by the operator (builders/pods.py) on training pods of jobs with the channel on -------
URL = "TRAINIUM_HEALTH_URL"  # the operator's endpoint, http://<service>.<namespace>.svc:<port>/...
TOKEN_FILE = "TRAINIUM_HEALTH_TOKEN_FILE"  # the projected, audience-bound, pod-bound token
INTERVAL_S = "TRAINIUM_HEALTH_INTERVAL_S"  # seconds between a rank's messages
# Where a rank writes its Python stacks when the operator asks (a stalled job): the attempt's
# profile directory's `stacks/`, on the shared volume; each request writes
# `<dir>/<request id>/rank-<RANK>.txt` (`stacks_file`).
STACKS_DIR = "TRAINIUM_HEALTH_STACKS_DIR"
# The pod's own directory where its ranks meet (`POD_DIR_PATH`, on the pod's memory-backed
# /dev/shm emptyDir): every rank writes its newest sample there, local rank 0 sends them all as
# one message and writes the operator's answer there for the others (`profiler/pod_samples.py`).
POD_DIR = "TRAINIUM_HEALTH_POD_DIR"
OPERATOR_SET = (URL, TOKEN_FILE, INTERVAL_S, STACKS_DIR, POD_DIR)

PATH = "/v1/progress"  # the endpoint's path on the operator
PORT = 8090  # the operator's default health-channel port (chart: health.port)
AUDIENCE = "trainium.dev/health"  # the token's audience: useless against the API server itself
TOKEN_DIR = "/var/run/secrets/trainium.dev/health"
TOKEN_NAME = "token"
TOKEN_PATH = f"{TOKEN_DIR}/{TOKEN_NAME}"
TOKEN_VOLUME = "trainium-health-token"
TOKEN_EXPIRATION_SECONDS = 3600  # the kubelet rotates it at 80 % of this
DEFAULT_INTERVAL_S = 5.0
# A replica that stands by (peering: another one writes status) answers 503 with this
# Retry-After (seconds); the rank then tries again that soon, at most an interval later, instead
# of backing off, and by then the Service routes it to the acting replica.
RETRY_AFTER_S = 1
POD_DIR_PATH = "/dev/shm/trainium-health"  # builders/pods.py mounts a Memory emptyDir at /dev/shm

# -- the pod directory: one file per local rank, and the operator's latest answer -----------
# torchrun's names for a rank's place in its pod (read, never set, by the reporter).
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
MAX_SAMPLE_BYTES = 4096  # one rank's sample file (a legitimate one is under 1 KiB)
ANSWER_FILE = "answer.json"  # the `requests` of the operator's latest reply to local rank 0
# A sample or answer older than this many intervals is left out: its writer is gone (a dead
# rank is then silent to the operator, as the stall policy expects).
STALE_INTERVALS = 3

# -- what TokenReview says about a pod-bound token (status.user.extra) ----------------------
CLAIM_POD_NAME = "authentication.kubernetes.io/pod-name"
CLAIM_POD_UID = "authentication.kubernetes.io/pod-uid"
CLAIM_NODE_NAME = "authentication.kubernetes.io/node-name"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

# -- the message ------------------------------------------------------------------------------
# The unit is one message per pod per interval (`batch_json`): the newest state of every rank
# of the pod, sent by its local rank 0 (`profiler/channel.py`). The older form, one message per
# rank (`ProgressMessage.to_json`: a pod of one rank, or an older profiler), is accepted too: the
# operator rate-limits by rank reports, so both cost a pod the same budget, but a batch costs
# the operator one request instead of 32-128.
MAX_BODY_BYTES = 8192  # a one-rank message
MAX_STEP_TIMES = 64  # recent step durations a one-rank message carries (the newest last)
MAX_NAME = 253
MAX_RANKS_PER_MESSAGE = 128  # a pod's processes: at most an instance type's logical cores
MAX_BATCH_STEP_TIMES = 16  # per rank in a batch: the operator reads the latest 16 only
MAX_BATCH_BODY_BYTES = 65536  # 128 ranks of 16 step times fit with room
MAX_TOKEN_BYTES = 8192  # a bearer token longer than this is refused unread
# The operator rate-limits a pod as if it reported no more often than this (spec.health's own
# floor), whatever its job's spec says.
MIN_INTERVAL_S = 0.2

# -- what the operator may ask in its reply (`requests`) ---------------------------------------
# Write the Python stacks of all the rank's threads for request <id>, then say so in every later
# message (`stacksDumped`). An id is a path component: letters, digits and dashes only.
REQUEST_DUMP_STACKS = "dumpStacks"
STACKS_SUBDIR = "stacks"
# Capture the next <steps> steps in full (a user's `trainium.dev/profile-steps` annotation):
# {"id": <request id>, "steps": N}. The rank opens a detailed window at its next step, writes it
# to `on_demand_dir(<its STACKS_DIR>, id)` (beside `stacks/` in the attempt's profile
# directory), says `profileCapturing` while it records and `profileCaptured` once the files are
# complete.
REQUEST_CAPTURE_STEPS = "captureSteps"
ON_DEMAND_SUBDIR = "on-demand"
MAX_CAPTURE_STEPS = 1000
_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")


def valid_request_id(value: object) -> bool:
    return isinstance(value, str) and _REQUEST_ID.match(value) is not None


def stacks_dir(profile_dir: str) -> str:
    """The attempt's stacks directory under its profile directory."""
    return f"{profile_dir.rstrip('/')}/{STACKS_SUBDIR}"


def stacks_file(directory: str, request_id: str, rank: int) -> str:
    """Where rank `rank` writes its stacks for request `request_id`."""
    if not valid_request_id(request_id):
        raise ValueError(f"not a stack request id: {request_id!r}")
    return f"{directory.rstrip('/')}/{request_id}/rank-{rank}.txt"


def sample_file(pod_directory: str, local_rank: int) -> str:
    """Where local rank `local_rank` writes its newest sample."""
    return f"{pod_directory.rstrip('/')}/rank-{local_rank}.json"


def answer_file(pod_directory: str) -> str:
    return f"{pod_directory.rstrip('/')}/{ANSWER_FILE}"


def stale_after_s(interval_s: float) -> float:
    """How old a sample or answer may be and still count (never under a second: file times
    and thread wake-ups are coarse)."""
    return max(STALE_INTERVALS * interval_s, 1.0)


def on_demand_dir(stacks_directory: str, request_id: str) -> str:
    """Where on-demand capture `request_id` writes: `<profile dir>/on-demand/<id>`, the profile
    directory being the one whose `stacks/` the rank was given."""
    if not valid_request_id(request_id):
        raise ValueError(f"not a capture request id: {request_id!r}")
    profile_dir = stacks_directory.rstrip("/").rpartition("/")[0]
    return f"{profile_dir}/{ON_DEMAND_SUBDIR}/{request_id}"


@dataclass(frozen=True, slots=True)
class CaptureRequest:
    """A `captureSteps` request: `steps` steps in full, from the rank's next step."""

    request_id: str
    steps: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.request_id, "steps": self.steps}

    @classmethod
    def from_json(cls, value: object) -> CaptureRequest | None:
        """The request, or None for anything malformed (a rank ignores it)."""
        if not isinstance(value, dict):
            return None
        request_id, steps = value.get("id"), value.get("steps")
        if not valid_request_id(request_id) or not isinstance(steps, int):
            return None
        if isinstance(steps, bool) or not 1 <= steps <= MAX_CAPTURE_STEPS:
            return None
        assert isinstance(request_id, str)
        return cls(request_id, steps)


@dataclass(frozen=True, slots=True)
class ProgressMessage:
    """One rank's progress: the newest step it started and its recent step times."""

    job: str
    namespace: str
    uid: str
    attempt: int
    rank: int  # torchrun's RANK (global)
    node_rank: int  # torchrun's GROUP_RANK: the pod's trainium.dev/node-rank
    world_size: int
    step: int  # the step the rank is in now (-1: none started yet)
    step_times_ms: tuple[float, ...]  # durations of the latest finished steps
    samples: int | None = None  # cumulative, when the script reports them (profiler.report)
    tokens: int | None = None
    sequence: int = 0  # the rank's message counter since its start
    # How long the rank had been in `step` when it sent this, by its own monotonic clock: the
    # operator dates the step from it (received - age), so the date survives an operator
    # restart and does not depend on the two clocks agreeing. None: an older profiler.
    step_age_ms: float | None = None
    stacks_dumped: str = ""  # the id of the newest stack request this rank answered
    profile_capturing: str = ""  # the capture request whose window this rank is recording
    profile_captured: str = ""  # the newest capture request whose files this rank completed
    final: bool = False  # the rank's last message (the profiler stopped): it ended, not stalled
    # The step of the newest checkpoint this rank knows is complete (profiler.checkpoint_saved):
    # a restart loses the steps after it. None: the script does not say (lost work unknown).
    last_checkpoint_step: int | None = None

    def header_json(self) -> dict[str, Any]:
        """The fields every rank of one pod shares (a batch's top level)."""
        return {key: getattr(self, attribute) for key, attribute, _ in _HEADER}

    def rank_json(self, max_step_times: int = MAX_STEP_TIMES) -> dict[str, Any]:
        """This rank's own fields (a batch's `ranks` entry)."""
        body: dict[str, Any] = {
            "rank": self.rank,
            "step": self.step,
            "stepTimesMs": [round(t, 3) for t in self.step_times_ms[-max_step_times:]],
        }
        if self.samples is not None:
            body["samples"] = self.samples
        if self.tokens is not None:
            body["tokens"] = self.tokens
        if self.step_age_ms is not None:
            body["stepAgeMs"] = round(self.step_age_ms, 1)
        if self.stacks_dumped:
            body["stacksDumped"] = self.stacks_dumped
        if self.profile_capturing:
            body["profileCapturing"] = self.profile_capturing
        if self.profile_captured:
            body["profileCaptured"] = self.profile_captured
        if self.final:
            body["final"] = True
        if self.last_checkpoint_step is not None:
            body["lastCheckpointStep"] = self.last_checkpoint_step
        return body

    def to_json(self) -> bytes:
        """The one-rank form of the message."""
        body = {**self.header_json(), **self.rank_json()}
        return json.dumps(body, separators=(",", ":")).encode()


def sample_json(message: ProgressMessage) -> bytes:
    """A rank's sample in its pod directory: the one-rank form with a batch's step times."""
    body = {**message.header_json(), **message.rank_json(MAX_BATCH_STEP_TIMES)}
    return json.dumps(body, separators=(",", ":")).encode()


def batch_json(messages: list[ProgressMessage]) -> bytes:
    """One pod's message: the first message's header and every rank's own fields, in order,
    as many as fit MAX_BATCH_BODY_BYTES and MAX_RANKS_PER_MESSAGE (the first always does)."""
    if not messages:
        raise ValueError("a batch has at least one rank")
    head = json.dumps(messages[0].header_json(), separators=(",", ":"))
    opening, closing = head[:-1] + ',"ranks":[', "]}"
    size = len(opening) + len(closing)
    entries: list[str] = []
    for message in messages[:MAX_RANKS_PER_MESSAGE]:
        entry = json.dumps(message.rank_json(MAX_BATCH_STEP_TIMES), separators=(",", ":"))
        added = len(entry.encode()) + (1 if entries else 0)
        if entries and size + added > MAX_BATCH_BODY_BYTES:
            continue  # an absurdly large entry (a tenant's sample) costs only itself
        entries.append(entry)
        size += added
    return (opening + ",".join(entries) + closing).encode()


def _int(body: dict[str, Any], key: str, low: int) -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < 2**62:
        raise ValueError(f"{key}: an integer >= {low} is required")
    return value


def _optional_int(body: dict[str, Any], key: str) -> int | None:
    return None if body.get(key) is None else _int(body, key, 0)


def _name(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        raise ValueError(f"{key}: a name of 1..{MAX_NAME} characters is required")
    return value


def _load(raw: bytes, limit: int) -> dict[str, Any]:
    if len(raw) > limit:
        raise ValueError(f"the message is larger than {limit} bytes")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"the message is not JSON ({error})") from error
    if not isinstance(body, dict):
        raise ValueError("the message is not a JSON object")
    return body


# The header's fields, written and read: (JSON key, attribute, lowest value; None: a name).
_HEADER: tuple[tuple[str, str, int | None], ...] = (
    ("job", "job", None),
    ("namespace", "namespace", None),
    ("uid", "uid", None),
    ("attempt", "attempt", 0),
    ("nodeRank", "node_rank", 0),
    ("worldSize", "world_size", 1),
    ("sequence", "sequence", 0),
)


def _header(body: dict[str, Any]) -> dict[str, Any]:
    return {
        attribute: _name(body, key) if low is None else _int(body, key, low)
        for key, attribute, low in _HEADER
    }


def _rank_fields(body: dict[str, Any], max_step_times: int) -> dict[str, Any]:
    times = body.get("stepTimesMs", [])
    if not isinstance(times, list) or len(times) > max_step_times:
        raise ValueError(f"stepTimesMs: a list of at most {max_step_times} numbers is required")
    step_times: list[float] = []
    for value in times:
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
            or value < 0
        ):
            raise ValueError("stepTimesMs: finite, non-negative numbers are required")
        step_times.append(float(value))
    age = body.get("stepAgeMs")
    if age is not None and (
        not isinstance(age, int | float)
        or isinstance(age, bool)
        or not math.isfinite(age)
        or not 0 <= age < 1e12
    ):
        raise ValueError("stepAgeMs: a finite, non-negative number is required")
    dumped = body.get("stacksDumped", "")
    if dumped != "" and not valid_request_id(dumped):
        raise ValueError("stacksDumped: a stack request id is required")
    capture_ids: dict[str, str] = {}
    for key in ("profileCapturing", "profileCaptured"):
        value = body.get(key, "")
        if value != "" and not valid_request_id(value):
            raise ValueError(f"{key}: a capture request id is required")
        capture_ids[key] = str(value)
    final = body.get("final", False)
    if not isinstance(final, bool):
        raise ValueError("final: a boolean is required")
    return {
        "rank": _int(body, "rank", 0),
        "step": _int(body, "step", -1),
        "step_times_ms": tuple(step_times),
        "samples": _optional_int(body, "samples"),
        "tokens": _optional_int(body, "tokens"),
        "step_age_ms": None if age is None else float(age),
        "stacks_dumped": str(dumped),
        "profile_capturing": capture_ids["profileCapturing"],
        "profile_captured": capture_ids["profileCaptured"],
        "final": final,
        "last_checkpoint_step": _optional_int(body, "lastCheckpointStep"),
    }


def parse_message(raw: bytes) -> ProgressMessage:
    """A one-rank message from its JSON body; ValueError names the first bad field. Nothing in
    it is trusted beyond its shape: the sender's identity comes from its token, not from here."""
    body = _load(raw, MAX_BODY_BYTES)
    return ProgressMessage(**_header(body), **_rank_fields(body, MAX_STEP_TIMES))


def parse_messages(raw: bytes) -> tuple[ProgressMessage, ...]:
    """The ranks of one message, either form (a pod's batch with `ranks`, or one rank's), each
    as its own ProgressMessage; ValueError names the first bad field. A batch names each rank
    once, at most MAX_RANKS_PER_MESSAGE of them."""
    body = _load(raw, MAX_BATCH_BODY_BYTES)
    if "ranks" not in body:
        if len(raw) > MAX_BODY_BYTES:
            raise ValueError(f"a one-rank message is larger than {MAX_BODY_BYTES} bytes")
        return (ProgressMessage(**_header(body), **_rank_fields(body, MAX_STEP_TIMES)),)
    header = _header(body)
    entries = body["ranks"]
    if not isinstance(entries, list) or not 0 < len(entries) <= MAX_RANKS_PER_MESSAGE:
        raise ValueError(f"ranks: a list of 1..{MAX_RANKS_PER_MESSAGE} ranks is required")
    messages: list[ProgressMessage] = []
    seen: set[int] = set()
    for entry in entries:
        if not isinstance(entry, dict):
            raise ValueError("ranks: JSON objects are required")
        message = ProgressMessage(**header, **_rank_fields(entry, MAX_BATCH_STEP_TIMES))
        if message.rank in seen:
            raise ValueError(f"ranks: rank {message.rank} is named twice")
        seen.add(message.rank)
        messages.append(message)
    return tuple(messages)


def reply_json(
    *, accepted: bool, reason: str = "", requests: dict[str, Any] | None = None
) -> bytes:
    """The operator's answer. `requests` carries what the operator asks of the rank
    (`REQUEST_DUMP_STACKS`: write your stacks; `REQUEST_CAPTURE_STEPS`: profile the next steps);
    an unknown request is ignored by the rank."""
    return json.dumps(
        {"accepted": accepted, "reason": reason, "requests": requests or {}},
        separators=(",", ":"),
    ).encode()


def channel_env(url: str, interval_s: float, stacks_directory: str) -> dict[str, str]:
    """What a training pod of a job with the channel on gets, in this order."""
    return {
        URL: url,
        TOKEN_FILE: TOKEN_PATH,
        INTERVAL_S: f"{interval_s:g}",
        STACKS_DIR: stacks_directory,
        POD_DIR: POD_DIR_PATH,
    }
