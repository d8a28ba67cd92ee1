"""``dl-nfv profile``: measure models into op graphs and the network into topologies."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click
from rich.table import Table

from dl_nfv.artifacts import CATALOG, Granularity

from .options import (
    Number,
    deliver,
    json_option,
    output_option,
    print_json,
    print_view,
    seed_option,
    stderr_console,
)


@click.group(name="profile")
def command() -> None:
    """Measure models into op graphs and the network into topologies; list the zoo and catalog.

    \b
    Example:
      dl-nfv profile models
      dl-nfv profile model resnet50 --batch-size 32 -o resnet50.json
      dl-nfv profile network --nprocs 2 -o local.yaml
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
        from dl_nfv.artifacts.records import to_data

        print_json([to_data(t) for t in CATALOG.values()])
        return
    table = Table(title="device catalog", title_justify="left")
    for col in ("type", "kind", "memory GiB", "FP32 TFLOP/s", "FP16 TFLOP/s", "BF16 TFLOP/s",
                "memory GB/s", "datasheet"):
        table.add_column(col)
    for t in CATALOG.values():
        table.add_row(t.name, t.kind.value, f"{t.memory_gib:g}", f"{t.fp32_tflops:g}",
                      f"{t.fp16_tflops:g}", "-" if t.bf16_tflops is None else f"{t.bf16_tflops:g}",
                      f"{t.memory_bandwidth_gb_per_s:g}", t.datasheet)
    print_view(table)


@command.command(name="models")
@json_option
@click.option("--tiny/--no-tiny", default=False, show_default=True,
              help="Also list the <name>-tiny variants.")
def models(as_json: bool, tiny: bool) -> None:
    """List the model zoo: parameters, default input size and granularity.

    Every model also exists as <name>-tiny (a toy size for tests); gpt2-tiny
    and bert-tiny are aliases. Any other model is named module:callable or
    path/to/file.py:callable (see `dl-nfv profile model --help`).

    \b
    Example:
      dl-nfv profile models --json
    """
    from dl_nfv.profilers.zoo import TINY, ZOO, parameter_count

    rows = [{"name": m.name, "family": m.family, "task": m.task.value,
             "parameters": parameter_count(m.name), "published_parameters": m.published_params,
             "default_batch_size": m.default_batch, "default_seq_len": m.default_seq_len or None,
             "input_shape": list(m.input_shape) or None,
             "default_granularity": m.default_granularity.value, "description": m.description}
            for m in ZOO.values() if tiny or not m.name.endswith(TINY)]
    if as_json:
        print_json({"models": rows})
        return
    table = Table(title="model zoo (each also as <name>-tiny)", title_justify="left")
    for col in ("model", "parameters", "default size", "granularity", "description"):
        table.add_column(col, justify="right" if col == "parameters" else "left")
    for r, m in zip(rows, (ZOO[r["name"]] for r in rows)):
        table.add_row(r["name"], f"{r['parameters'] / 1e6:,.1f} M", m.default_size,
                      r["default_granularity"], r["description"])
    print_view(table)


def _shape(ctx, param, values):
    shapes = []
    for text in values:
        parts = [p.strip() for p in text.replace("x", ",").split(",") if p.strip()]
        try:
            shape = tuple(int(p) for p in parts)
        except ValueError:
            raise click.BadParameter(f"{text!r}: expected comma-separated positive integers, "
                                     f"e.g. 8,3,224,224") from None
        if not shape or any(s < 1 for s in shape):
            raise click.BadParameter(f"{text!r}: dimensions must be positive integers")
        shapes.append(shape)
    return tuple(shapes)


@contextlib.contextmanager
def _progress_bar(description: str):
    """A rich progress bar on stderr when it is a terminal; yields a callback or None."""
    console = stderr_console()
    if console is None:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[step]}"), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task(description, total=None, step="")

        def update(step: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, step=step)

        yield update


@command.command(name="model")
@click.argument("model")
@output_option("Write the op graph here (.json).")
@json_option
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Batch size (zoo default: see `profile models`; user models: dimension 0 of "
                   "--input-shape).")
