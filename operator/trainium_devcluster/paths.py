"""Where the dev cluster keeps binaries, build trees and cluster state (never in the checkout)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

CACHE_DIR_ENV = "TRAINIUM_CACHE_DIR"
DEFAULT_CLUSTER_NAME = "trainium"


def cache_root() -> Path:
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "trainium-operator"


def bin_root() -> Path:
    return cache_root() / "bin"


def work_root() -> Path:
    """Scratch copies of the wrapper modules: builds never run inside the checkout."""
    return cache_root() / "work"


def kwok_workdir() -> Path:
    """KWOK_WORKDIR for kwokctl: each cluster's PKI, etcd data, logs and pids live under here."""
    return cache_root() / "kwok"


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class FileIn:
    """A read-only Path attribute: `file_name` (`{name}` in it: the owner's name) in the
    owner's directory named `directory` (one line a file instead of a property each)."""

    def __init__(self, directory: Literal["kwok_dir", "state_dir"], file_name: str) -> None:
        self.directory = directory
        self.file_name = file_name

    def __get__(self, owner: _Named, owner_type: type | None = None) -> Path:
        directory: Path = getattr(owner, self.directory)
        return directory / self.file_name.format(name=owner.name)


@dataclass(frozen=True, slots=True)
class ClusterPaths:
    """Files of one named dev cluster: kwokctl's own directory plus ours beside it."""

    name: str

    @property
    def kwok_dir(self) -> Path:
        return kwok_workdir() / "clusters" / self.name

    @property
    def state_dir(self) -> Path:
        # Outside kwok_dir on purpose: `kwokctl delete cluster` removes that directory, and the
        # Volcano processes' logs must outlive the cluster for a post-mortem.
        return cache_root() / "clusters" / self.name

    kubeconfig = FileIn("kwok_dir", "kubeconfig.yaml")
    kwokctl_config = FileIn("state_dir", "kwokctl-config.yaml")
    kwokctl_log = FileIn("state_dir", "kwokctl.log")
