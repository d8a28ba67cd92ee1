"""``nfv run``, ``nfv inspect`` and ``nfv bench``: config + trace + engine -> report.

``run_config`` loads an ``nf-config`` (resolving rules files relative to it),
reads the trace once, runs the chain with the chosen engine and turns the
engine's raw output rows into an ``nfv-report``. ``bench`` runs several
engines over the same parsed trace and checks that their NF outputs are
identical (by digest) before reporting throughput.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections import Counter
from pathlib import Path

# before numpy: this path does no matrix products, and the BLAS thread pool numpy starts
# by default (a thread per core) costs each process at its start, at every fork and at exit
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from dl_nfv.artifacts import load  # noqa: E402
from dl_nfv.artifacts.errors import InvalidArtifact, RuntimeFailure  # noqa: E402
from dl_nfv.artifacts.nfconfig import NfConfig, NfKind  # noqa: E402
from dl_nfv.artifacts.nfvreport import (  # noqa: E402
    Alert,
    Drop,
    FirewallOutput,
    FiveTuple,
    FlowStats,
    HttpOutput,
    IdsOutput,
    Latency,
    MonitorOutput,
    NfOutputs,
    NfvReport,
)

from .engines import parse_engine  # noqa: E402
from .engines.runner import EngineOptions, EngineResult, run_engine, usable_cores  # noqa: E402
from .nfs.snort import load_rules  # noqa: E402
from .traffic.capture import release_freed  # noqa: E402
from .traffic.http import METHODS  # noqa: E402
from .traffic.trace import Trace, load_trace  # noqa: E402

MAX_LISTED_DROPS = 1000


def load_config(path: str | Path) -> NfConfig:
    """Load an ``nf-config`` and resolve/validate its rules files (relative to the config)."""
    config: NfConfig = load(path, expect="nf-config")
    if not config.chain:
        raise InvalidArtifact("no chain: list the NFs to run over the trace's messages"
                              + (" (its l4_chain runs with `nfv chain`)" if config.l4_chain
                                 else ""), field="chain", file=str(path))
    base = Path(path).resolve().parent
    chain = []
    for spec in config.chain:
        if spec.nf == NfKind.IDS:
            rules = Path(spec.rules)
            if not rules.is_absolute():
                rules = base / rules
            load_rules(rules)  # InvalidRules names the file and line
            spec = dataclasses.replace(spec, rules=str(rules))
        chain.append(spec)
    return dataclasses.replace(config, chain=tuple(chain))


def engine_options(config: NfConfig, **overrides) -> EngineOptions:
    e = config.engine
    values = {"batch_size": e.batch_size, "workers": e.workers, "device": e.device,
              "adaptive_batch": e.adaptive_batch, "batch_step": e.batch_step,
              "calibration_batches": e.calibration_batches, "reprofile_every": e.reprofile_every,
              "torch_threads": e.torch_threads}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return EngineOptions(**values)


def run_config(config_path: str | Path, trace_path: str | Path, *, engine: str | None = None,
               trace: Trace | None = None, **overrides) -> NfvReport:
    """Run the chain of ``config_path`` over ``trace_path`` and report.

    ``engine`` overrides the config's engine name (cpu, gpu, fixed:X,
    flowshader). Raises ``BadInput`` for a bad config, rules file, trace or
    engine name; ``RuntimeFailure`` if a worker fails.
    """
    config = load_config(config_path)
    choice = parse_engine(engine or config.engine.name)
    options = engine_options(config, **overrides)
    # The packet path's objects (arrays, per-message tuples, flow records) hold no cycles
    # worth collecting, and each collection would walk every object the imports made (a
    # tenth of a one-worker run in collections): none while the trace is read and run.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _run(config, trace_path, choice, options, trace)
    finally:
        if collecting:
            gc.enable()


def _run(config: NfConfig, trace_path, choice, options: EngineOptions, trace: Trace | None
         ) -> NfvReport:
    t0 = time.perf_counter()
    stages = {}
    owned = trace is None  # read here: nothing reads its message bytes after the NFs
    if owned:  # flows built by as many processes as the NFs get cores
        shards = options.workers or usable_cores()
        if choice.kind == "cpu" and shards > 1:  # each shard its flows and their NFs
            from .engines.sharded import run_sharded  # (its fork machinery: only here)

            trace, result = run_sharded(trace_path, config.chain, choice, options, shards)
            stages.update(trace.stages_s)
            parse_s = stages["read"] + stages["decode"] + stages["flows"]
            if "merge" not in stages:  # too small to shard: the chain built in this process
                stages["setup"] = max(0.0, time.perf_counter() - t0 - parse_s
                                      - result.startup_s - result.elapsed_s)
            return build_report(config, trace, str(choice), result, parse_s, started=t0,
                                stages=stages)
        trace = load_trace(trace_path, workers=shards)
        stages.update(trace.stages_s)
    parse_s = time.perf_counter() - t0
    release_freed()  # flow building's freed temporaries, before the NFs' buffers
    result = run_engine(trace, config.chain, choice, options, release_payload=owned)
    # building the chain (rules compiled, NF tables) before the engine's own clock starts
    stages["setup"] = time.perf_counter() - t0 - parse_s - result.startup_s - result.elapsed_s
    return build_report(config, trace, str(choice), result, parse_s, started=t0, stages=stages)


def _five(trace: Trace, flow: int) -> FiveTuple:
    f = trace.flows[flow]
    return FiveTuple(proto=f.proto, src=f.client, sport=f.client_port, dst=f.server,
                     dport=f.server_port)


def _digest(table: np.ndarray) -> str:
    import hashlib  # here: OpenSSL's libcrypto is mapped once the NFs are done, not at the peak

    return hashlib.sha256(np.ascontiguousarray(table, dtype=np.int64).tobytes()).hexdigest()


def build_report(config: NfConfig, trace: Trace, engine: str, result: EngineResult,
                 parse_s: float, *, started: float | None = None,
                 stages: dict[str, float] | None = None) -> NfvReport:
    """The ``nfv-report`` of one run; throughput over the wall time since ``started``
    (``time.perf_counter()`` when the capture was opened), measured once the report's
    contents are built."""
    specs = {s.nf: s for s in config.chain}
    outputs = {}
    alerts: tuple[Alert, ...] = ()
    if NfKind.IDS in specs:
        rules = {r.sid: r for r in load_rules(specs[NfKind.IDS].rules)}
        alerts = tuple(Alert(sid=sid, msg=rules[sid].msg, flow=_five(trace, flow),
                             message_index=index) for flow, index, sid in result.alerts)
        patterns = {(c.pattern.lower() if c.nocase else c.pattern, c.nocase)
                    for r in rules.values() for c in r.contents}
        outputs["ids"] = IdsOutput(rules=len(rules), patterns=len(patterns), alerts=len(alerts),
                                   stride_bytes=result.stride,
                                   digest=_digest(np.array(result.alerts, dtype=np.int64)))
    if NfKind.HTTP_LB in specs:
        h = result.http
        names = [m.decode() for m in METHODS] + ["OTHER"]
        backends = specs[NfKind.HTTP_LB].backends
        req = h[h[:, 2] == 1] if len(h) else h
        resp = h[h[:, 2] == 2] if len(h) else h
        outputs["http"] = HttpOutput(
            requests=len(req), responses=len(resp),
            methods={names[m]: c for m, c in sorted(Counter(req[:, 3].tolist()).items())},
            statuses={str(s): c for s, c in sorted(Counter(resp[:, 4].tolist()).items())},
            backends={backends[b]: c for b, c in sorted(Counter(req[:, 8].tolist()).items())},
            digest=_digest(h))
    if NfKind.FIREWALL in specs:
        d = result.drops
        flows, counts = np.unique(d[:, 0], return_counts=True) if len(d) else ([], [])
        outputs["firewall"] = FirewallOutput(
            dropped_messages=len(d), dropped_flows=len(flows),
            drops=tuple(Drop(flow=_five(trace, int(f)), messages=int(c))
                        for f, c in list(zip(flows, counts))[:MAX_LISTED_DROPS]),
            digest=_digest(d))
    if NfKind.MONITOR in specs:
        m = result.monitor
        top = m[np.argsort(-m[:, 3], kind="stable")[:10]] if len(m) else m
        outputs["monitor"] = MonitorOutput(
            flows=len(m), messages=int(m[:, 1].sum()) if len(m) else 0,
            packets=int(m[:, 2].sum()) if len(m) else 0, bytes=int(m[:, 3].sum()) if len(m) else 0,
            top_flows=tuple(FlowStats(flow=_five(trace, int(r[0])), messages=int(r[1]),
                                      packets=int(r[2]), bytes=int(r[3]),
                                      duration_us=int(r[5] - r[4])) for r in top),
            digest=_digest(m))
    payload = int(trace.msg_len.sum())
    lat = result.latency_us if len(result.latency_us) else np.zeros(1)
    p50, p90, p99 = _percentiles(lat, (50, 90, 99))
    wall = time.perf_counter() - started if started is not None else \
        parse_s + result.startup_s + result.elapsed_s
    stages = dict(stages or {})
    stages.update(startup=result.startup_s, nfs=result.elapsed_s)
    stages["report"] = max(0.0, wall - sum(v for k, v in stages.items() if k != "report"))
    elapsed = max(wall, 1e-9)
    return NfvReport(
        config=config.name, trace=str(trace.source), engine=engine, device=result.device,
        workers=result.workers, packets=trace.packets, wire_bytes=trace.wire_bytes,
        flows=len(trace.flows), messages=trace.n_messages, payload_bytes=payload,
        parse_s=round(parse_s, 6), startup_s=round(result.startup_s, 6),
        elapsed_s=round(result.elapsed_s, 6), wall_s=round(wall, 6),
        stages_s={k: round(v, 6) for k, v in stages.items()}, gbps=payload * 8 / elapsed / 1e9,
        messages_per_s=trace.n_messages / elapsed, mpps=trace.packets / elapsed / 1e6,
        latency=Latency(p50_us=float(p50), p90_us=float(p90), p99_us=float(p99),
                        max_us=float(lat.max())),
        batches=tuple(result.batches),
        calibration={k: float(v) for k, v in result.rates.items()},
        malformed=dict(trace.malformed), tcp=dict(trace.tcp), alerts=alerts,
        outputs=NfOutputs(**outputs))


def _percentiles(values: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """``np.percentile(values, qs)`` (linear interpolation between the closest ranks),
    without its import of ``numpy.ma`` (10 ms of a run)."""
    s = np.sort(values)
    pos = np.asarray(qs, dtype=np.float64) / 100 * (len(s) - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, len(s) - 1)
    return (s[lo] + (s[hi] - s[lo]) * (pos - lo)).tolist()


def digests(report: NfvReport) -> dict[str, str]:
    """NF name -> output digest, for comparing engines."""
    out = {}
    for name in ("monitor", "http", "firewall", "ids"):
        part = getattr(report.outputs, name)
        if part is not None:
            out[name] = part.digest
    return out


def inspect_trace(path: str | Path) -> dict:
    """Summary of a trace: packets (every record of the file) and those decoded into
    flows, flows by application, messages, flow-size spread, malformed packets by
    reason, TCP reassembly events, the largest flows."""
    t0 = time.perf_counter()
    trace = load_trace(path)
    parse_s = time.perf_counter() - t0
    n_flows = len(trace.flows)
    msgs = np.bincount(trace.msg_flow, minlength=n_flows) if n_flows else np.zeros(0, np.int64)
    nbytes = (np.bincount(trace.msg_flow, weights=trace.msg_len, minlength=n_flows)
              if n_flows else np.zeros(0))

    def spread(a: np.ndarray) -> dict:
        if len(a) == 0:
            return {"min": 0, "median": 0, "p99": 0, "max": 0, "top1pct_share": 0.0}
        top = np.sort(a)[::-1][:max(1, len(a) // 100)]
        return {"min": float(a.min()), "median": float(np.median(a)),
                "p99": float(np.percentile(a, 99)), "max": float(a.max()),
                "top1pct_share": float(top.sum() / max(a.sum(), 1))}

    order = np.argsort(-nbytes, kind="stable")[:5]
    return {
        "trace": str(path), "packets": trace.packets,
        "decoded_packets": sum(f.packets for f in trace.flows), "wire_bytes": trace.wire_bytes,
        "flows": n_flows, "messages": trace.n_messages, "payload_bytes": int(trace.msg_len.sum()),
        "applications": dict(Counter(f.app for f in trace.flows)),
        "message_kinds": {name: int((trace.msg_kind == k).sum())
                          for k, name in ((1, "http_request"), (2, "http_response"), (0, "other"))},
        "messages_per_flow": spread(msgs.astype(float)),
        "bytes_per_flow": spread(nbytes),
        "malformed": dict(trace.malformed), "tcp": dict(trace.tcp),
        "largest_flows": [{**trace.flows[int(i)].five_tuple(), "messages": int(msgs[i]),
                           "bytes": int(nbytes[i])} for i in order],
        "parse_s": round(parse_s, 3),
    }


def bench(config_path: str | Path, trace_path: str | Path, engines: list[str], *,
          repeats: int = 1, **overrides) -> dict:
    """Run each engine ``repeats`` times over one parsed trace; best-of throughput per engine.

    Raises ``RuntimeFailure`` if two engines' NF outputs differ.
    """
    for name in engines:
        parse_engine(name)
    trace = load_trace(trace_path)
    rows = []
    reference: dict[str, str] | None = None
    for name in engines:
        best = None
        for _ in range(max(1, repeats)):
            report = run_config(config_path, trace_path, engine=name, trace=trace, **overrides)
            if best is None or report.elapsed_s < best.elapsed_s:
                best = report
        d = digests(best)
        if reference is None:
            reference = d
        elif d != reference:
            raise RuntimeFailure(f"engine {name} produced different NF outputs than {engines[0]}: "
                                 f"{sorted(k for k in d if d[k] != reference.get(k))}")
        gpu_share = sum(b.gpu_messages for b in best.batches) / max(best.messages, 1)
        rows.append({"engine": name, "gbps": best.gbps, "messages_per_s": best.messages_per_s,
                     "elapsed_s": best.elapsed_s, "gpu_message_share": gpu_share,
                     "batches": len(best.batches), "device": best.device,
                     "workers": best.workers, "alerts": len(best.alerts)})
    return {"trace": str(trace_path), "messages": trace.n_messages, "flows": len(trace.flows),
            "payload_bytes": int(trace.msg_len.sum()), "outputs_identical": True, "engines": rows}