@click.option("--seq-len", type=click.IntRange(min=1), default=None, help="Sequence length of zoo sequence models.")
@click.option("--granularity", type=click.Choice([g.value for g in Granularity]), default=None,
              help="op: one op per traced operation; layer: one op per layer (block). "
                   "Default: layer for the largest zoo models, else op.")
@click.option("--input-shape", "input_shapes", multiple=True, callback=_shape,
              help="Shape of one input of a user model, e.g. 8,3,224,224 (repeat per input).")
@click.option("--input-dtype", "input_dtypes", multiple=True,
              help="dtype of the user model's inputs (one for all, or one per input): float32, "
                   "int64, bool, ...")
@click.option("--dtype", default="float32", show_default=True,
              type=click.Choice(["float32", "bfloat16", "float16", "float64"]),
              help="Parameter (and floating input) dtype.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed rounds (one whole step + one per-op step each); medians are kept.")
@click.option("--span", "span_s", type=click.FloatRange(min=0), default=3.0, show_default=True,
              help="Least seconds each timing pass spans: rounds are added until it is "
                   "reached, so that a fast step's medians are the machine over seconds, not "
                   "one moment of it (0: --repeats rounds alone).")
@click.option("--warmup", type=click.IntRange(min=0), default=0, show_default=True,
              help="Untimed steps after the counting pass (which is itself a full warm-up step).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads (default: torch's choice).")
@click.option("--device", default="auto", show_default=True,
              help="auto (CUDA when present), cpu, cuda or cuda:N.")
@click.option("--device-type", default=None,
              help="Catalog type to record the times under (default: cpu, or the GPU's type).")
@click.option("--leaf", "leaf_modules", multiple=True,
              help="Module name or class traced as one opaque op (repeatable).")
@click.option("--batch-scaling/--no-batch-scaling", default=True, show_default=True,
              help="Also time every op at an eighth of the batch, to measure the part of its "
                   "time that does not shrink with the batch (replicas, microbatches).")
@seed_option
def model(model: str, output: Path | None, as_json: bool, batch_size, seq_len, granularity,
          input_shapes, input_dtypes, dtype, repeats, span_s, warmup, threads, device,
          device_type, leaf_modules, batch_scaling, seed) -> None:
    """Profile a model into an op graph: trace it, count FLOPs and bytes, time every op.

    MODEL is a zoo name (`dl-nfv profile models`), module:callable or
    path/to/file.py:callable (a function returning an nn.Module, called with
    no arguments). Every op's forward and backward time is measured inside real
    training steps (median of --repeats), and the per-op sum is checked against
    the measured whole step (the ratio is in the graph's profile note). Steps at
    an eighth of the batch measure the part of each op's time that does not
    shrink with the batch. Without -o the graph is printed as JSON.

    \b
    Example:
      dl-nfv profile model resnet50 --batch-size 32 -o resnet50.json
      dl-nfv profile model gpt2-xl --batch-size 8 --seq-len 1024 --granularity layer -o gpt2xl.json
      dl-nfv profile model ./my_model.py:make --input-shape 16,128 --input-dtype int64 -o mine.json
    """
    from dl_nfv.profilers import profile_model
    from dl_nfv.profilers.zoo import model_ref

    ref = model_ref(model, batch_size=batch_size, seq_len=seq_len, input_shapes=input_shapes,
                    input_dtypes=input_dtypes, dtype=dtype)
    with _progress_bar(f"profiling {ref.name}") as progress:
        graph = profile_model(ref, granularity=granularity, repeats=repeats, span_s=span_s,
                              warmup=warmup,
                              threads=threads, seed=seed, device=device, device_type=device_type,
                              leaf_modules=leaf_modules, batch_scaling=batch_scaling,
                              progress=progress)

    def summary(graph) -> str:
        p = graph.profile
        text = (f"{ref.name}: {len(graph.ops)} ops, {len(graph.edges)} edges, "
                f"{sum(o.flops for o in graph.ops) / 1e9:.2f} forward GFLOPs")
        if p is None:
            return text
        return (f"{text}; step {p.step_ms:.1f} ms, per-op sum {p.op_sum_ms:.1f} ms "
                f"(ratio {p.op_sum_ms / p.step_ms:.3f})")

    deliver(graph, output, as_json, summary=summary, document="json")


