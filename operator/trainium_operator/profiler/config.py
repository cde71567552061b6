"""Profiler settings: from the environment the operator sets in training pods, or built in code.

Environment (the first group is set by the operator; see the design notes):

| variable | meaning |
|---|---|
| `TRAINIUM_PROFILE` | `1`/`true` turns profiling on |
| `TRAINIUM_PROFILE_DIR` | profile directory: `<mountPath>/profiles/<namespace>/<job>/<attempt>` |
| `TRAINIUM_PROFILE_STEPS` | `<first>:<last>` detailed window (inclusive); unset = every step |
| `TRAINIUM_NODE_NAME` | node name (downward API); falls back to the host name |
| `RANK`, `LOCAL_RANK`, `GROUP_RANK`, `WORLD_SIZE` | torchrun's rank identity |
| `TRAINIUM_JOB_NAME`, `..._NAMESPACE`, `..._UID` | job identity for `profile.json` (*) |
| `TRAINIUM_ATTEMPT` | attempt number (*) |
| `TRAINIUM_PROFILE_SOURCES` | device sources: `torch,neuron` (default) or `none` |
| `TRAINIUM_PROFILE_NEURON_DEVICE` | `1`: the torch source also captures TorchNeuron's profiles |
| `TRAINIUM_PROFILE_RING_EVENTS` | records per thread ring (power of two, default 65536) |
| `TRAINIUM_PROFILE_FLUSH_MS` | flush period of the background writer (default 1000) |
| `TRAINIUM_PROFILE_SAMPLE_MS` | CPU/memory sample period in the window (200; 0 = off) (**) |
| `TRAINIUM_PROFILE_SYNC_S` | period of clock sync points (default 10) |

(*) name, namespace and attempt fall back to the `profiles/<namespace>/<job>/<attempt>` path.
(**) ten times slower outside the step window.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from trainium_operator.contract import neuron_env, profiler_env

# Variable names come from contract.profiler_env, which the operator's pod builder imports too.
NumberT = TypeVar("NumberT", int, float)

KNOWN_SOURCES = frozenset({"torch", "neuron"})
DEFAULT_SOURCES = frozenset({"torch", "neuron"})
DEFAULT_RING_EVENTS = 1 << 16

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class ProfilerConfigError(ValueError):
    """The profiler settings are invalid; the message lists every problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid profiler settings: " + "; ".join(self.problems))


@dataclass(frozen=True)
class StepWindow:
    """Steps `first`..`last` inclusive get detailed capture (annotations, device sources)."""

    first: int
    last: int

    def __post_init__(self) -> None:
        if self.first < 0 or self.last < self.first:
            raise ValueError(
                f"step window {self.first}:{self.last} must satisfy 0 <= first <= last"
            )

    @classmethod
    def parse(cls, text: str) -> StepWindow:
        """`"<first>:<last>"`, or a single step `"<n>"`."""
        first, sep, last = text.strip().partition(":")
        try:
            return cls(int(first), int(last) if sep else int(first))
        except ValueError as exc:
            raise ValueError(f"step window {text!r} is not <first>:<last> ({exc})") from exc


