"""A directory of profiles written by many tenants: a malformed manifest or an unreadable rank
file is that profile's error; the list answers 200 for everyone and the others load."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.profiler.manifest import ManifestError, load_manifest
from trainium_operator.ui.app import create_app
from ui_serving import get_json, post_json, serving

SPEC = SyntheticSpec(nodes=1, ranks_per_node=2, kernels_per_step=4, steps=4, detailed_steps=(1, 2))

BAD_MANIFESTS = {
    "schema-text": {"schema": "one"},
    "schema-list": {"schema": [1]},
    "ranks-string": {"ranks": "all"},
    "rank-file-escape": {"ranks": [{"rank": 0, "node": "n", "file": "../../etc/rank-0.trnprof"}]},
    "window-short": {"step_window": [3]},
    "extra-list": {"extra": [1, 2]},
}


@pytest.mark.parametrize("body", [*BAD_MANIFESTS.values(), [1], "x"])
def test_a_malformed_manifest_raises_manifest_error_only(tmp_path: Path, body: Any) -> None:
    (tmp_path / "profile.json").write_text(json.dumps(body))
    with pytest.raises(ManifestError, match=r"profile\.json"):
        load_manifest(tmp_path)


@pytest.mark.parametrize("raw", [b'{"attempt": Infinity}', b"[" * 100_000, b'{"a": "\xff"}'])
def test_unparseable_manifest_bytes_raise_manifest_error_only(tmp_path: Path, raw: bytes) -> None:
    (tmp_path / "profile.json").write_bytes(raw)
    with pytest.raises(ManifestError, match=r"profile\.json"):
        load_manifest(tmp_path)


def test_bad_profiles_are_their_own_errors_and_the_others_list_and_load(tmp_path: Path) -> None:
    root = tmp_path / "profiles"
    write_synthetic_profile(root / "ml/good/0", SPEC)
    for job, manifest in BAD_MANIFESTS.items():
        directory = write_synthetic_profile(root / f"ml/{job}/0", SPEC)
        (directory / "profile.json").write_text(json.dumps(manifest))
    garbage = write_synthetic_profile(root / "ml/garbage/0", SPEC)
    for rank_file in garbage.glob("*/rank-*.trnprof"):
        rank_file.write_bytes(b"\x89TRNPRF\n" + b"\xff" * 64)

    with serving(create_app(str(root), workers=1)) as url:
        rows = {row["id"]: row for row in get_json(f"{url}/api/profiles")["profiles"]}
        assert sorted(rows) == sorted(
            ["ml/good/0", "ml/garbage/0", *(f"ml/{job}/0" for job in BAD_MANIFESTS)]
        )
        for job in BAD_MANIFESTS:
            row = rows[f"ml/{job}/0"]
            # The rank files are the source of truth: still loadable, the manifest's problem named.
            assert "profile.json: " in row["manifest_problem"], (job, row)
            assert row["ranks"] == 2
            assert post_json(f"{url}/api/profiles/load?id=ml/{job}/0&wait=1")["state"] == "loaded"

        with pytest.raises(urllib.error.HTTPError) as refused:
            post_json(f"{url}/api/profiles/load?id=ml/garbage/0&wait=1")
        assert refused.value.code == 422
        message = refused.value.read().decode()
        assert "rank-0.trnprof" in message, message
        assert "is not supported" in message, message
        errored = {row["id"]: row for row in get_json(f"{url}/api/profiles")["profiles"]}
        assert errored["ml/garbage/0"]["state"] == "error"
        assert "rank-0.trnprof" in errored["ml/garbage/0"]["error"]

        assert post_json(f"{url}/api/profiles/load?id=ml/good/0&wait=1")["state"] == "loaded"
        dashboard = get_json(f"{url}/api/dashboard?id=ml/good/0")
        assert dashboard["overview"]["ranks"] == 2
