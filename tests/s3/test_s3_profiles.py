"""Profiles in S3 against a real S3 API on localhost (moto's server mode, tests/s3_server.py):
upload with the manifest last, multipart, paged listings, interrupted uploads, the ETag cache,
errors for a missing bucket and a denied request, and the `profile` commands on s3:// URIs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from s3_server import S3Bucket, aws_env
from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.analysis.s3store import S3ProfileSource, fetch_uri
from trainium_operator.cli import main
from trainium_operator.profiler.manifest import (
    MANIFEST_NAME,
    ManifestRank,
    ProfileManifest,
    write_manifest,
)
from trainium_operator.profiler.s3 import (
    MIB,
    S3Location,
    S3ProfileError,
    parse_s3_uri,
    s3_client,
    upload_profile,
)

SMALL = SyntheticSpec(nodes=2, ranks_per_node=2, kernels_per_step=8, steps=6, detailed_steps=(1, 4))


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINIUM_PROFILE_CACHE", str(tmp_path / "s3-cache"))


@pytest.fixture(scope="module")
def local_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_profile(tmp_path_factory.mktemp("local") / "ml/llama/0", SMALL)


def _count_calls(client: Any, operation: str) -> list[str]:
    calls: list[str] = []
    client.meta.events.register(
        f"before-call.s3.{operation}", lambda **kwargs: calls.append(operation)
    )
    return calls


def test_s3_uris_parse_into_bucket_and_prefix() -> None:
    assert parse_s3_uri("s3://b/a//c/") == S3Location("b", "a/c")
    assert parse_s3_uri("s3://b") == S3Location("b", "")
    assert str(S3Location("b", "p").child("ns", "job", "0")) == "s3://b/p/ns/job/0"
    for bad in ("b/p", "s3:///p", "s3://b/../x"):
        with pytest.raises(ValueError, match=r"s3://|bucket|not allowed"):
            parse_s3_uri(bad)


def test_clients_after_the_first_read_no_service_model_again(
    s3: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    from botocore.loaders import JSONFileLoader

    s3_client()
    read: list[str] = []
    original = JSONFileLoader.load_file

    def counted(self: JSONFileLoader, path: str) -> Any:
        read.append(path)
        return original(self, path)

    monkeypatch.setattr(JSONFileLoader, "load_file", counted)
    s3_client()
    s3_client(max_attempts=2).list_objects_v2(Bucket=s3.bucket)
    assert read == []


def test_upload_writes_every_rank_file_then_the_manifest(s3: S3Bucket, local_profile: Path) -> None:
    client = s3.client()
    puts: list[str] = []
    client.meta.events.register(
        "before-parameter-build.s3.PutObject", lambda params, **_: puts.append(params["Key"])
    )
    destination = parse_s3_uri(s3.uri("profiles/ml/llama/0"))
    result = upload_profile(local_profile, destination, client=client)

    keys = s3.keys("profiles/")
    rank_keys = sorted(k for k in keys if k.endswith(".trnprof"))
    assert len(rank_keys) == 4
    assert puts[-1] == "profiles/ml/llama/0/profile.json", "the manifest is the last write"
    for key in rank_keys:
        local = local_profile / key.removeprefix("profiles/ml/llama/0/")
        assert keys[key] == local.stat().st_size
    manifest = json.loads(
        client.get_object(Bucket=s3.bucket, Key=result.manifest_key)["Body"].read()
    )
    assert manifest["job_name"] == "llama-pretrain"
    assert sorted(manifest["extra"]["s3"]["files"]) == sorted(
        k.removeprefix("profiles/ml/llama/0/") for k in rank_keys
    )


def test_a_rank_file_above_the_threshold_goes_up_in_parts_and_comes_back_whole(
    s3: S3Bucket, tmp_path: Path
) -> None:
    from boto3.s3.transfer import TransferConfig

    profile = tmp_path / "ns/big/0"
    rank_file = profile / "node-0" / "rank-0.trnprof"
    rank_file.parent.mkdir(parents=True)
    payload = os.urandom(12 * MIB + 12345)
    rank_file.write_bytes(payload)
    write_manifest(profile, ProfileManifest(job_name="big", namespace="ns", finished=True))
    client = s3.client()
    parts = _count_calls(client, "UploadPart")
    config = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB)
    upload_profile(profile, parse_s3_uri(s3.uri("p/ns/big/0")), client=client, config=config)

    assert len(parts) == 3, "12 MiB in 5 MiB parts"
    head = client.head_object(Bucket=s3.bucket, Key="p/ns/big/0/node-0/rank-0.trnprof")
    assert head["ETag"].strip('"').endswith("-3"), "a multipart object's ETag"
    source = S3ProfileSource(parse_s3_uri(s3.uri("p")), client=client, cache_dir=tmp_path / "c")
    (listed,) = source.listing()
    assert listed.complete
    local = source.fetch(listed)
    assert (local / "node-0" / "rank-0.trnprof").read_bytes() == payload


def test_a_listing_that_needs_several_pages_finds_every_profile(
    s3: S3Bucket, tmp_path: Path, local_profile: Path
) -> None:
    client = s3.client()
    for job in ("a", "b", "c"):
        upload_profile(local_profile, parse_s3_uri(s3.uri(f"root/ml/{job}/0")), client=client)
    pages = _count_calls(client, "ListObjectsV2")
    source = S3ProfileSource(
        parse_s3_uri(s3.uri("root")), client=client, cache_dir=tmp_path, page_size=2
    )
    profiles = source.listing()

    assert [p.identifier for p in profiles] == ["ml/a/0", "ml/b/0", "ml/c/0"]
    assert all(p.complete for p in profiles)
    assert len(pages) >= 8, "15 objects in pages of 2"


def _interrupted_upload(s3: S3Bucket, profile: Path, uri: str) -> subprocess.CompletedProcess[str]:
    """The upload in its own process, killed (os._exit) right after its first rank file."""
    code = textwrap.dedent(
        f"""
        import os
        from trainium_operator.profiler.s3 import parse_s3_uri, s3_client, upload_profile
        client = s3_client()
        rank_files = []
        def stop(params, **_):
            if params["Key"].endswith(".trnprof"):
                rank_files.append(params["Key"])
                if len(rank_files) == 2:
                    os._exit(9)  # the pod is killed mid-upload, one rank file in
        client.meta.events.register("before-parameter-build.s3.PutObject", stop)
        upload_profile({str(profile)!r}, parse_s3_uri({uri!r}), client=client)
        """
    )
    env = {**os.environ, **s3.env}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )


def test_an_interrupted_upload_leaves_no_manifest_and_is_not_loadable(
    s3: S3Bucket, tmp_path: Path, local_profile: Path
) -> None:
    uri = s3.uri("prof/ml/llama/0")
    upload_profile(local_profile, parse_s3_uri(uri))  # an earlier complete upload
    result = _interrupted_upload(s3, local_profile, uri)

    assert result.returncode == 9, result.stderr
    keys = s3.keys("prof/")
    assert "prof/ml/llama/0/profile.json" not in keys, "the old commit marker went first"
    source = S3ProfileSource(parse_s3_uri(s3.uri("prof")), cache_dir=tmp_path)
    (listed,) = source.listing()
    assert not listed.complete
    assert "no manifest" in (listed.problem or "")
    with pytest.raises(S3ProfileError, match="not loadable"):
        source.fetch(listed)
    outcome = CliRunner().invoke(main, ["profile", "report", uri])
    assert outcome.exit_code == 1
    assert "no manifest" in outcome.output
    assert "Traceback" not in outcome.output
    listing = CliRunner().invoke(main, ["profile", "ls", s3.uri("prof")])
    assert "INCOMPLETE" in listing.output


def test_a_manifest_whose_rank_files_are_missing_is_not_loadable(
    s3: S3Bucket, tmp_path: Path, local_profile: Path
) -> None:
    client = s3.client()
    upload_profile(local_profile, parse_s3_uri(s3.uri("x/ml/llama/0")), client=client)
    (last,) = [k for k in s3.keys("x/") if k.endswith("/rank-3.trnprof")]
    client.delete_object(Bucket=s3.bucket, Key=last)
    (listed,) = S3ProfileSource(parse_s3_uri(s3.uri("x")), cache_dir=tmp_path).listing()
    assert not listed.complete
    assert last.removeprefix("x/ml/llama/0/") in (listed.problem or "")


def test_the_cache_downloads_a_rank_file_again_only_when_its_etag_changes(
    s3: S3Bucket, tmp_path: Path, local_profile: Path
) -> None:
    client = s3.client()
    uri = s3.uri("cache/ml/llama/0")
    upload_profile(local_profile, parse_s3_uri(uri), client=client)
    gets = _count_calls(client, "GetObject")
    source = S3ProfileSource(parse_s3_uri(uri), client=client, cache_dir=tmp_path)
    first = source.fetch(source.listing()[0])
    after_first = len(gets)
    source.fetch(source.listing()[0])
    assert after_first == 5, "four rank files and the manifest"
    assert len(gets) == after_first, "a second load downloads nothing"

    changed = local_profile.parent / "changed"
    write_synthetic_profile(changed, SyntheticSpec(**{**SMALL.__dict__, "seed": 99}))
    upload_profile(changed, parse_s3_uri(uri), client=client)
    before = len(gets)
    source.fetch(source.listing()[0])
    assert len(gets) - before == 5, "new ETags: everything changed is downloaded again"
    (rank_file,) = changed.glob("*/rank-0.trnprof")
    relative = rank_file.relative_to(changed)
    assert (first / relative).read_bytes() == rank_file.read_bytes()


def test_report_and_export_of_an_s3_profile_match_the_directory(
    s3: S3Bucket, tmp_path: Path, local_profile: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINIUM_PROFILE_CACHE", str(tmp_path / "cache"))
    uri = s3.uri("rep/ml/llama/0")
    runner = CliRunner()
    uploaded = runner.invoke(main, ["profile", "upload", str(local_profile), uri])
    assert uploaded.exit_code == 0, uploaded.output
    assert f"to {uri}" in uploaded.output

    from_s3 = runner.invoke(main, ["profile", "report", uri, "--json", "--workers", "1"])
    from_dir = runner.invoke(
        main, ["profile", "report", str(local_profile), "--json", "--workers", "1"]
    )
    assert from_s3.exit_code == 0, from_s3.output
    s3_data, dir_data = json.loads(from_s3.output), json.loads(from_dir.output)
    assert s3_data["overview"].pop("path") == uri
    dir_data["overview"].pop("path")
    for data in (s3_data, dir_data):
        data["overview"].pop("load_seconds")  # timing
    assert s3_data == dir_data

    trace = tmp_path / "t.perfetto-trace"
    exported = runner.invoke(main, ["profile", "export", uri, "--perfetto", str(trace)])
    assert exported.exit_code == 0, exported.output
    assert trace.stat().st_size > 0
    listing = runner.invoke(main, ["profile", "ls", s3.uri("rep")])
    assert listing.exit_code == 0
    # The row names the namespace and job of the S3 location, not what the (pod-written)
    # manifest claims.
    assert "ml/llama/0\tml/llama\tattempt 0" in listing.output


def test_a_missing_bucket_is_a_clear_error_not_a_crash(
    s3: S3Bucket, local_profile: Path, tmp_path: Path
) -> None:
    with pytest.raises(S3ProfileError, match="bucket 'no-such-bucket' does not exist"):
        upload_profile(local_profile, parse_s3_uri("s3://no-such-bucket/p"))
    runner = CliRunner()
    for args in (
        ["profile", "upload", str(local_profile), "s3://no-such-bucket/p"],
        ["profile", "ls", "s3://no-such-bucket/p"],
        ["profile", "report", "s3://no-such-bucket/p/ml/llama/0"],
    ):
        outcome = runner.invoke(main, args)
        assert outcome.exit_code == 1, (args, outcome.output)
        assert "does not exist" in outcome.output, outcome.output
        assert outcome.exception is None or isinstance(outcome.exception, SystemExit)


def test_a_denied_request_is_a_clear_error(
    s3: S3Bucket, s3_denying_endpoint: str, local_profile: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in aws_env(s3_denying_endpoint).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(S3ProfileError, match="access denied"):
        upload_profile(local_profile, parse_s3_uri("s3://anything/p"))
    outcome = CliRunner().invoke(main, ["profile", "ls", "s3://anything/p"])
    assert outcome.exit_code == 1
    assert "access denied" in outcome.output


def test_the_upload_module_is_what_the_upload_pod_runs(
    s3: S3Bucket, local_profile: Path, tmp_path: Path
) -> None:
    env = {**os.environ, **s3.env}
    uri = s3.uri("pod/ml/llama/0")
    ok = subprocess.run(
        [sys.executable, "-m", "trainium_operator.profiler.s3", str(local_profile), uri],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stderr.strip().splitlines()[-1].startswith("uploaded 4 rank files")
    failed = subprocess.run(
        [sys.executable, "-m", "trainium_operator.profiler.s3", str(local_profile), "s3://gone/x"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert failed.returncode == 6, "BucketMissing (profiler.s3.ExitCode)"
    last = failed.stderr.strip().splitlines()[-1]
    assert last == "profile upload failed: uploading to s3://gone/x: bucket 'gone' does not exist"
    empty = tmp_path / "never-trained"
    empty.mkdir()
    skipped = subprocess.run(
        [sys.executable, "-m", "trainium_operator.profiler.s3", str(empty), uri + "-empty"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert skipped.returncode == 3, "no rank files: nothing to upload, not a failure"
    assert skipped.stderr.strip().startswith("profile upload skipped:")


def test_a_profile_without_a_manifest_gets_one_built_from_its_rank_files(
    s3: S3Bucket, tmp_path: Path, local_profile: Path
) -> None:
    import shutil

    copy = tmp_path / "ml/nomanifest/0"
    shutil.copytree(local_profile, copy)
    (copy / MANIFEST_NAME).unlink()
    upload_profile(copy, parse_s3_uri(s3.uri("nm/ml/nomanifest/0")))
    local = fetch_uri(parse_s3_uri(s3.uri("nm/ml/nomanifest/0")))
    data = json.loads((local / MANIFEST_NAME).read_text())
    assert [ManifestRank(**r).rank for r in data["ranks"]] == [0, 1, 2, 3]


def test_errors_wrapped_by_the_transfer_manager_keep_their_clear_message() -> None:
    from boto3.exceptions import S3UploadFailedError

    from trainium_operator.profiler.s3 import describe_error

    wrapped = S3UploadFailedError(
        "Failed to upload a to b/p/x: An error occurred (AccessDenied) when calling the "
        "PutObject operation: Access Denied"
    )
    message = describe_error(wrapped, S3Location("b", "p"), "uploading to")
    assert message.startswith("uploading to s3://b/p: access denied (AccessDenied)")
