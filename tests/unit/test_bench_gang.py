"""The gang-size benchmark's pure helpers: ratios, verdicts, spreads, the next attempt's pod
names and the API server's request rates (the bench itself needs a dev cluster)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))
import bench_gang  # noqa: E402
import bench_operator  # noqa: E402


def test_ratio_is_none_without_a_positive_reference() -> None:
    assert bench_gang.ratio(3.0, 2.0) == 1.5
    assert bench_gang.ratio(3.0, None) is None
    assert bench_gang.ratio(None, 2.0) is None
    assert bench_gang.ratio(3.0, 0.0) is None


def test_verdict_meets_the_target_at_and_below_the_limit_only() -> None:
    assert bench_gang.verdict(1.2) == "met"
    assert bench_gang.verdict(1.21) == "NOT met"
    assert bench_gang.verdict(None) == "-"


def test_spread_shows_median_then_min_and_max() -> None:
    assert bench_gang.spread([3.0, 1.0, 2.0]) == "2.00 (1.00-3.00)"
    assert bench_gang.spread([1.5]) == "1.50"
    assert bench_gang.spread([]) == "-"


def test_next_attempt_names_every_rank_of_the_following_attempt() -> None:
    pods = {"warm0-0000-train-0-0", "warm0-0000-train-0-11"}
    assert bench_gang.next_attempt(pods) == {"warm0-0000-train-1-0", "warm0-0000-train-1-11"}


def test_the_direct_restarts_pods_are_the_rendered_ones_renamed_to_the_next_attempt() -> None:
    rendered = [
        {
            "kind": "Pod",
            "metadata": {
                "name": f"again0-0000-train-0-{rank}",
                "labels": {"trainium.dev/attempt": "0", "trainium.dev/rank": str(rank)},
            },
            "spec": {"hostname": f"train-{rank}"},
        }
        for rank in (0, 1)
    ]
    renamed = bench_gang.next_attempt_pods(rendered)
    assert [pod["metadata"]["name"] for pod in renamed] == [
        "again0-0000-train-1-0",
        "again0-0000-train-1-1",
    ]
    assert renamed[1]["metadata"]["labels"] == {
        "trainium.dev/attempt": "1",
        "trainium.dev/rank": "1",
    }
    assert renamed[1]["spec"] == rendered[1]["spec"]
    assert rendered[0]["metadata"]["name"] == "again0-0000-train-0-0", "the rendered pods stay"


def test_the_restart_is_compared_with_a_warm_start_and_with_the_direct_clients_restart() -> None:
    times = [
        bench_operator.Times(first_pod=0.1, all_pods=0.5, gangs_running=running)
        for running in (2.0, 2.0)
    ]
    result = bench_gang.SizeResult(128, 2, warm=times, direct_again=times)
    result.restart = [3.0, 3.2]
    result.restart_direct = [2.8, 3.2]
    restarts = {
        (row.figure, row.reference_label): row.cells()[4:]
        for row in result.rows()
        if "rank fails" in row.figure
    }
    assert restarts == {
        ("rank fails -> new gang Running", "ours warm start"): ["1.55x", "NOT met"],
        ("direct: rank fails -> Running", "direct start"): ["1.50x", ""],
        ("rank fails -> new gang Running", "direct restart"): ["1.04x", "met"],
    }


def test_request_rates_sum_codes_and_sort_highest_first() -> None:
    text = "\n".join(
        [
            "# TYPE apiserver_request_total counter",
            'apiserver_request_total{code="200",resource="leases",verb="PUT"} 100',
            'apiserver_request_total{code="409",resource="leases",verb="PUT"} 10',
            'apiserver_request_total{code="200",resource="pods",verb="LIST"} 5',
        ]
    )
    before = bench_gang.parse_request_counts(text)
    assert before == Counter({"PUT leases": 110, "LIST pods": 5})
    after = Counter({"PUT leases": 130, "LIST pods": 5, "GET nodes": 10})
    assert bench_gang.request_rates(before, after, 10.0) == [
        ("PUT leases", 2.0),
        ("GET nodes", 1.0),
    ]


def test_table_rows_carry_the_median_of_the_pairs_ratios_and_its_verdict() -> None:
    # Pairs: 2.0/2.0, 4.0/2.5, 3.0/3.0 -> 1.0, 1.6, 1.0; the ratio of the medians would be 1.2.
    row = bench_gang.Row("warm job, all Running", [2.0, 4.0, 3.0], [2.0, 2.5, 3.0], "direct")
    assert row.cells() == [
        "warm job, all Running",
        "3.00 (2.00-4.00)",
        "2.50 (2.00-3.00)",
        "direct",
        "1.00x",
        "met",
    ]
    text = bench_gang.table([row])
    assert text.splitlines()[0].startswith("figure (s)")
    assert "1.00x  met" in text


def test_a_pair_that_did_not_measure_a_figure_is_left_out_of_its_ratio() -> None:
    row = bench_gang.Row("warm job, admitted", [None, 3.0, 1.3], [1.0, 2.0, 1.0], "direct", 0.0)
    assert row.cells()[1:5] == ["2.15 (1.30-3.00)", "1.00 (1.00-2.00)", "direct", "1.40x"]
    assert bench_gang.paired_ratio([None], [1.0]) is None