@command.command(name="network")
@click.option("--nprocs", type=click.IntRange(min=1), default=2, show_default=True,
              help="Worker processes to start on this host (ignored under torchrun).")
@output_option("Write the measured topology here (.yaml or .json).")
@json_option
@output_option("Also write the raw measurements (a network-probe: .json, .yaml or .yml) here.",
               flags=("--report",), name="report_path")
@click.option("--min-bytes", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Smallest message size.")
@click.option("--max-bytes", type=click.IntRange(min=1), default=64 * 2**20, show_default=True,
              help="Largest message size (sizes grow 4x from --min-bytes).")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed rounds over every size (per size the fastest round is kept).")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Untimed messages per size.")
@click.option("--backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto",
              show_default=True, help="auto: NCCL when every process gets a GPU, else gloo.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads per process (default: cores / processes).")
@click.option("--name", default=None, help="Topology name (default: measured-<host>-<N>).")
def network(nprocs, output, as_json, report_path, min_bytes, max_bytes, repeats, warmup, backend,
            threads, name) -> None:
    """Measure the links between worker processes and write a topology.

    Starts --nprocs processes with torch.distributed (gloo on CPU, NCCL on
    CUDA), times point-to-point messages for every pair and AllReduce over
    sizes from --min-bytes to --max-bytes, fits latency + size/bandwidth per
    pair (and, on one host, the figures with which the AllReduce it timed
    crosses the links), and writes a topology the planners and simulator
    read. Under torchrun (across hosts) each rank runs the probe and rank 0
    writes the file. Without -o the topology is printed as YAML.

    \b
    Example:
      dl-nfv profile network --nprocs 2 -o local.yaml
      torchrun --nnodes 2 --nproc-per-node 4 -m dl_nfv profile network -o cluster.yaml
    """
    from dl_nfv.artifacts import from_data, save
    from dl_nfv.artifacts.results import NetworkProbe
    from dl_nfv.profilers.network import message_sizes, probe_network

    sizes = message_sizes(min_bytes, max_bytes)
    with _progress_bar("probing the network") as progress:
        topology, report = probe_network(nprocs, sizes=sizes, repeats=repeats, warmup=warmup,
                                         backend=backend, threads=threads, name=name,
                                         progress=progress)
    if topology is None:  # a rank other than 0 under torchrun
        return
    if report_path is not None:
        save(from_data(NetworkProbe, report.to_data()), report_path)
    console = stderr_console()
    if console is not None:
        for pair, fit in report.fits.items():
            console.print(f"ranks {pair}: {fit['bandwidth_gbps']:.2f} Gbps, "
                          f"{fit['latency_us']:.1f} us latency")
        console.print(f"AllReduce {report.sizes[-1]} B: {report.allreduce_s[-1] * 1e3:.2f} ms "
                      f"(bus {report.allreduce_bus_gbps():.2f} Gbps)")
    deliver(topology, output, as_json, document="yaml")


@command.group(name="import")
def import_group() -> None:
    """Bring op graphs profiled by other tools (PipeDream, NeurIPS'20 placement JSON).

    \b
    Example:
      dl-nfv profile import pipedream graph.txt -o g.json
    """


_device_type_option = click.option(
    "--device-type", default="V100-16GB", show_default=True,
    help="Catalog type the times were measured on (the published profiles used V100s).")
_batch_option = click.option("--batch-size", type=click.IntRange(min=1), default=1, show_default=True,
                             help="Batch size the profile was taken at (the file does not say).")
_name_option = click.option("--name", default=None, help="Model name (default: the file's stem).")


@import_group.command(name="pipedream")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@output_option("Write the op graph here (.json).")
@json_option
@_device_type_option
@_batch_option
@_name_option
@click.option("--keep-input-time", is_flag=True,
              help="Keep the time of Input nodes (data loading); by default it is zeroed, as "
                   "PipeDream's optimizer does.")
