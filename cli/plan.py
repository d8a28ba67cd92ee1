"""``dl-nfv plan``: Search for a distributed training plan."""

from __future__ import annotations

import click


@click.group(name="plan")
def command() -> None:
    """Search for a distributed training plan.

    No subcommands are available yet in this version.
    """
