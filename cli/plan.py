"""``dl-nfv plan``: one subcommand per registered planner, plus ``list`` and ``compare``.

The per-planner commands are generated from the registry: each keyword-only
option of a planner's ``plan`` function becomes a command-line option, with
its help taken from the function's docstring ("Parameters" section).
"""

from __future__ import annotations

import inspect
import os
import re
from dataclasses import replace
from pathlib import Path

import click

from dl_nfv.artifacts import Optimizer, load
from dl_nfv.planners import PLANNERS, PlannerInfo, get

from .options import emit, emit_data, json_option, output_option, seed_option, stderr_console


@click.group(name="plan")
def command() -> None:
    """Search for a distributed training plan, or compare planners.

    \b
    Examples:
      dl-nfv plan list
      dl-nfv plan dp --graph g.json --topology examples/topologies/v100x8-nvlink.yaml -o plan.json
      dl-nfv plan compare --graph g.json --topology t.yaml --planners dp,single
    """


@command.command(name="list")
@json_option
def list_planners(as_json: bool) -> None:
    """List every planner with one line on what it decides.

    \b
    Example:
      dl-nfv plan list
    """
    if as_json:
        emit_data({"planners": [{"name": p.name, "family": p.family, "baseline": p.baseline,
                                 "summary": p.summary} for p in PLANNERS.values()]}, None, True)
        return
    width = max(len(n) for n in PLANNERS)
    for p in PLANNERS.values():
        click.echo(f"{p.name:<{width}}  {p.family:<13}  {p.summary}")


def _graph_topology_options(func):
    func = click.option("--topology", "topology_path", required=True,
                        type=click.Path(dir_okay=False), help="Cluster topology (YAML).")(func)
    return click.option("--graph", "graph_path", required=True, type=click.Path(dir_okay=False),
                        help="Op graph from `dl-nfv profile model`.")(func)


def _relative(path: str, output: Path | None) -> str:
    if output is None:
        return os.path.abspath(path)
    return os.path.relpath(os.path.abspath(path), os.path.abspath(output.parent or "."))


def _param_help(doc: str) -> dict[str, str]:
    """Map parameter names to their descriptions from a numpy-style docstring."""
    helps: dict[str, str] = {}
    lines = (doc or "").splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^\s*(\w+)\s*:\s*\S", line)
        if m and i + 1 < len(lines) and lines[i + 1].startswith(line[: len(line) - len(line.lstrip())] + " "):
            text = []
            for nxt in lines[i + 1:]:
                if not nxt.strip() or re.match(r"^\s*(\w+)\s*:\s*\S", nxt):
                    break
                text.append(nxt.strip())
            helps[m.group(1)] = " ".join(text)
    return helps


def _planner_command(info: PlannerInfo) -> click.Command:
    func = info.load()
    params = [p for p in inspect.signature(func).parameters.values()
              if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "seed"
              and p.name not in info.preset]
    helps = _param_help(func.__doc__ or "")

    def callback(graph_path, topology_path, output, as_json, seed, **options):
        graph = load(graph_path, expect="op-graph")
        topology = load(topology_path, expect="topology")
        plan = get(info.name)(graph, topology, seed=seed, **options)
        plan = replace(plan, graph_path=_relative(graph_path, output),
                       topology_path=_relative(topology_path, output))
        console = stderr_console()
        if console is not None and plan.prediction is not None:
            bound = f", bound {plan.bound_ms:.2f} ms" if plan.bound_ms else ""
            console.print(f"{info.name}: predicted iteration {plan.prediction.iteration_ms:.2f} ms"
                          f"{bound}, planned in {plan.wall_time_s:.2f} s")
        emit(plan, output, as_json)

    summary = (func.__doc__ or info.summary).strip().splitlines()[0]
    doc = (f"{summary}\n\n{info.summary[0].upper()}{info.summary[1:]}.\n\n\b\nExample:\n"
           f"  dl-nfv plan {info.name} --graph g.json --topology t.yaml -o plan.json")
    cmd = click.Command(name=info.name, callback=callback, help=doc, short_help=info.summary)
    for p in reversed(params):
        flag = "--" + p.name.replace("_", "-")
        text = helps.get(p.name, "")
        if isinstance(p.default, bool):
            opt = click.Option([f"{flag}/--no-{flag[2:]}", p.name], default=p.default,
                               show_default=True, help=text)
        else:
            kind = type(p.default) if p.default is not None else str
            opt = click.Option([flag, p.name], type=kind, default=p.default, show_default=True,
                               help=text)
        cmd.params.insert(0, opt)
    common = click.Command(name="common", callback=None)
    for decorator in (_graph_topology_options, output_option("Write the plan here (.json)."),
                      json_option, seed_option):
        common = decorator(common)
    cmd.params[:0] = common.params
    return cmd


