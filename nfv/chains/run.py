"""``dl-nfv nfv chain`` and the chain path of ``nfv bench``: a chain over a trace, a report.

``run_chain`` loads the nf-config's ``l4_chain`` and the capture, drives the
chain over the packets in batches of ``batch_size`` (in capture order), writes
the forwarded packets to a pcap if asked, and returns the ``chain-report``
document: packets in/out/dropped per NF and reason, NAT translations and pool
use, LB flows per backend, monitor flows, time per stage, Mpps and Gbps (wire
bytes of the packets offered, over the time spent in the engine, loading and
writing excluded) and per-batch latency percentiles (the wall time of each
batch, from its columns on the host to its outcomes back on the host). The tensor
engine's flow table is sized once, before the run, for the trace's distinct flows
(``table_capacity``), so no batch pays for a rehash.

``bench_chain`` runs every engine at every batch size on one trace and checks
that they forward, drop and rewrite every packet the same way. Each engine first
runs a few batches untimed on a chain of its own (the process's first call of each
step, and a device's set-up, are not the engine's throughput), then ``repeats`` timed
runs from fresh state; the fastest counts: a run of a short trace takes tens of
milliseconds, which other work on a shared machine can stretch by more than any
change being compared.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from ...artifacts import BadInput, InvalidArtifact, load
from .engine import OUT_FIELDS, BatchResult, TensorChain, build_chain
from .flowtable import capacity_for
from .packets import ChainPackets, flow_count, load_packets, write_output
from .states import DROP_REASONS

ENGINES = ("cpu", "tensor")
BENCH_REPEATS = 3  # runs per engine and batch size of ``nfv bench`` on a chain by default
WARM_UP_BATCHES = 2  # batches a bench runs untimed on a fresh chain before the timed runs
SIZED_UP_TO = 1 << 22  # slots of a table sized from the trace (~0.6 GB for four NFs' columns)


def load_chain_config(path: str | Path):
    config = load(path, expect="nf-config")
    if not config.l4_chain:
        raise InvalidArtifact("no l4_chain: list the L3/L4 NFs (firewall, nat, lb, monitor, "
                              "rate-limit) to run with `nfv chain`", field="l4_chain",
                              file=str(path))
    return config


def is_chain_config(path: str | Path) -> bool:
    """True if the nf-config at ``path`` has an l4_chain and no L7 chain."""
    config = load(path, expect="nf-config")
    return bool(config.l4_chain) and not config.chain


def resolve(device: str) -> str:
    from ...profilers.model import resolve_device

    return str(resolve_device(device))


def table_capacity(spec, packets: ChainPackets) -> int:
    """The tensor engine's flow table, sized once for every flow of the trace (at least the
    config's ``table_capacity``, at most ``SIZED_UP_TO`` slots: a long trace's flows are
    seldom all live at once), so that it does not rehash during the run."""
    return max(spec.table_capacity, min(capacity_for(flow_count(packets)), SIZED_UP_TO))


def drive(chain, packets: ChainPackets, batch_size: int) -> tuple[list[BatchResult], list[float]]:
    """Run ``chain`` over ``packets`` in batches; the results and each batch's wall time.

    The tensor engine on the CPU runs on one core (one torch thread, restored after):
    its vector steps are a batch long or shorter, too short for threads to pay off."""
    results, latency = [], []
    one_core = isinstance(chain, TensorChain) and chain.device.type == "cpu"
    threads = torch.get_num_threads()
    if one_core:
        torch.set_num_threads(1)
    try:
        for start in range(0, len(packets), batch_size):
            t0 = time.perf_counter()
            results.append(chain.run_batch(packets.slice(start, start + batch_size)))
            latency.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return results, latency


def merge(results: list[BatchResult]) -> BatchResult:
    if not results:
        empty = np.zeros(0, dtype=np.int64)
        return BatchResult(stage=empty, reason=empty, fields={f: empty for f in OUT_FIELDS})
    return BatchResult(stage=np.concatenate([r.stage for r in results]),
                       reason=np.concatenate([r.reason for r in results]),
                       fields={f: np.concatenate([r.fields[f] for r in results])
                               for f in OUT_FIELDS})


def _stages(chain, merged: BatchResult, results: list[BatchResult]) -> list[dict]:
    rows = []
    times = np.sum([r.stage_s for r in results], axis=0) if results else []
    tensor = len(times) == len(chain.names) + 1
    for k, name in enumerate(chain.names):
        reached = (merged.stage == -1) | (merged.stage >= k)
        dropped = merged.reason[merged.stage == k]
        drops = {DROP_REASONS[int(v)]: int(c) for v, c in
                 zip(*np.unique(dropped, return_counts=True))}
        rows.append({"nf": name, "packets_in": int(reached.sum()),
                     "packets_out": int(reached.sum()) - int(dropped.size), "dropped": drops,
                     "time_s": float(times[k + 1]) if tensor else 0.0})
    return rows


def _nf_outputs(chain) -> dict:
    out: dict = {}
    for name, nf in zip(chain.names, chain.nfs):
        if name == "nat":
            out["nat"] = {"translations": nf.translations, "exhausted": nf.exhausted,
                          "pool_size": len(nf.bindings) if hasattr(nf, "bindings") else nf.size,
                          "in_use": nf.in_use(), "peak_in_use": nf.peak_in_use}
        elif name == "lb":
            out["lb"] = {nf.backends.names[b]: c for b, c in sorted(nf.flows_per_backend.items())}
        elif name == "monitor":
            flows = nf.snapshot()
            out["monitor"] = {"flows": len(flows), "exported": nf.exported,
                              "packets": sum(v[0] for v in flows.values()),
                              "bytes": sum(v[1] for v in flows.values())}
    return out


def _latency(latency: list[float]) -> dict[str, float]:
    if not latency:
        return {"p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    ms = np.array(latency) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
            "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max())}


def chain_report(chain, packets: ChainPackets, results, latency, **meta) -> dict:
    """The ``chain-report`` document of a finished run."""
    merged = merge(results)
    elapsed = float(sum(latency))
    wire = int(packets.wire_bytes.sum())
    return {"kind": "chain-report", "schema_version": 1, **meta,
            "packets_in": len(packets), "packets_out": int((merged.stage == -1).sum()),
            "wire_bytes": wire, "batches": len(results), "elapsed_s": elapsed,
            "mpps": len(packets) / elapsed / 1e6 if elapsed else 0.0,
            "gbps": wire * 8 / elapsed / 1e9 if elapsed else 0.0,
            "latency": _latency(latency), "stages": _stages(chain, merged, results),
            **_nf_outputs(chain)}


def run_chain(config_path: str, trace_path: str, *, engine: str | None = None,
              device: str | None = None, batch_size: int | None = None,
              write: str | Path | None = None) -> dict:
    """Run the config's l4_chain over the trace; the ``chain-report`` document.

    Raises ``BadInput``/``InvalidArtifact`` for a config without l4_chain, an
    unknown engine, a device this machine lacks or a file that is not a capture."""
    config = load_chain_config(config_path)
    spec = config.l4_engine
    engine = engine or spec.name
    if engine not in ENGINES:
        raise BadInput(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    device = resolve(device or spec.device) if engine == "tensor" else "cpu"
    batch_size = batch_size or spec.batch_size
    capture = load_packets(trace_path)
    chain = build_chain(config.l4_chain, engine, device=device,
                        capacity=table_capacity(spec, capture.packets) if engine == "tensor"
                        else spec.table_capacity,
                        sweep_interval_s=spec.sweep_interval_s)
    results, latency = drive(chain, capture.packets, batch_size)
    report = chain_report(chain, capture.packets, results, latency, config=str(config_path),
                          trace=str(trace_path), engine=engine, device=device,
                          batch_size=batch_size, frames=capture.frames,
                          ingress_dropped=capture.ingress_drops)
    if write is not None:
        merged = merge(results)
        rows = np.flatnonzero(merged.stage == -1)
        report["written"] = write_output(write, capture, rows,
                                         {f: merged.fields[f][rows] for f in OUT_FIELDS})
    return report


def same_outcome(a: BatchResult, b: BatchResult) -> bool:
    return (np.array_equal(a.stage, b.stage) and np.array_equal(a.reason, b.reason)
            and all(np.array_equal(a.fields[f], b.fields[f]) for f in OUT_FIELDS))


def bench_chain(config_path: str, trace_path: str, engines: list[str],
                batch_sizes: list[int] | None, *, device: str | None = None,
                repeats: int = BENCH_REPEATS) -> dict:
    """Every engine at every batch size on one trace, ``repeats`` runs each from fresh
    state, the fastest kept, after ``WARM_UP_BATCHES`` untimed batches on a chain of its
    own: the ``chain-bench`` document. ``DlNfvError`` (exit 1) if two runs at one batch
    size differ in any packet."""
    from ...artifacts import DlNfvError

    config = load_chain_config(config_path)
    spec = config.l4_engine
    for name in engines:
        if name not in ENGINES:
            raise BadInput(f"--engines: unknown engine {name!r}; valid: {', '.join(ENGINES)}")
    dev = resolve(device or spec.device)
    capture = load_packets(trace_path)
    capacity = table_capacity(spec, capture.packets)
    rows = []
    for size in batch_sizes or [spec.batch_size]:
        first = None
        for name in engines:
            report = None
            new = partial(build_chain, config.l4_chain, name,
                          device=dev if name == "tensor" else "cpu", capacity=capacity,
                          sweep_interval_s=spec.sweep_interval_s)
            # untimed: the process's first calls of each step (and a device's set-up)
            drive(new(), capture.packets.slice(0, WARM_UP_BATCHES * size), size)
            for _ in range(repeats):
                chain = new()
                results, latency = drive(chain, capture.packets, size)
                run = chain_report(chain, capture.packets, results, latency)
                merged = merge(results)
                if first is None:
                    first = merged
                elif not same_outcome(first, merged):
                    raise DlNfvError(f"engine {name!r} at batch size {size} forwards, drops or "
                                     f"rewrites packets differently from {engines[0]!r}")
                if report is None or run["mpps"] > report["mpps"]:
                    report = run
            rows.append({"engine": name, "batch_size": size,
                         "device": dev if name == "tensor" else "cpu",
                         "mpps": report["mpps"], "gbps": report["gbps"],
                         "p50_ms": report["latency"]["p50_ms"],
                         "p99_ms": report["latency"]["p99_ms"],
                         "packets_out": report["packets_out"]})
    return {"kind": "chain-bench", "schema_version": 1, "config": str(config_path),
            "trace": str(trace_path), "packets": len(capture.packets), "rows": rows}
