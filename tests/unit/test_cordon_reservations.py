"""The reconciler's view of the cordon budget (controller/reconciler.py CordonReservations):
a cordon decided in one pass counts for the next pass before the node cache shows it."""

from __future__ import annotations

from trainium_operator.controller.reconciler import CordonReservations


def cordoned(name: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": {"trainium.dev/cordoned": "straggler"}},
        "spec": {"unschedulable": True},
    }


def test_a_decided_cordon_takes_the_last_slot_before_the_cache_shows_it() -> None:
    clock = [0.0]
    reservations = CordonReservations(2, clock=lambda: clock[0])
    with reservations.lock:
        first = reservations.budget([cordoned("a")])
        assert first.refusal("b") is None
        reservations.reserve(["b"])  # job 1's pass decided to cordon b
    with reservations.lock:
        second = reservations.budget([cordoned("a")])  # the cache has not seen b yet
    assert second.cordoned == frozenset({"a", "b"})
    refusal = second.refusal("c")
    assert refusal is not None
    assert "2 of 2" in refusal
    assert second.refusal("b") is None  # re-asserting its own cordon costs nothing


def test_a_reservation_expires_so_an_uncordoned_node_frees_its_slot() -> None:
    clock = [0.0]
    reservations = CordonReservations(1, clock=lambda: clock[0])
    with reservations.lock:
        reservations.reserve(["b"])
    clock[0] = CordonReservations.RESERVATION_SECONDS + 1
    with reservations.lock:
        # b was uncordoned meanwhile: the cache shows no cordon, the reservation is stale.
        assert reservations.budget([]).refusal("c") is None


def test_a_zero_budget_refuses_every_cordon() -> None:
    reservations = CordonReservations(0)
    with reservations.lock:
        refusal = reservations.budget([]).refusal("a")
    assert refusal is not None
    assert "--straggler-cordon-budget" in refusal
