"""``dl-nfv profile``: measure models into op graphs and the network into topologies."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from dl_nfv.artifacts import CATALOG

from .options import json_option


@click.group(name="profile")
def command() -> None:
    """Measure models into op graphs, and list the device catalog.

    \b
    Example:
      dl-nfv profile devices
    """


@command.command(name="devices")
@json_option
def devices(as_json: bool) -> None:
    """List the device catalog: memory and peak figures per device type.

    Topology files name these types; a topology may add its own under
    `device_types:`.

    \b
    Example:
      dl-nfv profile devices --json
    """
    if as_json:
        import json

        from dl_nfv.artifacts.records import to_data

        click.echo(json.dumps([to_data(t) for t in CATALOG.values()], indent=1))
        return
    table = Table(title="device catalog", title_justify="left")
    for col in ("type", "kind", "memory GiB", "FP32 TFLOP/s", "FP16 TFLOP/s", "BF16 TFLOP/s",
                "memory GB/s", "datasheet"):
        table.add_column(col)
    for t in CATALOG.values():
        table.add_row(t.name, t.kind.value, f"{t.memory_gib:g}", f"{t.fp32_tflops:g}",
                      f"{t.fp16_tflops:g}", "-" if t.bf16_tflops is None else f"{t.bf16_tflops:g}",
                      f"{t.memory_bandwidth_gb_per_s:g}", t.datasheet)
    Console(soft_wrap=False).print(table)
