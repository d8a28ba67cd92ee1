"""``dl-nfv plan``: one subcommand per registered planner, plus ``list`` and ``compare``.

The per-planner commands are generated from the registry: each keyword-only
option of a planner's ``plan`` function becomes a command-line option, with
its help taken from the function's docstring ("Parameters" section). Options
a preset entry fixes are hidden; options of the registry's shared vocabulary
(``OPTION_CHOICES``) are choices; numbers are finite and non-negative (no
planner option means anything below zero); an option whose default is the
empty string ("not given") is optional, and passed only when given.
"""

from __future__ import annotations

import inspect
import os
import re
from dataclasses import replace
from pathlib import Path

import click

from dl_nfv.artifacts import Optimizer, load
from dl_nfv.planners import OPTION_CHOICES, PLANNERS, PlannerInfo, get

from .options import (
    Number,
    check_output_folder,
    deliver,
    json_option,
    output_option,
    print_json,
    print_view,
    seed_option,
    stderr_console,
)

# Planner options that name a file, and what the file is (the option's metavar).
FILE_OPTIONS = {"refine_with": "RUN_REPORT", "policy": "POLICY", "estimator": "POLICY"}


class PlannerGroup(click.Group):
    """``plan``'s group: its own commands plus one per registered planner, each built (and
    its planner imported) only when it is called or its help is shown, so a command
    line that does not plan imports no planner."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *PLANNERS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        found = super().get_command(ctx, name)
        if found is None and name in PLANNERS:
            found = PlannerCommand(PLANNERS[name])
            self.add_command(found)
        return found


@click.group(name="plan", cls=PlannerGroup)
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
        print_json({"planners": [{"name": p.name, "family": p.family, "baseline": p.baseline,
                                  "summary": p.summary} for p in PLANNERS.values()]})
        return
    from rich.table import Table

    table = Table(box=None, show_header=True, pad_edge=False)
    for col in ("planner", "family", "baseline", "what it decides"):
        table.add_column(col)
    for p in PLANNERS.values():
        table.add_row(p.name, p.family, "yes" if p.baseline else "", p.summary)
    print_view(table)


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


def _planner_help(info: PlannerInfo, func) -> str:
    """The command's help: what the planner does, said once, then an example.

    A planner's own entry uses its docstring's first paragraph; a preset entry the
    registry's summary and the entry it presets.
    """
    if info.preset:
        base = next((p.name for p in PLANNERS.values() if p.target == info.target
                     and not p.preset), None)
        defaults = {p.name: p.default for p in inspect.signature(func).parameters.values()}
        fixed = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in info.preset.items()
                         if defaults.get(k) != v)
        text = f"{info.summary[0].upper()}{info.summary[1:]}."
        if base is not None:
            # a preset of the defaults names them all: the name pins what the defaults are now
            fixed = fixed or " ".join(f"--{k.replace('_', '-')} {v}" for k, v in info.preset.items())
            text += f"\n\nThe `{base}` planner with {fixed}."
    else:
        doc = inspect.cleandoc(func.__doc__ or info.summary)
        text = " ".join(doc.split("\n\n")[0].split())
    return (f"{text}\n\n\b\nExample:\n"
            f"  dl-nfv plan {info.name} --graph g.json --topology t.yaml -o plan.json")


def _planner_option(p: inspect.Parameter, text: str) -> click.Option:
    """The command-line option of planner keyword ``p`` (see the module docstring)."""
    flag = "--" + p.name.replace("_", "-")
    if isinstance(p.default, bool):
        return click.Option([f"{flag}/--no-{flag[2:]}", p.name], default=p.default,
                            show_default=True, help=text)
    if p.name in OPTION_CHOICES:
        return click.Option([flag, p.name], type=click.Choice(OPTION_CHOICES[p.name]),
                            default=p.default, show_default=True, help=text)
    if p.default == "" or p.default is None:
        kind = (click.Path(dir_okay=False) if p.name in FILE_OPTIONS else str)
        return click.Option([flag, p.name], type=kind, default=None,
                            metavar=FILE_OPTIONS.get(p.name), help=text)
    if isinstance(p.default, int):
        kind = click.IntRange(min=0)
    elif isinstance(p.default, float):
        kind = Number(min=0)
    else:
        kind = type(p.default)
    return click.Option([flag, p.name], type=kind, default=p.default, show_default=True, help=text)


class PlannerCommand(click.Command):
    """The command of one registry entry. Its planner is imported, and its options and help
    built, when the command is parsed or its help shown: listing ``plan``'s commands
    needs only the registry, and a planner that fails to import breaks only its own
    command."""

    def __init__(self, info: PlannerInfo):
        super().__init__(name=info.name, callback=self._plan,
                         short_help=f"{info.summary[0].upper()}{info.summary[1:]}")
        self.info = info
        self._built = False

    def _build(self) -> None:
        if self._built:
            return
        func = self.info.load()
        params = [p for p in inspect.signature(func).parameters.values()
                  if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "seed"
                  and p.name not in self.info.preset]
        helps = _param_help(func.__doc__ or "")
        common = click.Command(name="common", callback=None)
        for decorator in (_graph_topology_options,
                          output_option("Write the plan here (.json, .yaml or .yml)."),
                          json_option, seed_option):
            common = decorator(common)
        self.params = [*common.params, *(_planner_option(p, helps.get(p.name, "")) for p in params)]
        self.help = _planner_help(self.info, func)
        self._built = True

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        self._build()
        return super().get_params(ctx)

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._build()
        super().format_help_text(ctx, formatter)

    def _summary(self, plan) -> str:
        if plan.prediction is None:
            return f"{self.name}: planned in {plan.wall_time_s:.2f} s"
        bound = f", bound {plan.bound_ms:.2f} ms" if plan.bound_ms else ""
        return (f"{self.name}: predicted iteration {plan.prediction.iteration_ms:.2f} ms"
                f"{bound}, planned in {plan.wall_time_s:.2f} s"
                + "".join(f"\nnote: {note}" for note in plan.notes))

    def _plan(self, graph_path, topology_path, output, as_json, seed, **options) -> None:
        graph = load(graph_path, expect="op-graph")
        topology = load(topology_path, expect="topology")
        given = {k: v for k, v in options.items() if v is not None}
        plan = get(self.info.name)(graph, topology, seed=seed, **given)
        plan = replace(plan, graph_path=_relative(graph_path, output),
                       topology_path=_relative(topology_path, output))
        deliver(plan, output, as_json, summary=self._summary, document="json")


def _planner_names(ctx, param, value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise click.BadParameter(f"{value!r}: name at least one planner, comma-separated")
    unknown = [n for n in names if n not in PLANNERS]
    if unknown:
        raise click.BadParameter(f"unknown planner {unknown[0]!r}; valid: {', '.join(PLANNERS)}")
    duplicate = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if duplicate is not None:
        raise click.BadParameter(f"planner {duplicate!r} is named twice")
    return names


@command.command(name="compare")
@_graph_topology_options
@click.option("--planners", "planner_names", default="dp,single", show_default=True,
              callback=_planner_names, help="Comma-separated planner names (see `dl-nfv plan list`).")
@click.option("--time-limit", type=Number(min=0), default=None,
              help="Seconds each planner that accepts a time limit may search.")
@click.option("--optimizer", type=click.Choice([o.value for o in Optimizer]), default="sgd",
              show_default=True, help="The optimizer every plan is made for (its state and step).")
@seed_option
@output_option("Write the comparison (a plan-comparison) here (.json, .yaml or .yml).")
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
    from dl_nfv.artifacts import from_data
    from dl_nfv.artifacts.results import PlanComparison
    from dl_nfv.planners.compare import compare

    from .render_compare import render_comparison

    graph = load(graph_path, expect="op-graph")
    topology = load(topology_path, expect="topology")
    options = {"optimizer": optimizer, **({"time_limit": time_limit} if time_limit is not None else {})}
    console = stderr_console()
    rows = compare(graph, topology, planner_names, seed=seed, options=options,
                   progress=(lambda n: console.print(f"planning with {n} ...")) if console else None)
    result = from_data(PlanComparison, {"graph": graph.model.name, "topology": topology.name,
                                        "optimizer": optimizer, "seed": seed,
                                        "rows": [r.to_data() for r in rows]})
    deliver(result, output, as_json, render=render_comparison)


@command.command(name="export")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["torch-pipelining"]), default="torch-pipelining",
              show_default=True, help="What to export for.")
@click.option("--graph", "graph_path", type=click.Path(dir_okay=False), default=None,
              help="Op graph of the plan (default: the one the plan records).")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False, path_type=Path),
              callback=lambda ctx, param, value: check_output_folder(value),
              help="Folder to write the export into (created).")
def export_command(plan_path, fmt, graph_path, output):
    """Export a pipeline plan for another runtime: split points and the per-rank schedule CSV.

    Writes schedule.csv (torch.distributed.pipelining's compute-only CSV, one row per
    rank), split_points.json (stages, their modules and devices) and README.md.

    \b
    Example:
      dl-nfv plan export plan.json --format torch-pipelining -o outdir/
    """
    from dl_nfv.artifacts.io import make_folder, write_text_atomic
    from dl_nfv.planners.export import export_files

    files = export_files(plan_path, graph=graph_path, fmt=fmt)
    make_folder(output)
    for name, text in files.items():
        write_text_atomic(output / name, text)
    console = stderr_console()
    if console is not None:
        console.print(f"wrote {', '.join(files)} to {output}")


@command.group(name="learn")
def learn_group() -> None:
    """Train a learned planner's policy on the simulator.

    \b
    Example:
      dl-nfv plan learn heterog --graphs a.json,b.json --topologies t.yaml --episodes 600 -o my.policy.json
    """


def _paths(ctx, param, value: str) -> list[str]:
    paths = [p.strip() for p in value.split(",") if p.strip()]
    if not paths:
        raise click.BadParameter(f"{value!r}: name at least one file, comma-separated")
    return paths


@learn_group.command(name="heterog")
@click.option("--graphs", "graph_paths", required=True, callback=_paths,
              help="Comma-separated op graphs to train on.")
@click.option("--topologies", "topology_paths", required=True, callback=_paths,
              help="Comma-separated topologies; every graph is trained on every topology.")
@click.option("--episodes", type=click.IntRange(min=1), default=600, show_default=True,
              help="Episodes in all (one per (graph, topology) pair per step).")
@click.option("--search-s", type=Number(min=0), default=10.0, show_default=True,
              help="CPU seconds of refinement per pair for the strategy the policy imitates.")
@seed_option
@output_option("Write the policy here (.json, .yaml or .yml).")
@json_option
def learn_heterog(graph_paths, topology_paths, episodes, search_s, seed, output, as_json):
    """Train a HeteroG policy over every (graph, topology) pair, recording what it saw.

    \b
    Example:
      dl-nfv plan learn heterog --graphs a.json,b.json --topologies t.yaml --episodes 600 -o my.policy.json
    """
    import shlex

    from dl_nfv.planners.heterog import learn

    from .render_policy import render

    graphs = [(Path(p).stem, load(p, expect="op-graph")) for p in graph_paths]
    topologies = [(Path(p).stem, load(p, expect="topology")) for p in topology_paths]
    line = ["dl-nfv", "plan", "learn", "heterog", "--graphs", ",".join(graph_paths),
            "--topologies", ",".join(topology_paths), "--episodes", str(episodes),
            "--search-s", f"{search_s:g}", "--seed", str(seed), *(["-o", str(output)] if output else [])]
    console = stderr_console()
    policy = learn(graphs, topologies, episodes=episodes, seed=seed, search_s=search_s,
                   command=shlex.join(line), progress=console.print if console else None)
    deliver(policy, output, as_json, render=render, document="json")


@learn_group.command(name="tag")
@click.option("--graphs", "graph_paths", required=True, callback=_paths,
              help="Comma-separated op graphs to train on.")
@click.option("--topologies", "topology_specs", required=True, callback=_paths,
              help="Comma-separated topology files or random:N[:SEED] (N generated topologies).")
@click.option("--iterations", type=click.IntRange(min=1), default=20, show_default=True,
              help="Rounds of one search per (graph, topology) pair and a few training steps.")
@click.option("--playouts", type=click.IntRange(min=1), default=128, show_default=True,
              help="Tree-search playouts per search.")
@click.option("--init", "init_path", type=click.Path(dir_okay=False), default=None,
              help="Fine-tune: start from this TAG policy's weights (default: fresh weights).")
@seed_option
@output_option("Write the policy here (.json, .yaml or .yml).")
@json_option
def learn_tag(graph_paths, topology_specs, iterations, playouts, init_path, seed, output, as_json):
    """Train a TAG policy from its own tree searches over every (graph, topology) pair.

    \b
    Example:
      dl-nfv plan learn tag --graphs a.json --topologies random:8,t.yaml --iterations 20 -o tag.policy.json
    """
    import shlex

    from dl_nfv.planners.learned.policy import read_policy
    from dl_nfv.planners.tag.learn import learn
    from dl_nfv.planners.tag.topogen import topologies_of

    from .render_policy import render

    topologies = topologies_of(topology_specs)
    graphs = [(Path(p).stem, load(p, expect="op-graph")) for p in graph_paths]
    line = ["dl-nfv", "plan", "learn", "tag", "--graphs", ",".join(graph_paths), "--topologies",
            ",".join(topology_specs), "--iterations", str(iterations), "--playouts", str(playouts),
            *(["--init", init_path] if init_path else []), "--seed", str(seed),
            *(["-o", str(output)] if output else [])]
    init = read_policy(init_path) if init_path else None
    console = stderr_console()
    policy = learn(graphs, topologies, iterations=iterations, playouts=playouts, seed=seed,
                   command=shlex.join(line), progress=console.print if console else None,
                   init=init)
    deliver(policy, output, as_json, render=render, document="json")
@learn_group.command(name="disco")
@click.option("--measurements", "measurement_paths", required=True, callback=_paths,
              help="Comma-separated fusion-times files (`dl-nfv profile fusion`) to train on.")
@click.option("--held-out", "held_out_paths", default="", help="Comma-separated fusion-times "
              "files of other models: the estimator's error on them is recorded in its notes.")
@click.option("--epochs", type=click.IntRange(min=1), default=60, show_default=True,
              help="Full-batch training epochs.")
@seed_option
@output_option("Write the estimator (a policy: .json, .yaml or .yml) here.")
@json_option
def learn_disco(measurement_paths, held_out_paths, epochs, seed, output, as_json):
    """Train DisCo's fused-kernel estimator (a GNN) on measured fused groups.

    \b
    Example:
      dl-nfv plan learn disco --measurements a.json,b.json --held-out c.json -o disco.estimator.json
    """
    import shlex

    from dl_nfv.planners.disco.estimator import learn
    from dl_nfv.profilers.fusion import load_fusion_times

    from .render_policy import render

    held = [p.strip() for p in held_out_paths.split(",") if p.strip()]
    line = ["dl-nfv", "plan", "learn", "disco", "--measurements", ",".join(measurement_paths),
            *(["--held-out", ",".join(held)] if held else []), "--epochs", str(epochs),
            "--seed", str(seed), *(["-o", str(output)] if output else [])]
    measured = [load_fusion_times(p) for p in measurement_paths]
    held_out = [load_fusion_times(p) for p in held]
    policy = learn(measured, [t.model.name for t in measured], held_out=held_out,
                   held_out_names=[t.model.name for t in held_out], seed=seed, epochs=epochs,
                   command=shlex.join(line))
    deliver(policy, output, as_json, render=render, document="json")


from . import plan_sfb  # noqa: E402, F401  (registers `plan sfb` on this group)
