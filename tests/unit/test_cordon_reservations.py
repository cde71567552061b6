"""The cluster-wide cordon budget as the applier enforces it (controller/reconciler.py
CordonReservations): a proposed cordon is checked and reserved in one step under the lock, a
reservation counts for the next pass before the node cache shows it, and a plan whose status
write failed gives its reservation back."""

from __future__ import annotations

from trainium_operator.controller.reconciler import CordonReservations


def cordoned(name: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": {"trainium.dev/cordoned": "straggler"}},
        "spec": {"unschedulable": True},
    }


def test_a_reserved_cordon_takes_the_last_slot_before_the_cache_shows_it() -> None:
    clock = [0.0]
    reservations = CordonReservations(2, clock=lambda: clock[0])
    assert reservations.budget([cordoned("a")]).refusal("b") is None
    assert reservations.reserve(["b"], [cordoned("a")])  # job 1's plan cordons b
    second = reservations.budget([cordoned("a")])  # the cache has not seen b yet
    assert second.cordoned == frozenset({"a", "b"})
    refusal = second.refusal("c")
    assert refusal is not None
    assert "2 of 2" in refusal
    assert second.refusal("b") is None  # re-asserting its own cordon costs nothing
    assert reservations.reserve(["b"], [cordoned("a")])


def test_two_plans_proposed_from_the_same_budget_get_one_slot() -> None:
    reservations = CordonReservations(1)
    seen = reservations.budget([])  # both jobs' snapshots saw a free slot
    assert seen.refusal("x") is None
    assert seen.refusal("y") is None
    assert reservations.reserve(["x"], [])
    assert not reservations.reserve(["y"], []), "the second plan must be decided again"
    assert reservations.budget([]).cordoned == frozenset({"x"})


def test_a_released_reservation_frees_its_slot() -> None:
    reservations = CordonReservations(1)
    assert reservations.reserve(["x"], [])
    reservations.release(["x"])  # its status write failed: the cordon never happens
    assert reservations.reserve(["y"], [])


def test_a_reservation_expires_so_an_uncordoned_node_frees_its_slot() -> None:
    clock = [0.0]
    reservations = CordonReservations(1, clock=lambda: clock[0])
    assert reservations.reserve(["b"], [])
    clock[0] = CordonReservations.RESERVATION_SECONDS + 1
    # b was uncordoned meanwhile: the cache shows no cordon, the reservation is stale.
    assert reservations.budget([]).refusal("c") is None


def test_a_zero_budget_refuses_every_cordon() -> None:
    reservations = CordonReservations(0)
    refusal = reservations.budget([]).refusal("a")
    assert refusal is not None
    assert "--straggler-cordon-budget" in refusal
    assert not reservations.reserve(["a"], [])
