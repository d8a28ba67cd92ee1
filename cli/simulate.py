"""``dl-nfv simulate``: predict a plan's iteration time with the discrete-event simulator."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .options import emit, json_option, output_option, stderr_console


@click.command(name="simulate")
@click.argument("plan", type=click.Path(dir_okay=False))
@output_option("Write the sim-report to this file (.json or .yaml).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write a Chrome/Perfetto trace (JSON) of the iteration here.")
@click.option("--graph", type=click.Path(dir_okay=False), default=None,
              help="The op graph (default: the path the plan recorded).")
@click.option("--topology", type=click.Path(dir_okay=False), default=None,
              help="The topology (default: the path the plan recorded).")
@json_option
@click.option("--compare", "compare_path", type=click.Path(dir_okay=False), default=None,
              help="A run-report of this plan from `dl-nfv train`: show the measured time "
                   "beside the prediction.")
def command(plan: str, output: Path | None, trace_path: Path | None, graph: str | None,
            topology: str | None, as_json: bool, compare_path: str | None) -> None:
    """Simulate one training iteration of PLAN and report its predicted time.

    The report holds the iteration time, per-device busy time and peak memory
    (with any overflow: device, time, shortfall), per-link traffic, the critical
    path and how much communication hides behind computation. The graph and
    topology default to the paths the plan recorded; their sha256 must match the
    plan's. The trace opens in https://ui.perfetto.dev or chrome://tracing.

    \b
    Example:
      dl-nfv simulate plan.json -o report.json --trace trace.json
      dl-nfv simulate plan.json --graph g.json --topology t.yaml --json
      dl-nfv simulate plan.json --compare run-report.json
    """
    from dl_nfv.artifacts.io import write_text_atomic
    from dl_nfv.simulator.files import simulate_files

    result, report = simulate_files(plan, graph=graph, topology=topology, compare=compare_path)
    if trace_path is not None:
        write_text_atomic(trace_path, json.dumps(result.trace(), separators=(",", ":")))
    emit(report, output, as_json)
    from .render_sim import render

    if output is None and not as_json and trace_path is None:
        from rich.console import Console

        Console(soft_wrap=False).print(render(report))
    elif (console := stderr_console()) is not None:
        console.print(render(report))
