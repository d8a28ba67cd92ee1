"""``dl-nfv nfv``: run network functions over packet traces (gen-trace, inspect, run, bench)."""

from __future__ import annotations

from pathlib import Path

import click

from .main import LazyGroup, skip_teardown
from .options import (
    TRACE_SUFFIXES,
    Number,
    check_output_path,
    deliver,
    json_option,
    output_option,
    print_json,
    print_view,
    seed_option,
    stderr_console,
)


# the actors (NFVactor) and netstar groups are imported when named
@click.group(name="nfv", cls=LazyGroup, lazy={"actors": "actors", "netstar": "netstar"})
def command() -> None:
    """Run network functions over packet traces, on CPU workers, a GPU, or both.

    Traces are pcap or pcapng files; NF chains are nf-config YAML files
    (examples/nf/). Engines: cpu, gpu, fixed:X, flowshader.

    \b
    Example:
      dl-nfv nfv gen-trace --flows 2000 --size-dist zipf:1.2 -o skewed.pcap
      dl-nfv nfv run --config examples/nf/ids.yaml --trace skewed.pcap -o report.json
    """


@command.command(name="gen-trace")
@click.option("--flows", type=click.IntRange(min=1), default=1000, show_default=True, help="Number of TCP flows.")
@click.option("--size-dist", default="zipf:1.2", show_default=True,
              help="Flow sizes in request/response exchanges: uniform, zipf:S or pareto:A.")
@click.option("--mix", default="http", show_default=True, help="Traffic mix (http).")
@click.option("--mean-exchanges", type=Number(min=1), default=4.0, show_default=True,
              help="Mean request/response exchanges per flow.")
@click.option("--attack-rate", type=Number(min=0, max=1), default=0.01, show_default=True,
              help="Fraction of messages carrying a string the example IDS rules detect.")
@seed_option
@output_option("The pcap (.pcap) or pcapng (.pcapng) file to write; the extension picks the "
               "format.", suffixes=TRACE_SUFFIXES, required=True)
@json_option
def gen_trace(flows: int, size_dist: str, mix: str, mean_exchanges: float, attack_rate: float,
              seed: int, output: Path, as_json: bool) -> None:
    """Write a synthetic HTTP/1.1 trace with skewed flow sizes as a real pcap.

    Each flow is a full TCP connection (handshake, MSS-sized segments, FIN)
    carrying request/response exchanges; the number of exchanges per flow
    follows the size distribution. Same options and seed give the same file.

    \b
    Example:
      dl-nfv nfv gen-trace --flows 20000 --size-dist zipf:1.2 --mix http -o skewed.pcap
      dl-nfv nfv gen-trace --flows 500 --size-dist uniform -o small.pcapng
    """
    from dl_nfv.nfv.traffic.generate import TraceSpec, generate_trace

    summary = generate_trace(TraceSpec(flows=flows, size_dist=size_dist, mix=mix,
                                       mean_exchanges=mean_exchanges, attack_rate=attack_rate,
                                       seed=seed), output)
    if as_json:
        print_json(summary)
    elif (console := stderr_console()) is not None:
        console.print(f"wrote {output}: {summary['flows']} flows, {summary['packets']} packets, "
                      f"{summary['exchanges']} exchanges (largest flow "
                      f"{summary['largest_flow_exchanges']})")


@command.command(name="inspect")
@click.argument("trace", type=click.Path(dir_okay=False))
@json_option
def inspect(trace: str, as_json: bool) -> None:
    """Summarise a pcap/pcapng: flows, messages, sizes, protocols, malformed packets.

    \b
    Example:
      dl-nfv nfv inspect skewed.pcap
      dl-nfv nfv inspect tests/data/loopback-http.pcap --json
    """
    from dl_nfv.nfv.run import inspect_trace

    summary = inspect_trace(trace)
    if as_json:
        print_json(summary)
        return
    from .render_nfv import render_inspect

    print_view(render_inspect(summary))


