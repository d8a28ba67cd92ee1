"""``dl-nfv train``: Execute a plan with torch.distributed."""

from __future__ import annotations

import click


@click.group(name="train")
def command() -> None:
    """Execute a plan with torch.distributed.

    No subcommands are available yet in this version.
    """
