"""Generate the CLI reference (docs/cli.md) from the commands' own help.

``python -m dl_nfv.cli.reference > docs/cli.md`` rewrites it; a test checks
that the file is current, so the reference never drifts from ``--help``.
"""

from __future__ import annotations

import click

from .main import cli

HEADER = """# CLI reference

Generated from `--help` by `python -m dl_nfv.cli.reference > docs/cli.md`; do not edit by hand.
Every command exits 0 on success, 1 when the job fails, 2 on bad input or usage (one line on
stderr; `dl-nfv --debug ...` shows the traceback).
"""


def iter_commands(group: click.Group = cli, prefix: str = "dl-nfv"):
    """Yield ``(full name, command)`` for the root and every subcommand, depth first."""
    yield prefix, group
    if isinstance(group, click.Group):
        ctx = click.Context(group, info_name=prefix)
        for name in group.list_commands(ctx):
            sub = group.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            if isinstance(sub, click.Group):
                yield from iter_commands(sub, f"{prefix} {name}")
            else:
                yield f"{prefix} {name}", sub


def help_text(name: str) -> str:
    """Exactly what ``<name> --help`` prints, at a fixed width of 100 columns."""
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, [*name.split()[1:], "--help"], env={"COLUMNS": "102"},
                                prog_name="dl-nfv", terminal_width=102)
    return result.output.rstrip("\n")


def render() -> str:
    parts = [HEADER]
    for name, _ in iter_commands():
        parts.append(f"## `{name}`\n\n```text\n{help_text(name)}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(), end="")
