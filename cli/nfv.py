"""``dl-nfv nfv``: Run network functions over packet traces."""

from __future__ import annotations

import click


@click.group(name="nfv")
def command() -> None:
    """Run network functions over packet traces.

    No subcommands are available yet in this version.
    """
