"""``dl-nfv nfv netstar``: NFs written with futures over a real store and DNS (run, bench)."""

from __future__ import annotations

from pathlib import Path

import click

from .options import Number, deliver, json_option, output_option

STYLES = click.Choice(["async", "callback", "blocking"])
_config = click.option("--config", "config_path", type=click.Path(dir_okay=False), required=True,
                       help="The nf-config (YAML) whose chain holds NetStar NFs "
                            "(ids, firewall, nat, malware, url-filter).")
_store = click.option("--store", default="embedded", show_default=True,
                      help="Where flow state lives: embedded, or redis://HOST:PORT[/DB].")
_dns = click.option("--dns", default=None,
                    help="DNS server HOST[:PORT] for the malware and url-filter NFs.")


@click.group(name="netstar")
def command() -> None:
    """Run NFs written as async/await code over an external store and DNS (NetStar).

    Each flow's NF code reads like sequential code and waits on Redis or DNS
    while every other flow progresses; the same NFs exist in callback and
    blocking style for comparison, with identical outputs.

    \b
    Example:
      dl-nfv nfv netstar run --config examples/nf/netstar-ids.yaml --trace t.pcap -o report.json
      dl-nfv nfv netstar bench --config examples/nf/netstar-ids.yaml --styles async,callback
    """


def _write(result: dict, output: Path | None, as_json: bool, summary: str) -> None:
    """The result where the options say (``deliver``); ``summary`` is its text for a person."""
    from rich.text import Text

    deliver(result, output, as_json, render=lambda _: Text(summary))


@command.command(name="run")
@_config
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), required=True,
              help="The pcap or pcapng trace.")
@_store
@_dns
@click.option("--style", type=STYLES, default="async", show_default=True,
              help="How the NFs are written: async (futures), callback or blocking.")
@click.option("--window", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Messages inside the chain at once.")
@click.option("--retry-budget-s", type=Number(min=0), default=30.0, show_default=True,
              help="Seconds of back-off a request to a failed service may wait before the run fails.")
@output_option("Write the netstar-report to this file (.json).")
@json_option
def run(config_path: str, trace_path: str, store: str, dns: str | None, style: str, window: int,
        retry_budget_s: float, output: Path | None, as_json: bool) -> None:
    """Run a NetStar NF chain over a trace and write a netstar-report.

    The report lists the alerts (NF, code, message, flow 5-tuple, message
    index), each NF's messages, drops and digest of its outputs, per-flow notes
    (NAT mappings), messages/s, and the services' counters (requests, retries,
    flows held while a service was down, peak requests outstanding). An
    unreachable store or DNS server at start is exit 2; one that stays down
    mid-run past the retry budget is exit 1.

    \b
    Example:
      dl-nfv nfv netstar run --config examples/nf/netstar-ids.yaml --trace t.pcap --store redis://127.0.0.1:6379 -o report.json
      dl-nfv nfv netstar run --config examples/nf/netstar-malware.yaml --trace t.pcap --dns 127.0.0.1:5353 --json
    """
    from dl_nfv.nfv.netstar.run import RunOptions, run_netstar

    report = run_netstar(config_path, trace_path, RunOptions(
        style=style, store=store, dns=dns, window=window, retry_budget_s=retry_budget_s))
    nfs = ", ".join(f"{name}: {o['messages']} messages, {o['alerts']} alerts, "
                    f"{o['dropped_messages']} dropped" for name, o in report["outputs"].items())
    _write(report, output, as_json,
           f"{report['config']} ({style}, store {report['store']}): {report['flows']} flows, "
           f"{report['messages']} messages, {report['messages_per_s']:.0f} messages/s; {nfs}")


@command.command(name="bench")
@_config
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="The pcap or pcapng trace (default: a generated HTTP trace of --flows flows).")
@click.option("--flows", type=click.IntRange(min=1, max=65535), default=1000, show_default=True,
              help="Flows of the generated trace when no --trace is given.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated trace.")
@click.option("--styles", default="async,callback,blocking", show_default=True,
              help="Comma-separated styles to compare.")
@click.option("--store-latency-ms", default="0", show_default=True,
              help="Comma-separated store latencies to measure at (ms per request round trip).")
@_store
@_dns
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Runs per style and latency; the fastest counts.")
@output_option("Write the comparison to this file (.json).")
@json_option
def bench(config_path: str, trace_path: str | None, flows: int, seed: int, styles: str,
          store_latency_ms: str, store: str, dns: str | None, repeats: int, output: Path | None,
          as_json: bool) -> None:
    """Compare styles: lines of code per NF, messages/s at each store latency, same outputs.

    Lines are counted by radon (source lines, without blank lines, comments or
    docstrings). With the embedded store the latency is modelled in the store;
    with a Redis store on 127.0.0.1 a loopback proxy adds it. Fails (exit 1)
    if two styles' outputs differ.

    \b
    Example:
      dl-nfv nfv netstar bench --config examples/nf/netstar-ids.yaml --styles async,callback
      dl-nfv nfv netstar bench --config examples/nf/netstar-ids.yaml --store redis://127.0.0.1:6379 --store-latency-ms 0,1,5
    """
    import tempfile

    from dl_nfv.artifacts.errors import BadInput
    from dl_nfv.nfv.netstar.run import bench as run_bench
    from dl_nfv.nfv.traffic.generate import TraceSpec, generate_trace
    from dl_nfv.nfv.traffic.trace import load_trace

    names = [s.strip() for s in styles.split(",") if s.strip()]
    try:
        latencies = [float(x) for x in store_latency_ms.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--store-latency-ms: {store_latency_ms!r} is not a list of numbers") from None
    if not latencies or any(not 0 <= x < 1000 for x in latencies):
        raise BadInput(f"--store-latency-ms: {store_latency_ms!r}: give latencies in [0, 1000)")
    if trace_path is None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"netstar-{flows}.pcap"
            generate_trace(TraceSpec(flows=flows, seed=seed), path)
            trace = load_trace(path)
        trace.source = f"generated: {flows} flows, seed {seed}"
    else:
        trace = load_trace(trace_path)
    result = run_bench(config_path, trace, names, latencies, store=store, dns=dns, repeats=repeats)
    rows = [f"{style}: {result['lines'][style]['total']} lines" for style in names]
    for row in result["throughput"]:
        rows.append(f"{row['store_latency_ms']:g} ms: " + ", ".join(
            f"{s} {v:.0f} messages/s" for s, v in row["messages_per_s"].items()))
    _write(result, output, as_json, "\n".join(rows))
