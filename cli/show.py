"""``dl-nfv show FILE``: render any artifact for a person, or print it normalised."""

from __future__ import annotations

import importlib

import click

from dl_nfv.artifacts import dumps, load

from .options import json_option

# kind -> "module:function" in this package; each renders one artifact kind.
RENDERERS: dict[str, str] = {
    "topology": "render_topology:render",
    "op-graph": "render_graph:render_graph",
    "plan": "render_graph:render_plan",
    "sim-report": "render_sim:render",
    "run-report": "render_run:render",
    "nf-config": "render_nfv:render_config",
    "nfv-report": "render_nfv:render_report",
}


@click.command(name="show")
@click.argument("file", type=click.Path(dir_okay=False))
@json_option
@click.option("--width", type=int, default=None, help="Render at this many columns.")
def command(file: str, as_json: bool, width: int | None) -> None:
    """Render any dl-nfv artifact (topology, op graph, plan, report) as tables.

    With --json, print the validated, normalised document instead.

    \b
    Examples:
      dl-nfv show examples/topologies/heterog-testbed8.yaml
      dl-nfv show plan.json --json | jq .groups
    """
    artifact = load(file)
    if as_json:
        click.echo(dumps(artifact), nl=False)
        return
    from rich.console import Console

    console = Console(width=width, soft_wrap=False)
    module_name, func = RENDERERS.get(artifact.kind, "render_graph:render_generic").split(":")
    renderer = getattr(importlib.import_module(f"{__package__}.{module_name}"), func)
    console.print(renderer(artifact))
