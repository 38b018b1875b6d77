"""Command lines parsed as the CLIs would parse them (ours and Ray's), without running them."""

from __future__ import annotations

from typing import Any


def resolve(group: Any, argv: list[str]) -> Any:
    """Parse argv the way the CLI would, down to the leaf command, without running it.

    Works for click groups (ray) and typer's own (which no longer subclass click's).
    """
    context = group.make_context(group.name or "cli", list(argv), resilient_parsing=False)
    command = group
    args = list(argv)
    while hasattr(command, "resolve_command"):
        name, sub, args = command.resolve_command(context, args)
        assert sub is not None, f"unknown command {name!r}"
        command = sub
        context = command.make_context(name or "", args, parent=context)
    return context


def ray_cli() -> Any:
    from ray.scripts.scripts import cli

    return cli