def _device(ctx, param, value):
    """The tensor path's device, refused up front if this machine cannot give it."""
    if value is not None:
        from dl_nfv.profilers.model import resolve_device

        resolve_device(value)
    return value


_engine_option = click.option(
    "--engine", default=None,
    help="cpu, gpu, fixed:X (fraction X of flows on the CPU) or flowshader "
         "(default: the config's engine).")
_run_options = [
    click.option("--config", "config_path", type=click.Path(dir_okay=False), required=True,
                 help="The nf-config (YAML) describing the NF chain."),
    click.option("--trace", "trace_path", type=click.Path(dir_okay=False), required=True,
                 help="The pcap or pcapng trace."),
    click.option("--batch-size", type=click.IntRange(min=1), default=None,
                 help="Messages per batch (initial)."),
    click.option("--workers", type=click.IntRange(min=0), default=None,
                 help="CPU worker processes (0: automatic)."),
    click.option("--device", default=None, callback=_device,
                 help="auto, cpu or cuda[:N] for the tensor path."),
]


def _with(options):
    def wrap(func):
        for option in reversed(options):
            func = option(func)
        return func

    return wrap


@command.command(name="run")
@_with(_run_options)
@_engine_option
@output_option("Write the nfv-report to this file (.json, .yaml or .yml).")
@json_option
def run(config_path: str, trace_path: str, batch_size: int | None, workers: int | None,
        device: str | None, engine: str | None, output: Path | None, as_json: bool) -> None:
    """Run an NF chain over a trace and write an nfv-report.

    The report has throughput (Gbps of payload, messages/s), per-message latency
    percentiles, the CPU/GPU split of every batch, the alerts (sid, msg, flow
    5-tuple, message index), HTTP/LB decisions, firewall drops, per-flow monitor
    figures and malformed-packet counts by reason.

    \b
    Example:
      dl-nfv nfv run --config examples/nf/ids.yaml --trace skewed.pcap --engine flowshader -o report.json
      dl-nfv nfv run --config examples/nf/ids.yaml --trace skewed.pcap --engine fixed:0.3 --json
    """
    from dl_nfv.nfv.run import run_config

    report = run_config(config_path, trace_path, engine=engine, batch_size=batch_size,
                        workers=workers, device=device)
    deliver(report, output, as_json, render=_render_report)
    skip_teardown()  # the report is out and the workers are joined


def _render_report(report):
    """The report's tables; rich is imported only when they are drawn (~0.06 s)."""
    from .render_nfv import render_report

    return render_report(report)