@dataclass(frozen=True)
class ProfilerConfig:
    """Everything the profiler needs; `ProfilerConfig.from_env()` builds it from a pod's env."""

    enabled: bool = True
    output_dir: Path | None = None
    steps: StepWindow | None = None
    node: str = field(default_factory=socket.gethostname)
    rank: int = 0
    local_rank: int = 0
    group_rank: int = 0
    world_size: int = 1
    job_name: str = ""
    namespace: str = ""
    job_uid: str = ""
    attempt: int = 0
    sources: frozenset[str] = DEFAULT_SOURCES
    # The torch source passes TorchNeuron's NeuronConfig for the window (contract/neuron_env.py).
    neuron_device: bool = False
    ring_events: int = DEFAULT_RING_EVENTS
    flush_interval_s: float = 1.0
    sample_interval_s: float = 0.2
    sync_interval_s: float = 10.0

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise ProfilerConfigError(problems)

    @property
    def rank_file(self) -> Path | None:
        """`<output_dir>/<node>/rank-<rank>.trnprof`, or None without an output directory."""
        if self.output_dir is None:
            return None
        return self.output_dir / self.node / f"rank-{self.rank}.trnprof"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ProfilerConfig:
        """Read the settings; collects every malformed variable into one ProfilerConfigError."""
        env = os.environ if environ is None else environ
        problems: list[str] = []

        def get_number(name: str, default: NumberT, parse: Callable[[str], NumberT]) -> NumberT:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                return parse(raw)
            except ValueError:
                kind = "an integer" if parse is int else "a number"
                problems.append(f"{name}={raw!r} is not {kind}")
                return default

        def get_int(name: str, default: int) -> int:
            return get_number(name, default, int)

        def get_float(name: str, default: float) -> float:
            return get_number(name, default, float)

        flag = env.get(profiler_env.ENABLE, "").strip().lower()
        if flag not in _TRUE | _FALSE:
            problems.append(f"{profiler_env.ENABLE}={flag!r} is not 1/0/true/false")
        enabled = flag in _TRUE
        if not enabled and not problems:
            # Profiling is off: the rest of the environment is not our business.
            return cls(enabled=False)

        steps = None
        raw_steps = env.get(profiler_env.STEPS, "").strip()
        if raw_steps:
            try:
                steps = StepWindow.parse(raw_steps)
            except ValueError as exc:
                problems.append(f"{profiler_env.STEPS}: {exc}")

        raw_dir = env.get(profiler_env.DIR, "").strip()
        output_dir = Path(raw_dir) if raw_dir else None
        path_ns, path_job, path_attempt = _identity_from_dir(output_dir)

        neuron_flag = env.get(neuron_env.TORCH_CAPTURE, "").strip().lower()
        if neuron_flag not in _TRUE | _FALSE:
            problems.append(f"{neuron_env.TORCH_CAPTURE}={neuron_flag!r} is not 1/0/true/false")

        raw_sources = env.get(profiler_env.SOURCES)
        sources = DEFAULT_SOURCES if raw_sources is None else parse_sources(raw_sources, problems)

        values: dict[str, Any] = {
            "enabled": enabled,
            "output_dir": output_dir,
            "steps": steps,
            "node": env.get(profiler_env.NODE, "").strip() or socket.gethostname(),
            "rank": get_int("RANK", 0),
            "local_rank": get_int("LOCAL_RANK", 0),
            "group_rank": get_int("GROUP_RANK", 0),
            "world_size": get_int("WORLD_SIZE", 1),
            "job_name": env.get(profiler_env.JOB_NAME, "").strip() or path_job,
            "namespace": env.get(profiler_env.JOB_NAMESPACE, "").strip() or path_ns,
            "job_uid": env.get(profiler_env.JOB_UID, "").strip(),
            "attempt": get_int(profiler_env.ATTEMPT, path_attempt),
            "sources": sources,
            "neuron_device": neuron_flag in _TRUE,
            "ring_events": get_int(profiler_env.RING_EVENTS, DEFAULT_RING_EVENTS),
            "flush_interval_s": get_float(profiler_env.FLUSH_MS, 1000.0) / 1000.0,
            "sample_interval_s": get_float(profiler_env.SAMPLE_MS, 200.0) / 1000.0,
            "sync_interval_s": get_float(profiler_env.SYNC_S, 10.0),
        }
        try:
            config = cls(**values)
        except ProfilerConfigError as exc:
            problems.extend(exc.problems)
        if problems:
            raise ProfilerConfigError(problems)
        return config


def parse_sources(text: str, problems: list[str]) -> frozenset[str]:
    names = {s.strip().lower() for s in text.split(",") if s.strip()}
    if names in ({"none"}, set()):
        return frozenset()
    unknown = names - KNOWN_SOURCES
    if unknown:
        problems.append(
            f"{profiler_env.SOURCES}: unknown source(s) {sorted(unknown)}; "
            f"known: {sorted(KNOWN_SOURCES)}"
        )
    return frozenset(names & KNOWN_SOURCES)


def _identity_from_dir(output_dir: Path | None) -> tuple[str, str, int]:
    """(namespace, job, attempt) from `<mount>/profiles/<namespace>/<job>/<attempt>`."""
    if output_dir is None:
        return "", "", 0
    parts = output_dir.parts
    if len(parts) >= 4 and parts[-4] == "profiles" and parts[-1].isdigit():
        return parts[-3], parts[-2], int(parts[-1])
    return "", "", 0


def _problems(config: ProfilerConfig) -> list[str]:
    problems = []
    if config.enabled and config.output_dir is None:
        problems.append(f"profiling is on but no output directory is set ({profiler_env.DIR})")
    if config.world_size < 1:
        problems.append(f"world size {config.world_size} must be >= 1")
    if not 0 <= config.rank < max(config.world_size, 1):
        problems.append(f"rank {config.rank} is outside world size {config.world_size}")
    if config.local_rank < 0 or config.group_rank < 0:
        problems.append("LOCAL_RANK and GROUP_RANK must be >= 0")
    ring = config.ring_events
    if ring < 16 or ring & (ring - 1):
        problems.append(f"ring size {ring} must be a power of two >= 16")
    if config.flush_interval_s <= 0:
        problems.append("flush interval must be > 0")
    if config.sample_interval_s < 0:
        problems.append("sample interval must be >= 0")
    if config.sync_interval_s <= 0:
        problems.append("sync interval must be > 0")
    if "/" in config.node or config.node in ("", ".", ".."):
        problems.append(f"node name {config.node!r} cannot be a directory name")
    unknown = config.sources - KNOWN_SOURCES
    if unknown:
        problems.append(f"unknown source(s) {sorted(unknown)}")
    return problems
