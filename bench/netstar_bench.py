"""NetStar benchmark: lines of code per NF and style, and messages/s at store latency 0, 1, 5 ms.

Lines: each NF's async function, callback class and blocking class counted by
radon (source lines; blank lines, comments and docstrings excluded; the logic
the three share is not counted). Throughput: one generated HTTP trace
(uniform flow sizes, so that the figure measures overlap rather than one
straggler flow), parsed once, run through the IDS chain (per-flow matcher
state in the store) and the firewall + NAT chain, each on a real
``redis-server`` on loopback. Latency 0 is Redis directly; 1 and 5 ms go
through a loopback proxy (``nfv/netstar/proxy.py``, its own process) that
delays every request by that much. Best of ``--repeats`` runs per cell, the
styles taking turns (the blocking style once at 1 and 5 ms: its time is the
requests times the latency);
every style's outputs are checked identical before a figure is recorded.
Prints the tables and writes the ``netstar`` section of docs/benchmarks.md.

    python bench/netstar_bench.py                 # about 3 minutes on 2 cores
    python bench/netstar_bench.py --flows 100 --no-record
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _record import markdown_table, record_section  # noqa: E402

from dl_nfv.nfv.netstar import servers  # noqa: E402
from dl_nfv.nfv.netstar.run import bench, count_lines  # noqa: E402
from dl_nfv.nfv.traffic import load_trace  # noqa: E402
from dl_nfv.nfv.traffic.generate import TraceSpec, generate_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHAINS = {"IDS": ROOT / "examples/nf/netstar-ids.yaml",
          "firewall + NAT": ROOT / "examples/nf/netstar-nat.yaml"}
STYLES = ["async", "callback", "blocking"]
LATENCIES = [0.0, 1.0, 5.0]


def lines_table() -> tuple[str, dict]:
    lines = count_lines()
    rows = []
    for nf in [*[k for k in lines["async"] if k != "total"], "total"]:
        a, c, b = lines["async"][nf], lines["callback"][nf], lines["blocking"][nf]
        rows.append([nf, a, c, b, f"{100 * (1 - a / c):.0f}%"])
    return markdown_table(["NF", "async", "callback", "blocking", "async vs callback"],
                          rows), lines


def throughput(trace, store: str, repeats: int) -> tuple[str, list]:
    rows, results = [], []
    for chain, config in CHAINS.items():
        for latency in LATENCIES:
            cells = {}
            for round_ in range(repeats):  # the styles take turns, so load bursts hit all
                for style in STYLES:
                    if style == "blocking" and latency and round_:
                        continue
                    result = bench(config, trace, [style], [latency], store=store, repeats=1)
                    rate = result["throughput"][0]["messages_per_s"][style]
                    cells[style] = max(cells.get(style, 0.0), rate)
            # identical outputs across styles: one bench over all three at this latency
            if latency == 0:
                bench(config, trace, STYLES, [0.0], store=store, repeats=1)
            results.append({"chain": chain, "latency_ms": latency, **cells})
            rows.append([chain, f"{latency:g}", *(f"{cells[s]:,.0f}" for s in STYLES),
                         f"{cells['async'] / cells['callback']:.2f}",
                         f"{cells['async'] / cells['blocking']:.1f}x"])
            print(rows[-1], flush=True)
    return markdown_table(["chain", "store latency ms", *[f"{s} msg/s" for s in STYLES],
                           "async / callback", "async / blocking"], rows), results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the servers on the way out
    lines_md, lines = lines_table()
    print(lines_md)
    with tempfile.TemporaryDirectory() as tmp:
        pcap = Path(tmp) / "netstar.pcap"
        generate_trace(TraceSpec(flows=args.flows, size_dist="uniform", mean_exchanges=4,
                                 seed=1), pcap)
        trace = load_trace(pcap)
        redis = servers.start_redis(Path(tmp) / "redis")
        try:
            table, _ = throughput(trace, redis.url, args.repeats)
        finally:
            redis.stop()
    print(table)
    if args.no_record:
        return
    a, c = lines["async"]["total"], lines["callback"]["total"]
    body = (f"Lines of code per NF (radon SLOC: no blank lines, comments or docstrings; the "
            f"logic the styles share is not counted). All five NFs: async {a}, callback {c}, "
            f"{100 * (1 - a / c):.0f}% fewer.\n\n{lines_md}\n\n"
            f"Messages/s on a generated HTTP trace ({len(trace.flows)} flows, "
            f"{trace.n_messages} messages, uniform sizes, 4 exchanges per flow on average) with "
            f"the store on a real redis-server on loopback; latency added by a loopback proxy "
            f"on every request; best of {args.repeats} (blocking at 1 and 5 ms: one run). "
            f"Outputs identical across the styles.\n\n{table}")
    record_section("netstar", "NetStar: async/await NFs vs callbacks vs blocking", body,
                   command=f"python bench/netstar_bench.py --flows {args.flows} "
                           f"--repeats {args.repeats}")


if __name__ == "__main__":
    main()
