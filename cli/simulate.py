"""``dl-nfv simulate``: predict a plan's iteration time with the discrete-event simulator."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .options import JSON_SUFFIXES, deliver, json_option, output_option


@click.command(name="simulate")
@click.argument("plan", type=click.Path(dir_okay=False))
@output_option("Write the sim-report to this file (.json or .yaml).")
@output_option("Write a Chrome/Perfetto trace (.json) of the iteration here (with --compare: "
               "the simulated and the measured timelines, one process each).",
               suffixes=JSON_SUFFIXES, flags=("--trace",), name="trace_path")
@click.option("--graph", type=click.Path(dir_okay=False), default=None,
              help="The op graph (default: the path the plan recorded).")
@click.option("--topology", type=click.Path(dir_okay=False), default=None,
              help="The topology (default: the path the plan recorded).")
@json_option
@click.option("--compare", "compare_path", type=click.Path(dir_okay=False), default=None,
              help="A run-report of this plan from `dl-nfv train`: show the measured time "
                   "beside the prediction, per device and by category (compute, "
                   "communication, update, idle).")
@click.option("--estimator", type=click.Path(dir_okay=False), default=None,
              help="Price fused groups by this fused-kernel estimator (`dl-nfv plan learn "
                   "disco`), as `plan disco --estimator` does.")
def command(plan: str, output: Path | None, trace_path: Path | None, graph: str | None,
            topology: str | None, as_json: bool, compare_path: str | None,
            estimator: str | None) -> None:
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
      dl-nfv simulate plan.json --compare run-report.json --trace both.json
      dl-nfv simulate plan.json --estimator disco.estimator.json
    """
    from dl_nfv.artifacts.io import plain_data, write_text_atomic
    from dl_nfv.simulator.files import simulate_files

    if estimator is None:
        result, report = simulate_files(plan, graph=graph, topology=topology, compare=compare_path)
    else:
        from dl_nfv.planners.disco.estimator import simulate_with_estimator

        result, report = simulate_with_estimator(plan, estimator, graph=graph, topology=topology,
                                                 compare=compare_path)
    if trace_path is not None:
        if compare_path is None:
            trace = result.trace()
        else:
            from dl_nfv.artifacts import load
            from dl_nfv.simulator.trace import compared_trace

            trace = compared_trace(result, load(compare_path, expect="run-report"))
        write_text_atomic(trace_path, json.dumps(plain_data(trace), separators=(",", ":"),
                                                 allow_nan=False))
    from .render_sim import render

    deliver(report, output, as_json, render=render)
