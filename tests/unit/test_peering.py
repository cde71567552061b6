from __future__ import annotations

from datetime import UTC, datetime, timedelta

from trainium_operator.controller.peering import may_work, outranked

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def peer(priority: int, seen_ago: float = 1, lifetime: int = 60) -> dict[str, object]:
    return {
        "priority": priority,
        "lastseen": (NOW - timedelta(seconds=seen_ago)).isoformat(),
        "lifetime": lifetime,
    }


def test_alone_the_replica_works() -> None:
    assert not outranked({"me": peer(10)}, 10, NOW)


def test_a_live_higher_priority_peer_pauses_the_replica() -> None:
    assert outranked({"me": peer(10), "other": peer(20)}, 10, NOW)
    assert not outranked({"me": peer(20), "other": peer(10)}, 20, NOW)


def test_a_dead_higher_priority_peer_does_not_pause_it() -> None:
    assert not outranked({"me": peer(10), "other": peer(20, seen_ago=120)}, 10, NOW)


def test_a_tie_pauses_both_as_kopf_does() -> None:
    assert outranked({"me": peer(10), "other": peer(10)}, 10, NOW)


def test_a_missing_peering_object_or_own_entry_pauses_the_replica() -> None:
    assert not may_work({}, 10, NOW), "no peering object: another replica may be working"
    assert not may_work({"other": peer(5)}, 10, NOW), "our entry is not written (yet)"
    assert not may_work({"me": peer(10, seen_ago=120)}, 10, NOW), "our own entry expired"
    assert may_work({"me": peer(10), "other": peer(5)}, 10, NOW)
    assert not may_work({"me": peer(10), "other": peer(20)}, 10, NOW)
