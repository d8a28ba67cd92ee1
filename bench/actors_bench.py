"""NFVactor benchmark: packets/s and latency with and without replication, migration
completion time actor vs central, recovery time after kill -9.

Starts its own loopback cluster (a switch and three runtimes on free ports, heartbeat
every 20 ms, declared dead after 300 ms of silence) and runs ``nfv/actors/measure.py``'s
``bench`` on generated traffic through the fw-nat-lb chain (``examples/nf``): every
replay's outputs are checked equal to the first run's before a figure counts. Goals
(NFVactor, JSAC 2019): actor migration at least 10x faster than central at 500 flows,
takeover under 100 ms after detection, replication adding under 1 ms at p99. Prints
the tables and writes the ``actors`` section of docs/benchmarks.md.

    python bench/actors_bench.py                       # a few minutes on 2 cores
    python bench/actors_bench.py --quick --no-record   # about a minute
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _record import markdown_table, record_section  # noqa: E402

from dl_nfv.nfv.actors.chain import chain_document  # noqa: E402
from dl_nfv.nfv.actors.cluster import load_cluster  # noqa: E402
from dl_nfv.nfv.actors.measure import bench, speedups  # noqa: E402
from dl_nfv.nfv.actors.processes import ClusterProcesses  # noqa: E402
from dl_nfv.nfv.actors.traffic import interleaved  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHAIN = ROOT / "examples/nf/fw-nat-lb.yaml"


def cluster_file(folder: Path) -> Path:
    socks = [socket.socket() for _ in range(4)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    path = folder / "cluster.yaml"
    path.write_text("\n".join([
        "kind: actors-cluster", "schema_version: 1",
        f'switch: {{name: switch, address: "127.0.0.1:{ports[0]}"}}', "runtimes:",
        *[f'  - {{name: rt{i}, address: "127.0.0.1:{ports[i]}"}}' for i in (1, 2, 3)],
        "heartbeat_ms: 20", "heartbeat_timeout_ms: 300", "replication: true", ""]))
    return path


def tables(result: dict) -> str:
    rows = []
    for key, label in (("no_replication", "off"), ("replication", "on")):
        t, lat = result["throughput"][key], result["latency_us"][key]
        rows.append([label, f"{t['packets_per_s']:.0f}", f"{t['per_runtime']:.0f}",
                     f"{lat['p50']:.0f}", f"{lat['p99']:.0f}"])
    rates = markdown_table(["replication", "packets/s", "per runtime", "p50 us", "p99 us"],
                           rows)
    times = {(m["flows"], m["mode"]): m["completion_ms"] for m in result["migration"]}
    ratio = speedups(result)
    moves = markdown_table(["flows", "actor ms", "central ms", "central / actor"], [
        [n, f"{times[(n, 'actor')]:.1f}", f"{times[(n, 'central')]:.1f}", f"{ratio[n]:.1f}x"]
        for n in sorted(ratio)])
    lat = result["latency_us"]
    pairs = len(lat["replication"]["runs"])
    added = "; ".join(f"{q} {lat['added'][q]['median']:+.0f} us ({lat['added'][q]['min']:+.0f} "
                      f"to {lat['added'][q]['max']:+.0f})" for q in ("p50", "p99"))
    parts = [f"{result['packets']} packets of generated TCP flows, fw-nat-lb chain, "
             f"{result['runtimes']} runtimes; latency over the first "
             f"{result['latency_packets']} packets at {result['latency_rate_pps']:.0f} "
             f"packets/s, medians of {pairs} runs each, off and on in turn.", rates,
             f"Replication adds (on minus off, median of {pairs} pairs, least to most): "
             f"{added}.",
             f"Migration (idle flows, first runtime to second; median of "
             f"{len(result['migration'][0]['runs_ms'])} runs per size and mode, the modes "
             f"in turn):", moves]
    if "recovery" in result:
        r = result["recovery"]
        parts += [f"Recovery after kill -9 of {r['runtime']} (timeout "
                  f"{r['heartbeat_timeout_ms']:.0f} ms):",
                  markdown_table(["detection ms", "takeover ms", "flows promoted",
                                  "flows re-replicated"],
                                 [[f"{r['detection_ms']:.0f}", f"{r['takeover_ms']:.1f}",
                                   r["flows_promoted"], r["flows_rereplicated"]]])]
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="200 flows of traffic, 3 latency pairs, one throughput run per setting")
    parser.add_argument("--repeats", type=int, default=3, help="throughput runs, best counts")
    parser.add_argument("--latency-repeats", type=int, default=None,
                        help="pairs of latency runs, off and on (default 5, quick 3)")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    flows = 200 if args.quick else 2000
    packets = interleaved(flows, 10, seed=0)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = cluster_file(Path(tmp))
        spec = load_cluster(path)
        with ClusterProcesses(path, spec):
            result = bench(spec, packets, chain_document(CHAIN), sizes=(100, 500, 2000),
                           repeats=1 if args.quick else args.repeats,
                           latency_repeats=args.latency_repeats or (3 if args.quick else 5),
                           migration_repeats=3)
    body = (f"Load average (1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, "
            f"on {os.cpu_count()} cores.\n\n" + tables(result))
    print(body)
    if not args.no_record:
        record_section("actors", "NFVactor: replication, migration and recovery", body)


if __name__ == "__main__":
    main()
