"""Writes the Perfetto TrackEvent fixtures of the native stack's device profiles.

Built field by field from Perfetto's documented protos (trace.proto, trace_packet.proto,
track_event/track_event.proto, track_descriptor.proto, interned_data.proto), not captured on
hardware: no Neuron Explorer Perfetto export is published. Track and event names are
placeholders (what Neuron puts on which track is not documented). Regenerate with
`python tests/profiler/perfetto_fixture.py`; a test checks the committed files match.
"""

from __future__ import annotations

import struct
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "neuron"
UNIX_FIXTURE = FIXTURES / "device_profile_model_10001.pftrace"
RELATIVE_FIXTURE = FIXTURES / "device_profile_model_10002_relative.pftrace"
UNIX_BASE_NS = 1_729_888_371_100_000_000  # the system fixture's first nc_exec_running + ...
SEQUENCE = 7


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def uint(number: int, value: int) -> bytes:
    return key(number, 0) + varint(value)


def message(number: int, body: bytes) -> bytes:
    return key(number, 2) + varint(len(body)) + body


def text(number: int, value: str) -> bytes:
    return message(number, value.encode())


def fixed64(number: int, value: int) -> bytes:
    return key(number, 1) + struct.pack("<Q", value)


def packet(*fields: bytes) -> bytes:
    return message(1, b"".join(fields))  # Trace.packet = 1


def track(uuid: int, name: str, parent: int = 0) -> bytes:
    body = uint(1, uuid) + text(2, name) + (uint(5, parent) if parent else b"")
    return packet(message(60, body))  # TracePacket.track_descriptor = 60


def interned_names(*pairs: tuple[int, str], cleared: bool = False) -> bytes:
    names = b"".join(message(2, uint(1, iid) + text(2, name)) for iid, name in pairs)
    flags = uint(13, 1) if cleared else b""  # SEQ_INCREMENTAL_STATE_CLEARED
    return packet(uint(10, SEQUENCE), flags, message(12, names))  # interned_data = 12


def event(ts: int, kind: int, track_uuid: int, *, iid: int = 0, name: str = "") -> bytes:
    body = uint(9, kind) + uint(11, track_uuid)
    body += uint(10, iid) if iid else b""
    body += text(23, name) if name else b""
    return packet(uint(8, ts), uint(10, SEQUENCE), message(11, body))  # track_event = 11


def counter(ts: int, track_uuid: int, value: int) -> bytes:
    body = uint(9, 4) + uint(11, track_uuid) + uint(30, value)
    return packet(uint(8, ts), uint(10, SEQUENCE), message(11, body))


def device_profile(base_ns: int) -> bytes:
    """Two engine tracks under one NeuronCore track: a nested pair, an inline name, an
    instant, an end without a begin (dropped) and a counter track (kept apart)."""
    return b"".join(
        [
            track(100, "NeuronCore (placeholder)"),
            track(101, "engine A (placeholder)", parent=100),
            track(102, "engine B (placeholder)", parent=100),
            track(103, "counter (placeholder)", parent=100),
            interned_names((1, "matmul"), (2, "activation"), cleared=True),
            event(base_ns + 1_000, 1, 101, iid=1),
            event(base_ns + 2_000, 1, 101, iid=2),
            event(base_ns + 5_000, 2, 101),
            event(base_ns + 9_000, 2, 101),
            event(base_ns + 3_000, 1, 102, name="dma copy"),
            event(base_ns + 7_000, 2, 102),
            event(base_ns + 8_000, 3, 102, name="semaphore"),
            event(base_ns + 9_500, 2, 102),
            counter(base_ns + 4_000, 103, 42),
        ]
    )


def main() -> None:
    UNIX_FIXTURE.write_bytes(device_profile(UNIX_BASE_NS))
    RELATIVE_FIXTURE.write_bytes(device_profile(0))


if __name__ == "__main__":
    main()
