"""A bucket is untrusted input: keys with "..", absolute or empty components never become
local paths (listing and loading write nothing outside the cache), and a malformed manifest
is that profile's problem while the other profiles list and load (local S3 server)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from s3_server import S3Bucket
from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.analysis.s3store import S3ProfileSource, key_problem
from trainium_operator.profiler.s3 import S3Location, S3ProfileError, parse_s3_uri, upload_profile
from trainium_operator.ui.app import create_app
from ui_serving import get_json, post_json, serving

SPEC = SyntheticSpec(nodes=1, ranks_per_node=2, kernels_per_step=4, steps=4, detailed_steps=(1, 2))

# Keys a tenant with write access below the prefix could create, each aimed outside the cache.
TRAVERSAL_KEYS = (
    "profiles/ml/evil/0/../../../../../../../escaped/rank-0.trnprof",
    "profiles/../../../../escaped/ml/x/0/profile.json",
    "profiles/ml/evil/1/../rank-1.trnprof",
    "profiles/ml/evil/2/node/../../profile.json",
    "profiles/ml//evil/3/node/rank-0.trnprof",
    "profiles/ml/evil/4/node\\..\\..\\x/rank-0.trnprof",
)


def _files(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if path.is_file()}


@pytest.mark.parametrize(
    "relative",
    [
        "../x/profile.json",
        "ml/../0/profile.json",
        "ml/job/0/../rank-0.trnprof",
        "ml/job/0/./rank-0.trnprof",
        "/ml/job/0/profile.json",
        "ml//0/profile.json",
        "ml/job\x00/0/profile.json",
        "ml/job/0/node\\..\\x/rank-0.trnprof",
    ],
)
def test_unsafe_keys_are_named(relative: str) -> None:
    assert key_problem(relative) is not None


@pytest.mark.parametrize(
    "relative", ["ml/job/0/profile.json", "ml/job/0/ip-10-1.ec2/rank-7.trnprof"]
)
def test_layout_keys_are_safe(relative: str) -> None:
    assert key_problem(relative) is None


def test_cache_paths_stay_inside_the_cache(tmp_path: Path) -> None:
    source = S3ProfileSource(S3Location("bucket", "profiles"), cache_dir=tmp_path / "cache")
    inside = source.cache_path(S3Location("bucket", "profiles/ml/j/0"), "node/rank-0.trnprof")
    assert inside == (tmp_path / "cache/bucket/profiles/ml/j/0/node/rank-0.trnprof").resolve()
    for location, relative in (
        (S3Location("bucket", "profiles/ml/../../.."), "profile.json"),
        (S3Location("bucket", "profiles/ml/j/0"), "../../../../x/rank-0.trnprof"),
        (S3Location("..", "profiles"), "profile.json"),
    ):
        with pytest.raises(S3ProfileError, match="unsafe path component"):
            source.cache_path(location, relative)


def test_a_listing_with_traversal_keys_writes_nothing_outside_the_cache(
    s3: S3Bucket, tmp_path: Path
) -> None:
    local = write_synthetic_profile(tmp_path / "local", SPEC)
    upload_profile(local, parse_s3_uri(s3.uri("profiles/ml/good/0")))
    client = s3.client()
    manifest = (local / "profile.json").read_bytes()
    rank_file = next(local.glob("*/rank-0.trnprof")).read_bytes()
    for key in TRAVERSAL_KEYS:
        body = manifest if key.endswith("profile.json") else rank_file
        client.put_object(Bucket=s3.bucket, Key=key, Body=body)
    stored = set(s3.keys("profiles/"))
    assert any(".." in key for key in stored), f"the server normalised the keys: {stored}"

    cache = tmp_path / "work" / "cache"
    before = _files(tmp_path)
    source = S3ProfileSource(parse_s3_uri(s3.uri("profiles")), cache_dir=cache)
    profiles = source.listing()
    loaded = [source.fetch(profile) for profile in profiles if profile.complete]

    written = _files(tmp_path) - before
    assert written, "the good profile was cached"
    assert all(path.resolve().is_relative_to(cache.resolve()) for path in written), sorted(written)
    assert [path.name for path in loaded] == ["0"]
    rows = {profile.identifier: profile for profile in profiles}
    assert rows["ml/good/0"].complete
    hostile = [profile for profile in profiles if profile.identifier != "ml/good/0"]
    assert hostile, "the hostile keys are listed"
    for profile in hostile:
        assert not profile.complete
        assert profile.problem is not None
        assert "unsafe" in profile.problem or "is not <node>/rank-" in profile.problem, (
            profile.problem
        )


MALFORMED_MANIFESTS = {
    "list": b"[1, 2, 3]",
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "s3-files-string": json.dumps({"schema": 1, "extra": {"s3": "not an object"}}).encode(),
    "s3-files-escape": json.dumps(
        {"schema": 1, "extra": {"s3": {"files": {"../../../x/rank-0.trnprof": 10}}}}
    ).encode(),
    "rank-file-escape": json.dumps(
        {"ranks": [{"rank": 0, "node": "n", "file": "../../../etc/rank-0.trnprof"}]}
    ).encode(),
    "schema-text": json.dumps({"schema": "one"}).encode(),
    "attempt-infinite": b'{"attempt": Infinity}',
    "not-utf8": b'{"job_name": "\xff"}',
}


def test_a_malformed_manifest_is_that_profiles_error_and_the_others_list_and_load(
    s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINIUM_PROFILE_CACHE", str(tmp_path / "cache"))
    local = write_synthetic_profile(tmp_path / "local", SPEC)
    upload_profile(local, parse_s3_uri(s3.uri("profiles/ml/good/0")))
    client = s3.client()
    for job, body in MALFORMED_MANIFESTS.items():
        upload_profile(local, parse_s3_uri(s3.uri(f"profiles/ml/{job}/0")))
        client.put_object(Bucket=s3.bucket, Key=f"profiles/ml/{job}/0/profile.json", Body=body)

    with serving(create_app(s3.uri("profiles"), workers=1)) as url:
        rows = {row["id"]: row for row in get_json(f"{url}/api/profiles")["profiles"]}
        assert rows["ml/good/0"]["loadable"]
        for job in MALFORMED_MANIFESTS:
            row = rows[f"ml/{job}/0"]
            assert not row["loadable"], job
            assert "profile.json" in row["manifest_problem"], (job, row["manifest_problem"])
            with pytest.raises(urllib.error.HTTPError) as refused:
                post_json(f"{url}/api/profiles/load?id=ml/{job}/0&wait=1")
            assert refused.value.code == 409, job
            assert "profile.json" in refused.value.read().decode()
        loaded = post_json(f"{url}/api/profiles/load?id=ml/good/0&wait=1")
        assert loaded["state"] == "loaded"