def _names(ctx, param, value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise click.BadParameter(f"{value!r}: name at least one, comma-separated")
    return names


def _sizes(ctx, param, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        sizes = [int(n) for n in value.split(",") if n.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated integers") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"{value!r}: name at least one batch size, each >= 1")
    return sizes


@command.command(name="bench")
@_with(_run_options)
@click.option("--engines", default=None, callback=lambda c, p, v: None if v is None else
              _names(c, p, v),
              help="Comma-separated engines to compare [default: cpu,gpu,flowshader; "
                   "cpu,tensor for a config with an l4_chain].")
@click.option("--batch-sizes", default=None, callback=_sizes,
              help="l4_chain only: comma-separated batch sizes (packets) to run each engine at "
                   "[default: the config's].")
@click.option("--repeats", type=click.IntRange(min=1), default=None,
              help="Runs per engine; the fastest counts [default: 1; 3 for an l4_chain, "
                   "after two untimed batches].")
@output_option("Write the comparison (an nfv-bench, or a chain-bench for an l4_chain) to this "
               "file (.json, .yaml or .yml).")
@json_option
def bench(config_path: str, trace_path: str, batch_size: int | None, workers: int | None,
          device: str | None, engines: list[str] | None, batch_sizes: list[int] | None,
          repeats: int, output: Path | None, as_json: bool) -> None:
    """Compare engines on one trace: throughput, GPU share, and identical NF outputs.

    Fails (exit 1) if two engines' NF outputs differ. A config with an
    l4_chain and no L7 chain is benched as `nfv chain` runs it: every engine
    at every batch size, packet for packet the same outcome.

    \b
    Example:
      dl-nfv nfv bench --config examples/nf/ids.yaml --trace skewed.pcap --engines cpu,gpu,flowshader
      dl-nfv nfv bench --config examples/nf/fw-nat-lb.yaml --trace t.pcap --engines cpu,tensor --batch-sizes 1024,8192,65536
    """
    from dl_nfv.artifacts import from_data
    from dl_nfv.nfv.chains.run import BENCH_REPEATS, bench_chain, is_chain_config

    if is_chain_config(config_path):
        from dl_nfv.artifacts.chainreport import ChainBench

        from .render_chain import render_bench as render_chain_bench

        sizes = batch_sizes or ([batch_size] if batch_size else None)
        result = bench_chain(config_path, trace_path, engines or ["cpu", "tensor"], sizes,
                             device=device, repeats=repeats or BENCH_REPEATS)
        deliver(from_data(ChainBench, result), output, as_json, render=render_chain_bench)
        return
    from dl_nfv.artifacts.results import NfvBench
    from dl_nfv.nfv.run import bench as run_bench

    result = run_bench(config_path, trace_path, engines or ["cpu", "gpu", "flowshader"],
                       repeats=repeats or 1, batch_size=batch_size, workers=workers, device=device)
    from .render_compare import render_bench

    deliver(from_data(NfvBench, result), output, as_json, render=render_bench)


@command.command(name="chain")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), required=True,
              help="The nf-config (YAML) whose l4_chain to run.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), required=True,
              help="The pcap or pcapng trace.")
@click.option("--engine", type=click.Choice(["tensor", "cpu"]), default=None,
              help="tensor (batched torch kernels) or cpu (the per-packet reference) "
                   "[default: the config's l4_engine].")
@click.option("--device", default=None, callback=_device,
              help="auto, cpu or cuda[:N] for the tensor engine.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Packets per batch [default: the config's l4_engine.batch_size].")
@output_option("Write the chain-report to this file (.json, .yaml or .yml).")
@click.option("-w", "--write", "write_path", type=click.Path(dir_okay=False), default=None,
              help="Write the forwarded, rewritten packets to this pcap.")
@json_option
def chain(config_path: str, trace_path: str, engine: str | None, device: str | None,
          batch_size: int | None, output: Path | None, write_path: str | None,
          as_json: bool) -> None:
    """Run a stateful L3/L4 service chain (firewall, NAT, Maglev LB, monitor, rate
    limiter) over a trace, packet by packet or as batched tensor kernels.

    Every NF keeps per-flow state (a flow table on the device for the tensor
    engine); the report counts packets in/out/dropped per NF and reason, NAT
    bindings, LB flows per backend, time per stage, Mpps, Gbps and per-batch
    latency. -w writes the forwarded packets with their rewritten addresses,
    ports and checksums.

    \b
    Example:
      dl-nfv nfv chain --config examples/nf/fw-nat-lb.yaml --trace t.pcap --engine tensor -o report.json -w out.pcap
      dl-nfv nfv chain --config examples/nf/fw-nat-lb.yaml --trace t.pcap --engine cpu --json
    """
    from dl_nfv.artifacts import from_data
    from dl_nfv.artifacts.chainreport import ChainReport
    from dl_nfv.nfv.chains.run import run_chain

    if write_path is not None:
        try:
            check_output_path(Path(write_path), TRACE_SUFFIXES)
        except click.BadParameter as bad:
            raise click.BadParameter(bad.message, param_hint="-w") from None
    report = run_chain(config_path, trace_path, engine=engine, device=device,
                       batch_size=batch_size, write=write_path)
    from .render_chain import render_report

    deliver(from_data(ChainReport, report), output, as_json, render=render_report)

