"""The operator wheel, built once for the session: the wheel's own tests and the operator
image's entry-point tests read the same build (a pip build takes seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from images.dockerfile_model import build_operator_wheel


@pytest.fixture(scope="session")
def operator_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_operator_wheel(tmp_path_factory.mktemp("operator-wheel"))
