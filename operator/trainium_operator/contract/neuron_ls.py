"""`neuron-ls` JSON output, parsed into what a node's devices are: count, cores, memory, links
and the processes on them. Pure, standard library only: the training image (which runs
`neuron-ls` in a pod) and the operator (which reads what such a pod reports) share it.

Two output shapes, one per Neuron SDK range:

| SDK | command | top level |
|---|---|---|
| 2.33 and earlier | `neuron-ls --json-output` (`-j`) | a list of device objects |
| 2.34 and later | `neuron-ls --output-format json` | an object: instance fields, a device list |

Sources. The `-j` shape and its field names are the Neuron LS user guide's
(`tools/neuron-sys-tools/neuron-ls.rst` in github.com/aws-neuron/aws-neuron-sdk: the `-j`
example on a trn2 and the "Field Definitions"): `neuron_device`, `bdf`, `cpu_affinity`,
`numa_node` (a string in the example), `connected_to`, `nc_count`, `logical_neuroncore_config`
(trn2 only), `memory_size` (bytes), `neuroncore_ids`, `neuron_processes` (`pid`, `command`,
`neuron_runtime_version`). Neuron 2.34 (2026-11-30) replaced `-j` with `--output-format json`,
which "adds top-level fields for information that applies to more than one device, such as
instance and UltraServer details" (announcement `announce-intent-eos-neuron-ls-json`, Neuron
docs, 2026-10-16). That is all that was published about the new shape in what we could read:
its key names are NOT CONFIRMED. So for it the parser takes the device list as the one
top-level list whose entries are objects with `neuron_device` (the per-device fields are read
as in `-j`), and keeps the other top-level scalars, and the scalars of top-level objects one
level down (`ultraserver.id`), as `instance` facts, by name, without interpreting them.

The text comes from a pod the job's author controls, so it is hostile input: at most
MAX_BYTES, nested at most MAX_DEPTH deep (checked before `json.loads` builds anything), at most
MAX_DEVICES devices, MAX_PROCESSES processes per device, and every string and list cut to its
bound. Anything else is a NeuronLsError naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

# The commands, per SDK range (the parser reads both outputs).
JSON_OUTPUT_ARGV: Final = ("neuron-ls", "--json-output")  # Neuron 2.33 and earlier
OUTPUT_FORMAT_JSON_ARGV: Final = ("neuron-ls", "--output-format", "json")  # Neuron 2.34+
FIRST_SDK_WITH_OUTPUT_FORMAT: Final = (2, 34)

JSON_OUTPUT: Final = "json-output"
OUTPUT_FORMAT_JSON: Final = "output-format-json"
Shape = Literal["json-output", "output-format-json"]

# A trn2.48xlarge lists 16 devices with 4 or 8 cores each and a few lines per process; these
# bounds are far above any instance's, and small enough that a reader never holds much.
MAX_BYTES: Final = 1 << 20
MAX_DEPTH: Final = 8  # the 2.34 shape: object > devices > device > processes > process = 4
MAX_DEVICES: Final = 64
MAX_CORES_PER_DEVICE: Final = 16
MAX_LINKS_PER_DEVICE: Final = 16
MAX_PROCESSES: Final = 256
MAX_STRING: Final = 256  # longer strings (a process's command line) are cut
MAX_INSTANCE_FACTS: Final = 64
MAX_FACT_KEY: Final = 64
MAX_INT: Final = 1 << 53  # memory sizes in bytes fit; nothing larger is meaningful here

Fact = str | int | bool


class NeuronLsError(ValueError):
    """`neuron-ls` output that cannot be read; the message names the field and the bound."""


@dataclass(frozen=True)
class NeuronProcess:
    pid: int
    command: str = ""
    runtime_version: str = ""


@dataclass(frozen=True)
class NeuronDevice:
    index: int  # neuron_device: the device's logical id
    core_count: int  # nc_count: NeuronCores the device exposes (logical at the node's LNC)
    core_ids: tuple[int, ...] = ()
    memory_bytes: int | None = None
    connected_to: tuple[int, ...] = ()
    bdf: str = ""
    cpu_affinity: str = ""
    numa_node: int | None = None
    lnc: int | None = None  # logical_neuroncore_config (trn2 only)
    processes: tuple[NeuronProcess, ...] = ()


@dataclass(frozen=True)
class NeuronLsReport:
    shape: Shape
    devices: tuple[NeuronDevice, ...]
    # 2.34+: instance-wide fields by their own names (unconfirmed; not interpreted).
    instance: Mapping[str, Fact] = field(default_factory=dict)

    @property
    def device_count(self) -> int:
        return len(self.devices)

    @property
    def core_count(self) -> int:
        return sum(d.core_count for d in self.devices)

    @property
    def lnc(self) -> int | None:
        """The devices' common LNC; None when none says or they disagree."""
        values = {d.lnc for d in self.devices}
        return values.pop() if len(values) == 1 else None


def parse(raw: bytes | str) -> NeuronLsReport:
    """Either shape of `neuron-ls` JSON output, bounded; NeuronLsError otherwise."""
    text = _text(raw)
    _check_depth(text)
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        raise NeuronLsError(f"neuron-ls output is not JSON ({error})") from error
    if isinstance(data, list):
        return NeuronLsReport(JSON_OUTPUT, _devices(data, "devices"))
    if isinstance(data, dict):
        key, devices = _device_list(data)
        return NeuronLsReport(
            OUTPUT_FORMAT_JSON, _devices(devices, key), _instance_facts(data, skip=key)
        )
    raise NeuronLsError("neuron-ls output is neither a device list (-j) nor an object (2.34+)")


