"""``dl-nfv simulate``: Predict a plan's iteration time with the discrete-event simulator."""

from __future__ import annotations

import click


@click.group(name="simulate")
def command() -> None:
    """Predict a plan's iteration time with the discrete-event simulator.

    No subcommands are available yet in this version.
    """