for _info in PLANNERS.values():
    command.add_command(_planner_command(_info))


@command.command(name="compare")
@_graph_topology_options
@click.option("--planners", "planner_names", default="dp,single", show_default=True,
              help="Comma-separated planner names (see `dl-nfv plan list`).")
@click.option("--time-limit", type=float, default=None,
              help="Seconds each planner that accepts a time limit may search.")
@click.option("--optimizer", type=click.Choice([o.value for o in Optimizer]), default="sgd",
              show_default=True, help="The optimizer every plan is made for (its state and step).")
@seed_option
@output_option("Write the comparison table here (JSON).")
@json_option
def compare_command(graph_path, topology_path, planner_names, time_limit, optimizer, seed, output,
                    as_json):
    """Run several planners, simulate each, and print a comparison table.

    Rows: planner, stages, microbatches, iteration ms, speed-up over dp, ratio to the
    lower bound, peak memory, planning time; an infeasible planner gets a row saying why.

    \b
    Example:
      dl-nfv plan compare --graph g.json --topology t.yaml --planners dp,dp-ps,single -o cmp.json
    """
    from dl_nfv.planners.compare import compare

    graph = load(graph_path, expect="op-graph")
    topology = load(topology_path, expect="topology")
    names = [n.strip() for n in planner_names.split(",") if n.strip()]
    options = {"optimizer": optimizer, **({"time_limit": time_limit} if time_limit is not None else {})}
    console = stderr_console()
    rows = compare(graph, topology, names, seed=seed, options=options,
                   progress=(lambda n: console.print(f"planning with {n} ...")) if console else None)
    data = {"graph": graph.model.name, "topology": topology.name, "rows": [r.to_data() for r in rows]}
    emit_data(data, output, as_json)
    if not as_json:
        from rich.console import Console

        from .render_compare import render_rows

        Console(stderr=output is not None and not as_json, soft_wrap=False).print(render_rows(data))


@command.command(name="export")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["torch-pipelining"]), default="torch-pipelining",
              show_default=True, help="What to export for.")
@click.option("--graph", "graph_path", type=click.Path(dir_okay=False), default=None,
              help="Op graph of the plan (default: the one the plan records).")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write the export into (created).")
def export_command(plan_path, fmt, graph_path, output):
    """Export a pipeline plan for another runtime: split points and the per-rank schedule CSV.

    Writes schedule.csv (torch.distributed.pipelining's compute-only CSV, one row per
    rank), split_points.json (stages, their modules and devices) and README.md.

    \b
    Example:
      dl-nfv plan export plan.json --format torch-pipelining -o outdir/
    """
    from dl_nfv.artifacts.io import write_text_atomic
    from dl_nfv.planners.export import export_files

    files = export_files(plan_path, graph=graph_path, fmt=fmt)
    output.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write_text_atomic(output / name, text)
    console = stderr_console()
    if console is not None:
        console.print(f"wrote {', '.join(files)} to {output}")