def argv_for(sdk: tuple[int, int]) -> tuple[str, ...]:
    """The `neuron-ls` command whose JSON a Neuron SDK (major, minor) writes."""
    return OUTPUT_FORMAT_JSON_ARGV if sdk >= FIRST_SDK_WITH_OUTPUT_FORMAT else JSON_OUTPUT_ARGV


def _text(raw: bytes | str) -> str:
    size = len(raw.encode() if isinstance(raw, str) else raw)
    if size > MAX_BYTES:
        raise NeuronLsError(f"neuron-ls output is larger than {MAX_BYTES} bytes ({size})")
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise NeuronLsError(f"neuron-ls output is not UTF-8 ({error})") from error


def _check_depth(text: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH before the JSON decoder builds anything."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise NeuronLsError(f"neuron-ls output is nested deeper than {MAX_DEPTH} levels")
        elif char in "]}":
            depth -= 1


def _device_list(data: dict[str, Any]) -> tuple[str, list[Any]]:
    """The one top-level list of device objects of the 2.34+ shape, and its key."""
    found = [
        (key, value)
        for key, value in data.items()
        if isinstance(value, list)
        and value
        and all(isinstance(item, dict) and "neuron_device" in item for item in value)
    ]
    if len(found) != 1:
        which = "no" if not found else f"{len(found)} ({', '.join(sorted(k for k, _ in found))})"
        raise NeuronLsError(
            f"neuron-ls output has {which} top-level list of devices (objects with "
            "neuron_device); exactly one is expected"
        )
    return found[0]


def _devices(items: list[Any], path: str) -> tuple[NeuronDevice, ...]:
    if len(items) > MAX_DEVICES:
        raise NeuronLsError(f"{path}: more than {MAX_DEVICES} devices ({len(items)})")
    devices = tuple(_device(item, f"{path}[{i}]") for i, item in enumerate(items))
    indexes = [d.index for d in devices]
    if len(set(indexes)) != len(indexes):
        raise NeuronLsError(f"{path}: a neuron_device id appears twice ({sorted(indexes)})")
    return devices


def _device(item: Any, path: str) -> NeuronDevice:
    if not isinstance(item, dict):
        raise NeuronLsError(f"{path}: a device object is required")
    memory = item.get("memory_size")
    numa = item.get("numa_node")
    lnc = item.get("logical_neuroncore_config")
    processes = item.get("neuron_processes") or []
    if not isinstance(processes, list):
        raise NeuronLsError(f"{path}.neuron_processes: a list is required")
    if len(processes) > MAX_PROCESSES:
        raise NeuronLsError(f"{path}.neuron_processes: more than {MAX_PROCESSES} processes")
    return NeuronDevice(
        index=_int(item.get("neuron_device"), f"{path}.neuron_device", MAX_DEVICES - 1),
        core_count=_int(item.get("nc_count"), f"{path}.nc_count", MAX_CORES_PER_DEVICE),
        core_ids=_ints(item.get("neuroncore_ids"), f"{path}.neuroncore_ids", MAX_CORES_PER_DEVICE),
        memory_bytes=None if memory is None else _int(memory, f"{path}.memory_size", MAX_INT),
        connected_to=_ints(item.get("connected_to"), f"{path}.connected_to", MAX_LINKS_PER_DEVICE),
        bdf=_string(item.get("bdf"), f"{path}.bdf"),
        cpu_affinity=_string(item.get("cpu_affinity"), f"{path}.cpu_affinity"),
        numa_node=None if numa in (None, "") else _int(numa, f"{path}.numa_node", 1 << 16),
        lnc=None if lnc is None else _int(lnc, f"{path}.logical_neuroncore_config", 2, low=1),
        processes=tuple(
            _process(p, f"{path}.neuron_processes[{i}]") for i, p in enumerate(processes)
        ),
    )


def _process(item: Any, path: str) -> NeuronProcess:
    if not isinstance(item, dict):
        raise NeuronLsError(f"{path}: a process object is required")
    return NeuronProcess(
        pid=_int(item.get("pid"), f"{path}.pid", 1 << 22),
        command=_string(item.get("command"), f"{path}.command"),
        runtime_version=_string(item.get("neuron_runtime_version"), f"{path}.runtime"),
    )


def _int(value: Any, path: str, high: int, *, low: int = 0) -> int:
    """An integer in low..high; the docs' examples write some numbers as decimal strings."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise NeuronLsError(f"{path}: an integer {low}..{high} is required (got {value!r:.40})")
    return value


def _ints(value: Any, path: str, most: int) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > most:
        raise NeuronLsError(f"{path}: a list of at most {most} integers is required")
    return tuple(_int(v, f"{path}[{i}]", MAX_INT) for i, v in enumerate(value))


def _string(value: Any, path: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise NeuronLsError(f"{path}: a string is required")
    return str(value)[:MAX_STRING]


def _instance_facts(data: dict[str, Any], *, skip: str) -> dict[str, Fact]:
    """Top-level scalars, and the scalars of top-level objects as `<object>.<key>`, by name."""
    facts: dict[str, Fact] = {}

    def keep(key: str, value: Any) -> None:
        if len(facts) >= MAX_INSTANCE_FACTS or len(key) > MAX_FACT_KEY:
            return
        if isinstance(value, bool | int) and (isinstance(value, bool) or abs(value) <= MAX_INT):
            facts[key] = value
        elif isinstance(value, str):
            facts[key] = value[:MAX_STRING]

    for key, value in data.items():
        if key == skip:
            continue
        if isinstance(value, dict):
            for inner, item in value.items():
                keep(f"{key}.{inner}", item)
        else:
            keep(key, value)
    return facts
