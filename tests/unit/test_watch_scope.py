"""Which namespaces the operator's watches cover, for names and glob patterns."""

from __future__ import annotations

from trainium_operator.controller.watch_scope import watch_scope


def test_no_namespace_watches_everything_unfiltered() -> None:
    scope = watch_scope(())
    assert scope.clusterwide
    assert scope.accepts is None


def test_names_are_watched_one_by_one_without_a_filter() -> None:
    scope = watch_scope(("team-a", "team-b", "team-a"))
    assert scope.sources == ("team-a", "team-b")
    assert scope.accepts is None


def test_a_pattern_watches_cluster_wide_and_keeps_only_matching_namespaces() -> None:
    scope = watch_scope(("team-*", "ml"))
    assert scope.clusterwide
    assert scope.accepts is not None
    assert scope.accepts("team-a")
    assert scope.accepts("ml")
    assert not scope.accepts("mlops")
    assert not scope.accepts("kube-system")
    assert not scope.accepts("TEAM-a"), "namespace names are matched case-sensitively"
