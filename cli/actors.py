"""``dl-nfv nfv actors``: NFVactor, an actor per flow over runtime processes (up, replay,
migrate, fail, status, bench)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import click

from .options import (
    JSON_SUFFIXES,
    check_output_folder,
    deliver,
    json_option,
    output_option,
    stderr_console,
)

_cluster = click.option("--cluster", "cluster_path", type=click.Path(dir_okay=False),
                        required=True, help="The cluster file (YAML): switch and runtime "
                                            "addresses, heartbeat, replication.")
_chain = click.option("--chain", "chain_path", type=click.Path(dir_okay=False), default=None,
                      help="An nf-config whose l4_chain (or chain) the flow actors run "
                           "(default: a flow monitor).")


def _rate(ctx, param, value: str) -> float:
    text = value.strip().lower().removesuffix("pps")
    try:
        rate = float(text)
    except ValueError:
        raise click.BadParameter(f"{value!r}: give packets per second, e.g. 200000pps "
                                 f"(0: as fast as the window allows)") from None
    if not 0 <= rate < 1e9:
        raise click.BadParameter(f"{value!r}: must be in [0, 1e9) packets per second")
    return rate


def _load(path: str):
    from dl_nfv.nfv.actors.cluster import load_cluster

    return load_cluster(path)


def _text(lines: list[str]):
    from rich.text import Text

    return Text("\n".join(lines))


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


@command.command(name="up")
@_cluster
def up(cluster_path: str) -> None:
    """Start the switch and every runtime of the cluster here, until Ctrl-C.

    All processes run in one process group; Ctrl-C (or SIGTERM) ends every one of
    them, and so does a failure while starting (a port in use, a runtime that
    never answers: exit 2 naming it). Exit 1 if the switch dies. A runtime that
    dies is restarted once the switch has declared it dead and taken its flows
    over; it rejoins, empty, at the next replay.

    \b
    Example:
      dl-nfv nfv actors up --cluster examples/nf/actors-local.yaml
    """
    from dl_nfv.artifacts.errors import DlNfvError
    from dl_nfv.nfv.actors.client import status as cluster_status
    from dl_nfv.nfv.actors.processes import ClusterProcesses

    spec = _load(cluster_path)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    with ClusterProcesses(cluster_path, spec) as procs:
        click.echo(f"up: switch {spec.switch.address}, runtimes "
                   + ", ".join(f"{r.name} {r.address}" for r in spec.runtimes)
                   + " (Ctrl-C stops them)", err=True)
        while procs.alive(spec.switch.name):
            time.sleep(0.5)
            try:
                restarted = procs.restart_dead(cluster_status(spec))
            except DlNfvError:
                continue  # the switch did not answer in time; it is checked again
            for name in restarted:
                click.echo(f"up: restarted {name} (pid {procs.pid(name)}), declared dead; it "
                           f"rejoins, empty, at the next replay", err=True)
        raise DlNfvError(f"the switch {spec.switch.name!r} exited; stopped every runtime")


@command.command(name="replay")
@_cluster
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="The pcap or pcapng trace (default: generated traffic, --flows flows).")
@click.option("--flows", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Flows of the generated traffic when no --trace is given.")
@click.option("--packets-per-flow", type=click.IntRange(min=1), default=10, show_default=True,
              help="Packets per flow of the generated traffic.")
@_chain
@click.option("--rate", default="0", callback=_rate, show_default=True,
              help="Packets per second (200000pps); 0: as fast as the window allows.")
@click.option("--window", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Packets sent and not yet out, at most.")
@click.option("--replication/--no-replication", default=None,
              help="Replicate state before output (default: the cluster file's setting).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of generated traffic.")
@click.option("-o", "--output", "output", type=click.Path(file_okay=False, path_type=Path),
              default=None, callback=lambda c, p, v: check_output_folder(v),
              help="Folder for what the chain produced, nothing else: report.json and "
                   "outputs.jsonl (one line per packet).")
@output_option("Write how the run went (speed, latency, migrations, the cluster's state) "
               "to this file (.json).", suffixes=JSON_SUFFIXES, flags=("--stats",),
               name="stats")
@json_option
def replay(cluster_path: str, trace_path: str | None, flows: int, packets_per_flow: int,
           chain_path: str | None, rate: float, window: int, replication: bool | None,
           seed: int, output: Path | None, stats: Path | None, as_json: bool) -> None:
    """Replay a trace through a running cluster: outputs, final NF state, latency.

    The report has packets in and out, drops per NF, flows, lost / duplicated /
    reordered packets (0 when the guarantees hold) and a digest of every output
    and final per-flow state: the same for runs that must agree, failures and
    migrations or not, so `-o` folders of two such runs are byte-identical. How
    the run went (packets/s, latency percentiles, migrations, the switch's
    events) is measured, not produced: --stats writes it, --json prints both.

    \b
    Example:
      dl-nfv nfv actors replay --cluster examples/nf/actors-local.yaml --trace t.pcap --rate 200000pps --chain examples/nf/fw-nat-lb.yaml -o out/
    """
    from dl_nfv.artifacts import save
    from dl_nfv.nfv.actors.chain import chain_document
    from dl_nfv.nfv.actors.client import read_packets
    from dl_nfv.nfv.actors.client import replay as run_replay
    from dl_nfv.nfv.actors.report import replay_report, replay_run, write_replay
    from dl_nfv.nfv.actors.traffic import interleaved

    spec = _load(cluster_path)
    document = chain_document(chain_path)
    packets = (read_packets(trace_path) if trace_path is not None
               else interleaved(flows, packets_per_flow, seed))
    result = run_replay(spec, packets, document, rate_pps=rate, window=window,
                        replication=replication)
    report = replay_report(result, trace_path or f"generated: {flows} flows, seed {seed}")
    summary = _text([
        f"{report['packets']} packets, {report['passed']} out, {report['flows']} flows, "
        f"{result['packets_per_s']:.0f} packets/s, p99 {result['latency_us']['p99']:.0f} us; "
        f"lost {report['lost']}, duplicated {report['duplicates']}, "
        f"reordered {report['reordered']}"])
    run = replay_run(result)
    if stats is not None:
        save(run, stats)
    if output is not None:
        write_replay(result, report, output)
        if not as_json:
            if (err := stderr_console()) is not None:
                err.print(summary)
            return
    deliver({**report, "run": run}, None, as_json, render=lambda _: summary)


@command.command(name="migrate")
@_cluster
@click.option("--flows", type=click.IntRange(min=1), required=True, help="Flows to move.")
@click.option("--from", "source", required=True, help="The runtime the flows are on.")
@click.option("--to", "destination", required=True, help="The runtime to move them to.")
@click.option("--mode", type=click.Choice(["actor", "central"]), default="actor",
              show_default=True, help="actor: NFVactor's; central: an OpenNF-style controller.")
@json_option
def migrate(cluster_path: str, flows: int, source: str, destination: str, mode: str,
            as_json: bool) -> None:
    """Move flows of a running cluster from one runtime to another, loss-free and in order.

    Exit 2 if the runtimes are the same, unknown or dead (the live ones are
    named), or the source holds fewer flows; exit 1 if one of them dies during
    the migration (its flows are taken over by the runtimes holding their state).

    \b
    Example:
      dl-nfv nfv actors migrate --cluster examples/nf/actors-local.yaml --flows 500 --from rt1 --to rt2 --mode actor
    """
    from dl_nfv.nfv.actors.client import migrate as run_migrate

    result = run_migrate(_load(cluster_path), flows, source, destination, mode)
    deliver(result, None, as_json, render=lambda r: _text([
        f"{r['flows']} flows {r['source']} -> {r['destination']} ({r['mode']}): "
        f"{r['completion_ms']:.1f} ms"]))


@command.command(name="fail")
@_cluster
@click.option("--runtime", required=True, help="The runtime to kill (kill -9).")
@json_option
def fail(cluster_path: str, runtime: str, as_json: bool) -> None:
    """kill -9 a runtime of a running cluster and report its detection and takeover.

    \b
    Example:
      dl-nfv nfv actors fail --cluster examples/nf/actors-local.yaml --runtime rt2
    """
    from dl_nfv.nfv.actors.client import fail as run_fail

    result = run_fail(_load(cluster_path), runtime)
    deliver(result, None, as_json, render=lambda r: _text([
        f"killed {r['runtime']} (pid {r['pid']}): declared dead after "
        f"{r.get('detection_ms', float('nan')):.0f} ms of silence, takeover "
        + ("not finished" if r.get("takeover_ms") is None else f"{r['takeover_ms']:.1f} ms")]))


@command.command(name="status")
@_cluster
@json_option
def status(cluster_path: str, as_json: bool) -> None:
    """Flows, replicas and un-acknowledged packets per runtime; failures and migrations.

    \b
    Example:
      dl-nfv nfv actors status --cluster examples/nf/actors-local.yaml --json
    """
    from dl_nfv.nfv.actors.client import status as run_status

    from .render_actors import render_status

    deliver(run_status(_load(cluster_path)), None, as_json, render=render_status)


@command.command(name="bench")
@_cluster
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="The pcap or pcapng trace (default: 2000 generated flows of 10 packets).")
@_chain
@click.option("--sizes", default="100,500,2000", show_default=True,
              help="Comma-separated numbers of flows to migrate.")
@click.option("--no-recovery", is_flag=True,
              help="Skip the recovery measurement (it kills the third live runtime).")
@output_option("Write the measurements to this file (.json).", suffixes=JSON_SUFFIXES)
@json_option
def bench(cluster_path: str, trace_path: str | None, chain_path: str | None, sizes: str,
          no_recovery: bool, output: Path | None, as_json: bool) -> None:
    """Measure a running cluster: packets/s and latency with and without replication,
    migration time actor vs central, recovery time after kill -9.

    Measured on the runtimes live now: a cluster that lost one is measured on
    the rest. The recovery measurement kills the third live runtime (last, so
    the others are measured on the whole cluster); with fewer than three live
    it is skipped, with a note.

    \b
    Example:
      dl-nfv nfv actors bench --cluster examples/nf/actors-local.yaml --trace t.pcap
    """
    from dl_nfv.artifacts.errors import BadInput
    from dl_nfv.nfv.actors.chain import chain_document
    from dl_nfv.nfv.actors.client import read_packets
    from dl_nfv.nfv.actors.measure import bench as run_bench
    from dl_nfv.nfv.actors.traffic import interleaved

    from .render_actors import render_bench

    try:
        counts = tuple(int(x) for x in sizes.split(",") if x.strip())
    except ValueError:
        raise BadInput(f"--sizes: {sizes!r} is not a comma-separated list of integers") from None
    if not counts or min(counts) < 1:
        raise BadInput(f"--sizes: {sizes!r}: give positive numbers of flows")
    packets = read_packets(trace_path) if trace_path else interleaved(2000, 10, 0)
    result = run_bench(_load(cluster_path), packets, chain_document(chain_path), sizes=counts,
                       recovery=not no_recovery)
    deliver(result, output, as_json, render=render_bench)
