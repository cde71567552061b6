"""The `trainium-operator` console script: run the operator, the dev cluster, render, profile.

Each area owns its click group; this module only assembles them, importing each lazily so
that `trainium-operator profile ...` never pays for kopf and `dev` never for torch.
"""

from __future__ import annotations

import importlib

import click

# command name -> "module:attribute" of a click command or group
_SUBCOMMANDS: dict[str, str] = {
    "run": "trainium_operator.controller.commands:run",
    "render": "trainium_operator.controller.commands:render",
    "dev": "trainium_operator.devcluster.commands:dev",
    "profile": "trainium_operator.ui.commands:profile",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command


@click.group(cls=_LazyGroup)
@click.version_option(package_name="trainium-operator")
def main() -> None:
    """Distributed PyTorch training on AWS Trainium: compile, train, profile."""
