"""The `trainium-operator` console script: run the operator, the dev cluster, render, profile.

Each area owns its click group; this module only assembles them, importing each lazily so
that `trainium-operator profile ...` never pays for kopf and `dev` never for torch.
"""

from __future__ import annotations

import importlib
import importlib.util

import click

# command name -> "module:attribute" of a click command or group
_SUBCOMMANDS: dict[str, str] = {
    "run": "trainium_operator.controller.commands:run",
    "render": "trainium_operator.controller.commands:render",
    "dev": "trainium_devcluster.commands:dev",
    "profile": "trainium_operator.analysis.commands:profile",
}

# Commands another area adds to a group: the profile UI's `serve` and `ls` read through the UI's
# profile store, so they live in `ui`, above the analysis layer the group belongs to.
_ADDED: dict[str, tuple[str, ...]] = {
    "profile": (
        "trainium_operator.ui.commands:serve",
        "trainium_operator.ui.commands:list_profiles",
        "trainium_operator.controller.on_demand_commands:profile_now",
    ),
}


# Installed only from a source checkout (the wheel and the operator image leave it out).
_DEV_ONLY = {"dev"}


def _available(module_name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:
        return False


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(
            name
            for name, target in _SUBCOMMANDS.items()
            if name not in _DEV_ONLY or _available(target.partition(":")[0])
        )

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name = target.partition(":")[0]
        if cmd_name in _DEV_ONLY and not _available(module_name):
            raise click.UsageError(
                f"`trainium-operator {cmd_name}` is the local development cluster; it runs from a "
                "source checkout (pip install -e '.[dev]'), not from an installed wheel or the "
                "operator image"
            )
        command = _load(target)
        if isinstance(command, click.Group):
            for added in _ADDED.get(cmd_name, ()):
                command.add_command(_load(added))
        return command


def _load(target: str) -> click.Command:
    module_name, _, attribute = target.partition(":")
    command = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(command, click.Command):
        raise TypeError(f"{target} is not a click command")
    return command


@click.group(cls=_LazyGroup)
@click.version_option(package_name="trainium-operator")
def main() -> None:
    """Distributed PyTorch training on AWS Trainium: compile, train, profile."""
