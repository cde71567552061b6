"""The upload pod's entry point against a real S3 API (moto, tests/s3_server.py) when the job
author planted something in the profile directory: a rank file, a node directory or the
manifest that is a symlink (to the pod's web-identity token, say), or a FIFO, is refused with
the Refused exit code and nothing is uploaded (test_s3_profiles runs the module itself for a
clean profile and a missing bucket)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from s3_server import S3Bucket
from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.profiler.manifest import MANIFEST_NAME
from trainium_operator.profiler.s3 import ExitCode, main

SPEC = SyntheticSpec(nodes=1, ranks_per_node=2, kernels_per_step=4, steps=4, detailed_steps=(1, 2))
SECRET = "eyJhbGciOiJSUzI1NiJ9.the-upload-roles-web-identity-token"


@pytest.fixture(scope="module")
def clean_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_profile(tmp_path_factory.mktemp("clean") / "ml/job/0", SPEC)


def _rank_files(profile: Path) -> list[Path]:
    return sorted(profile.glob("*/rank-*.trnprof"))


def _symlinked_rank_file(profile: Path, secret: Path) -> str:
    target = _rank_files(profile)[0]
    target.unlink()
    target.symlink_to(secret)
    return "a rank file that is a symlink to the token"


def _symlinked_node_dir(profile: Path, secret: Path) -> str:
    outside = secret.parent / "elsewhere"
    outside.mkdir()
    shutil.copy(secret, outside / "rank-9.trnprof")
    (profile / "node-x").symlink_to(outside, target_is_directory=True)
    return "a node directory that is a symlink out of the profile directory"


def _symlinked_manifest(profile: Path, secret: Path) -> str:
    (profile / MANIFEST_NAME).unlink()
    (profile / MANIFEST_NAME).symlink_to(secret)
    return "a manifest that is a symlink to the token"


def _fifo_rank_file(profile: Path, secret: Path) -> str:
    target = _rank_files(profile)[0]
    target.unlink()
    os.mkfifo(target)
    return "a rank file that is a FIFO (never opened for a blocking read)"


@pytest.mark.parametrize(
    "plant", [_symlinked_rank_file, _symlinked_node_dir, _symlinked_manifest, _fifo_rank_file]
)
def test_the_uploader_refuses_a_profile_with_a_symlink_or_special_file_and_uploads_nothing(
    s3: S3Bucket,
    clean_profile: Path,
    tmp_path: Path,
    plant: Callable[[Path, Path], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    profile = tmp_path / "profile"
    shutil.copytree(clean_profile, profile)
    secret = tmp_path / "token"
    secret.write_text(SECRET)
    what = plant(profile, secret)
    code = main([str(profile), s3.uri("up/0")])  # the upload pod's entry point, in process
    assert code == ExitCode.REFUSED, what
    assert s3.keys() == {}, f"{what}: nothing may be uploaded"
    assert SECRET not in capsys.readouterr().err, "the uploader never read the target"
