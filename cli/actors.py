"""``dl-nfv nfv actors``: NFVactor, an actor per flow over runtime processes (up, replay,
migrate, fail, status, bench)."""

from __future__ import annotations

import click


@click.group(name="actors")
def command() -> None:
    """Run NF chains as one actor per flow over runtime processes (NFVactor).

    A flow switch process maps flows to runtime processes, each hosting many
    flow actors; actors replicate their state to another runtime before a
    packet leaves, take over when a runtime dies, and migrate flows between
    runtimes on their own (or through a central controller, for comparison).

    \b
    Example:
      dl-nfv nfv actors up --cluster examples/nf/actors-local.yaml
      dl-nfv nfv actors replay --cluster examples/nf/actors-local.yaml --trace t.pcap -o out/
    """
