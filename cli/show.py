"""``dl-nfv show FILE``: render any file dl-nfv writes for a person, or print it normalised."""

from __future__ import annotations

import importlib

import click

from dl_nfv.artifacts import InvalidArtifact, from_document, read_document
from dl_nfv.artifacts.chrome_trace import is_chrome_trace, summarise_trace

from .options import json_option, print_json, print_view

# kind -> "module:function" in this package; each renders one artifact kind.
RENDERERS: dict[str, str] = {
    "topology": "render_topology:render",
    "op-graph": "render_graph:render_graph",
    "plan": "render_graph:render_plan",
    "sim-report": "render_sim:render",
    "run-report": "render_run:render",
    "nf-config": "render_nfv:render_config",
    "nfv-report": "render_nfv:render_report",
    "netstar-report": "render_nfv:render_netstar_report",
    "netstar-bench": "render_nfv:render_netstar_bench",
    "plan-comparison": "render_compare:render_comparison",
    "nfv-bench": "render_compare:render_bench",
    "network-probe": "render_compare:render_probe",
    "policy": "render_policy:render",
    "chain-report": "render_chain:render_report",
    "chain-bench": "render_chain:render_bench",
}


@click.command(name="show")
@click.argument("file", type=click.Path(dir_okay=False))
@json_option
@click.option("--width", type=click.IntRange(min=20), default=None,
              help="Render at this many columns [default: the terminal's; unbounded when stdout "
                   "is not a terminal].")
def command(file: str, as_json: bool, width: int | None) -> None:
    """Render any file dl-nfv writes as tables: an artifact (topology, op graph, plan,
    report, comparison, bench) or a Chrome trace from `simulate --trace` / `train --trace`.

    With --json, print the validated, normalised document instead (a trace's
    summary per track).

    \b
    Examples:
      dl-nfv show examples/topologies/heterog-testbed8.yaml
      dl-nfv show plan.json --json | jq .groups
      dl-nfv show trace.json
    """
    doc = read_document(file)
    if is_chrome_trace(doc):
        try:
            summary = summarise_trace(doc)
        except InvalidArtifact as exc:
            raise exc.at(file=file) from None
        if as_json:
            print_json(summary)
            return
        from .render_compare import render_trace

        print_view(render_trace(summary, file), width=width)
        return
    if isinstance(doc, dict) and str(doc.get("kind", "")).startswith("actors-"):
        from .render_actors import show as render_actors

        view = render_actors(doc, file)  # checks what it renders, also for --json
        if as_json:
            print_json(doc)
        else:
            print_view(view, width=width)
        return
    artifact = from_document(doc, file=file)
    if as_json:
        print_json(artifact)
        return
    module_name, func = RENDERERS.get(artifact.kind, "render_graph:render_generic").split(":")
    renderer = getattr(importlib.import_module(f"{__package__}.{module_name}"), func)
    print_view(renderer(artifact), width=width)