def import_pipedream_command(path, output, as_json, device_type, batch_size, name,
                             keep_input_time) -> None:
    """Import PipeDream's profiler graph.txt (per-layer times, activation and parameter sizes).

    Input nodes get zero time unless --keep-input-time. Without -o the op graph
    is printed as JSON.

    \b
    Example:
      dl-nfv profile import pipedream profiles/vgg16/graph.txt --batch-size 64 -o vgg16.json
    """
    from dl_nfv.profilers.importers import import_pipedream

    graph = import_pipedream(path, device_type=device_type, batch_size=batch_size, name=name,
                             keep_input_time=keep_input_time)
    deliver(graph, output, as_json, document="json")


@import_group.command(name="placement-json")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@output_option("Write the op graph here (.json).")
@json_option
@_device_type_option
@_batch_option
@click.option("--transfer-gbps", type=Number(min=0, min_open=True), default=2**31 * 8 / 1e9, show_default=True,
              help="Rate the file's edge costs (ms) were computed at; turns them into bytes "
                   "(default: 2^31 bytes/s, the published files' rate).")
@_name_option
def import_placement_command(path, output, as_json, device_type, batch_size, transfer_gbps,
                             name) -> None:
    """Import a NeurIPS'20 device-placement JSON (nodes, edges, forward/backward colour classes).

    Each forward node is an op; backward nodes add their time to the forward
    ops of their colorClass; a class with several forward nodes becomes a
    colocation group; `size` is memory held on the device. Without -o the op
    graph is printed as JSON.

    \b
    Example:
      dl-nfv profile import placement-json gnmt_training.json -o gnmt.json
    """
    from dl_nfv.profilers.importers import import_placement_json

    graph = import_placement_json(path, device_type=device_type, batch_size=batch_size,
                                  transfer_gbps=transfer_gbps, name=name)
    deliver(graph, output, as_json, document="json")


@command.command(name="fusion")
@click.option("--graph", "graph_path", required=True, type=click.Path(dir_okay=False),
              help="Op graph from `dl-nfv profile model` (its model is rebuilt and traced).")
@click.option("--samples", type=click.IntRange(min=1), default=50, show_default=True,
              help="Fused groups to sample (valid groups of 2 to --max-ops ops).")
@click.option("--max-ops", type=click.IntRange(min=2), default=4, show_default=True,
              help="Most ops in a sampled group.")
@click.option("--repeats", type=click.IntRange(min=1), default=20, show_default=True,
              help="Timed calls per measurement (the minimum is kept).")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="CPU threads.")
@click.option("--compile-budget-s", type=Number(min=0, min_open=True), default=600.0,
              show_default=True, help="Wall seconds of compiling and timing, after which the "
                                      "remaining groups are skipped (and recorded as skipped).")
@seed_option
@output_option("Write the fusion-times artifact here (.json).")
@json_option
def fusion(graph_path, samples, max_ops, repeats, threads, compile_budget_s, seed, output, as_json):
    """Measure sampled fused op groups compiled by torch.compile against their eager ops.

    Each group is pulled into one submodule as `dl-nfv train` fuses it and
    timed eagerly and compiled (inductor), forward and backward; the per-call
    cost of a compiled region is measured too. `dl-nfv plan learn disco` trains
    the fused-kernel estimator on these files.

    \b
    Example:
      dl-nfv profile fusion --graph resnet50.json --samples 300 -o fused-times.json
    """
    from dl_nfv.artifacts import load
    from dl_nfv.planners.disco.fusible import sample_groups
    from dl_nfv.profilers.fusion import check_same_machine, profile_fusion

    graph = load(graph_path, expect="op-graph")
    check_same_machine(graph, f"{graph_path}: ")
    groups = sample_groups(graph, samples, seed=seed, max_ops=max_ops)
    with _progress_bar(f"compiling {len(groups)} fused groups") as progress:
        times = profile_fusion(graph, groups, repeats=repeats, threads=threads, seed=seed,
                               compile_budget_s=compile_budget_s, progress=progress)
    deliver(times, output, as_json, document="json",
            summary=lambda t: f"{len(t.groups)} groups measured, {len(t.skipped)} skipped; "
                              f"per-call cost {t.per_call_fwd_ms:.3f} ms forward, "
                              f"{t.per_call_bwd_ms:.3f} ms backward")
