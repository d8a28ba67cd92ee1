"""Throughput of the L3/L4 chain (firewall -> NAT -> LB -> monitor): cpu vs tensor.

Traces are generated in memory as columns (``nfv.chains.synth``): 64- and 512-byte
packets, 10k and 1M flows, batch sizes 1k-64k; the tensor engine runs with one
torch thread (and on CUDA when present, ``--device cuda``). The per-packet
reference is timed on a prefix of each trace (it is ~100x slower); Mpps is packets
over engine time, Gbps counts wire bytes. Every tensor run is checked against the
reference on that prefix, packet for packet. The flow table is sized once for the
trace's flows, as ``nfv chain`` sizes it, and the example chain's NAT pool is widened
(``NAT_POOL_BASE`` onwards, same port range) to hold a binding for every flow of the
trace, so that no row times packets dropped for want of a binding. ``--trace`` runs the same rows on a capture
instead (e.g. ``nfv gen-trace --flows 10000 --mix http``), with its own packet sizes.

    python bench/chain_bench.py            # full table, recorded in docs/benchmarks.md
    python bench/chain_bench.py --quick --no-record
    python bench/chain_bench.py --trace big.pcap --no-record
    python bench/chain_bench.py --quick --cpu-time     # CPU time, on a machine others load
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import markdown_table, record_section  # noqa: E402

from dl_nfv.artifacts import load  # noqa: E402
from dl_nfv.artifacts.nfconfig import L4NfKind, port_range  # noqa: E402
from dl_nfv.nfv.chains.engine import build_chain  # noqa: E402
from dl_nfv.nfv.chains.flowtable import capacity_for  # noqa: E402
from dl_nfv.nfv.chains.packets import flow_count, load_packets  # noqa: E402
from dl_nfv.nfv.chains.run import drive, merge, same_outcome  # noqa: E402
from dl_nfv.nfv.chains.synth import synthetic_packets  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "nf" / "fw-nat-lb.yaml"
NAT_POOL_BASE = ipaddress.IPv4Address("198.18.0.1")  # RFC 2544's benchmarking range


def pool_for(specs, flows: int):
    """The chain with its NAT pool holding at least one binding per flow: the pool's own
    addresses while they suffice, else as many consecutive addresses from
    ``NAT_POOL_BASE`` as the port range needs."""
    out = []
    for spec in specs:
        if spec.nf == L4NfKind.NAT:
            lo, hi = port_range(spec.ports)
            need = math.ceil(flows / (hi - lo + 1))
            if need > len(spec.pool):
                spec = replace(spec, pool=tuple(str(NAT_POOL_BASE + k) for k in range(need)))
        out.append(spec)
    return out


def _time(chain, packets, batch_size, clock=time.perf_counter):
    """``drive``'s run timed by ``clock`` (``time.thread_time`` with ``--cpu-time``: this
    thread's CPU time, where other work shares the cores)."""
    t0 = clock()
    results, latency = drive(chain, packets, batch_size)
    return clock() - t0, results, latency


def synthetic(flows: int, packets: int, size: int):
    """The synthetic trace of a row and its table capacity (built once per trace, shared by
    the rows of every batch size)."""
    trace = synthetic_packets(flows=flows, packets=packets, packet_bytes=size, seed=1,
                              duration_s=packets / 2e6)
    return trace, capacity_for(flow_count(trace))


def measure(specs, *, flows, size, batch, device, ref_packets, trace, capacity,
            clock=time.perf_counter):
    """One row: the tensor engine over the whole trace, the reference over its prefix,
    their outcomes on the prefix compared."""
    chain = build_chain(specs, "tensor", device=device, capacity=capacity)
    elapsed, results, latency = _time(chain, trace, batch, clock)
    n = len(trace)
    prefix = trace.slice(0, min(ref_packets, n))
    ref_s, ref_results, _ = _time(build_chain(specs, "cpu"), prefix, batch, clock)
    check = build_chain(specs, "tensor", device=device, capacity=capacity)
    _, ten_results, _ = _time(check, prefix, batch)
    assert same_outcome(merge(ref_results), merge(ten_results)), "tensor != reference"
    mpps = n / elapsed / 1e6
    ref_mpps = len(prefix) / ref_s / 1e6
    wire = int(trace.wire_bytes.sum())
    return {"flows": flows, "bytes": size, "batch": batch, "packets": n,
            "tensor_mpps": mpps, "tensor_gbps": wire * 8 / elapsed / 1e9,
            "p99_ms": float(np.percentile(np.array(latency) * 1e3, 99)),
            "cpu_mpps": ref_mpps, "speedup": mpps / ref_mpps}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small trace, three batch sizes")
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] for the tensor engine")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="Mpps over the thread's CPU time, not wall time (a loaded machine; "
                             "not recorded)")
    parser.add_argument("--trace", default=None,
                        help="a capture to run instead of the synthetic traces (not recorded)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    args.no_record |= args.cpu_time
    specs = load(CONFIG).l4_chain
    capture = None
    if args.trace:
        capture = load_packets(args.trace).packets
        grid = [(flow_count(capture), len(capture))]
        batches, sizes, ref_packets = [1024, 8192, 65536], ["mixed"], 20_000
        if args.quick:
            batches = [8192]
        args.no_record = True
    elif args.quick:
        grid = [(10_000, 200_000)]
        batches, sizes, ref_packets = [1024, 8192, 65536], [64], 20_000
    else:
        grid = [(10_000, 2_000_000), (1_000_000, 6_000_000)]
        batches, sizes, ref_packets = [1024, 8192, 65536], [64, 512], 100_000
    rows = []
    for flows, packets in grid:
        for size in sizes:
            trace, capacity = (capture, capacity_for(flows)) if capture is not None \
                else synthetic(flows, packets, size)
            chain = pool_for(specs, flows)
            for batch in batches:
                r = measure(chain, flows=flows, size=size, batch=batch, device=args.device,
                            ref_packets=ref_packets, trace=trace, capacity=capacity,
                            clock=clock)
                rows.append(r)
                print(f"{flows:>9} flows {size:>4} B batch {batch:>6}: tensor "
                      f"{r['tensor_mpps']:.3f} Mpps {r['tensor_gbps']:.3f} Gbps "
                      f"(p99 batch {r['p99_ms']:.1f} ms), reference {r['cpu_mpps']:.4f} Mpps, "
                      f"{r['speedup']:.1f}x", flush=True)
    table = markdown_table(
        ["flows", "packet B", "batch", "packets", "tensor Mpps", "tensor Gbps", "p99 batch ms",
         "reference Mpps", "speed-up"],
        [[f"{r['flows']:,}", r["bytes"], r["batch"], f"{r['packets']:,}",
          f"{r['tensor_mpps']:.3f}", f"{r['tensor_gbps']:.3f}", f"{r['p99_ms']:.1f}",
          f"{r['cpu_mpps']:.4f}", f"{r['speedup']:.1f}x"] for r in rows])
    if not args.no_record:
        record_section("chain", f"L3/L4 chain (FW -> NAT -> LB -> monitor), tensor on "
                                f"{args.device} with {args.threads} thread(s) vs the reference",
                       table)
    print(table)


if __name__ == "__main__":
    main()
