"""The profile UI's API serving an s3:// prefix from the local S3 server: list (search, status
filter), only complete profiles loadable, the same dashboard as from a directory."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from s3_server import S3Bucket
from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.analysis.loading import load_profile
from trainium_operator.analysis.report import dashboard
from trainium_operator.profiler.s3 import parse_s3_uri, upload_profile
from trainium_operator.ui.app import create_app
from trainium_operator.ui.profiles import JobInfo
from trainium_operator.ui.summary_cache import SummaryCache, checked_directory
from ui_serving import get_json, post_json, serving

SPEC = SyntheticSpec(nodes=2, ranks_per_node=2, kernels_per_step=8, steps=6, detailed_steps=(1, 4))


def upload_tree(s3: S3Bucket, tmp_path: Path, root: str) -> Path:
    """Two complete profiles and one interrupted upload (rank files, no manifest)."""
    for job in ("bert-large", "llama-pretrain"):
        spec = SyntheticSpec(**{**SPEC.__dict__, "job_name": job})
        local = write_synthetic_profile(tmp_path / job, spec)
        upload_profile(local, parse_s3_uri(s3.uri(f"{root}/ml/{job}/0")))
    client = s3.client()
    for rank_file in sorted(local.glob("*/rank-*.trnprof"))[:2]:
        key = f"{root}/ml/bert-large/1/{rank_file.relative_to(local).as_posix()}"
        client.upload_file(str(rank_file), s3.bucket, key)
    return local


async def jobs() -> list[JobInfo]:
    return [
        JobInfo("bert-large", "ml", "2026-01-02T00:00:00Z", "Failed", None, None),
        JobInfo(
            "llama-pretrain", "ml", "2026-01-01T00:00:00Z", "Succeeded", None, "s3://x/y/ml/z/0"
        ),
    ]


def test_the_ui_lists_and_opens_profiles_from_s3(
    s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINIUM_PROFILE_CACHE", str(tmp_path / "cache"))
    local = upload_tree(s3, tmp_path, "profiles")
    with serving(create_app(s3.uri("profiles"), workers=1)) as url:
        listing = get_json(f"{url}/api/profiles")
        assert listing["source"] == "s3"
        assert listing["root"] == s3.uri("profiles")
        rows = {row["id"]: row for row in listing["profiles"]}
        assert sorted(rows) == ["ml/bert-large/0", "ml/bert-large/1", "ml/llama-pretrain/0"]
        assert rows["ml/llama-pretrain/0"]["loadable"]
        assert rows["ml/llama-pretrain/0"]["job_name"] == "llama-pretrain"
        incomplete = rows["ml/bert-large/1"]
        assert not incomplete["loadable"]
        assert incomplete["status"] == "Incomplete"
        assert incomplete["job_name"] == "bert-large", "named from the key layout"

        with pytest.raises(urllib.error.HTTPError) as refused:
            post_json(f"{url}/api/profiles/load?id=ml/bert-large/1")
        assert refused.value.code == 409

        loaded = post_json(f"{url}/api/profiles/load?id=ml/llama-pretrain/0&wait=1")
        assert loaded["state"] == "loaded", loaded
        served = get_json(f"{url}/api/dashboard?id=ml/llama-pretrain/0")
        expected = dashboard(load_profile(local, workers=1))
        assert served["steps"] == json.loads(json.dumps(expected["steps"]))
        assert served["overview"]["ranks"] == expected["overview"]["ranks"]
        assert served["overview"]["path"] == s3.uri("profiles/ml/llama-pretrain/0")


def test_the_list_is_searched_by_job_name_and_filtered_by_status(
    s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINIUM_PROFILE_CACHE", str(tmp_path / "cache"))
    upload_tree(s3, tmp_path, "p")
    with serving(create_app(s3.uri("p"), job_lister=jobs, workers=1)) as url:
        everything = get_json(f"{url}/api/profiles")
        by_id = {row["id"]: row["status"] for row in everything["profiles"]}
        # A profile's status is its job's phase when the cluster knows the job.
        assert by_id == {
            "ml/bert-large/0": "Failed",
            "ml/bert-large/1": "Failed",
            "ml/llama-pretrain/0": "Succeeded",
        }
        assert everything["statuses"] == ["Failed", "Succeeded"]
        searched = get_json(f"{url}/api/profiles?q={urllib.parse.quote('LLAMA')}")
        assert [row["id"] for row in searched["profiles"]] == ["ml/llama-pretrain/0"]
        assert [job["name"] for job in searched["jobs"]] == ["llama-pretrain"]
        failed = get_json(f"{url}/api/profiles?status=Failed")
        assert [row["id"] for row in failed["profiles"]] == ["ml/bert-large/0", "ml/bert-large/1"]
        both = get_json(f"{url}/api/profiles?status=Failed&q=bert-large/1")
        assert [row["id"] for row in both["profiles"]] == ["ml/bert-large/1"]
        assert everything["total"] == 3


def test_a_missing_bucket_is_reported_on_the_page_not_a_crash(
    s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINIUM_PROFILE_CACHE", str(tmp_path / "cache"))
    with serving(create_app("s3://no-such-bucket/profiles", workers=1)) as url:
        listing = get_json(f"{url}/api/profiles")
        assert listing["profiles"] == []
        assert "bucket 'no-such-bucket' does not exist" in listing["profiles_error"]
        assert get_json(f"{url}/api/profiles")["profiles_error"], "the server keeps answering"


def test_complete_s3_profiles_are_summarised_ahead_once_listed(
    s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINIUM_PROFILE_CACHE", str(tmp_path / "cache"))
    upload_tree(s3, tmp_path, "ahead")
    cache = SummaryCache(checked_directory(tmp_path / "summaries", None))
    with serving(create_app(s3.uri("ahead"), workers=1, summary_cache=cache)) as url:
        deadline = time.monotonic() + 60
        while True:
            rows = {row["id"]: row for row in get_json(f"{url}/api/profiles")["profiles"]}
            states = {key: (row["summaries"] or {}).get("state") for key, row in rows.items()}
            if "queued" not in states.values() and "summarising" not in states.values():
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.1)

        assert states == {
            "ml/bert-large/0": "ready",
            "ml/bert-large/1": None,  # an incomplete upload is not downloaded
            "ml/llama-pretrain/0": "ready",
        }
        assert len(list((tmp_path / "summaries").glob("*.dashboard"))) == 2
